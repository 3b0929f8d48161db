"""Errors of the HTTP client: one class per way a request to the server can fail.

Where the engine has a class for the same failure (``ValidationError``, ``NotFoundError``,
``ConflictError``) the client's class derives from it, so code written against an embedded
``Memory`` catches the same errors from a remote one. Every class also derives from
:class:`APIError`, which carries what the server said: ``status_code``, ``code``,
``detail`` and ``request_id`` (quote it when reporting a server error); validation errors
also have ``problems``, one line per offending field.

This module does not import httpx, so ``from stratamem.client import NotFoundError`` is cheap.
"""

from __future__ import annotations

from typing import Any

from .. import errors as engine

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "ConflictError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServerError",
    "ValidationError",
    "error_for_status",
]


class APIError(engine.StratamemError):
    """The server could not be reached, or it answered with an error.

    ``status_code`` is None when no answer came (connection refused, timeout).
    """

    status_code: int | None = None
    code: str | None = None
    detail: str = ""
    request_id: str | None = None
    body: Any = None


class APIConnectionError(APIError):
    """No answer: the server refused the connection, dropped it, or the URL is wrong."""


class APITimeoutError(APIConnectionError, TimeoutError):
    """The server did not connect or answer within the configured timeout."""


class APIStatusError(APIError):
    """The server answered with an error status that no more specific class covers."""


class AuthenticationError(APIStatusError):
    """401 or 403: the API key is missing, malformed, unknown or revoked (or the route is
    not open to it). Retrying does not help; fix the key."""


class ValidationError(APIStatusError, engine.ValidationError):
    """400 or 422: the server refused the input; ``problems`` has one line per field,
    e.g. ``"messages[0].role: Input should be 'user', ..."``."""


class PayloadTooLargeError(ValidationError):
    """413: the request body, a message's content or its metadata is over the server's
    limit. A ``ValidationError`` too, as the embedded engine reports the same limits."""


class NotFoundError(APIStatusError, engine.NotFoundError):
    """404: no such session or item in the key's project (another project's ids look the
    same as missing ones)."""


class ConflictError(APIStatusError, engine.ConflictError):
    """409: the request contradicts stored state (a session id of another user, a message
    id resent with other content)."""


class RateLimitError(APIStatusError):
    """429: too many requests; ``retry_after`` is the server's hint in seconds, if any."""

    retry_after: float | None = None


class ServerError(APIStatusError):
    """5xx: the server failed (500) or is unavailable for now (503: storage, embedder or
    processing; stored messages stay stored). Quote ``request_id`` when reporting it."""


def _problem_lines(problems: Any) -> list[str]:
    lines = []
    for p in problems if isinstance(problems, list) else []:
        if isinstance(p, dict):
            field, message = p.get("field") or "", p.get("message") or ""
            lines.append(f"{field}: {message}" if field else str(message))
        else:
            lines.append(str(p))
    return lines


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date; rare enough not to parse
        return None


def error_for_status(status: int, body: Any, headers: Any = None) -> APIStatusError:
    """The error for a response with ``status``, from its (decoded) ``body``: the server's
    envelope ``{"error": {"code", "detail", "problems", "request_id"}}``, FastAPI's plain
    ``{"detail": ...}``, or any text a proxy in between may have sent."""
    info: dict[str, Any] = {}
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            info = body["error"]
        elif "detail" in body:
            info = {"detail": body["detail"]}
    detail = info.get("detail") or (body.get("message") if isinstance(body, dict) else None)
    if not isinstance(detail, str) or not detail:
        text = body if isinstance(body, str) else ""
        detail = text.strip()[:300] or f"HTTP {status}"
    problems = _problem_lines(info.get("problems"))
    request_id = info.get("request_id") or (headers.get("x-request-id") if headers else None)

    exc: APIStatusError
    if status in (400, 422):
        exc = ValidationError(detail, problems)
    elif status == 413:
        exc = PayloadTooLargeError(detail, problems)
    elif status in (401, 403):
        exc = AuthenticationError(detail)
    elif status == 404:
        exc = NotFoundError(detail)
    elif status == 409:
        exc = ConflictError(detail)
    elif status == 429:
        exc = RateLimitError(detail)
        exc.retry_after = _retry_after(headers)
    elif status >= 500:
        suffix = f" (request id {request_id})" if request_id and request_id not in detail else ""
        exc = ServerError(detail + suffix)
    else:
        exc = APIStatusError(f"HTTP {status}: {detail}")
    exc.status_code = status
    exc.code = info.get("code") if isinstance(info.get("code"), str) else None
    exc.detail = detail
    exc.request_id = request_id if isinstance(request_id, str) else None
    exc.body = body
    return exc

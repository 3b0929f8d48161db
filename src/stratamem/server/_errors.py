"""Errors on the wire: every failure becomes an error envelope with a real status code.

Engine errors map to statuses here, once, so routes never catch them. Nothing below ever
puts a traceback or an exception's repr into a response: unexpected errors are logged with
the request id and answered with a generic 500 that quotes it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._checks import ID_RULE
from .._queries import field_path
from .._strings import UNICODE_RULE, printable
from ..errors import (
    ConflictError,
    EmbeddingError,
    NotFoundError,
    ProcessingError,
    StoreError,
    StratamemError,
    ValidationError,
)
from ..types import ID_PATTERN

__all__ = ["ApiError", "error_body", "error_response", "install_error_handlers"]

log = logging.getLogger("stratamem.server")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    500: "internal_error",
    501: "not_implemented",
    503: "unavailable",
}


class ApiError(Exception):
    """An error a route raises to answer with ``status`` and a readable ``detail``."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: str | None = None,
        problems: Sequence[tuple[str, str]] = (),
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = code or _CODES.get(status, "error")
        self.problems = list(problems)
        self.headers = headers


def error_body(
    status: int,
    detail: str,
    *,
    request_id: str | None,
    code: str | None = None,
    problems: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    # Details and problems may quote the input: whatever it held (a lone surrogate cannot be
    # encoded as UTF-8), the error must still be sendable, so such characters are escaped.
    detail = printable(detail)
    return {
        "success": False,
        "data": None,
        "message": detail,
        "error": {
            "code": code or _CODES.get(status, "error"),
            "detail": detail,
            "problems": [{"field": printable(f), "message": printable(m)} for f, m in problems],
            "request_id": request_id,
        },
    }


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def error_response(
    request: Request,
    status: int,
    detail: str,
    *,
    code: str | None = None,
    problems: Sequence[tuple[str, str]] = (),
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = error_body(status, detail, request_id=_request_id(request), code=code, problems=problems)
    return JSONResponse(body, status_code=status, headers=headers)


# "messages[2].role: must be one of ..." -> ("messages[2].role", "must be one of ..."). The
# field runs to the first ": " and holds no space; it may hold a metadata key or an operator
# ("filters.stars.$gt").
_PROBLEM = re.compile(r"^([A-Za-z_]\S*?): (.*)$", re.DOTALL)


def _split_problem(line: str) -> tuple[str, str]:
    m = _PROBLEM.match(line)
    return (m.group(1), m.group(2)) if m else ("", line)


def _loc_to_field(loc: Sequence[Any]) -> str:
    # ("body", "messages", 2, "role") -> "messages[2].role"; the location ("body", "query",
    # "path") is left out because field names do not repeat across locations here.
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header") else list(loc)
    return field_path(parts) or (str(loc[0]) if loc else "")


def _validation_problems(exc: RequestValidationError) -> tuple[int, str, list[tuple[str, str]]]:
    problems: list[tuple[str, str]] = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return 400, "the request body is not valid JSON", []
        field = _loc_to_field(err.get("loc", ()))
        kind = err.get("type")
        if kind == "extra_forbidden":
            msg = "unknown field"
        elif kind == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == ID_PATTERN:
            msg = ID_RULE
        elif kind == "string_unicode":  # pydantic-core's own refusal of a lone surrogate
            msg = UNICODE_RULE
        else:
            msg = str(err.get("msg"))
        given = err.get("input")
        if err.get("type") not in ("missing", "extra_forbidden") and _short(given):
            msg += f" (got {_short(given)})"
        problems.append((field, msg))
    fields = ", ".join(sorted({f for f, _ in problems if f})) or "the request"
    return 422, f"invalid request: {fields}", problems


def _short(value: Any) -> str:
    # Echo scalar inputs (bounded) so the client sees what was refused; never whole objects.
    if isinstance(value, (str, int, float, bool)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 80 else text[:77] + "..."
    return ""


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(
            request,
            exc.status,
            exc.detail,
            code=exc.code,
            problems=exc.problems,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail, problems = _validation_problems(exc)
        return error_response(request, status, detail, problems=problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            detail = "no such route"
        return error_response(
            request, exc.status_code, detail, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(StratamemError)
    async def _engine(request: Request, exc: StratamemError) -> JSONResponse:
        if isinstance(exc, ValidationError):
            problems = [_split_problem(p) for p in exc.problems]
            fields = ", ".join(sorted({f for f, _ in problems if f})) or "the request"
            return error_response(request, 422, f"invalid request: {fields}", problems=problems)
        if isinstance(exc, NotFoundError):
            return error_response(request, 404, str(exc))
        if isinstance(exc, ConflictError):
            return error_response(request, 409, str(exc))
        if isinstance(exc, (ProcessingError, EmbeddingError, StoreError)):
            # Stored messages stay stored; the client may retry (idempotently with ids).
            log.warning("request %s: %s: %s", _request_id(request), type(exc).__name__, exc)
            return error_response(request, 503, str(exc).splitlines()[0])
        log.error("request %s failed: %s: %s", _request_id(request), type(exc).__name__, exc)
        return error_response(
            request,
            500,
            f"internal error (request id {_request_id(request)})",
        )

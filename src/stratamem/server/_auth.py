"""Who is calling: an API key names a project, and every /api route acts in that project.

``Authorization: Api-Key <key>`` (GUMem's form) or ``Bearer <key>``. The key is checked by
the engine (``mem.keys.verify``: stored hashed, revoked keys refused); the request then runs
on ``mem.for_project(key.project_id)``, a view that can only see that project's rows, so an
id of another project is simply not found. The /admin API takes the admin token instead.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader

from ..memory import Memory
from ..types import ApiKey
from ._errors import ApiError
from ._throttle import Throttle, client_address

__all__ = ["Admin", "Caller", "CallerDep", "authenticate", "require_admin", "throttle_of"]

# Declared as a security scheme so the OpenAPI document says how to authenticate.
_AUTH_HEADER = APIKeyHeader(
    name="Authorization",
    auto_error=False,
    scheme_name="ApiKey",
    description="`Api-Key <key>` or `Bearer <key>`; keys are created by `stratamem serve` "
    "on first start, `stratamem keys create`, or the admin API.",
)

_SCHEMES = ("api-key", "bearer")
_CHALLENGE = {"WWW-Authenticate": 'Api-Key realm="stratamem", Bearer realm="stratamem"'}


def _secret(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() not in _SCHEMES or not value or " " in value:
        return None
    return value


@dataclass(frozen=True)
class Caller:
    """The authenticated project: the Memory view to act on and the key that opened it."""

    memory: Memory
    key: ApiKey

    @property
    def project_id(self) -> str:
        return self.key.project_id

    @property
    def actor(self) -> str:
        # Audit records name the key by id (stable even if keys share a name).
        return f"api_key:{self.key.id}"


def authenticate(
    memory: Memory, authorization: str | None, *, throttle: Throttle, address: str
) -> Caller:
    """The caller an ``Authorization`` header names (``ApiError`` 401 if none, 429 while
    ``address`` is held back for its wrong keys): the REST routes' dependency, the MCP
    endpoint and the proxy's key check all ask this."""
    secret = _secret(authorization)
    if secret is None:
        raise ApiError(
            401,
            "missing or malformed Authorization header; send `Api-Key <key>` or `Bearer <key>`",
            headers=_CHALLENGE,
        )
    throttle.check("api_key", address)
    key = memory.keys.verify(secret)
    if key is None:
        throttle.failed("api_key", address)
        # One answer for unknown, revoked and malformed keys: nothing to probe.
        raise ApiError(401, "invalid or revoked API key", headers=_CHALLENGE)
    return Caller(memory=memory.for_project(key.project_id), key=key)


def throttle_of(request: Request) -> Throttle:
    """The app's limiter of failed credentials (``create_app`` makes it)."""
    throttle: Throttle = request.app.state.throttle
    return throttle


def _caller(
    request: Request, authorization: Annotated[str | None, Depends(_AUTH_HEADER)]
) -> Caller:
    caller = authenticate(
        request.app.state.memory,
        authorization,
        throttle=throttle_of(request),
        address=client_address(request),
    )
    request.state.project_id = caller.project_id
    return caller


CallerDep = Annotated[Caller, Depends(_caller)]


def require_admin(
    request: Request, authorization: Annotated[str | None, Depends(_AUTH_HEADER)]
) -> None:
    expected = request.app.state.settings.admin_token
    if expected is None:
        raise ApiError(403, "the admin API is disabled; set STRATAMEM_ADMIN_TOKEN to enable it")
    given = _secret(authorization)
    if given is None:
        raise ApiError(401, "invalid admin token", headers=_CHALLENGE)
    throttle, address = throttle_of(request), client_address(request)
    throttle.check("admin_token", address)
    if not hmac.compare_digest(given.encode(), expected.get_secret_value().encode()):
        throttle.failed("admin_token", address)
        raise ApiError(401, "invalid admin token", headers=_CHALLENGE)


Admin = Depends(require_admin)

"""``GET /healthz``: the process is up and its store answers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Request

from ._errors import ApiError
from ._models import Envelope, ErrorEnvelope, Health

router = APIRouter(tags=["health"])

try:
    _VERSION = version("stratamem")
except PackageNotFoundError:  # running from a source tree that is not installed
    _VERSION = "unknown"


@router.get(
    "/healthz",
    summary="Health check",
    description="No authentication. 200 when the store answers, 503 when it does not.",
    response_model=Envelope[Health],
    responses={503: {"model": ErrorEnvelope, "description": "The store does not answer."}},
)
def healthz(request: Request) -> Envelope[Health]:
    try:
        request.app.state.memory.store.schema_version()
    except Exception as exc:
        raise ApiError(503, "the store does not answer") from exc
    return Envelope(data=Health(version=_VERSION))

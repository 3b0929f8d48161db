"""The audit log: every status change, forget and erasure, by whom and why."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ._render import render
from ._signin import Viewer
from ._users import PAGE, page_of
from ._view import Form, endpoint

__all__ = ["routes"]


def _audit(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = request.query_params.get("user_id", "").strip() or None
    page = page_of(request)
    records = memory.audit(
        user_id=user_id, limit=PAGE + 1, offset=(page - 1) * PAGE, newest_first=True
    )
    return render(
        request,
        "audit.html",
        viewer=viewer,
        records=records[:PAGE],
        more=len(records) > PAGE,
        page=page,
        user_id=user_id or "",
    )


routes = [Route("/audit", endpoint(_audit), methods=["GET"])]

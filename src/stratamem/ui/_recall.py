"""Recall, explained: a query's hits in every layer with their scores and signals, the exact
``formatted_context`` a model would receive, and the log of what recent requests got."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ValidationError
from ..types import Hit, SearchLayer
from ._render import render
from ._signin import Viewer
from ._users import PAGE, page_of
from ._view import Form, endpoint

__all__ = ["routes"]

_LAYERS: tuple[SearchLayer, ...] = ("summary", "fact", "message")
_HITS_PER_LAYER = 10


def _recall(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    params = request.query_params
    user_id = params.get("user_id", "").strip()
    query = params.get("query", "").strip()
    session_id = params.get("session_id", "").strip()
    context: dict[str, Any] = {
        "user_id": user_id,
        "query": query,
        "session_id": session_id,
        "sessions": [],
        "ran": False,
    }
    if user_id:
        sessions = memory.sessions.list(user_id=user_id, limit=1000)
        context["sessions"] = sessions
        if query:
            if not sessions:
                raise ValidationError(f"user {user_id!r} has no session to recall for")
            if not session_id:
                session_id = max(sessions, key=lambda s: s.updated_at).id
                context["session_id"] = session_id
            started = time.perf_counter()
            memory_context = memory.get_memory(session_id, query, details=True)
            elapsed_ms = (time.perf_counter() - started) * 1000
            hits: dict[str, list[Hit]] = {
                layer: memory.search(query, user_id=user_id, limit=_HITS_PER_LAYER, layers=[layer])
                for layer in _LAYERS
            }
            context.update(
                ran=True, ctx=memory_context, hits=hits, elapsed_ms=elapsed_ms, layers=_LAYERS
            )
    return render(request, "recall.html", viewer=viewer, **context)


def _log(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = request.query_params.get("user_id", "").strip() or None
    page = page_of(request)
    records = memory.recall_log.list(user_id=user_id, limit=PAGE + 1, offset=(page - 1) * PAGE)
    return render(
        request,
        "recall_log.html",
        viewer=viewer,
        records=records[:PAGE],
        more=len(records) > PAGE,
        page=page,
        user_id=user_id or "",
        enabled=memory.settings.recall_log,
        keep=memory.settings.recall_log_max_entries,
        hours=memory.settings.recall_log_retention_hours,
    )


routes = [
    Route("/recall", endpoint(_recall), methods=["GET"]),
    Route("/recall/log", endpoint(_log), methods=["GET"]),
]

"""Users: the list with search and paging, and one user's memory along its layers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._strings import shown
from ..errors import ValidationError
from ..types import Summary
from ._render import render
from ._signin import Viewer
from ._view import Form, confirm, endpoint, see_other

__all__ = ["page_of", "routes"]

PAGE = 50
# A user's summaries are shown in full on their page: a LoCoMo-sized user has a few
# hundred. Past this many the page lists the first ones and says so.
_SUMMARIES_SHOWN = 2000
_SHOWN_STATUSES = ("active", "deprioritized", "archived", "superseded")
_TABS = ("memory", "facts", "messages", "sessions")


def page_of(request: Request) -> int:
    raw = request.query_params.get("page", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= 100_000:
        raise ValidationError(f"page: expected a number from 1 (got {shown(raw)})")
    return int(raw)


def _users(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    search = request.query_params.get("q", "").strip()[:200] or None
    page = page_of(request)
    total = memory.users.count(search=search)
    users = memory.users.list(search=search, limit=PAGE, offset=(page - 1) * PAGE)
    return render(
        request,
        "users.html",
        viewer=viewer,
        users=users,
        total=total,
        search=search or "",
        page=page,
        pages=max(1, -(-total // PAGE)),
    )


def _by_topic(
    topics: Sequence[Any], summaries: Sequence[Summary]
) -> tuple[list[tuple[Any, list[Summary]]], list[Summary]]:
    """Current summaries under their topics, and those filed under none. A topic none of
    whose summaries is current (all deleted or archived, say) is left out: an empty
    heading says nothing (the archived ones are listed apart)."""
    by_id = {s.id: s for s in summaries}
    filed: set[str] = set()
    grouped = []
    for topic in topics:
        items = [by_id[i] for i in topic.summary_ids if i in by_id]
        filed.update(s.id for s in items)
        if items:
            grouped.append((topic, items))
    return grouped, [s for s in summaries if s.id not in filed]


def _duplicates(summaries: Sequence[Summary]) -> list[list[Summary]]:
    """Current summaries that say the same thing (same words, case and spacing aside)."""
    by_text: dict[str, list[Summary]] = {}
    for s in summaries:
        by_text.setdefault(" ".join(s.text.casefold().split()), []).append(s)
    return [group for group in by_text.values() if len(group) > 1]


def _stale(summaries: Sequence[Summary]) -> list[Summary]:
    """Current summaries whose validity ended: still recalled, but no longer true."""
    now = datetime.now(timezone.utc)
    return [s for s in summaries if s.valid_to is not None and s.valid_to < now]


def _user(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = request.path_params["user_id"]
    tab = request.query_params.get("tab", "memory")
    if tab not in _TABS:
        tab = "memory"
    page = page_of(request)
    offset = (page - 1) * PAGE
    sessions = memory.sessions.list(user_id=user_id, limit=1000)
    context: dict[str, Any] = {"tab": tab, "page": page, "user_id": user_id, "sessions": sessions}
    if tab == "memory":
        summaries = memory.summaries.list(
            user_id=user_id, status=_SHOWN_STATUSES, limit=_SUMMARIES_SHOWN
        )
        current = [s for s in summaries if s.status in ("active", "deprioritized")]
        grouped, unfiled = _by_topic(memory.topics.list(user_id=user_id), current)
        context.update(
            standing=memory.users.standing(user_id),
            grouped=grouped,
            unfiled=unfiled,
            duplicates=_duplicates(current),
            stale=_stale(current),
            retired=[s for s in summaries if s.status not in ("active", "deprioritized")],
            truncated=len(summaries) >= _SUMMARIES_SHOWN,
        )
    elif tab == "facts":
        context["facts"] = memory.facts.list(user_id=user_id, limit=PAGE + 1, offset=offset)
    elif tab == "messages":
        context["messages"] = memory.messages.list(user_id=user_id, limit=PAGE + 1, offset=offset)
    empty_memory = tab == "memory" and not (
        context["grouped"] or context["retired"] or context["standing"]
    )
    if not sessions and empty_memory:
        context["empty"] = True
    return render(request, "user.html", viewer=viewer, **context)


def _export(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = request.path_params["user_id"]
    asked = confirm(
        request,
        viewer,
        form,
        title=f"Export {user_id}",
        consequence="A JSON file with everything stored about this user (every layer, with "
        "provenance) will be downloaded. It holds personal data: keep it safe.",
        fields=(),
        cancel=f"/users/{_quoted(user_id)}",
        danger=False,
    )
    if asked is not None:
        return asked
    data = memory.export_user(user_id)
    filename = "".join(c if c.isalnum() or c in "-_." else "_" for c in user_id)[:80]
    return Response(
        json.dumps(data, indent=2, default=str, ensure_ascii=False),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="stratamem-{filename}.json"'},
    )


def _erase(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = request.path_params["user_id"]
    asked = confirm(
        request,
        viewer,
        form,
        title=f"Erase {user_id}",
        consequence="Every session, message, fact, summary and topic of this user is removed, "
        "with its index entries. This cannot be undone. The audit log keeps who erased the "
        "user and why, never the content.",
        fields=("reason",),
        cancel=f"/users/{_quoted(user_id)}",
    )
    if asked is not None:
        return asked
    memory.erase_user(user_id, reason=form.get("reason") or None, actor=viewer.actor)
    return see_other(request, "/users", done="erased")


def _forget(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    user_id = request.path_params["user_id"]
    scope = {k: form[k] for k in ("session_id", "topic_id", "message_id") if form.get(k)}
    what = ", ".join(f"{k.removesuffix('_id')} {v}" for k, v in scope.items())
    asked = confirm(
        request,
        viewer,
        form,
        title=f"Forget {what or 'nothing'}",
        consequence="Deletion works from provenance upward: the messages go, facts drawn only "
        "from them go, summaries left without evidence go. Nothing forgotten is recalled "
        "again. This cannot be undone.",
        fields=("session_id", "topic_id", "message_id", "reason"),
        cancel=f"/users/{_quoted(user_id)}",
    )
    if asked is not None:
        return asked
    message_id = scope.pop("message_id", None)
    counts = memory.forget(
        user_id=user_id,
        message_ids=[message_id] if message_id else None,
        reason=form.get("reason") or None,
        actor=viewer.actor,
        **scope,
    )
    return see_other(
        request, f"/users/{_quoted(user_id)}", done=f"forgotten:{sum(counts.values())}"
    )


def _quoted(user_id: str) -> str:
    return quote(user_id, safe="")


UID = "/users/{user_id:path}"

routes = [
    Route("/users", endpoint(_users), methods=["GET"]),
    Route(UID + "/export", endpoint(_export, post=True), methods=["POST"]),
    Route(UID + "/erase", endpoint(_erase, post=True), methods=["POST"]),
    Route(UID + "/forget", endpoint(_forget, post=True), methods=["POST"]),
    Route(UID, endpoint(_user), methods=["GET"]),
]

"""One item of any layer with its provenance both ways, and a summary's history and status.

Down a layer is what an item came from (a summary's facts and messages); up is what was
made of it (a message's facts, the summaries citing them, their topics). Every linked item
is a link to its own page, so provenance can be followed from a topic to the words said
and back.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._vocabulary import SummaryStatus
from ._render import render
from ._signin import Viewer
from ._view import Form, confirm, endpoint, error_page, see_other

__all__ = ["routes"]

# What an operator may set; "superseded" is the pipeline's, set by a correction.
_SETTABLE: tuple[SummaryStatus, ...] = ("active", "deprioritized", "archived", "deleted")


def _item(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    item_id = request.path_params["item_id"]
    provenance = memory.provenance(item_id)
    history, replaces = [], []
    if provenance.kind == "summary":
        history = memory.summaries.history(item_id)
        # What a correction superseded points here: the older summaries this one replaced.
        replaces = [
            s
            for s in memory.summaries.list(
                user_id=provenance.item.user_id, status="superseded", limit=1000
            )
            if s.superseded_by == item_id
        ]
    return render(
        request,
        "item.html",
        viewer=viewer,
        p=provenance,
        item=provenance.item,
        history=history,
        replaces=replaces,
        settable=_SETTABLE,
    )


def _set_status(request: Request, viewer: Viewer, form: Form) -> Response:
    memory = viewer.project
    summary_id = request.path_params["item_id"]
    status, reason = form.get("status", ""), form.get("reason", "").strip()
    here = f"/items/{quote(summary_id, safe='')}"
    if status not in _SETTABLE:
        return error_page(request, viewer, 400, f"status: expected one of {', '.join(_SETTABLE)}")
    if not reason:
        return error_page(request, viewer, 400, "reason: say why the status changes (audited)")
    asked = confirm(
        request,
        viewer,
        form,
        title=f"Set this summary to {status!r}",
        consequence={
            "active": "It is recalled at full weight again.",
            "deprioritized": "It is still recalled, at half weight.",
            "archived": "It is kept but never recalled.",
            "deleted": "It is removed from every recall path.",
        }.get(status, "")
        + " The change, your reason and who made it are kept in its history.",
        fields=("status", "reason"),
        cancel=here,
        danger=status == "deleted",
    )
    if asked is not None:
        return asked
    memory.set_status(summary_id, status, reason=reason, actor=viewer.actor)
    return see_other(request, here, done="status")


routes = [
    Route("/items/{item_id:path}/status", endpoint(_set_status, post=True), methods=["POST"]),
    Route("/items/{item_id:path}", endpoint(_item), methods=["GET"]),
]

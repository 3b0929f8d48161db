"""Governance and deletion: status changes, forgetting by scope, export, erasure, audit.

Every change records the calling key as its actor (``api_key:<key id>``) with the reason
given, so the audit log says who did what and why.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from .._queries import ForgetScope
from ..types import AuditRecord, Summary
from ._auth import CallerDep
from ._common import API_ERRORS, Limit, Offset, listed
from ._models import Envelope, Page, SummaryStatusChange

router = APIRouter(prefix="/api", tags=["governance"], responses=API_ERRORS)


@router.patch(
    "/summaries/{summary_id:path}",
    summary="Change a summary's status",
    description="`active`, `deprioritized` (recalled at half weight), `archived` (kept, "
    "never recalled) or `deleted` (removed from every recall path). The change, its reason "
    "and the calling key are audited and kept in the summary's history.",
    response_model=Envelope[Summary],
)
def set_summary_status(
    summary_id: str, body: SummaryStatusChange, caller: CallerDep
) -> Envelope[Summary]:
    summary = caller.memory.set_status(
        summary_id, body.status, reason=body.reason, actor=caller.actor
    )
    return Envelope(data=summary)


@router.post(
    "/forget",
    summary="Forget by scope",
    description="Forget a user's `message_ids`, a `session_id`, or a `topic_id` (exactly "
    "one). Deletion works from provenance upward: the messages go, facts drawn only from "
    "them go, summaries left without evidence go, so nothing forgotten is recalled again. "
    "Returns the counts removed per layer.",
    response_model=Envelope[dict[str, int]],
)
def forget(body: ForgetScope, caller: CallerDep) -> Envelope[dict[str, int]]:
    # The scope is checked by the model (exactly one, naming all three fields if not).
    counts = caller.memory.forget(actor=caller.actor, **body.arguments())
    return Envelope(data=counts)


@router.get(
    "/users/{user_id:path}/export",
    summary="Export a user's memory",
    description="Everything stored about the user, every layer with provenance, as JSON.",
    response_model=Envelope[dict[str, Any]],
)
def export_user(user_id: str, caller: CallerDep) -> Envelope[dict[str, Any]]:
    return Envelope(data=caller.memory.export_user(user_id))


@router.delete(
    "/users/{user_id:path}",
    summary="Erase a user",
    description="Remove the user's sessions, messages, facts, summaries, topics and their "
    "index entries. The audit log keeps who erased the user, when and why (never the "
    "content). Returns the counts removed.",
    response_model=Envelope[dict[str, int]],
)
def erase_user(
    user_id: str,
    caller: CallerDep,
    reason: Annotated[str | None, Query(max_length=2000, description="Why (audited).")] = None,
) -> Envelope[dict[str, int]]:
    counts = caller.memory.erase_user(user_id, actor=caller.actor, reason=reason)
    return Envelope(data=counts)


@router.get(
    "/audit",
    summary="Audit log",
    description="Governance and deletion records of the project (or of one user), oldest "
    "first (newest first with `newest_first=true`): action, target, actor (`api_key:<key "
    "id>` for changes made over this API), reason, details (counts, old and new status), "
    "time. Never the content.",
    response_model=Envelope[Page[AuditRecord]],
)
def audit(
    caller: CallerDep,
    limit: Limit = 100,
    offset: Offset = 0,
    user_id: Annotated[str | None, Query(description="Only this user's records.")] = None,
    newest_first: Annotated[bool, Query(description="Newest records first.")] = False,
) -> Envelope[Page[AuditRecord]]:
    return listed(caller.memory.audit, limit, offset, user_id=user_id, newest_first=newest_first)

"""Accepting messages: validate a call's messages whole, store them with their job in one
transaction, and (``sync=True``) wait until they are processed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from ._checks import check_id, check_metadata, new_id, pydantic_problems
from ._engine import Engine
from ._speakers import speaker_of, without_speaker
from ._time import now_iso, to_iso, utcnow
from .config import Settings
from .errors import NotFoundError, ProcessingError, ValidationError
from .pipeline import is_small_talk
from .store import AddOutcome, MessageRow, SessionRow
from .types import AddResult, MessageInput

__all__ = ["add_captured", "add_messages"]


def _content_hash(session_id: str, m: MessageInput) -> str:
    fields = [session_id, m.role, m.content, m.event_type, m.page]
    if m.name is not None:  # appended only when set, so hashes of unnamed messages stay stable
        fields.append(m.name)
    key = json.dumps(fields, ensure_ascii=False)
    return hashlib.sha256(key.encode()).hexdigest()


def _validate_messages(
    settings: Settings, session_id: str, messages: Any
) -> list[tuple[MessageInput, str]]:
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        raise ValidationError("invalid messages", ["messages: expected a list of message objects"])
    if not messages:
        raise ValidationError("invalid messages", ["messages: the list is empty"])
    limit = settings.max_messages_per_call
    if len(messages) > limit:
        raise ValidationError(
            "too many messages",
            [f"messages: {len(messages)} in one call; the limit is {limit} (send batches)"],
        )
    problems: list[str] = []
    parsed: list[MessageInput] = []
    for i, raw in enumerate(messages):
        try:
            m = raw if isinstance(raw, MessageInput) else MessageInput.model_validate(raw)
        except PydanticValidationError as exc:
            problems.extend(pydantic_problems(exc, f"messages[{i}]"))
            continue
        if len(m.content) > settings.max_content_chars:
            problems.append(
                f"messages[{i}].content: {len(m.content)} characters; the limit is "
                f"{settings.max_content_chars}"
            )
        try:
            check_metadata(
                m.metadata, f"messages[{i}].metadata", max_bytes=settings.max_metadata_bytes
            )
        except ValidationError as exc:
            problems.extend(exc.problems)
        parsed.append(m)
    seen: dict[str, int] = {}
    for i, m in enumerate(parsed):
        if m.id is not None:
            if m.id in seen:
                problems.append(f"messages[{i}].id: {m.id!r} repeats messages[{seen[m.id]}]")
            seen.setdefault(m.id, i)
    if problems:
        raise ValidationError("invalid messages; nothing was stored", problems)
    return [(m, _content_hash(session_id, m)) for m in parsed]


def _speaker(m: MessageInput) -> str | None:
    """The name sent, else the speaker a user turn's content starts with ("Caroline: ..."):
    stored as the name, so that recall, the write path and the context see the speaker of
    a transcript's turn as they see a named one (see ``_speakers``)."""
    # Only the user's turns, where transcripts and group chats are sent: an assistant's turn
    # is the assistant speaking ("Case Study: ..." there is a heading; on LongMemEval's
    # assistant turns most labels are), a tool's or system message's "Cluster State: ..."
    # output or configuration.
    if m.name is not None or m.event_type or m.role != "user":
        return m.name
    return speaker_of(m.content)


def _small_talk(m: MessageInput, speaker: str | None) -> bool:
    """Whether a conversation turn is small talk as a whole (events are not turns); a
    speaker label written into the content is not part of what was said."""
    if m.event_type:
        return False
    return is_small_talk(without_speaker(m.content, speaker))


def _asks(m: MessageInput) -> bool:
    """Whether a conversation turn asks something: its text ends with a question mark.
    Judged once here rather than read from the text by every search (on PostgreSQL a long
    turn's text is stored out of line and would be fetched whole)."""
    return not m.event_type and m.content.rstrip().endswith(("?", "\uff1f"))


def add_messages(
    engine: Engine, project_id: str, session_id: str, messages: Any, *, sync: bool
) -> AddResult:
    """``Memory.add_messages`` in ``project_id``, once the Memory is known to be open."""
    check_id(session_id, "session_id")
    validated = _validate_messages(engine.settings, session_id, messages)
    store = engine.store
    session = store.get_session(project_id, session_id)
    if session is None:
        raise NotFoundError(f"no session {session_id!r}; create it with mem.sessions.create")
    outcome = store.add_messages(project_id, session, _rows(session, validated))
    return _accepted(engine, project_id, session.id, outcome, sync=sync)


def add_captured(
    engine: Engine,
    project_id: str,
    user_id: str,
    session_id: str,
    messages: Any,
    *,
    began_at: float,
) -> AddResult | None:
    """A captured exchange's messages into ``user_id``'s session (created if new), in one
    transaction; None (nothing stored) if the exchange began (``began_at``, epoch seconds)
    before the user was last erased, by any process (store/_core/erasures.py)."""
    check_id(user_id, "user_id")
    check_id(session_id, "session_id")
    validated = _validate_messages(engine.settings, session_id, messages)
    now = now_iso()
    session = SessionRow(project_id, session_id, user_id, None, {}, now, now)
    outcome = engine.store.add_captured(session, _rows(session, validated), began_at=began_at)
    if outcome is None:
        return None
    return _accepted(engine, project_id, session_id, outcome, sync=False)


def _rows(session: SessionRow, validated: list[tuple[MessageInput, str]]) -> list[MessageRow]:
    """The rows of validated messages in ``session``."""
    now = utcnow()
    created = to_iso(now)
    speakers = [_speaker(m) for m, _ in validated]
    return [
        MessageRow(
            project_id=session.project_id,
            id=m.id or new_id("m"),
            user_id=session.user_id,
            session_id=session.id,
            role=m.role,
            content=m.content,
            content_hash=digest,
            ts=to_iso(m.timestamp or now),
            created_at=created,
            process_id=m.process_id,
            event_type=m.event_type,
            page=m.page,
            name=speaker,
            metadata=m.metadata,
            small_talk=_small_talk(m, speaker),
            asks=_asks(m),
        )
        for (m, digest), speaker in zip(validated, speakers, strict=True)
    ]


def _accepted(
    engine: Engine, project_id: str, session_id: str, outcome: AddOutcome, *, sync: bool
) -> AddResult:
    """What a stored call returns: its job queued (and with ``sync``, processed)."""
    result = AddResult(
        session_id=session_id,
        message_ids=outcome.message_ids,
        duplicates=outcome.duplicates,
        job_id=outcome.job_id,
    )
    if outcome.job_id is not None:
        engine.track_job(outcome.job_id)
        engine.queue.notify()
    if sync:
        _wait_processed(engine, project_id, result)
    return result


def _wait_processed(engine: Engine, project_id: str, result: AddResult) -> None:
    store, settings = engine.store, engine.settings
    ids = [] if result.job_id is None else [result.job_id]
    # Duplicates may still be in flight from the first send: wait for those too.
    if result.duplicates:
        for mid in result.duplicates:
            row = store.get_message(project_id, mid)
            if row is not None and row.job_id is not None:
                ids.append(row.job_id)
    states = engine.queue.wait_jobs(ids, settings.sync_timeout_seconds)
    engine.forget_jobs(ids)
    failed = [j for j, s in states.items() if s == "failed"]
    if failed:
        errors = [
            m.error
            for m in store.list_messages(
                project_id,
                session_id=result.session_id,
                status="failed",
                limit=5,
                newest_first=True,
            )
            if m.error
        ]
        raise ProcessingError(
            f"processing failed for good after {settings.job_max_attempts} attempts "
            f"({errors[0] if errors else 'see message errors'}); the messages are "
            "stored with status 'failed' and can be retried with Memory.retry_failed()"
        )
    result.processed = True

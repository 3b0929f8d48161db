"""What each MCP tool does, over any memory (``MemoryAPI``) and one user.

No MCP here: the tools are plain methods that take the tool's arguments and return
JSON-ready data, so they are tested and read without a protocol in between. The user is
fixed when a ``MemoryTools`` is made (by the connection) and every item read by id is
checked to be that user's: another user's memory in the same project is "not found",
exactly like an id that does not exist. Arguments are checked by the memory itself (its
query models, the REST API's), whose ``ValidationError`` the server turns into a tool error.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import Field

from .. import _metrics
from .._checks import MAX_OFFSET, MAX_PAGE, check_id, check_paging
from .._queries import SummaryQuery
from ..api import MemoryAPI
from ..errors import NotFoundError, ValidationError
from ..memory import Memory
from ..types import CORRECTS, NOTE_EVENT, Fact, Hit, Message, Summary, Topic

__all__ = ["MemoryTools", "ToolRefused"]

SOURCES_PER_HIT = 3  # source messages shown with each search hit
PROVENANCE_LIMIT = 20  # facts and messages shown with one memory
_LEARNED_SEARCH = 20  # hits searched for what a new note produced
_PAGE = 500  # summaries read per listing call


# The tools' parameters as the model sees them (the MCP server publishes these descriptions).
Text = Annotated[str, Field(description="What to remember: one or a few sentences.")]
SessionId = Annotated[
    str | None,
    Field(description="The conversation it belongs to (default: the user's memory session)."),
]
Metadata = Annotated[
    dict[str, Any] | None,
    Field(description='Labels kept with it, usable as search filters, e.g. {"source": "chat"}.'),
]
Wait = Annotated[
    bool, Field(description="Wait until it is processed and return what was learned (slower).")
]
Query = Annotated[str, Field(description="What to look for, in plain words.")]
Limit = Annotated[int, Field(description=f"How many results, 1 to {MAX_PAGE}.")]
Since = Annotated[
    str | None, Field(description="Only memories from this time on (ISO 8601, e.g. 2026-05-01).")
]
Until = Annotated[str | None, Field(description="Only memories before this time (ISO 8601).")]
Layer = Annotated[
    Literal["summary", "fact", "message"] | None,
    Field(description="Only this layer (default: all three, ranked together)."),
]
Superseded = Annotated[bool, Field(description="Also return memories corrected since.")]
MemoryId = Annotated[
    str,
    Field(
        description="A memory's id: s_... (summary), f_... (fact), t_... (topic) or a message id."
    ),
]
SummaryId = Annotated[
    str,
    Field(
        description="The id of the summary to correct (s_...), as search_memories, "
        "list_memories and get_memory return it. Only summaries are corrected: facts and "
        "messages are the evidence they were drawn from, never edited."
    ),
]
Status = Annotated[
    Literal["active", "deprioritized", "archived", "deleted", "superseded"],
    Field(description="Which memories: the current (active) ones, or those set aside."),
]
TopicId = Annotated[str | None, Field(description="Only this topic's memories (t_...).")]
PageSize = Annotated[int, Field(description=f"Memories per page, 1 to {MAX_PAGE}.")]
Offset = Annotated[
    int,
    Field(description=f"Where the page starts (next_offset of the last one), 0 to {MAX_OFFSET}."),
]
Reason = Annotated[str | None, Field(description="Why, kept in the audit log.")]
Correction = Annotated[str, Field(description="The corrected statement, as a sentence.")]
ForgetSession = Annotated[str | None, Field(description="Forget this conversation.")]
ForgetTopic = Annotated[str | None, Field(description="Forget this topic (t_...).")]


class ToolRefused(ValueError):
    """A tool call that cannot be carried out as asked; its text is for the model to read."""


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _message(m: Message, *, limit: int | None = None) -> dict[str, Any]:
    content = m.content if limit is None or len(m.content) <= limit else m.content[:limit] + "…"
    return {
        "id": m.id,
        "layer": "message",
        "role": m.role,
        "content": content,
        "date": _when(m.timestamp),
        "session_id": m.session_id,
        "event_type": m.event_type,
    }


def _fact(f: Fact) -> dict[str, Any]:
    return {
        "id": f.id,
        "layer": "fact",
        "text": f.text,
        "kind": f.kind,
        "status": f.status,
        "date": _when(f.occurred_at or f.observed_at or f.created_at),
        "superseded_by": f.superseded_by,
        "message_ids": f.message_ids,
    }


def _summary(s: Summary) -> dict[str, Any]:
    return {
        "id": s.id,
        "layer": "summary",
        "text": s.text,
        "status": s.status,
        "date": _when(s.valid_from or s.observed_at or s.created_at),
        "valid_to": _when(s.valid_to),
        "confidence": s.confidence,
        "version": s.version,
        "superseded_by": s.superseded_by,
        "fact_ids": s.fact_ids,
        "message_ids": s.message_ids,
    }


def _topic(t: Topic) -> dict[str, Any]:
    return {
        "id": t.id,
        "layer": "topic",
        "name": t.name,
        "description": t.description,
        "memories": len(t.summary_ids),
    }


def default_session(user_id: str) -> str:
    """The session a user's notes go to when the tool call names none."""
    session = f"mcp-{user_id}"
    if len(session) <= 200:
        return session
    return "mcp-" + hashlib.sha256(user_id.encode()).hexdigest()[:40]


class MemoryTools:
    """The tools of one connection: ``memory`` (a project's) acting for ``user_id``."""

    def __init__(self, memory: MemoryAPI, user_id: str, *, actor: str = "mcp") -> None:
        self.memory = memory
        self.user_id = check_id(user_id, "user_id")
        # Who the audit log names for deletions; a server records its calling key itself.
        self.actor = actor

    # -- helpers -----------------------------------------------------------------------

    def _session(self, session_id: str | None) -> str:
        """The session to write to or recall in: the named one (created if new, refused if
        another user's) or the user's MCP session."""
        session = default_session(self.user_id) if session_id is None else session_id
        # create() returns an existing session of the same user and refuses another user's.
        return self.memory.sessions.create(self.user_id, session_id=session).id

    def _owned(self, item: Any, memory_id: str) -> Any:
        if getattr(item, "user_id", None) != self.user_id:
            raise NotFoundError(f"no memory {memory_id!r}")
        return item

    def _lookup(self, memory_id: str) -> Summary | Fact | Topic | Message:
        """The item an id names, of any layer, if it is this user's. Summaries, facts and
        topics have the engine's ids (``s_``, ``f_``, ``t_``); anything else is a message
        id, which callers may choose."""
        check_id(memory_id, "memory_id")
        getters = {
            "s_": self.memory.summaries.get,
            "f_": self.memory.facts.get,
            "t_": self.memory.topics.get,
        }
        get = getters.get(memory_id[:2], self.memory.messages.get)
        try:
            found = get(memory_id)
        except NotFoundError:  # one answer for "none" and "another user's"
            raise NotFoundError(f"no memory {memory_id!r}") from None
        item: Summary | Fact | Topic | Message = self._owned(found, memory_id)
        return item

    def _forget(self, **scope: Any) -> dict[str, int]:
        if isinstance(self.memory, Memory):
            return self.memory.forget(user_id=self.user_id, actor=self.actor, **scope)
        return self.memory.forget(user_id=self.user_id, **scope)

    def _messages(self, ids: Sequence[str], *, limit: int | None = None) -> list[dict[str, Any]]:
        out = []
        for mid in ids:
            try:
                message = self.memory.messages.get(mid)
            except NotFoundError:  # forgotten since: the item keeps the id, the text is gone
                continue
            if message.user_id == self.user_id:
                out.append(_message(message, limit=limit))
        return out

    # -- the tools ---------------------------------------------------------------------

    def add_memory(
        self,
        text: Text,
        session_id: SessionId = None,
        metadata: Metadata = None,
        wait: Wait = False,
    ) -> dict[str, Any]:
        session = self._session(session_id)
        note: dict[str, Any] = {"role": "user", "content": text, "event_type": NOTE_EVENT}
        if metadata is not None:
            note["metadata"] = metadata
        result = self.memory.add_messages(session, [note], sync=wait)
        out: dict[str, Any] = {
            "message_ids": result.message_ids,
            "session_id": result.session_id,
            "processed": result.processed,
        }
        if result.duplicates:
            out["duplicates"] = result.duplicates
        if wait:
            out["learned"] = self._learned(text, result.message_ids)
        return out

    def _learned(self, text: str, message_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The summaries and facts that cite the new message. The summaries are found by
        searching for the note's own words, which they were drawn from; their facts by
        their evidence (search shows a summary in place of the facts it covers)."""
        new = set(message_ids)
        hits = self.memory.search(
            text, user_id=self.user_id, layers=["summary"], limit=_LEARNED_SEARCH
        )
        summaries = [h for h in hits if new.intersection(h.message_ids)]
        facts: dict[str, str] = {}
        for summary in summaries:
            for fid in self.memory.summaries.get(summary.id).fact_ids:
                fact = self.memory.facts.get(fid)
                if new.intersection(fact.message_ids):
                    facts[fact.id] = fact.text
        return {
            "facts": [{"id": fid, "text": text} for fid, text in facts.items()],
            "summaries": [{"id": h.id, "text": h.text} for h in summaries],
        }

    def search_memories(
        self,
        query: Query,
        limit: Limit = 10,
        since: Since = None,
        until: Until = None,
        layer: Layer = None,
        include_superseded: Superseded = False,
    ) -> dict[str, Any]:
        start = time.perf_counter()
        hits = self.memory.search(
            query,
            user_id=self.user_id,
            limit=limit,
            since=since,
            until=until,
            layers=None if layer is None else [layer],
            include_superseded=include_superseded,
        )
        _metrics.recall("mcp", "injected" if hits else "none", time.perf_counter() - start)
        return {"results": [self._hit(h) for h in hits]}

    def _hit(self, h: Hit) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": h.id,
            "layer": h.layer,
            "text": h.text,
            "score": round(h.score, 4),
            "date": _when(h.timestamp),
            "session_id": h.session_id,
            "message_ids": h.message_ids,
            # Whether it still holds: "current", or history ("superseded": corrected or
            # replaced since; "expired": its validity ended), so the model does not state
            # an old value as today's.
            "status": "superseded" if h.superseded else "expired" if h.expired else "current",
        }
        if h.layer != "message":
            out["sources"] = self._messages(h.message_ids[:SOURCES_PER_HIT], limit=500)
        return out

    def get_context(self, query: Query, session_id: SessionId = None) -> dict[str, Any]:
        start = time.perf_counter()
        context = self.memory.get_memory(self._session(session_id), query)
        outcome = "injected" if context.formatted_context else "none"
        _metrics.recall("mcp", outcome, time.perf_counter() - start)
        return {
            "formatted_context": context.formatted_context,
            "token_estimate": context.token_estimate,
        }

    def list_memories(
        self,
        status: Status = "active",
        topic_id: TopicId = None,
        limit: PageSize = 50,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        # The REST API's page (the facade's listings take larger ones).
        check_paging(limit, offset, most=MAX_PAGE)
        fields = {"user_id": self.user_id, "status": status, "limit": limit, "offset": offset}
        q = SummaryQuery.build(fields, what="list_memories")
        if topic_id is None:
            topics = self.memory.topics.list(user_id=self.user_id)
            page = self.memory.summaries.list(
                user_id=self.user_id, status=q.status, limit=q.limit, offset=q.offset
            )
        else:
            topic = self._lookup(topic_id)
            if not isinstance(topic, Topic):
                raise ToolRefused(f"{topic_id!r} is not a topic id (list_topics gives them)")
            topics = [topic]
            members = [self.memory.summaries.get(sid) for sid in topic.summary_ids]
            chosen = [s for s in members if s.status in q.status]
            page = chosen[q.offset : q.offset + q.limit]
        filed: set[str] = set()
        grouped = []
        for t in topics:
            members_of = set(t.summary_ids)
            memories = [_summary(s) for s in page if s.id in members_of]
            if memories:
                grouped.append({"id": t.id, "name": t.name, "memories": memories})
                filed.update(m["id"] for m in memories)
        return {
            "topics": grouped,
            "unfiled": [_summary(s) for s in page if s.id not in filed],
            "offset": q.offset,
            "count": len(page),
            "next_offset": q.offset + len(page) if len(page) == q.limit else None,
        }

    def get_memory(self, memory_id: MemoryId) -> dict[str, Any]:
        item = self._lookup(memory_id)
        if isinstance(item, Summary):
            facts = []
            for fid in item.fact_ids[:PROVENANCE_LIMIT]:
                try:
                    facts.append(_fact(self.memory.facts.get(fid)))
                except NotFoundError:
                    continue
            topics = self.memory.topics.list(user_id=self.user_id)
            return {
                "memory": _summary(item),
                "topics": [_topic(t) for t in topics if item.id in t.summary_ids],
                "facts": facts,
                "messages": self._messages(item.message_ids[:PROVENANCE_LIMIT]),
                "history": self.memory.summaries.history(item.id),
            }
        if isinstance(item, Fact):
            return {
                "memory": _fact(item),
                "messages": self._messages(item.message_ids[:PROVENANCE_LIMIT]),
            }
        if isinstance(item, Topic):
            members = [self.memory.summaries.get(sid) for sid in item.summary_ids]
            return {"memory": _topic(item), "memories": [_summary(s) for s in members]}
        return {"memory": _message(item)}

    def update_memory(self, memory_id: SummaryId, text: Correction) -> dict[str, Any]:
        check_id(memory_id, "memory_id")
        # Refused by the id's form before any lookup, so the answer is the same whether or
        # not such an item exists (and whoever's it is).
        if not memory_id.startswith("s_"):
            raise ToolRefused(
                f"{memory_id!r} is not a summary id: update_memory corrects a summary (an "
                "s_... id from search_memories, list_memories or get_memory); facts and "
                "messages are the evidence summaries are drawn from and are never edited, so "
                "correct the summary that states it (search_memories with layer 'summary' "
                "finds it)"
            )
        old = cast(Summary, self._lookup(memory_id))  # an s_ id is a summary's (_lookup)
        if old.status not in ("active", "deprioritized"):  # what recall presents as current
            after = f" by {old.superseded_by}" if old.superseded_by else ""
            raise ToolRefused(f"memory {memory_id!r} is {old.status}{after}; correct a current one")
        correction = {
            "role": "user",
            "content": text,
            "event_type": NOTE_EVENT,
            "metadata": {CORRECTS: memory_id},
        }
        result = self.memory.add_messages(self._session(None), [correction], sync=True)
        now = self.memory.summaries.get(memory_id)
        if now.superseded_by is None:
            raise ToolRefused(
                f"the correction was stored (message {', '.join(result.message_ids)}) but no "
                f"memory could be drawn from it, so {memory_id!r} stays current: state the "
                "corrected fact as a sentence"
            )
        return {
            "corrected": _summary(now),
            "memory": _summary(self.memory.summaries.get(now.superseded_by)),
            "message_ids": result.message_ids,
        }

    def delete_memory(self, memory_id: MemoryId, reason: Reason = None) -> dict[str, Any]:
        item = self._lookup(memory_id)
        if isinstance(item, Topic):
            counts = self._forget(topic_id=item.id, reason=reason)
        else:
            ids = [item.id] if isinstance(item, Message) else item.message_ids
            if not ids:
                raise ToolRefused(f"memory {memory_id!r} cites no stored message to delete")
            counts = self._forget(message_ids=ids, reason=reason)
        return {"deleted": counts}

    def forget(
        self,
        session_id: ForgetSession = None,
        topic_id: ForgetTopic = None,
        reason: Reason = None,
    ) -> dict[str, Any]:
        if session_id is None and topic_id is None:
            raise ValidationError("invalid forget", ["give session_id or topic_id"])
        counts = self._forget(session_id=session_id, topic_id=topic_id, reason=reason)
        return {"deleted": counts}

    def list_topics(self) -> dict[str, Any]:
        return {"topics": [_topic(t) for t in self.memory.topics.list(user_id=self.user_id)]}

    def profile(self) -> str:
        """The user's current memory as Markdown: active summaries under their topics."""
        topics = self.memory.topics.list(user_id=self.user_id)
        active: list[Summary] = []
        while True:  # every page: a profile is the whole current memory
            page = self.memory.summaries.list(
                user_id=self.user_id, status="active", limit=_PAGE, offset=len(active)
            )
            active += page
            if len(page) < _PAGE:
                break
        by_id = {s.id: s for s in active}
        lines = [f"# Memory of {self.user_id}", ""]
        filed: set[str] = set()
        for t in topics:
            members = [by_id[sid] for sid in t.summary_ids if sid in by_id]
            if members:
                lines += [f"## {t.name}", *[_line(s) for s in members], ""]
                filed.update(s.id for s in members)
        rest = [s for s in active if s.id not in filed]
        if rest:
            lines += ["## Other", *[_line(s) for s in rest], ""]
        if not active:
            lines.append("Nothing remembered yet.")
        return "\n".join(lines).rstrip() + "\n"


def _line(s: Summary) -> str:
    when = s.valid_from or s.observed_at or s.created_at
    date = f"[{when.date().isoformat()}] " if when else ""
    return f"- {date}{s.text} ({s.id})"

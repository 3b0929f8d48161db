"""Public nouns of stratamem: what goes in, what is stored, what comes back (the memory
model: docs/architecture.md).

Input models (``MessageInput``) validate strictly and forbid unknown fields, so a typo is
an error rather than silently dropped data. Output models (``Message``, ``Hit``,
``MemoryContext`` ...) are plain data a caller can serialise with ``model_dump()``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any, Literal, Protocol

from pydantic import (
    AliasChoices,
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictStr,
    field_validator,
)
from pydantic.alias_generators import to_pascal

from ._strings import CheckedStrings
from ._time import Timestamp
from ._vocabulary import (
    AuditAction,
    DeliveryStatus,
    FactKind,
    ItemKind,
    MessageStatus,
    RecallOutcome,
    RecallSource,
    SummaryStatus,
    UiSessionKind,
    WebhookEvent,
    WebhookMode,
    WebhookResource,
)

__all__ = [
    "CORRECTS",
    "NOTE_EVENT",
    "ROLES",
    "ActivityBucket",
    "AddResult",
    "ApiKey",
    "AsyncSession",
    "AuditRecord",
    "DashboardSession",
    "DayUsage",
    "Fact",
    "Hit",
    "MemoryContext",
    "Message",
    "MessageInput",
    "MessageState",
    "ModelUsage",
    "ProcessingStatus",
    "Project",
    "Provenance",
    "RecallConfig",
    "RecallLatency",
    "RecallRecord",
    "Session",
    "Summary",
    "Topic",
    "Usage",
    "UserInfo",
    "Webhook",
    "WebhookDelivery",
]

Role = Literal["user", "assistant", "system", "tool"]
ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")
Layer = Literal["topic", "summary", "fact", "message"]
SearchLayer = Literal["summary", "fact", "message"]  # what search ranks (topics lead to these)

# A message with this ``event_type`` is a memory note: something to remember said outright
# (an agent's ``add_memory``), whose sentences the pipeline takes as facts as they stand,
# in the third person or the first. ``metadata[CORRECTS]`` on a note names the summary it
# corrects, which the note's summary then supersedes (docs/pipeline.md).
NOTE_EVENT = "memory"
CORRECTS = "corrects"


def event_key(event_type: str) -> str:
    """An event type as compared: lower case, spaces and dashes as underscores."""
    return re.sub(r"[\s\-]+", "_", event_type.strip().lower())


def is_note_event(event_type: str | None) -> bool:
    """Whether a message's ``event_type`` makes it a memory note (in any case or spacing)."""
    return event_type is not None and event_key(event_type) == NOTE_EVENT


# Identifiers appear in URLs, logs and SQL parameters: printable, no whitespace.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,199}$"
JsonObject = dict[str, Any]


class _Input(CheckedStrings):
    # Every string of an input (metadata keys and values too) is one the stores can hold.
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


class MessageInput(_Input):
    """One message as a caller sends it: a chat turn or a behaviour event.

    ``role`` and ``content`` are required; ``content`` must not be blank. ``id`` is
    optional; when given it makes resends idempotent (the same id with the same content
    is accepted once). A behaviour event (a search, a click, a tool call) sets
    ``event_type`` and usually ``page``.
    """

    id: StrictStr | None = Field(default=None, pattern=ID_PATTERN)
    role: Role
    content: StrictStr = Field(min_length=1)
    # ISO-8601 (naive = UTC) or epoch seconds; see Timestamp.
    timestamp: Timestamp | None = None
    event_type: StrictStr | None = Field(default=None, min_length=1, max_length=64)
    page: StrictStr | None = Field(default=None, max_length=2048)
    process_id: StrictStr | None = Field(default=None, pattern=ID_PATTERN)
    # The speaker's name, as in OpenAI's chat format: who said the turn when several
    # people talk ("Caroline"); recall matches it against names in the query.
    name: StrictStr | None = Field(default=None, min_length=1, max_length=64)
    metadata: JsonObject = Field(default_factory=dict)

    @field_validator("content")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


class Message(BaseModel):
    """A stored message (the raw layer). Never edited after it is accepted."""

    id: str
    project_id: str
    user_id: str
    session_id: str
    role: str
    content: str
    timestamp: datetime
    event_type: str | None = None
    page: str | None = None
    process_id: str | None = None
    name: str | None = None
    metadata: JsonObject = Field(default_factory=dict)
    status: MessageStatus = "pending"
    error: str | None = None
    attempts: int = 0
    created_at: datetime
    processed_at: datetime | None = None


class Fact(BaseModel):
    """A short, grounded statement extracted from messages (wire name: observation)."""

    id: str
    user_id: str
    text: str
    kind: FactKind = "fact"
    message_ids: list[str] = Field(default_factory=list)
    occurred_at: datetime | None = None
    observed_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    status: str = "active"
    superseded_by: str | None = None
    labels: list[str] = Field(default_factory=list)
    model: str | None = None
    prompt_version: str | None = None
    created_at: datetime | None = None
    # A standing instruction or preference: it holds for later requests in its scope
    # (what it applies to; None: every request). docs/recall.md#standing-instructions
    standing: bool = False
    scope: str | None = None


class Summary(BaseModel):
    """Long-term memory compressed from facts (wire name: proposition)."""

    id: str
    user_id: str
    text: str
    fact_ids: list[str] = Field(default_factory=list)
    message_ids: list[str] = Field(default_factory=list)
    status: SummaryStatus = "active"
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    labels: list[str] = Field(default_factory=list)
    version: int = 1
    superseded_by: str | None = None
    observed_at: datetime | None = None
    model: str | None = None
    prompt_version: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Topic(BaseModel):
    """An entry point for recall that groups summaries."""

    id: str
    user_id: str
    name: str
    description: str = ""
    summary_ids: list[str] = Field(default_factory=list)
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Hit(BaseModel):
    """One ranked search result of any layer, with provenance down to messages."""

    layer: Layer
    id: str
    text: str
    score: float
    message_ids: list[str] = Field(default_factory=list)
    user_id: str
    session_id: str | None = None
    timestamp: datetime | None = None
    role: str | None = None
    name: str | None = None
    event_type: str | None = None
    metadata: JsonObject = Field(default_factory=dict)
    # The evidence behind the rank (e.g. {"vector": 0.71, "fulltext": 3.2, "time_window": 1}).
    signals: dict[str, float] = Field(default_factory=dict)
    # Whether it still holds. ``superseded``: a summary or fact replaced by a correction or
    # a later value, or a message every fact of which was; ``expired``: a fact or summary
    # whose ``valid_to`` passed before the search's time. Such hits are history: a question
    # about the current value ranks them below what replaced them.
    superseded: bool = False
    expired: bool = False

    @property
    def current(self) -> bool:
        """Neither superseded nor expired."""
        return not (self.superseded or self.expired)


class MemoryContext(BaseModel):
    """What recall returns for one query (GUMem's ``context`` response, extended).

    ``formatted_context`` is ready to put into a prompt; the other fields carry the same
    content structured. ``matches`` is filled only when ``details=True``.
    ``instructions`` are the user's standing instructions and preferences that apply to
    the query, as the block lists them in their own section
    (docs/recall.md#standing-instructions).
    """

    project_id: str
    user_id: str
    session_id: str
    query: str | None = None
    history: list[Message] = Field(default_factory=list)
    facts: list[Fact] = Field(default_factory=list)
    summary: str | None = None
    topics: list[Topic] = Field(default_factory=list)
    formatted_context: str = ""
    token_estimate: int = 0
    matches: list[Hit] | None = None
    instructions: list[Fact] = Field(default_factory=list)


class RecallConfig(_Input):
    """Tuning of one recall, with GUM's snake_case keys and GUMem's PascalCase aliases.

    Unknown keys are rejected. Keys that act on layers the pipeline has not produced yet
    (observations, propositions, topics) are accepted and validated so that a client written
    for GUMem works unchanged; they take effect as soon as those layers hold data.
    """

    # Each key also by its PascalCase name (GUMem's): MessageRecentLimit ...
    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        alias_generator=AliasGenerator(
            validation_alias=lambda name: AliasChoices(name, to_pascal(name))
        ),
    )

    message_recent_limit: int = Field(default=6, ge=0, le=200)
    message_semantic_top_k: int = Field(default=8, ge=0, le=200)
    message_semantic_min_score: float = Field(default=0.0, ge=-1.0, le=1.0)
    observation_recent_limit: int = Field(default=0, ge=0, le=200)
    observation_semantic_top_k: int = Field(default=8, ge=0, le=200)
    observation_semantic_min_score: float = Field(default=0.0, ge=-1.0, le=1.0)
    proposition_top_k: int = Field(default=8, ge=0, le=200)
    topic_top_k: int = Field(default=3, ge=0, le=50)
    observation_context_top_k: int = Field(default=3, ge=0, le=50)
    long_term_rrf_k: int = Field(
        default=60,
        ge=1,
        le=1000,
        validation_alias=AliasChoices("long_term_rrf_k", "LongTermRrfK", "LongTermRRFK"),
    )
    enable_long_term_rerank: bool = False
    enable_long_term_recall: bool = True
    query_router: Literal["single_hop_direct", "single_hop_parallel", "multi_hop_chain"] = (
        "single_hop_direct"
    )
    token_budget: int = Field(default=800, ge=50, le=32_000)
    # stratamem's own keys.
    fusion: Literal["score", "rrf"] = "score"
    include_superseded: bool = False
    candidate_pool: int | None = Field(default=None, ge=5, le=5000)


class _MessageLister(Protocol):
    def list(
        self, *, session_id: str | None = ..., status: str | None = ..., limit: int = ...
    ) -> list[Message]: ...


class _SessionOwner(Protocol):
    """What a bound ``Session`` acts through: the ``Memory`` or ``MemoryClient`` that made it."""

    @property
    def messages(self) -> _MessageLister: ...

    def add_messages(
        self, session_id: str, messages: list[MessageInput | dict[str, Any]], *, sync: bool = ...
    ) -> AddResult: ...

    def get_memory(
        self,
        session_id: str,
        query: str | None = ...,
        *,
        details: bool = ...,
        recall_config: RecallConfig | dict[str, Any] | None = ...,
        metadata_filters: dict[str, Any] | None = ...,
        exclude_texts: Sequence[str] = ...,
    ) -> MemoryContext: ...

    def processing_status(self, session_id: str) -> ProcessingStatus: ...


class Session(BaseModel):
    """A conversation thread of one user. Bound sessions (from ``mem.sessions``) also act.

    ``add_messages`` and ``get_memory`` forward to the Memory that created the session.
    """

    id: str
    project_id: str
    user_id: str
    title: str | None = None
    metadata: JsonObject = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime

    _memory: _SessionOwner | None = PrivateAttr(default=None)

    @property
    def session_id(self) -> str:
        return self.id

    def _bound(self) -> _SessionOwner:
        if self._memory is None:
            raise RuntimeError(
                "this Session is plain data; get it from mem.sessions.create/get to call it"
            )
        return self._memory

    def add_messages(
        self, messages: list[MessageInput | dict[str, Any]], *, sync: bool = False
    ) -> AddResult:
        """Store messages durably and queue their processing; see ``Memory.add_messages``."""
        return self._bound().add_messages(self.id, messages, sync=sync)

    def get_memory(
        self,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
        exclude_texts: Sequence[str] = (),
    ) -> MemoryContext:
        """Recall what matters for ``query`` in this session; see ``Memory.get_memory``."""
        return self._bound().get_memory(
            self.id,
            query,
            details=details,
            recall_config=recall_config,
            metadata_filters=metadata_filters,
            exclude_texts=exclude_texts,
        )

    def messages(self, *, limit: int = 100, status: str | None = None) -> list[Message]:
        """This session's messages in acceptance order (with processing status)."""
        return self._bound().messages.list(session_id=self.id, limit=limit, status=status)

    def processing_status(self) -> ProcessingStatus:
        """How far this session's messages are through the write pipeline."""
        return self._bound().processing_status(self.id)


class AsyncSession:
    """A session of an ``AsyncMemory`` or an ``AsyncMemoryClient``: the :class:`Session`
    data (``data``; its fields read through) with ``Session``'s methods as coroutines."""

    def __init__(self, session: Session, owner: Any) -> None:
        self.data = session
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.data, name)

    def __repr__(self) -> str:
        return f"AsyncSession({self.data!r})"

    async def add_messages(
        self, messages: list[MessageInput | dict[str, Any]], *, sync: bool = False
    ) -> AddResult:
        result: AddResult = await self._owner.add_messages(self.data.id, messages, sync=sync)
        return result

    async def get_memory(
        self,
        query: str | None = None,
        *,
        details: bool = False,
        recall_config: RecallConfig | dict[str, Any] | None = None,
        metadata_filters: dict[str, Any] | None = None,
        exclude_texts: Sequence[str] = (),
    ) -> MemoryContext:
        context: MemoryContext = await self._owner.get_memory(
            self.data.id,
            query,
            details=details,
            recall_config=recall_config,
            metadata_filters=metadata_filters,
            exclude_texts=exclude_texts,
        )
        return context

    async def messages(self, *, limit: int = 100, status: str | None = None) -> list[Message]:
        listed: list[Message] = await self._owner.messages.list(
            session_id=self.data.id, limit=limit, status=status
        )
        return listed

    async def processing_status(self) -> ProcessingStatus:
        status: ProcessingStatus = await self._owner.processing_status(self.data.id)
        return status


class MessageState(BaseModel):
    id: str
    status: MessageStatus
    error: str | None = None


class ProcessingStatus(BaseModel):
    """Processing state of a session's messages: counts by status, then each message."""

    session_id: str
    pending: int = 0
    processed: int = 0
    failed: int = 0
    done: bool = True
    messages: list[MessageState] = Field(default_factory=list)


class Project(BaseModel):
    """A tenant: owns API keys, users' memory and (on the server) webhooks."""

    id: str
    name: str
    created_at: datetime


class ApiKey(BaseModel):
    """An API key's record. The key itself is shown once, when created, and never stored."""

    id: str
    project_id: str
    name: str | None = None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class AuditRecord(BaseModel):
    """Who changed or removed what, when and why (never the content itself)."""

    id: int
    project_id: str
    user_id: str | None = None
    action: AuditAction
    target: str | None = None
    actor: str
    reason: str | None = None
    details: JsonObject = Field(default_factory=dict)
    at: datetime


class AddResult(BaseModel):
    """What ``add_messages`` accepted: every message id in input order.

    ``duplicates`` are ids that were already stored with the same content (a resend);
    they are not stored or processed again. With ``sync=True`` ``processed`` is true once
    every accepted message has been processed.
    """

    session_id: str
    message_ids: list[str]
    duplicates: list[str] = Field(default_factory=list)
    job_id: int | None = None
    processed: bool = False


class Webhook(BaseModel):
    """A project's webhook: where and how one hook point is delivered over HTTP.

    The signing secret is not part of it: it is returned once, by ``create`` and
    ``rotate_secret``, and never again.
    """

    id: str
    project_id: str
    name: str
    resource: WebhookResource
    event: WebhookEvent
    mode: WebhookMode
    target_url: str
    enabled: bool
    timeout_ms: int
    created_at: datetime
    updated_at: datetime
    # After rotate_secret(grace_seconds=...): until when the old key still signs (else None).
    rotation_grace_until: datetime | None = None


class WebhookDelivery(BaseModel):
    """One delivery attempt of a webhook, as the delivery log keeps it.

    ``id`` is the delivery id (the ``webhook-id`` header), the same on every attempt of an
    async delivery. ``status`` is ``delivered``, ``failed`` (skipped for a sync hook; given
    up for an async one) or ``retrying`` (async, another attempt is scheduled). ``request``
    and ``response`` are the first characters of each body.
    """

    id: str
    hook_id: str
    project_id: str
    user_id: str | None = None
    message_ids: list[str] = Field(default_factory=list)
    resource: str
    event: str
    mode: WebhookMode
    attempt: int
    status: DeliveryStatus
    http_status: int | None = None
    latency_ms: float
    reason: str
    request: str
    response: str
    at: datetime


# -- what the dashboard reads (embedded only: Memory.users, provenance, activity) ----------


class UserInfo(BaseModel):
    """A user of the project (``mem.users.list``): their sessions and messages, and
    when they were first and last active (session created; last message added or session
    changed)."""

    user_id: str
    sessions: int
    messages: int
    first_seen: datetime
    last_seen: datetime


class Provenance(BaseModel):
    """An item and what it is linked to both ways (``mem.provenance``). A message: the
    facts drawn from it, the summaries citing it or those facts, their topics. A fact: its
    messages, the summaries citing it, their topics. A summary: its facts, its messages
    (and its facts'), its topics. A topic: its summaries. Superseded, deprioritized and
    archived facts and summaries are included (their ``status`` says so), and merged
    topics; deleted items never."""

    kind: ItemKind
    item: Message | Fact | Summary | Topic
    messages: list[Message] = Field(default_factory=list)
    facts: list[Fact] = Field(default_factory=list)
    summaries: list[Summary] = Field(default_factory=list)
    topics: list[Topic] = Field(default_factory=list)


class ActivityBucket(BaseModel):
    """Messages of the project in one interval from ``start`` (``mem.activity``):
    accepted, processed, and failed for good."""

    start: datetime
    messages_added: int = 0
    messages_processed: int = 0
    messages_failed: int = 0


class ModelUsage(BaseModel):
    """The pipeline's calls to one model (in a day, or over a window): tokens, and what
    they cost when ``llm_prices`` has a price for the model (``None`` otherwise)."""

    model: str
    calls: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None = None


class DayUsage(BaseModel):
    """One UTC day of a project: messages processed, the model calls that cost, and the
    tokens per processed message (``None`` on a day that processed none)."""

    day: date
    messages_processed: int
    prompt_tokens: int
    completion_tokens: int
    tokens_per_message: float | None = None
    cost: float | None = None
    models: list[ModelUsage] = Field(default_factory=list)


class Usage(BaseModel):
    """What memory cost a project since ``since`` (``mem.usage``): each UTC day (every day
    of the window, oldest first) and each model over the window. ``cost`` sums the priced
    models; ``unpriced`` names the models used without a price in ``llm_prices``."""

    since: date
    days: list[DayUsage]
    models: list[ModelUsage]
    prompt_tokens: int
    completion_tokens: int
    messages_processed: int
    cost: float | None = None
    unpriced: list[str] = Field(default_factory=list)


class DashboardSession(BaseModel):
    """A dashboard sign-in (``mem.dashboard_sessions``): with a project's API key
    (``kind`` ``key``) or as the operator (``admin``; ``project_id`` None until one is
    picked; ``key_id`` then identifies the admin token it signed in with, so that a new
    token ends it). ``csrf_token`` is what the signed-in pages post back."""

    kind: UiSessionKind
    key_id: str | None = None
    project_id: str | None = None
    csrf_token: str = Field(repr=False)
    created_at: datetime
    expires_at: datetime
    last_seen: datetime


class RecallRecord(BaseModel):
    """One recall a face made before a model call (``mem.recall_log``): who asked, through
    what, and the exact memory block injected. Holds memory text: erasing or forgetting
    the user deletes it (docs/recall.md#the-recall-log)."""

    project_id: str
    user_id: str
    session_id: str | None = None
    # capture (mem.llm), proxy (the memory proxy) or rest (the context routes)
    source: RecallSource
    # what asked: e.g. "openai chat.completions", "POST /v1/messages",
    # "POST /api/sessions/s1/context"
    request: str
    query: str | None = None
    # injected: a block went in; none: nothing relevant; skipped: the recall ran past its
    # bound or failed, and the call went on without memory
    outcome: RecallOutcome
    formatted_context: str = ""  # exactly what was injected; empty unless injected
    hits: int = 0  # memory items the recall matched (summaries, facts, messages)
    latency_ms: float  # the recall's wall time as the face saw it
    created_at: datetime


class RecallLatency(BaseModel):
    """One time bucket of a project's recall latency (``mem.recall_log.latency``):
    recalls that began in ``[bucket_start, bucket_start + bucket)``, skipped ones
    included (their latency is the bound they ran into)."""

    bucket_start: datetime
    count: int
    skipped: int
    p50_ms: float
    p95_ms: float
    max_ms: float

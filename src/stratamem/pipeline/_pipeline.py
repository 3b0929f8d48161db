"""Message → Facts → Summary → Topic for one claimed batch of one user.

Everything a batch derives is computed first and committed in one transaction together
with the batch's completion, so a batch is either wholly applied or not at all; a failure
anywhere (LLM down, unusable JSON after repair) raises, and the job queue retries the whole
batch later with backoff. With an LLM configured each stage is one call per chunk of
messages; without one, the offline heuristics in ``_heuristics`` do the same work.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import numpy as np
from pydantic import ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from .. import _metrics, _tracing
from .._checks import new_id
from .._foreground import PAUSE_SECONDS, Foreground
from .._speakers import without_speaker
from .._strings import CheckedStrings, value_problem
from .._time import Timestamp
from .._time import to_iso as _iso
from ..embed import Embedder
from ..hooks import HookContext, Hooks
from ..llm import CallLog, ChatModel, LLMError, complete_json
from ..store import (
    CURRENT_SUMMARY,
    CallWrite,
    ClaimedBatch,
    FactWrite,
    JobStore,
    LayerStore,
    LayerWrite,
    MessageRow,
    SummaryRow,
    SummaryWrite,
    TopicWrite,
)
from ..types import CORRECTS, is_note_event
from . import _heuristics as heuristics
from ._drafts import MAX_SCOPE_CHARS, FactDraft
from ._standing_summaries import standing_summaries
from .prompts import CONSOLIDATE, EXTRACT, HEURISTIC_VERSION, TOPICS, Prompt

__all__ = ["Pipeline", "PipelineStore", "embedding_text", "layer_embedding_text"]

log = logging.getLogger("stratamem.pipeline")
_Valid = TypeVar("_Valid")

# Offline consolidation thresholds on cosine similarity (calibrated on the local MiniLM
# model): a near-paraphrase strengthens; a correction of a related summary supersedes it.
STRENGTHEN_SIMILARITY = 0.86
SUPERSEDE_SIMILARITY = 0.45
# Offline, the sentences of one short message (one statement) become one summary, up to a
# size that keeps a summary one memory. A message giving more facts than
# GROUP_MESSAGE_MAX_FACTS covers several things (a long chat turn): its facts stay apart, so
# a question about one of them finds a summary about it alone. Facts of different messages
# are not grouped: merged by similarity (cosine 0.55-0.7) they cost LongMemEval-S turn
# R@5 2.5-5.5 points (a summary citing several turns puts non-evidence turns first).
GROUP_MESSAGE_MAX_FACTS = 3
GROUP_MAX_CHARS = 700

# What one batch may spend in total waiting for recalls at its safe points (see
# Foreground.pause): a batch's own work is ~10-20 ms offline, so recalls going first costs
# background throughput at most this much per batch, whatever the read traffic.
BATCH_PAUSE_SECONDS = 0.1
CANDIDATES_PER_FACT = 3
# The ``model`` of what the rules made: everything offline, and notes and the summaries
# they correct by id with an LLM too.
RULES = "heuristic"


def embedding_text(message: MessageRow) -> str:
    """The text a message is embedded as: behaviour events carry their kind and page, and a
    named speaker's turn carries the name (questions name people, turns rarely do)."""
    if is_note_event(message.event_type):
        return message.content  # a note is a statement, not an action to label
    if message.event_type:
        parts = [f"{message.event_type.replace('_', ' ')}: {message.content}"]
        if message.page:
            parts.append(f"(page: {message.page})")
        return " ".join(parts)
    if not message.name:
        return message.content
    # A transcript's turn already starts with its speaker ("Caroline: ..."): said once.
    return f"{message.name}: {without_speaker(message.content, message.name)}"


def _as_said(messages: Sequence[MessageRow]) -> list[MessageRow]:
    """The messages as the rules read them: a turn whose content starts with its own
    speaker's label ("Caroline: I went ...", a transcript's turn) without that label, as if
    the speaker had been sent as ``name`` (otherwise "Caroline:" would be read as part of
    the sentence). Only what extraction reads: the stored content stays as sent."""
    out = []
    for m in messages:
        said = without_speaker(m.content, m.name)
        out.append(m if said is m.content else replace(m, content=said))
    return out


def layer_embedding_text(text: str, message_ids: Sequence[str], names: dict[str, str]) -> str:
    """The text a fact or summary is embedded as: its text with the name of the speaker of
    its messages (``names``: message id -> the name facts call its speaker) read as "User".

    The text names its speaker ("Caroline adopted a cat"), but the vector is of what is said:
    a name shared by half of a conversation's facts put every one of them near any question
    naming that speaker, above the turns that answer it (LoCoMo turn R@5 -3 points). Who
    said what is matched on the messages (their vectors and the speaker prior of recall)."""
    for name in dict.fromkeys(names[m] for m in message_ids if m in names):
        text = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", heuristics.USER, text)
    return text


def speaker_names(messages: Sequence[MessageRow]) -> dict[str, str]:
    """Message id -> the name facts call its speaker, for ``layer_embedding_text``."""
    return {m.id: n for m in messages if (n := heuristics.speaker_name(m)) is not None}


def topic_key(name: str) -> str:
    """Names that differ only in case, punctuation, spacing or a plural "s" are one topic,
    so "Food & Diet", "food and diet" and "food-diets" do not split a user's memory."""
    words = re.findall(r"\w+", name.lower().replace("&", " and "))
    return " ".join(w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words)


def _line(m: MessageRow) -> str:
    """A message as one line of the extraction prompt. Its text's own line breaks become
    spaces: a message must not start a line of its own, where it could pass for another
    message (``[id] (time) assistant: ...``) or for the prompt's own sections."""
    who = (
        f"{m.role} note"
        if is_note_event(m.event_type)
        else m.role
        if not m.event_type
        else f"{m.role} event {m.event_type}"
    )
    page = f" page={_one_line(m.page)}" if m.page else ""
    return f"[{m.id}] ({m.ts[:16].replace('T', ' ')} UTC) {_one_line(who)}{page}: " + _one_line(
        m.content
    )


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def _scope(scope: str | None) -> str | None:
    """A standing fact's scope as stored: one line, trimmed; blank is None (every request)."""
    scope = " ".join((scope or "").split())
    return scope or None


# -- what the LLM answers, validated ---------------------------------------------------------


class _LLMFact(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    text: str = Field(min_length=1, max_length=1000)
    kind: str
    source_ids: list[str] = Field(min_length=1)
    confidence: float = Field(ge=0.0, le=1.0)
    occurred_at: Timestamp | None = None
    valid_from: Timestamp | None = None
    valid_to: Timestamp | None = None
    standing: bool = False
    scope: str | None = Field(default=None, max_length=MAX_SCOPE_CHARS)


class _Extraction(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    facts: list[_LLMFact]


class _Decision(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    fact_ids: list[str] = Field(min_length=1)
    action: str
    summary_id: str | None = None
    text: str | None = None


class _Consolidation(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    decisions: list[_Decision]


class _Assignment(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    summary_id: str
    topic: str = Field(min_length=1, max_length=80)
    description: str | None = None


class _Topics(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    assignments: list[_Assignment]


@dataclass
class _NewFact:
    write: FactWrite
    draft: FactDraft


def _target_problem(row: SummaryRow | None, user_id: str) -> str | None:
    """Why the summary a note corrects cannot be superseded by it (None: it can). A
    deprioritized summary can: recall still presents it, so the correction must retire it."""
    if row is None:
        return "is no summary of this project"
    if row.user_id != user_id:
        return "is another user's summary"
    if row.status not in CURRENT_SUMMARY:
        return f"is {row.status}"
    return None


def _joined(texts: Sequence[str]) -> str:
    """Sentences as one text: spaced, except after a Chinese full stop."""
    out = ""
    for text in texts:
        out += text if not out or out.endswith(("。", "！", "？")) else " " + text
    return out


def _speakers(
    messages: Sequence[MessageRow], facts: Sequence[_NewFact]
) -> dict[str, tuple[str, ...]]:
    """Who each fact is about: the session, role and name of its first source message."""
    by_id = {m.id: m for m in messages}
    out: dict[str, tuple[str, ...]] = {}
    for f in facts:
        m = by_id.get(f.write.message_ids[0]) if f.write.message_ids else None
        if m is not None:
            out[f.write.id] = (m.session_id, m.role, m.name or "")
    return out


class _Group:
    """A summary added in this batch and the facts grouped into it so far."""

    def __init__(self, write: SummaryWrite, speaker: tuple[str, ...], first: FactWrite) -> None:
        self.write = write
        self.speaker = speaker
        self.total = np.asarray(first.vector, dtype=np.float32).copy()
        self.window = (first.valid_from, first.valid_to)

    @property
    def mean(self) -> np.ndarray:
        norm = float(np.linalg.norm(self.total))
        mean: np.ndarray = self.total / norm if norm else self.total
        return mean

    def fits(self, f: _NewFact, speaker: tuple[str, ...]) -> bool:
        w = self.write
        return (
            bool(speaker)
            and speaker == self.speaker
            and len(w.text) + 1 + len(f.write.text) <= GROUP_MAX_CHARS
            # one validity window per summary: a dated fact joins only facts of its dates
            and (f.write.valid_from, f.write.valid_to) == self.window
        )

    def take(self, f: _NewFact) -> None:
        """Add ``f``: its text, evidence and kind; the summary is embedded anew."""
        w = self.write
        w.text = _joined([w.text, f.write.text])
        w.fact_ids.append(f.write.id)
        w.message_ids.extend(m for m in f.write.message_ids if m not in w.message_ids)
        w.confidence = max(w.confidence, f.write.confidence)
        if f.draft.kind not in w.labels:
            w.labels.append(f.draft.kind)
        w.reason = "from facts " + ", ".join(w.fact_ids)
        w.vector = None  # the joined text gets its own vector (Pipeline._embed_summaries)
        self.total += np.asarray(f.write.vector, dtype=np.float32)


def _belonging(
    f: _NewFact, speaker: tuple[str, ...], groups: Iterable[_Group], short: set[str]
) -> _Group | None:
    """The open group ``f`` belongs to: one holding a sentence of the same message, when
    that message is ``short`` (see ``GROUP_MESSAGE_MAX_FACTS``); None to start a summary of
    its own."""
    for g in groups:
        if g.fits(f, speaker) and set(f.write.message_ids) & set(g.write.message_ids) & short:
            return g
    return None


def _in_message_order(drafts: list[FactDraft], messages: Sequence[MessageRow]) -> list[FactDraft]:
    """``drafts`` ordered by their first source message (stable: a message's drafts keep
    their order)."""
    position = {m.id: i for i, m in enumerate(messages)}
    last = len(messages)
    return sorted(
        drafts, key=lambda d: min((position.get(m, last) for m in d.message_ids), default=last)
    )


def _draft_problems(drafts: Sequence[FactDraft], batch_ids: set[str]) -> list[str]:
    return [f"facts[{i}]: {p}" for i, d in enumerate(drafts) for p in d.problems(batch_ids)]


class PipelineStore(JobStore, LayerStore, Protocol):
    """What the pipeline needs of the store: a batch's context and the summaries and
    topics it builds on (layers), and the batch's completion with what it derived (jobs)."""


class Pipeline:
    """Processes one claimed batch; raises (so the queue retries) when it cannot finish."""

    def __init__(
        self,
        store: PipelineStore,
        embedder: Embedder,
        llm: ChatModel | None = None,
        hooks: Hooks | None = None,
        *,
        extract_chunk: int = 30,
        consolidate_chunk: int = 40,
        context_messages: int = 4,
        max_tokens: int = 4096,
        foreground: Foreground | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.hooks = hooks or Hooks()
        self.extract_chunk = extract_chunk
        self.consolidate_chunk = consolidate_chunk
        self.context_messages = context_messages
        self.max_tokens = max_tokens
        self.foreground = foreground

    @property
    def model_id(self) -> str:
        return self.llm.id if self.llm is not None else RULES

    def __call__(self, batch: ClaimedBatch) -> None:
        calls: list[CallWrite] = []
        pause = self._pauser()
        try:
            pause()
            vectors = self.embedder.embed([embedding_text(m) for m in batch.messages])
            layers = self.derive(batch, calls, pause)
        except Exception as exc:
            # The worker records the tokens a failed attempt spent along with the failure
            # (an attribute of whatever exception it is, read back with getattr).
            exc.stratamem_calls = calls  # type: ignore[attr-defined]
            raise
        finally:
            for c in calls:  # spent whether the batch commits or not
                _metrics.llm_call(
                    batch.project_id,
                    c.model,
                    c.stage,
                    ok=c.ok,
                    prompt_tokens=c.prompt_tokens,
                    completion_tokens=c.completion_tokens,
                    seconds=c.latency_ms / 1000,
                )
        pause()
        superseded = sum(1 for w in layers.summaries if w.action == "supersede")
        # What the batch derived, written at once: the pipeline chose what to create,
        # strengthen or supersede (an upsert, in the conventions' words).
        with _tracing.memory_span(
            "upsert_memory",
            batch.project_id,
            user_id=batch.user_id,
            count=len(layers.facts) + len(layers.summaries) + len(layers.topics),
            attributes={"stratamem.memory.superseded": superseded},
        ):
            self.store.complete_batch(
                batch, embedder=self.embedder.id, vectors=vectors, layers=layers
            )
        self.hooks.committed(layers.outbox)

    def _pauser(self) -> Callable[[], None]:
        """A safe point of one batch: wait for the recalls running now, within the batch's
        budget (BATCH_PAUSE_SECONDS)."""
        foreground = self.foreground
        if foreground is None:
            return lambda: None
        left = BATCH_PAUSE_SECONDS

        def pause() -> None:
            nonlocal left
            if left > 0 and foreground.busy:
                left -= foreground.pause(min(PAUSE_SECONDS, left))

        return pause

    # -- orchestration ---------------------------------------------------------------------

    def derive(
        self,
        batch: ClaimedBatch,
        calls: list[CallWrite],
        pause: Callable[[], None] = lambda: None,
    ) -> LayerWrite:
        """Facts, summaries and topics of ``batch``; ``pause`` is called between the steps
        (no transaction is open there)."""
        ctx = self.hooks.context(
            project_id=batch.project_id,
            user_id=batch.user_id,
            session_ids=tuple(dict.fromkeys(m.session_id for m in batch.messages)),
            message_ids=tuple(m.id for m in batch.messages),
        )
        pause()
        drafts = self._extract(batch, ctx, calls)
        pause()
        notes = {m.id for m in batch.messages if heuristics.is_note(m)}
        facts = self._fact_writes(drafts, {m.id: m.ts for m in batch.messages}, notes, batch)
        pause()
        summaries = self._consolidate(batch, ctx, facts, calls)
        pause()
        topics = self._topics(batch, ctx, summaries, calls)
        return LayerWrite(
            facts=[f.write for f in facts],
            summaries=summaries,
            topics=topics,
            calls=calls,
            outbox=ctx.outbox,
        )

    def _ask(
        self,
        stage: str,
        prompt: Prompt,
        user: str,
        validate: Callable[[dict[str, Any]], _Valid],
        calls: list[CallWrite],
    ) -> tuple[_Valid, str]:
        assert self.llm is not None
        log_ = CallLog()
        try:
            value, raw = complete_json(
                self.llm,
                prompt.system,
                user,
                schema=prompt.schema,
                validate=validate,
                max_tokens=self.max_tokens,
                calls=log_,
            )
        except LLMError:
            self._account(stage, prompt.version, log_, calls, failed=True)
            raise
        self._account(stage, prompt.version, log_, calls, failed=False)
        return value, raw

    def _account(
        self, stage: str, version: str, log_: CallLog, calls: list[CallWrite], *, failed: bool
    ) -> None:
        for i, c in enumerate(log_.calls):
            ok = not (failed and i == len(log_.calls) - 1)
            calls.append(
                CallWrite(
                    stage,
                    self.model_id,
                    version,
                    c.prompt_tokens,
                    c.completion_tokens,
                    c.latency_ms,
                    ok,
                )
            )
        if failed and not log_.calls:
            calls.append(CallWrite(stage, self.model_id, version, 0, 0, 0.0, False))

    # -- Message -> Facts ------------------------------------------------------------------

    def _extract(
        self, batch: ClaimedBatch, ctx: HookContext, calls: list[CallWrite]
    ) -> list[FactDraft]:
        batch_ids = {m.id for m in batch.messages}
        if self.llm is None:
            drafts = heuristics.extract_facts(_as_said(batch.messages))
        else:
            # A note is already what the model would make of it (a fact as it stands), so
            # the rules take it and the model is not asked to rephrase it.
            notes = [m for m in batch.messages if heuristics.is_note(m)]
            turns = [m for m in batch.messages if not heuristics.is_note(m)]
            drafts = heuristics.extract_facts(notes)
            for start in range(0, len(turns), self.extract_chunk):
                chunk = turns[start : start + self.extract_chunk]
                drafts.extend(self._extract_llm(batch, chunk, ctx, calls))
            if notes and turns:
                drafts = _in_message_order(drafts, batch.messages)
        problems = _draft_problems(drafts, batch_ids)
        if problems:
            # The engine's own output breaking its rules is a bug or a confused model: fail
            # the batch (it is retried) rather than store ungrounded facts.
            raise ValueError("extracted facts failed validation: " + "; ".join(problems[:5]))
        replaced = self.hooks.before_add(
            "fact",
            ctx,
            [_fact_wire(d) for d in drafts],
            validate=lambda items: _validated_drafts(items, batch_ids),
        )
        return drafts if replaced is None else _validated_drafts(replaced, batch_ids)

    def _extract_llm(
        self,
        batch: ClaimedBatch,
        chunk: Sequence[MessageRow],
        ctx: HookContext,
        calls: list[CallWrite],
    ) -> list[FactDraft]:
        first_pk = chunk[0].pk or 0
        context = self.store.context_messages(
            batch.project_id, batch.user_id, first_pk, self.context_messages
        )
        chunk_ids = {m.id for m in chunk}
        instruction = self.hooks.before_llm(
            "fact", ctx, {"messages": [_message_wire(m) for m in chunk]}
        )
        user = "CONTEXT (earlier messages, for reference only):\n"
        user += "\n".join(_line(m) for m in context) or "(none)"
        user += "\n\nMESSAGES:\n" + "\n".join(_line(m) for m in chunk)
        if instruction:
            user += "\n\nAdditional instructions:\n" + instruction

        def validate(obj: dict[str, Any]) -> list[FactDraft]:
            parsed = _Extraction.model_validate(obj)
            drafts = [
                FactDraft(
                    text=f.text.strip(),
                    kind=f.kind,
                    message_ids=list(dict.fromkeys(f.source_ids)),
                    confidence=f.confidence,
                    occurred_at=f.occurred_at,
                    valid_from=f.valid_from,
                    valid_to=f.valid_to,
                    standing=f.standing,
                    scope=_scope(f.scope) if f.standing else None,
                )
                for f in parsed.facts
            ]
            problems = _draft_problems(drafts, chunk_ids)
            if problems:
                raise ValueError("; ".join(problems[:5]))
            return drafts

        drafts, raw = self._ask("extract", EXTRACT, user, validate, calls)
        self.hooks.after_llm(
            "fact", ctx, {"raw_output": raw, "observations": [_fact_wire(d) for d in drafts]}
        )
        return drafts

    def _fact_writes(
        self,
        drafts: Sequence[FactDraft],
        times: dict[str, str],
        notes: set[str],
        batch: ClaimedBatch,
    ) -> list[_NewFact]:
        """The facts to store; those resting on ``notes`` alone were the rules' work (the
        model never sees a note as a message to extract from). Only the user's own words
        stand for later requests: a standing fact none of whose source messages is the
        user's (a model or hook that marked another speaker's line) is stored as an
        ordinary fact."""
        if not drafts:
            return []
        names = speaker_names(batch.messages)
        users = {m.id for m in batch.messages if m.role == "user"}
        vectors = self.embedder.embed(
            [layer_embedding_text(d.text, d.message_ids, names) for d in drafts]
        )

        def ruled(d: FactDraft) -> bool:
            return self.llm is None or all(m in notes for m in d.message_ids)

        return [
            _NewFact(
                FactWrite(
                    id=new_id("f"),
                    text=d.text,
                    kind=d.checked_kind,
                    message_ids=d.message_ids,
                    confidence=float(d.confidence),
                    model=RULES if ruled(d) else self.model_id,
                    prompt_version=HEURISTIC_VERSION if ruled(d) else EXTRACT.version,
                    vector=vectors[i],
                    occurred_at=_iso(d.occurred_at),
                    observed_at=max((times[m] for m in d.message_ids if m in times), default=None),
                    valid_from=_iso(d.valid_from),
                    valid_to=_iso(d.valid_to),
                    labels=list(d.labels),
                    standing=d.standing and any(m in users for m in d.message_ids),
                    scope=_scope(d.scope) if d.standing else None,
                ),
                d,
            )
            for i, d in enumerate(drafts)
        ]

    # -- Facts -> Summary ------------------------------------------------------------------

    def _candidates(
        self, batch: ClaimedBatch, facts: Sequence[_NewFact]
    ) -> dict[str, list[tuple[SummaryRow, float]]]:
        out = {}
        for f in facts:
            out[f.write.id] = self.store.similar_summaries(
                batch.project_id,
                batch.user_id,
                f.write.vector,
                self.embedder.id,
                CANDIDATES_PER_FACT,
            )
        return out

    def _consolidate(
        self,
        batch: ClaimedBatch,
        ctx: HookContext,
        facts: Sequence[_NewFact],
        calls: list[CallWrite],
    ) -> list[SummaryWrite]:
        # A note that names the summary it corrects supersedes it before anything else is
        # decided (no similarity or model second-guesses the caller), so the batch's other
        # facts build on the corrected memory: never on the retired summary.
        corrections, corrected, usual = self._corrections(batch, facts)
        if not facts:
            return []
        # Standing instructions and preferences are consolidated by rule, each its own
        # summary (_standing_summaries): never merged with other facts, so that retiring
        # one retires nothing else.
        # Other facts neither strengthen nor supersede a standing summary: only a standing
        # fact on its scope changes it ("now I'm working on async code" must not retire
        # "always give me a code example when I ask about async error handling").
        standing = standing_summaries(
            self.store, self.embedder, batch, [f.write for f in usual if f.write.standing]
        )
        corrections += standing
        usual = [f for f in usual if not f.write.standing]
        retired = set(corrected) | {w.supersedes for w in standing if w.supersedes}
        candidates = {
            fid: [(s, sim) for s, sim in rows if s.id not in retired and not s.standing]
            for fid, rows in self._candidates(batch, usual).items()
        }
        existing = {s.id: s for rows in candidates.values() for s, _ in rows}
        # What hooks may strengthen or supersede besides the summaries they create.
        stored = set(existing) | retired | {w.id for w in standing if w.action == "strengthen"}
        if self.llm is None:
            vectors = {f.write.id: f.write.vector for f in facts}
            earlier = [(w, vectors[w.fact_ids[0]]) for w in corrections if not w.standing]
            speakers = _speakers(batch.messages, facts)
            writes = corrections + self._consolidate_offline(
                usual, candidates, earlier, speakers, speaker_names(batch.messages)
            )
            # A strengthened summary keeps its words, which summary.before_add carries.
            kept = [existing.get(w.id) for w in writes if w.action == "strengthen"]
            ctx.quoted.update(m for row in kept if row is not None for m in row.message_ids)
        else:
            # Every candidate is quoted to the model, and so in summary.before_llm.
            ctx.quoted.update(m for row in existing.values() for m in row.message_ids)
            writes = list(corrections)
            for start in range(0, len(usual), self.consolidate_chunk):
                chunk = usual[start : start + self.consolidate_chunk]
                known = self._chunk_candidates(chunk, candidates, writes, facts)
                writes.extend(self._consolidate_llm(ctx, chunk, known, calls))
            existing.update(
                (w.id, _pending_row(w, batch)) for w in writes if w.action != "strengthen"
            )
        fact_ids = {f.write.id for f in facts}
        replaced = self.hooks.before_add(
            "summary",
            ctx,
            [_summary_wire(w) for w in writes],
            validate=lambda items: _validated_summaries(
                items, fact_ids, stored, facts, self.model_id
            ),
            extra={"observations": [_fact_wire(f.draft, f.write.id) for f in facts]},
        )
        if replaced is not None:
            writes = _validated_summaries(replaced, fact_ids, stored, facts, self.model_id)
        observed = {f.write.id: f.write.observed_at for f in facts}
        standing_ids = {f.write.id for f in facts if f.write.standing}
        for w in writes:
            w.observed_at = max((at for f in w.fact_ids if (at := observed.get(f))), default=None)
            # A summary made of standing facts only is standing (a hook's, a note's too).
            if w.action != "strengthen":
                w.standing = bool(w.fact_ids) and all(f in standing_ids for f in w.fact_ids)
        self._embed_summaries(
            writes, {sid: s.text for sid, s in existing.items()}, speaker_names(batch.messages)
        )
        return writes

    def _corrections(
        self, batch: ClaimedBatch, facts: Sequence[_NewFact]
    ) -> tuple[list[SummaryWrite], dict[str, SummaryRow], list[_NewFact]]:
        """The supersessions notes ask for by id (``types.CORRECTS``), the stored summaries
        they retire, and the facts left to consolidate as usual, in order.

        A note's facts become one summary (the note is one memory, as ``update_memory``
        wrote it) superseding the summary it names, if that is a current summary of this
        user; a later note naming the same summary supersedes the earlier note's summary,
        so the newest correction holds. A note naming anything else is logged and its
        facts are consolidated as usual: a caller's stale id must not fail the batch.
        """
        notes = {
            m.id: m
            for m in batch.messages
            if m.role == "user" and heuristics.is_note(m) and CORRECTS in m.metadata
        }
        groups: dict[str, list[_NewFact]] = {}
        for f in facts:
            note = next((m for m in f.write.message_ids if m in notes), None)
            if note is not None:
                groups.setdefault(note, []).append(f)
        for nid in notes:
            if nid not in groups:
                log.info(
                    "note %s of user %s corrects a summary but gave no fact", nid, batch.user_id
                )
        if not groups:
            return [], {}, list(facts)
        targets = {nid: heuristics.correction_target(notes[nid]) for nid in groups}
        named = sorted({t for t in targets.values() if t is not None})
        rows = {s.id: s for s in self.store.get_summaries(batch.project_id, named)}
        writes: list[SummaryWrite] = []
        corrected: dict[str, SummaryRow] = {}
        latest: dict[str, str] = {}  # a corrected summary -> the summary now in its place
        for nid, group in groups.items():
            target = targets[nid]
            row = rows.get(target) if target is not None else None
            problem = _target_problem(row, batch.user_id)
            if row is None or problem is not None:
                log.info(
                    "note %s of user %s corrects %.80r, which %s: consolidated as usual",
                    nid,
                    batch.user_id,
                    notes[nid].metadata[CORRECTS],
                    problem,
                )
                continue
            target = row.id
            fact_ids = [f.write.id for f in group]
            first = group[0].write
            write = SummaryWrite(
                action="supersede",
                id=new_id("s"),
                text=_joined([f.write.text for f in group]),
                confidence=max(f.write.confidence for f in group),
                fact_ids=fact_ids,
                message_ids=list(dict.fromkeys(m for f in group for m in f.write.message_ids)),
                model=RULES,
                prompt_version=HEURISTIC_VERSION,
                reason=f"corrected by message {nid} ({', '.join(fact_ids)})",
                # One fact's text is the summary's, and so is its vector.
                vector=first.vector if len(group) == 1 else None,
                supersedes=latest.get(target, target),
                valid_from=first.valid_from or first.occurred_at,
                valid_to=first.valid_to,
                labels=sorted({f.write.kind for f in group}),
            )
            writes.append(write)
            corrected[target] = row
            latest[target] = write.id
        used = {fid for w in writes for fid in w.fact_ids}
        return writes, corrected, [f for f in facts if f.write.id not in used]

    def _chunk_candidates(
        self,
        chunk: Sequence[_NewFact],
        candidates: dict[str, list[tuple[SummaryRow, float]]],
        earlier: Sequence[SummaryWrite],
        facts: Sequence[_NewFact],
    ) -> dict[str, SummaryRow]:
        """Stored summaries near this chunk's facts, plus those earlier chunks of the same
        batch created (so a repeated fact strengthens them instead of duplicating them)."""
        retired = {w.supersedes for w in earlier if w.supersedes}
        known = {s.id: s for f in chunk for s, _ in candidates[f.write.id] if s.id not in retired}
        vectors = {f.write.id: f.write.vector for f in facts}
        for w in earlier:
            if w.action == "strengthen" or w.id in retired or not w.fact_ids or w.standing:
                continue
            proxy = vectors[w.fact_ids[0]]
            if any(float(proxy @ f.write.vector) >= SUPERSEDE_SIMILARITY for f in chunk):
                known[w.id] = _pending_row(w, None)
        return known

    def _embed_summaries(
        self, writes: list[SummaryWrite], stored: dict[str, str], names: dict[str, str]
    ) -> None:
        # New summaries need a vector; a strengthened one only if its text was reworded
        # (otherwise its stored vector stays valid).
        todo = [
            w
            for w in writes
            if w.vector is None and (w.action != "strengthen" or w.text != stored.get(w.id))
        ]
        if todo:
            vectors = self.embedder.embed(
                [layer_embedding_text(w.text, w.message_ids, names) for w in todo]
            )
            for w, v in zip(todo, vectors, strict=True):
                w.vector = v

    def _consolidate_offline(
        self,
        facts: Sequence[_NewFact],
        candidates: dict[str, list[tuple[SummaryRow, float]]],
        earlier: Sequence[tuple[SummaryWrite, np.ndarray]] = (),
        speakers: dict[str, tuple[str, ...]] | None = None,
        names: dict[str, str] | None = None,
    ) -> list[SummaryWrite]:
        """The summary changes of ``facts``, after the batch's ``earlier`` ones (each with
        the vector it is compared by); ``speakers`` says who each fact is about (see
        ``_speakers``), so only one speaker's facts are grouped into one summary."""
        speakers, names = speakers or {}, names or {}
        per_message = Counter(f.write.message_ids[0] for f in facts if f.write.message_ids)
        short = {m for m, n in per_message.items() if n <= GROUP_MESSAGE_MAX_FACTS}
        groups: dict[str, _Group] = {}  # summaries added in this batch, open to more facts
        writes: list[SummaryWrite] = []
        # Summaries created or changed in this batch, so later facts can build on them.
        pending: dict[str, tuple[SummaryWrite, np.ndarray]] = {w.id: (w, v) for w, v in earlier}
        retired: set[str] = {w.supersedes for w, _ in earlier if w.supersedes}
        for f in facts:
            w, d = f.write, f.draft
            options: list[tuple[str, str, float, float, list[str]]] = [
                (s.id, s.text, sim, s.confidence, s.fact_ids)
                for s, sim in candidates[w.id]
                if s.id not in retired
            ]
            for sid, (pw, vec) in pending.items():
                if sid not in retired:
                    options.append((sid, pw.text, float(vec @ w.vector), pw.confidence, []))
            who = next((names[m] for m in w.message_ids if m in names), None)
            if who is not None:
                # Vectors do not carry the speaker (layer_embedding_text): a named speaker's
                # fact strengthens or corrects only a summary that names them, never the
                # same words said by someone else.
                said_by = re.compile(rf"(?<!\w){re.escape(who)}(?!\w)")
                options = [o for o in options if said_by.search(o[1])]
            best = max(options, key=lambda o: o[2], default=None)
            marked = "correction" in d.labels  # said to be one ("Correction: ...", "no longer")
            correction = marked or heuristics.is_correction(d.text)
            if best is not None and best[2] >= STRENGTHEN_SIMILARITY and not correction:
                sid, text, _, conf, _ = best
                merged = 1.0 - (1.0 - conf) * (1.0 - w.confidence)
                if sid in pending:
                    pw, _ = pending[sid]
                    pw.fact_ids.append(w.id)
                    pw.message_ids.extend(m for m in w.message_ids if m not in pw.message_ids)
                    pw.confidence = round(merged, 4)
                    continue
                sw = SummaryWrite(
                    action="strengthen",
                    id=sid,
                    text=text,
                    confidence=round(merged, 4),
                    fact_ids=[w.id],
                    message_ids=list(w.message_ids),
                    model=self.model_id,
                    prompt_version=HEURISTIC_VERSION,
                    reason=f"strengthened by fact {w.id}",
                )
                writes.append(sw)
                pending[sid] = (sw, w.vector)
                continue
            supersedes = None
            if (
                best is not None
                and correction
                and best[2] >= SUPERSEDE_SIMILARITY
                and (marked or heuristics.replaces(best[1], d.text))
            ):
                supersedes = best[0]
                retired.add(supersedes)
            speaker = speakers.get(w.id, ())
            group = None if supersedes else _belonging(f, speaker, groups.values(), short)
            if group is not None:
                group.take(f)
                pending[group.write.id] = (group.write, group.mean)
                continue
            sw = SummaryWrite(
                action="supersede" if supersedes else "add",
                id=new_id("s"),
                text=w.text,
                confidence=w.confidence,
                fact_ids=[w.id],
                message_ids=list(w.message_ids),
                model=self.model_id,
                prompt_version=HEURISTIC_VERSION,
                reason=(f"superseded by fact {w.id}" if supersedes else f"from fact {w.id}"),
                vector=w.vector,
                supersedes=supersedes,
                valid_from=w.valid_from or w.occurred_at,
                valid_to=w.valid_to,
                labels=[d.kind],
            )
            writes.append(sw)
            pending[sw.id] = (sw, w.vector)
            if not supersedes and not correction:
                groups[sw.id] = _Group(sw, speaker, w)
        return writes

    def _consolidate_llm(
        self,
        ctx: HookContext,
        facts: Sequence[_NewFact],
        existing: dict[str, SummaryRow],
        calls: list[CallWrite],
    ) -> list[SummaryWrite]:
        by_id = {f.write.id: f for f in facts}
        instruction = self.hooks.before_llm(
            "summary",
            ctx,
            {
                "observations": [_fact_wire(f.draft, f.write.id) for f in facts],
                "propositions": [_row_wire(s) for s in existing.values()],
            },
        )
        user = "EXISTING SUMMARIES:\n" + (
            "\n".join(f"[{s.id}] {s.text}" for s in existing.values()) or "(none)"
        )
        user += "\n\nNEW FACTS:\n" + "\n".join(
            f"[{f.write.id}] ({f.write.kind}"
            + (f", {f.write.occurred_at[:10]}" if f.write.occurred_at else "")
            + f") {f.write.text}"
            for f in facts
        )
        if instruction:
            user += "\n\nAdditional instructions:\n" + instruction

        def validate(obj: dict[str, Any]) -> list[_Decision]:
            parsed = _Consolidation.model_validate(obj)
            problems = []
            seen: set[str] = set()
            for i, d in enumerate(parsed.decisions):
                if d.action not in ("add", "strengthen", "supersede", "none"):
                    problems.append(f"decisions[{i}].action {d.action!r} is unknown")
                unknown = [f for f in d.fact_ids if f not in by_id]
                if unknown:
                    problems.append(f"decisions[{i}] names unknown facts {unknown[:3]}")
                if d.action in ("strengthen", "supersede") and d.summary_id not in existing:
                    problems.append(f"decisions[{i}] names unknown summary {d.summary_id!r}")
                if d.action in ("add", "supersede") and not (d.text and d.text.strip()):
                    problems.append(f"decisions[{i}] has no text")
                seen.update(d.fact_ids)
            if problems:
                raise ValueError("; ".join(problems[:5]))
            # A fact the model did not mention is kept as its own summary: never dropped.
            for fid in by_id:
                if fid not in seen:
                    parsed.decisions.append(_Decision(fact_ids=[fid], action="add"))
            return parsed.decisions

        decisions, raw = self._ask("consolidate", CONSOLIDATE, user, validate, calls)
        writes: list[SummaryWrite] = []
        retired: set[str] = set()
        for d in decisions:
            if d.action == "none":
                continue
            group = [by_id[f] for f in d.fact_ids]
            fact_ids = [f.write.id for f in group]
            message_ids = list(dict.fromkeys(m for f in group for m in f.write.message_ids))
            conf = max(f.write.confidence for f in group)
            text = (d.text or group[0].write.text).strip()
            if d.action == "strengthen" and d.summary_id not in retired:
                assert d.summary_id is not None  # validate: a strengthen names a summary
                old = existing[d.summary_id]
                merged = 1.0 - (1.0 - old.confidence) * (1.0 - conf)
                writes.append(
                    SummaryWrite(
                        action="strengthen",
                        id=old.id,
                        # Without a reworded text the summary keeps its own words.
                        text=(d.text or "").strip() or old.text,
                        confidence=round(merged, 4),
                        fact_ids=fact_ids,
                        message_ids=message_ids,
                        model=self.model_id,
                        prompt_version=CONSOLIDATE.version,
                        reason=f"strengthened by {', '.join(fact_ids)}",
                    )
                )
                continue
            supersedes = d.summary_id if d.action == "supersede" else None
            if supersedes in retired:
                supersedes = None
            if supersedes:
                retired.add(supersedes)
            first = group[0].write
            writes.append(
                SummaryWrite(
                    action="supersede" if supersedes else "add",
                    id=new_id("s"),
                    text=text,
                    confidence=conf,
                    fact_ids=fact_ids,
                    message_ids=message_ids,
                    model=self.model_id,
                    prompt_version=CONSOLIDATE.version,
                    reason=(
                        f"superseded by {', '.join(fact_ids)}"
                        if supersedes
                        else f"from {', '.join(fact_ids)}"
                    ),
                    supersedes=supersedes,
                    valid_from=first.valid_from or first.occurred_at,
                    valid_to=first.valid_to,
                    labels=sorted({f.write.kind for f in group}),
                )
            )
        self.hooks.after_llm(
            "summary",
            ctx,
            {
                "raw_output": raw,
                "observations": [_fact_wire(f.draft, f.write.id) for f in facts],
                "propositions": [_summary_wire(w) for w in writes],
            },
        )
        return writes

    # -- Summary -> Topic ------------------------------------------------------------------

    def _topics(
        self,
        batch: ClaimedBatch,
        ctx: HookContext,
        summaries: Sequence[SummaryWrite],
        calls: list[CallWrite],
    ) -> list[TopicWrite]:
        # A successor belongs where its predecessor is: the store copies the topic links of
        # a stored predecessor; one created in this batch passes its topic on here.
        new = [s for s in summaries if s.action == "add" or s.action == "supersede"]
        if not new:
            return []
        existing = self.store.list_topics(batch.project_id, batch.user_id)
        filed = {sid for t in existing for sid in t.summary_ids}
        in_batch = {s.id for s in new}
        todo = [
            s
            for s in new
            if not (s.supersedes and (s.supersedes in filed or s.supersedes in in_batch))
        ]
        if self.llm is None:
            pairs = []
            names = [t.name for t in existing]
            for s in todo:
                name, description = heuristics.topic_for([s.text], names)
                pairs.append((s.id, name, description))
                if name not in names:
                    names.append(name)
        else:
            pairs = self._topics_llm(ctx, todo, existing, calls) if todo else []
        topic_of = {sid: (name, description) for sid, name, description in pairs}
        for s in new:  # predecessors come first, so chains resolve in one pass
            if s.supersedes in topic_of and s.id not in topic_of:
                topic_of[s.id] = topic_of[s.supersedes]
                pairs.append((s.id, *topic_of[s.id]))
        if not pairs:
            return []
        by_name = {topic_key(t.name): t for t in existing}
        grouped: dict[str, TopicWrite] = {}
        for sid, name, description in pairs:
            key = topic_key(name)
            if key not in grouped:
                old = by_name.get(key)
                grouped[key] = TopicWrite(
                    id=old.id if old else new_id("t"),
                    name=old.name if old else name.strip(),
                    description=(old.description if old and old.description else description),
                    summary_ids=[],
                    is_new=old is None,
                )
            grouped[key].summary_ids.append(sid)
        topics = list(grouped.values())
        summary_ids = list(dict.fromkeys(sid for sid, _, _ in pairs))
        texts = {s.id: s.text for s in summaries}
        replaced = self.hooks.before_add(
            "topic",
            ctx,
            [_topic_wire(t) for t in topics],
            validate=lambda items: _validated_topics(items, set(summary_ids), by_name),
            extra={"propositions": [{"id": sid, "text": texts[sid]} for sid in summary_ids]},
        )
        if replaced is None:
            return topics
        return _validated_topics(replaced, set(summary_ids), by_name)

    def _topics_llm(
        self,
        ctx: HookContext,
        todo: Sequence[SummaryWrite],
        existing: Sequence[Any],
        calls: list[CallWrite],
    ) -> list[tuple[str, str, str]]:
        ids = {s.id for s in todo}
        user = "EXISTING TOPICS:\n" + (
            "\n".join(f"- {t.name}: {t.description}" for t in existing) or "(none)"
        )
        user += "\n\nSUMMARIES TO FILE:\n" + "\n".join(f"[{s.id}] {s.text}" for s in todo)

        def validate(obj: dict[str, Any]) -> list[_Assignment]:
            parsed = _Topics.model_validate(obj)
            unknown = [a.summary_id for a in parsed.assignments if a.summary_id not in ids]
            if unknown:
                raise ValueError(f"assignments name unknown summaries {unknown[:3]}")
            return parsed.assignments

        assignments, _ = self._ask("topics", TOPICS, user, validate, calls)
        placed = {a.summary_id for a in assignments}
        pairs = [(a.summary_id, a.topic, a.description or "") for a in assignments]
        names = [t.name for t in existing]
        for s in todo:  # a summary the model forgot still gets a topic
            if s.id not in placed:
                name, description = heuristics.topic_for([s.text], names)
                pairs.append((s.id, name, description))
        return pairs


# -- wire shapes for hooks, and validation of what hooks send back ---------------------------


def _message_wire(m: MessageRow) -> dict[str, Any]:
    return {
        "id": m.id,
        "role": m.role,
        "content": m.content,
        "timestamp": m.ts,
        "session_id": m.session_id,
        "event_type": m.event_type,
        "page": m.page,
        "metadata": m.metadata,
    }


def _fact_wire(d: FactDraft, fact_id: str | None = None) -> dict[str, Any]:
    wire = {
        "text": d.text,
        "kind": d.kind,
        "message_ids": list(d.message_ids),
        "confidence": d.confidence,
        "occurred_at": _iso(d.occurred_at),
        "valid_from": _iso(d.valid_from),
        "valid_to": _iso(d.valid_to),
        "labels": list(d.labels),
        "standing": d.standing,
        "scope": d.scope,
    }
    if fact_id:
        wire["id"] = fact_id
    return wire


def _validated_drafts(items: list[Any], batch_ids: set[str]) -> list[FactDraft]:
    drafts = []
    for i, item in enumerate(items):
        try:
            f = _LLMFact.model_validate(
                {**item, "source_ids": item.get("message_ids") or item.get("source_ids")}
                if isinstance(item, dict)
                else item
            )
        except PydanticValidationError as exc:
            raise ValueError(f"observations[{i}]: {exc.errors()[0]['msg']}") from None
        labels = item.get("labels") if isinstance(item.get("labels"), list) else []
        labels = [str(x) for x in labels][:10]
        if (found := value_problem(labels)) is not None:
            raise ValueError(f"observations[{i}].labels{found[0]}: {found[1]}")
        drafts.append(
            FactDraft(
                text=f.text.strip(),
                kind=f.kind,
                message_ids=list(dict.fromkeys(f.source_ids)),
                confidence=f.confidence,
                occurred_at=f.occurred_at,
                valid_from=f.valid_from,
                valid_to=f.valid_to,
                labels=labels,
                standing=f.standing,
                scope=_scope(f.scope) if f.standing else None,
            )
        )
    problems = _draft_problems(drafts, batch_ids)
    if problems:
        raise ValueError("; ".join(problems[:5]))
    return drafts


def _summary_wire(w: SummaryWrite) -> dict[str, Any]:
    return {
        "action": w.action,
        "id": w.id,
        "text": w.text,
        "confidence": w.confidence,
        "fact_ids": list(w.fact_ids),
        "message_ids": list(w.message_ids),
        "supersedes": w.supersedes,
        "valid_from": w.valid_from,
        "valid_to": w.valid_to,
        "labels": list(w.labels),
    }


def _row_wire(s: SummaryRow) -> dict[str, Any]:
    return {
        "id": s.id,
        "text": s.text,
        "status": s.status,
        "confidence": s.confidence,
        "fact_ids": s.fact_ids,
    }


class _SummaryItem(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    action: str
    id: str | None = None
    text: str = Field(min_length=1, max_length=2000)
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)
    fact_ids: list[str] = Field(min_length=1)
    supersedes: str | None = None
    labels: list[str] = Field(default_factory=list)


def _validated_summaries(
    items: list[Any],
    fact_ids: set[str],
    stored: set[str],
    facts: Sequence[_NewFact],
    model: str,
) -> list[SummaryWrite]:
    """A hook's summary changes, checked like the engine's own: ``stored`` are the summaries
    the batch saw. A summary an item creates gets a fresh id, and a later item naming it by
    the id the hook gave it (the engine's own id, when a hook passes the list on) is pointed
    at the fresh one: the store only knows the fresh id (docs/webhooks.md)."""
    by_fact = {f.write.id: f.write for f in facts}
    out: list[SummaryWrite] = []
    created: dict[str, str] = {}  # the hook's id of a summary created here -> its fresh id
    fresh: set[str] = set()
    for i, raw in enumerate(items):
        try:
            item = _SummaryItem.model_validate(raw)
        except PydanticValidationError as exc:
            raise ValueError(f"propositions[{i}]: {exc.errors()[0]['msg']}") from None
        if item.action not in ("add", "strengthen", "supersede"):
            raise ValueError(f"propositions[{i}].action {item.action!r} is unknown")
        foreign = [f for f in item.fact_ids if f not in fact_ids]
        if foreign:
            raise ValueError(f"propositions[{i}] cites facts outside this batch: {foreign[:3]}")
        named = item.id if item.action == "strengthen" else item.supersedes
        target = created.get(named, named) if named is not None else None
        if item.action != "add" and (target is None or target not in stored | fresh):
            verb = "strengthens" if item.action == "strengthen" else "supersedes"
            raise ValueError(f"propositions[{i}] {verb} unknown summary {named!r}")
        message_ids = list(dict.fromkeys(m for f in item.fact_ids for m in by_fact[f].message_ids))
        if item.action == "strengthen":
            assert target is not None  # checked above: it names a known summary
            sid = target
        else:
            sid = new_id("s")
            fresh.add(sid)
            if item.id is not None and item.id not in stored:
                created[item.id] = sid
        out.append(
            SummaryWrite(
                action=item.action,
                id=sid,
                text=item.text.strip(),
                confidence=item.confidence,
                fact_ids=item.fact_ids,
                message_ids=message_ids,
                model=model,
                prompt_version="hook",
                reason="set by a before_add hook",
                supersedes=target if item.action == "supersede" else None,
                labels=[str(x) for x in item.labels][:10],
            )
        )
    return out


def _topic_wire(t: TopicWrite) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "description": t.description,
        "summary_ids": list(t.summary_ids),
        "is_new": t.is_new,
    }


class _TopicItem(CheckedStrings):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=80)
    description: str = Field(default="", max_length=500)
    summary_ids: list[str] = Field(min_length=1)


def _validated_topics(
    items: list[Any], summary_ids: set[str], existing: dict[str, Any]
) -> list[TopicWrite]:
    out: dict[str, TopicWrite] = {}
    for i, raw in enumerate(items):
        try:
            item = _TopicItem.model_validate(raw)
        except PydanticValidationError as exc:
            raise ValueError(f"topics[{i}]: {exc.errors()[0]['msg']}") from None
        foreign = [s for s in item.summary_ids if s not in summary_ids]
        if foreign:
            raise ValueError(f"topics[{i}] files summaries outside this batch: {foreign[:3]}")
        key = topic_key(item.name)
        old = existing.get(key)
        topic = out.setdefault(
            key,
            TopicWrite(
                id=old.id if old else new_id("t"),
                name=old.name if old else item.name.strip(),
                description=item.description or (old.description if old else ""),
                summary_ids=[],
                is_new=old is None,
            ),
        )
        topic.summary_ids.extend(s for s in item.summary_ids if s not in topic.summary_ids)
    return list(out.values())


def _pending_row(w: SummaryWrite, batch: ClaimedBatch | None) -> SummaryRow:
    """A summary this batch creates, shaped like a stored one for later chunks' prompts."""
    return SummaryRow(
        pk=0,
        project_id=batch.project_id if batch else "",
        id=w.id,
        user_id=batch.user_id if batch else "",
        text=w.text,
        status="active",
        confidence=w.confidence,
        version=1,
        fact_ids=list(w.fact_ids),
        message_ids=list(w.message_ids),
        labels=list(w.labels),
        valid_from=w.valid_from,
        valid_to=w.valid_to,
        superseded_by=None,
        model=w.model,
        prompt_version=w.prompt_version,
        created_at="",
        updated_at="",
        standing=w.standing,
    )

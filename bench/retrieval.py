"""Retrieval quality: evidence Recall@5 / Recall@10 of ``mem.search`` on LoCoMo and LongMemEval.

What is measured
----------------
Both benchmarks label, for each question, the conversation turns that hold the answer
(the *evidence*). The script ingests the conversations through the public API only and asks
every question through ``mem.search``; a raw-turn BM25 baseline answers the same questions
in the same loop.

* Ingest. A fresh SQLite file in a temporary directory (``--keep DIR`` keeps it, ``--db``
  reuses one), ``Memory(url, embedder=--embedder)`` with default settings except
  ``max_content_chars`` (LongMemEval has user turns of up to ~77,000 characters). One
  stratamem user per LoCoMo conversation / per LongMemEval question, one stratamem session
  per benchmark session, one ``add_messages`` call per session (``sync=False``), then
  ``mem.wait()``: every message is embedded and run through the write pipeline (facts,
  summaries and topics, offline heuristics) before the first question.

  - LoCoMo: every turn; ``role`` user for speaker_a, assistant for speaker_b, ``name`` the
    speaker; a turn with a ``blip_caption`` gets the content
    ``"{text} [shared a photo: {caption}]"``; timestamps are the session date plus one
    minute per turn.
  - LongMemEval-S: only the USER turns (the benchmark's convention for turn-level
    retrieval), no ``name``; timestamps are ``haystack_dates`` plus one minute per turn
    (turn index within the session).

  ``--shape`` says how the turns are sent (the evidence ids and the scoring do not change):

  - ``roles`` (default): as above, roles and names chosen for the engine.
  - ``prefixed``: as many applications send group chats and transcripts: every turn
    ``role`` user, no ``name``, the speaker written into the content. LoCoMo:
    ``"Caroline: I went to ..."`` (the caption as above, after the text). LongMemEval-S,
    whose indexed turns are all the user's and unnamed: ``"User: ..."``, the label a
    transcript gives the person talking to an assistant; role user, as before.

  Message ids are unique within a project, so they are the benchmark's turn ids prefixed by
  the user: ``conv-26/D1:3`` (LoCoMo ``dia_id``), ``<question_id>/<session_id>:<turn>``
  (LongMemEval); session ids likewise. They are mapped back to the benchmark's ids when
  scoring. (Two LongMemEval haystacks hold one session twice; the second copy gets the
  session id ``<session_id>.dup2``, scored as the same session.)

* Questions. ``mem.search(question, user_id=..., limit=--search-limit)`` (default 100),
  plus ``as_of=<question time>`` when the installed ``Memory.search`` accepts it (LoCoMo:
  the start of the conversation's last session + 1 day; LongMemEval: ``question_date``).
  Hits may be of any layer (message, fact, summary, topic); each carries the ids of the
  messages it came from. The turn ranking flattens the hits in rank order into their
  message ids, keeping first occurrences; the session ranking collapses the turn ranking to
  sessions (first occurrence). The limit is deep because ten hits reach only ~4 distinct
  sessions: session R@10 needs a ranking that reaches 10 sessions (limit 30 reaches them
  for ~30% of LoCoMo questions, 100 for ~97%), and the engine's ranking depends on the
  limit (the candidate pools grow with it). The same question is also searched with
  ``limit=10``, the usual call: its turn recall is printed as a side row.

  - turn R@k: the share of a question's evidence turns among the first k turns;
  - session R@k: the share of its evidence sessions among the first k sessions;

  averaged over the questions that have evidence. A hit list that reaches fewer than k
  turns or sessions simply scores the ones it has (the script prints how often that
  happens). LoCoMo: evidence ids are normalised (``D:11:26`` -> ``D11:26``,
  ``D8:6; D9:17`` -> two ids, a bare ``D`` or an id not in the conversation is dropped);
  questions left without evidence are skipped and counted; evidence sessions are the
  sessions of the evidence turns. "overall" is categories 1-4 (1 multi-hop, 2 temporal,
  3 open-domain, 4 single-hop), category 5 (adversarial) is reported on its own.
  LongMemEval: evidence turns are user turns with ``has_answer: true``, evidence sessions
  ``answer_session_ids``; abstention questions (``_abs``) are skipped; questions whose
  evidence is only in assistant turns (single-session-assistant) count at session level
  only. "overall" is every question type.

* BM25 baseline: Okapi BM25 (k1=1.2, b=0.75, idf = log(1 + (N - n + 0.5) / (n + 0.5)))
  per user over the very turns the engine got; documents ``"{speaker}: {content}"``
  (LoCoMo) or the content (LongMemEval); lowercase ``[a-z0-9]+`` tokens minus a fixed
  English stopword list, no stemming; each query token scored (a repeated one counts
  again); every document ranked (ties in conversation order).

* Speed. Ingest wall time (``add_messages`` calls, then processing until ``mem.wait()``
  returns). Query latency: ``mem.search`` alone, at ``limit=10`` and at the scored limit,
  one query at a time, after ``WARMUP_QUERIES`` untimed searches and one untimed search
  per user (the first search of a user loads its vectors; printed separately). Context
  path: for every ``CONTEXT_EVERY``-th question, ``session.get_memory(query=question)`` in
  the user's latest session: its latency and the ``token_estimate`` of
  ``formatted_context``.

Nothing is asserted; the script prints figures (``--json``: also one JSON line).

    python bench/retrieval.py --dataset locomo                  # ~1-2 minutes
    python bench/retrieval.py --dataset longmemeval --limit-questions 10
    python bench/retrieval.py                                   # both (LongMemEval: ~6 minutes)
    python bench/retrieval.py --dataset locomo --split second-half   # data not tuned on
    python bench/retrieval.py --dataset locomo --db /tmp/locomo.db   # ingest once, rerun fast

``--db PATH`` reuses the file when it already holds the users (and ingests the missing
ones): the derived layers in it were built by the write pipeline of the run that ingested
them, so delete the file after changing the write path or the schema, and use one file
per ``--shape`` (the ids are the same in both shapes, so a file of the other shape would be
reused as it is). ``--db`` also takes a PostgreSQL URL (an existing database, used the same
way), so the same questions measure the PostgreSQL store:

    python bench/retrieval.py --dataset locomo --db postgresql://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import argparse
import inspect
import json
import lzma
import math
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from _common import (
    analyze_postgres,
    data_dir,
    emit_json,
    format_summary,
    load_locomo,
    locomo_turns,
    machine_info,
    other_load,
    stopwatch,
    summarize,
)
from stratamem import Memory
from stratamem.types import ID_PATTERN

KS = (5, 10)
METRICS = ("turn@5", "turn@10", "sess@5", "sess@10")
SYSTEMS = ("stratamem", "BM25 raw turns")
SHALLOW = "stratamem, limit=10"  # side row: the same engine asked for 10 hits only
SEARCH_LIMIT = 100  # hits of the scored search: deep enough to reach 10 distinct sessions
WARMUP_QUERIES = 5
CONTEXT_EVERY = 5
MAX_CONTENT_CHARS = 200_000
LOCOMO_CATEGORIES = {
    "1": "multi-hop",
    "2": "temporal",
    "3": "open-domain",
    "4": "single-hop",
    "5": "adversarial",
}
LONGMEMEVAL_FILE = "longmemeval_s_dev100.json.xz"
LONGMEMEVAL_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
)
BEAM_FILE = "beam_500k_dev.json.xz"
BEAM_TYPES = (
    "information_extraction",
    "knowledge_update",
    "temporal_reasoning",
    "multi_session_reasoning",
    "contradiction_resolution",
    "event_ordering",
    "instruction_following",
    "preference_following",
    "summarization",
)
_BEAM_DATE = "%B-%d-%Y"  # "January-05-2024"
_BEAM_MARKER = re.compile(r"\s*->->\s*[\d,\s]+$")  # " ->-> 4,32": the benchmark's index
_LOCOMO_DATE = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"
_LME_DATE = "%Y/%m/%d (%a) %H:%M"  # "2023/05/20 (Sat) 02:21"
_ID_RE = re.compile(ID_PATTERN)
_EVIDENCE_RE = re.compile(r"D:?(\d+):(\d+)")


# -- benchmark data as users, sessions, turns and questions ----------------------------------


@dataclass(frozen=True)
class Doc:
    """One ingested turn: what the engine stores and what BM25 indexes."""

    mid: str  # engine message id
    turn: str  # benchmark turn id
    session: str  # benchmark session id
    role: str
    name: str | None
    content: str
    timestamp: datetime
    bm25_text: str


@dataclass
class BenchSession:
    engine_id: str
    docs: list[Doc]


@dataclass(frozen=True)
class Question:
    qid: str
    text: str
    group: str  # LoCoMo category ("1".."5") / LongMemEval question_type
    gold_turns: frozenset[str]
    gold_sessions: frozenset[str]
    as_of: datetime


@dataclass
class User:
    user_id: str
    sessions: list[BenchSession]
    questions: list[Question]
    context_session: str  # engine id of the session get_memory is called in (the latest)

    @property
    def docs(self) -> list[Doc]:
        return [d for s in self.sessions for d in s.docs]


@dataclass
class Dataset:
    key: str
    title: str
    unit: str  # "conversations" / "questions"
    users: list[User]
    groups: dict[str, str]  # group key -> label, in print order
    overall: tuple[str, ...]  # groups averaged in "overall"
    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


def _safe_id(value: str) -> str:
    if _ID_RE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9._:@/+=-]", "_", value).lstrip("._:@/+=-")[:200] or "x"
    return cleaned if cleaned[0].isalnum() else f"x{cleaned}"[:200]


def _halves(items: list[Any], split: str) -> list[Any]:
    half = (len(items) + 1) // 2
    if split == "first-half":
        return items[:half]
    if split == "second-half":
        return items[half:]
    return items


def _normalise_evidence(raw: Any, known: set[str], fixes: Counter[str]) -> list[str]:
    """Evidence dia_ids of one LoCoMo question, repaired where the intent is clear."""
    out: list[str] = []
    entries = raw if isinstance(raw, list) else [raw]
    for entry in entries:
        pieces = [p for p in re.split(r"[;,\s]+", str(entry or "")) if p]
        if len(pieces) > 1:
            fixes["evidence entry split"] += 1
        for piece in pieces:
            m = _EVIDENCE_RE.fullmatch(piece)
            if m is None:
                fixes["malformed evidence id dropped"] += 1
                continue
            dia = f"D{m.group(1)}:{m.group(2)}"
            if dia not in known:
                fixes["unknown evidence id dropped"] += 1
                continue
            if dia != piece:
                fixes["evidence id repaired"] += 1
            if dia not in out:
                out.append(dia)
    return out


SHAPES = ("roles", "prefixed")


def locomo_dataset(split: str, limit: int | None, shape: str = "roles") -> Dataset:
    samples = _halves(load_locomo(), split)
    if limit is not None:
        samples = samples[:limit]
    wanted = {str(s["sample_id"]) for s in samples}
    by_sample: dict[str, list[Any]] = defaultdict(list)
    for t in locomo_turns():
        if t.sample_id in wanted:
            by_sample[t.sample_id].append(t)
    ds = Dataset(
        key="locomo",
        title="LoCoMo",
        unit="conversations",
        users=[],
        groups={k: f"{k} {v}" for k, v in LOCOMO_CATEGORIES.items()},
        overall=("1", "2", "3", "4"),
    )
    fixes: Counter[str] = Counter()
    for sample in samples:
        sample_id = str(sample["sample_id"])
        uid = _safe_id(sample_id)
        grouped: dict[int, list[Doc]] = defaultdict(list)
        for t in by_sample[sample_id]:
            content = t.text if t.caption is None else f"{t.text} [shared a photo: {t.caption}]"
            prefixed = shape == "prefixed"
            grouped[t.session].append(
                Doc(
                    mid=f"{uid}/{t.dia_id}",
                    turn=t.dia_id,
                    session=f"S{t.session}",
                    role="user" if prefixed else t.role,
                    name=None if prefixed else t.speaker or None,
                    content=f"{t.speaker}: {content}" if prefixed else content,
                    timestamp=t.timestamp,
                    bm25_text=f"{t.speaker}: {content}",
                )
            )
        sessions = [
            BenchSession(engine_id=f"{uid}/session_{n}", docs=grouped[n]) for n in sorted(grouped)
        ]
        last = max(grouped)
        raw_date = sample["conversation"].get(f"session_{last}_date_time")
        try:
            last_start = datetime.strptime(str(raw_date), _LOCOMO_DATE).replace(tzinfo=timezone.utc)
        except ValueError:
            last_start = min(d.timestamp for d in grouped[last])
        as_of = last_start + timedelta(days=1)
        turn_session = {d.turn: d.session for s in sessions for d in s.docs}
        questions = []
        for i, qa in enumerate(sample.get("qa", [])):
            text = str(qa.get("question") or "").strip()
            if not text:
                ds.skipped["no question text"] += 1
                continue
            gold = _normalise_evidence(qa.get("evidence"), set(turn_session), fixes)
            if not gold:
                ds.skipped["no valid evidence"] += 1
                continue
            questions.append(
                Question(
                    qid=f"{uid}#{i}",
                    text=text,
                    group=str(qa.get("category")),
                    gold_turns=frozenset(gold),
                    gold_sessions=frozenset(turn_session[g] for g in gold),
                    as_of=as_of,
                )
            )
        ds.users.append(User(uid, sessions, questions, sessions[-1].engine_id))
    if fixes:
        ds.notes.append(
            "evidence normalised: " + ", ".join(f"{n} {what}" for what, n in sorted(fixes.items()))
        )
    return ds


def _load_longmemeval() -> list[dict[str, Any]]:
    path = data_dir() / LONGMEMEVAL_FILE
    if not path.is_file():
        raise SystemExit(
            f"benchmark data not found: {path}; set STRATAMEM_DATA_DIR to the folder "
            f"holding {LONGMEMEVAL_FILE}"
        )
    with lzma.open(path, "rt", encoding="utf-8") as f:
        items = json.load(f)
    if not isinstance(items, list):
        raise SystemExit(f"{path}: expected a JSON list of questions")
    return items


def _lme_date(value: Any) -> datetime:
    return datetime.strptime(str(value).strip(), _LME_DATE).replace(tzinfo=timezone.utc)


def longmemeval_dataset(split: str, limit: int | None, shape: str = "roles") -> Dataset:
    items = _halves(_load_longmemeval(), split)
    if limit is not None:
        items = items[:limit]
    ds = Dataset(
        key="longmemeval",
        title="LongMemEval-S",
        unit="questions",
        users=[],
        groups={t: t for t in LONGMEMEVAL_TYPES},
        overall=LONGMEMEVAL_TYPES,
    )
    for item in items:
        qid = str(item["question_id"])
        if qid.endswith("_abs"):
            ds.skipped["abstention (_abs)"] += 1
            continue
        uid = _safe_id(qid)
        sessions: list[BenchSession] = []
        seen: Counter[str] = Counter()
        gold_turns: set[str] = set()
        for sid, date, turns in zip(
            item["haystack_session_ids"],
            item["haystack_dates"],
            item["haystack_sessions"],
            strict=True,
        ):
            sid = str(sid)
            seen[sid] += 1
            local = sid if seen[sid] == 1 else f"{sid}.dup{seen[sid]}"
            start = _lme_date(date)
            docs = []
            for i, t in enumerate(turns):
                content = str(t.get("content") or "")
                if t.get("role") != "user" or not content.strip():
                    continue
                turn_id = f"{local}:{i}"
                if t.get("has_answer"):
                    gold_turns.add(turn_id)
                docs.append(
                    Doc(
                        mid=_safe_id(f"{uid}/{turn_id}"),
                        turn=turn_id,
                        session=sid,
                        role="user",
                        name=None,
                        content=f"User: {content}" if shape == "prefixed" else content,
                        timestamp=start + timedelta(minutes=i),
                        bm25_text=content,
                    )
                )
            if docs:
                sessions.append(BenchSession(_safe_id(f"{uid}/{local}"), docs))
        if not sessions:
            ds.skipped["no user turns"] += 1
            continue
        gold_sessions = frozenset(str(s) for s in item.get("answer_session_ids") or ())
        if not gold_turns and not gold_sessions:
            ds.skipped["no evidence"] += 1
            continue
        latest = max(sessions, key=lambda s: s.docs[0].timestamp)
        question = Question(
            qid=qid,
            text=str(item["question"]).strip(),
            group=str(item.get("question_type")),
            gold_turns=frozenset(gold_turns),
            gold_sessions=gold_sessions,
            as_of=_lme_date(item["question_date"]),
        )
        if question.group not in ds.groups:
            ds.groups[question.group] = question.group
        ds.users.append(User(uid, sessions, [question], latest.engine_id))
    no_turns = sum(1 for u in ds.users for q in u.questions if not q.gold_turns)
    if no_turns:
        ds.notes.append(
            f"{no_turns} questions have evidence in assistant turns only: session level only"
        )
    return ds


def _load_beam() -> list[dict[str, Any]]:
    path = data_dir() / BEAM_FILE
    if not path.is_file():
        raise SystemExit(
            f"benchmark data not found: {path}; set STRATAMEM_DATA_DIR to the folder "
            f"holding {BEAM_FILE}"
        )
    with lzma.open(path, "rt", encoding="utf-8") as f:
        items = json.load(f)
    if not isinstance(items, list):
        raise SystemExit(f"{path}: expected a JSON list of chats")
    return items


def _beam_evidence(raw: Any) -> list[int]:
    """A question's ``source_chat_ids``: a list of turn ids, or a dict of such lists."""
    if isinstance(raw, dict):
        raw = [i for ids in raw.values() for i in (ids if isinstance(ids, list) else [ids])]
    if not isinstance(raw, list):
        return []
    return [int(i) for i in raw if isinstance(i, int) or str(i).isdigit()]


def beam_dataset(split: str, limit: int | None, shape: str = "roles") -> Dataset:
    """BEAM 500K: each chat one user, each batch one session, every turn (both roles) a
    message; the batch's ``time_anchor`` (on its first turn) then a minute per turn."""
    chats = _halves(_load_beam(), split)
    if limit is not None:
        chats = chats[:limit]
    ds = Dataset(
        key="beam",
        title="BEAM",
        unit="chats",
        users=[],
        groups={t: t for t in BEAM_TYPES},
        overall=BEAM_TYPES,
    )
    for chat in chats:
        uid = _safe_id(f"beam-{chat['conversation_id']}")
        sessions: list[BenchSession] = []
        turn_session: dict[str, str] = {}
        clock: datetime | None = None
        for batch in chat["chat"]:
            turns = [x for group in batch["turns"] for x in group]
            anchor = next((x["time_anchor"] for x in turns if x.get("time_anchor")), None)
            if anchor is not None:
                clock = datetime.strptime(str(anchor), _BEAM_DATE).replace(
                    hour=9, tzinfo=timezone.utc
                )
            elif clock is None:
                raise SystemExit(f"BEAM chat {chat['conversation_id']}: no time anchor")
            session = f"B{batch['batch_number']}"
            docs = []
            for i, x in enumerate(turns):
                content = _BEAM_MARKER.sub("", str(x.get("content") or "")).strip()
                if not content:
                    continue
                turn = str(x["id"])
                turn_session[turn] = session
                role = "user" if x.get("role") == "user" else "assistant"
                docs.append(
                    Doc(
                        mid=_safe_id(f"{uid}/{turn}"),
                        turn=turn,
                        session=session,
                        role="user" if shape == "prefixed" else role,
                        name=None,
                        content=f"{role.capitalize()}: {content}"
                        if shape == "prefixed"
                        else content,
                        timestamp=clock + timedelta(minutes=i),
                        bm25_text=content,
                    )
                )
            if docs:
                sessions.append(BenchSession(_safe_id(f"{uid}/{session}"), docs))
            # The next batch without an anchor of its own continues a day later.
            clock = clock + timedelta(days=1)
        as_of = max(d.timestamp for s in sessions for d in s.docs) + timedelta(days=1)
        questions = []
        for qtype, items in chat["probing_questions"].items():
            for i, q in enumerate(items):
                gold = [str(g) for g in _beam_evidence(q.get("source_chat_ids"))]
                gold = [g for g in gold if g in turn_session]
                if not gold:
                    ds.skipped[f"no evidence ({qtype})"] += 1
                    continue
                if qtype not in ds.groups:
                    ds.groups[qtype] = qtype
                questions.append(
                    Question(
                        qid=f"{uid}#{qtype}#{i}",
                        text=str(q["question"]).strip(),
                        group=qtype,
                        gold_turns=frozenset(gold),
                        gold_sessions=frozenset(turn_session[g] for g in gold),
                        as_of=as_of,
                    )
                )
        ds.users.append(User(uid, sessions, questions, sessions[-1].engine_id))
    return ds


# -- BM25 baseline -----------------------------------------------------------------------------

STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with about as is are was were be been being
    do does did have has had i you he she it we they me him her us them my your his its our
    their this that these those what which who whom when where why how there here not no yes so
    than too very can will just would should could may might must shall from into out up down
    over under again then once all any both each few more most other some such only own same s
    t don now also""".split()  # noqa: SIM905
)
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class BM25:
    """Okapi BM25 over one user's documents; ``rank`` orders every document."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        tokens = [tokenize(t) for t in texts]
        n = len(tokens)
        lengths = np.array([len(t) for t in tokens], dtype=np.float64)
        avgdl = max(float(lengths.mean()) if n else 0.0, 1e-9)
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, toks in enumerate(tokens):
            for term, tf in Counter(toks).items():
                postings[term].append((i, tf))
        self.k1 = k1
        self.n = n
        self.norm = k1 * (1.0 - b + b * lengths / avgdl)
        self.terms: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for term, plist in postings.items():
            docs = np.array([d for d, _ in plist], dtype=np.int64)
            tfs = np.array([tf for _, tf in plist], dtype=np.float64)
            df = len(plist)
            self.terms[term] = (docs, tfs, math.log(1.0 + (n - df + 0.5) / (df + 0.5)))

    def rank(self, query: str) -> np.ndarray:
        scores = np.zeros(self.n, dtype=np.float64)
        for term in tokenize(query):
            entry = self.terms.get(term)
            if entry is not None:
                docs, tfs, idf = entry
                scores[docs] += idf * tfs * (self.k1 + 1.0) / (tfs + self.norm[docs])
        return np.argsort(-scores, kind="stable")


# -- scoring -----------------------------------------------------------------------------------


def _recall(ranking: Sequence[str], gold: frozenset[str], k: int) -> float | None:
    if not gold:
        return None
    return len(gold.intersection(ranking[:k])) / len(gold)


def _sessions_of(turns: Sequence[str], session_of: dict[str, str]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for t in turns:
        s = session_of[t]
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def score(q: Question, turns: Sequence[str], session_of: dict[str, str]) -> dict[str, Any]:
    sessions = _sessions_of(turns, session_of)
    out: dict[str, Any] = {}
    for k in KS:
        out[f"turn@{k}"] = _recall(turns, q.gold_turns, k)
        out[f"sess@{k}"] = _recall(sessions, q.gold_sessions, k)
    out["turns"] = len(turns)
    out["sessions"] = len(sessions)
    return out


def _mean(rows: Sequence[dict[str, Any]], metric: str) -> tuple[float, int]:
    values = [r[metric] for r in rows if r[metric] is not None]
    return (100.0 * float(np.mean(values)) if values else float("nan")), len(values)


# -- engine ------------------------------------------------------------------------------------


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _ingested(mem: Memory, user: User) -> bool:
    have = {m.id for m in mem.messages.list(user_id=user.user_id, limit=10_000)}
    return all(d.mid in have for d in user.docs)


def ingest(mem: Memory, ds: Dataset) -> dict[str, Any]:
    """Every user's sessions through ``add_messages`` (one call per session), then wait."""
    todo = [u for u in ds.users if not _ingested(mem, u)]
    n_messages = sum(len(u.docs) for u in todo)
    reused = len(ds.users) - len(todo)
    if not todo:
        return {"reused_users": reused, "messages": 0, "add_s": 0.0, "process_s": 0.0}
    with stopwatch() as t_add:
        bar = tqdm(total=n_messages, desc=f"{ds.title}: add_messages", unit="msg", file=sys.stderr)
        for user in todo:
            for s in user.sessions:
                session = mem.sessions.create(user_id=user.user_id, session_id=s.engine_id)
                batch = []
                for d in s.docs:
                    m: dict[str, Any] = {
                        "id": d.mid,
                        "role": d.role,
                        "content": d.content,
                        "timestamp": d.timestamp,
                    }
                    if d.name is not None:
                        m["name"] = d.name
                    batch.append(m)
                session.add_messages(batch, sync=False)
                bar.update(len(batch))
        bar.close()
    with stopwatch() as t_proc:
        counts = mem.stats()["messages"]
        total = sum(counts.values())
        bar = tqdm(total=total, desc=f"{ds.title}: processing", unit="msg", file=sys.stderr)
        while True:
            counts = mem.stats()["messages"]
            bar.n = counts["processed"] + counts["failed"]
            bar.refresh()
            if counts["pending"] == 0:
                break
            time.sleep(1.0)
        bar.close()
        mem.wait()
    stats = mem.stats()
    return {
        "reused_users": reused,
        "messages": n_messages,
        "add_s": t_add[0],
        "process_s": t_proc[0],
        "failed": stats["messages"]["failed"],
        "facts": stats.get("facts"),
        "summaries": sum(stats.get("summaries", {}).values()),
        "topics": stats.get("topics"),
        "db_mib": stats["size_bytes"] / 2**20,
    }


def _turn_ranking(hits: Sequence[Any], by_mid: dict[str, Doc]) -> tuple[list[str], int]:
    """Hits in rank order -> their messages' benchmark turn ids (first occurrences)."""
    turns: list[str] = []
    seen: set[str] = set()
    unknown = 0
    for h in hits:
        for mid in h.message_ids:
            d = by_mid.get(mid)
            if d is None:
                unknown += 1
            elif d.turn not in seen:
                seen.add(d.turn)
                turns.append(d.turn)
    return turns, unknown


def evaluate(mem: Memory, ds: Dataset, limit: int) -> dict[str, Any]:
    """The question loop (see ``_evaluate``), with the share of the machine's CPU that other
    processes used meanwhile: the latency figures are only as quiet as the machine was."""
    with other_load() as load:
        out = _evaluate(mem, ds, limit)
    out["other_load"] = load[0]
    return out


def _evaluate(mem: Memory, ds: Dataset, limit: int) -> dict[str, Any]:
    """The question loop: engine searches (timed), BM25, and get_memory on a sample.

    Each question is searched twice: with ``limit`` (the scored ranking: deep enough for
    session-level R@10) and with ``limit=10`` (the usual call: its latency, and its turn
    ranking reported as a side row). Both timed; one query at a time.
    """
    search_as_of = _accepts(mem.search, "as_of")
    context_as_of = _accepts(mem.get_memory, "as_of")
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in (*SYSTEMS, SHALLOW)}
    deep_s: list[float] = []
    shallow_s: list[float] = []
    first_s: list[float] = []
    context_s: list[float] = []
    tokens: list[int] = []
    # What a captured LLM call would get: get_memory with the capture layer's compact
    # recall_config (no recent turns, as capture sends none by default).
    capture_config = {**mem.llm.recall_config, "message_recent_limit": 0}
    capture_s: list[float] = []
    capture_rows: list[dict[str, Any]] = []
    layers: Counter[str] = Counter()
    unknown_ids = 0
    warm = [q.text for u in ds.users for q in u.questions][:WARMUP_QUERIES]
    for text in warm:
        mem.search(text, user_id=ds.users[0].user_id, limit=limit)
    n_questions = sum(len(u.questions) for u in ds.users)
    bar = tqdm(total=n_questions, desc=f"{ds.title}: questions", unit="q", file=sys.stderr)
    asked = 0
    for user in ds.users:
        docs = user.docs
        by_mid = {d.mid: d for d in docs}
        session_of = {d.turn: d.session for d in docs}
        bm25 = BM25([d.bm25_text for d in docs])
        session = mem.sessions.get(user.context_session)
        t0 = time.perf_counter()
        mem.search("what happened recently", user_id=user.user_id, limit=10)
        first_s.append(time.perf_counter() - t0)
        for q in user.questions:
            extra: dict[str, Any] = {"as_of": q.as_of} if search_as_of else {}
            # Limit 10 first: the figure a caller sees includes embedding the question, which
            # the second search would find among the embedder's recent vectors.
            for k, samples, system in ((10, shallow_s, SHALLOW), (limit, deep_s, "stratamem")):
                t0 = time.perf_counter()
                hits = mem.search(q.text, user_id=user.user_id, limit=k, **extra)
                samples.append(time.perf_counter() - t0)
                turns, unknown = _turn_ranking(hits, by_mid)
                unknown_ids += unknown
                rows[system].append({"group": q.group, **score(q, turns, session_of)})
                if system == "stratamem":
                    layers.update(h.layer for h in hits)
            baseline = [docs[i].turn for i in bm25.rank(q.text)]
            rows["BM25 raw turns"].append({"group": q.group, **score(q, baseline, session_of)})
            ctx_extra = {"as_of": q.as_of} if context_as_of else {}
            t0 = time.perf_counter()
            ctx = session.get_memory(
                query=q.text, recall_config=capture_config, details=True, **ctx_extra
            )
            capture_s.append(time.perf_counter() - t0)
            if q.gold_turns:
                # The block's items: its matches, and the standing instructions and
                # preferences it lists (``instructions``, where the engine has them).
                shown = [*(ctx.matches or []), *getattr(ctx, "instructions", [])]
                turns, _ = _turn_ranking(shown, by_mid)
                found = len(q.gold_turns.intersection(turns)) / len(q.gold_turns)
                capture_rows.append(
                    {
                        "group": q.group,
                        "recall": found,
                        "turns": len(turns),
                        "tokens": ctx.token_estimate,
                    }
                )
            if asked % CONTEXT_EVERY == 0:
                t0 = time.perf_counter()
                ctx = session.get_memory(query=q.text, **ctx_extra)
                context_s.append(time.perf_counter() - t0)
                tokens.append(ctx.token_estimate)
            asked += 1
            bar.update(1)
    bar.close()
    return {
        "rows": rows,
        "search": summarize(deep_s),
        "search_10": summarize(shallow_s),
        "first_search": summarize(first_s),
        "context": summarize(context_s),
        "capture": summarize(capture_s),
        "capture_rows": capture_rows,
        "tokens": tokens,
        "layers": dict(layers),
        "unknown_ids": unknown_ids,
        "as_of": search_as_of,
        "context_as_of": context_as_of,
    }


# -- report ------------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return "  n/a" if v != v else f"{v:5.1f}"


def report(ds: Dataset, ing: dict[str, Any], ev: dict[str, Any], limit: int) -> dict[str, Any]:
    rows = ev["rows"]
    shown = (*SYSTEMS, SHALLOW)
    overall = {s: [r for r in rows[s] if r["group"] in ds.overall] for s in shown}
    n_q = len(overall["stratamem"])
    n_users = len(ds.users)
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(ds.skipped.items())) or "none"
    if ds.key == "locomo":
        scope = f"{n_users} conversations, {n_q} questions with evidence in categories 1-4"
    elif ds.key == "beam":
        scope = f"{n_users} chats, {n_q} questions with evidence turns (both roles indexed)"
    else:
        scope = f"{n_q} questions with evidence, one haystack each"
    print(f"\n{ds.title} ({scope}; skipped: {skipped})")
    for note in ds.notes:
        print(f"  {note}")
    out: dict[str, Any] = {"users": n_users, "questions": n_q, "skipped": dict(ds.skipped)}
    header = "".join(f"{m.replace('@', ' R@'):>11}" for m in METRICS)
    print(f"  {'':<24}{header}")
    out["overall"] = {}
    for s in shown:
        vals = {m: _mean(overall[s], m) for m in METRICS}
        out["overall"][s] = {m: round(v, 2) for m, (v, _) in vals.items()}
        label = f"{s} (limit={limit})" if s == "stratamem" else s
        print(f"  {label:<24}" + "".join(f"{_fmt(v):>11}" for v, _ in vals.values()))
    counts = {m: _mean(overall["stratamem"], m)[1] for m in METRICS}
    print(
        f"  (questions counted: turn level {counts['turn@5']}, session level "
        f"{counts['sess@5']}; the limit=10 row reaches few sessions, so its session R@k is "
        "truncated)"
    )

    title = "per category" if ds.key == "locomo" else "per question type"
    print(
        f"\n  {title:<27}{'n':>5}   stratamem turn R@5 R@10, sess R@5 R@10"
        "   BM25 raw turns, the same"
    )
    out["groups"] = {}
    for g, label in ds.groups.items():
        per = {s: [r for r in rows[s] if r["group"] == g] for s in shown}
        if not per["stratamem"]:
            continue
        vals = {s: {m: _mean(per[s], m)[0] for m in METRICS} for s in shown}
        out["groups"][label] = {
            "n": len(per["stratamem"]),
            "n_turn_level": _mean(per["stratamem"], "turn@5")[1],
            **{s: {m: round(v, 2) for m, v in vals[s].items()} for s in shown},
        }
        cells = "      ".join(" ".join(_fmt(vals[s][m]) for m in METRICS) for s in SYSTEMS)
        n_turn = _mean(per["stratamem"], "turn@5")[1]
        n_sess = _mean(per["stratamem"], "sess@5")[1]
        n = str(n_sess) if n_turn == n_sess else f"{n_turn}/{n_sess}"
        print(f"  {label:<27}{n:>5}      {cells}")
    if (
        ds.key == "locomo"
        and rows["stratamem"]
        and any(r["group"] == "5" for r in rows["stratamem"])
    ):
        print("  (category 5, adversarial, is not part of the overall figures)")

    # Evidence turns that the block injected into a captured call quotes (its matches'
    # messages): recall over the whole block, which holds at most 12 items.
    block = [r for r in ev["capture_rows"] if r["group"] in ds.overall]
    capture: dict[str, Any] = {}
    if block:
        capture = {
            "evidence_in_block": round(100 * float(np.mean([r["recall"] for r in block])), 2),
            "median_turns": float(np.median([r["turns"] for r in block])),
            "median_tokens": float(np.median([r["tokens"] for r in block])),
            "max_tokens": float(max(r["tokens"] for r in block)),
            "n": len(block),
        }
        print(
            "\n  capture recall (get_memory with mem.llm.recall_config, no recent turns): "
            f"{capture['evidence_in_block']:.1f}% of the evidence turns are in the block "
            f"(median {capture['median_turns']:.0f} turns behind its items, median "
            f"{capture['median_tokens']:.0f} tokens, max {capture['max_tokens']:.0f}; "
            f"n={len(block)})"
        )
        per_group: dict[str, dict[str, float]] = {}
        for g, label in ds.groups.items():
            recalls = [r["recall"] for r in ev["capture_rows"] if r["group"] == g]
            if recalls:
                share = round(100 * float(np.mean(recalls)), 2)
                per_group[label] = {"evidence_in_block": share, "n": len(recalls)}
        capture["groups"] = per_group
        unit = "category" if ds.key == "locomo" else "question type"
        print(
            f"  capture recall per {unit}: "
            + ", ".join(
                f"{k} {v['evidence_in_block']:.1f}% (n={v['n']:.0f})" for k, v in per_group.items()
            )
        )

    engine_rows = rows["stratamem"]
    short_sessions = sum(1 for r in engine_rows if r["sessions"] < 10)
    short_turns = sum(1 for r in engine_rows if r["turns"] < 10)
    layer_total = sum(ev["layers"].values()) or 1
    layer_mix = ", ".join(
        f"{k} {100 * v / layer_total:.1f}%" for k, v in sorted(ev["layers"].items())
    )
    print(
        f"\n  mem.search(limit={limit}{', as_of=question time' if ev['as_of'] else ''}): "
        f"hits by layer: {layer_mix or 'none'}; rankings reaching < 10 turns: {short_turns}, "
        f"< 10 sessions: {short_sessions} of {len(engine_rows)}"
    )
    if not ev["as_of"]:
        print("  (the installed Memory.search takes no as_of: questions asked without a time)")
    if ev["unknown_ids"]:
        print(f"  WARNING: {ev['unknown_ids']} message ids in hits are not this user's turns")

    print("\n  speed")
    if ing["messages"]:
        total = ing["add_s"] + ing["process_s"]
        print(
            f"  ingest: {ing['messages']} messages in {total:.1f} s "
            f"({ing['messages'] / total:.0f} msg/s): add_messages {ing['add_s']:.1f} s, "
            f"processing until wait() {ing['process_s']:.1f} s; the database now holds "
            f"{ing['facts']} facts, {ing['summaries']} summaries, {ing['topics']} topics, "
            f"{ing['failed']} failed messages, {ing['db_mib']:.0f} MiB"
        )
    if ing["reused_users"]:
        print(f"  ingest: {ing['reused_users']} users reused from the database file")
    print(
        f"  other processes used {ev['other_load']:.0%} of the machine's CPU during the questions"
    )
    print(format_summary("mem.search, limit=10 (warm)", ev["search_10"], width=38))
    print(format_summary(f"mem.search, limit={limit} (warm)", ev["search"], width=38))
    print(format_summary("first search of each user (cold)", ev["first_search"], width=38))
    print(format_summary(f"get_memory, every {CONTEXT_EVERY}th question", ev["context"], width=38))
    print(format_summary("get_memory, capture config", ev["capture"], width=38))
    tok = np.asarray(ev["tokens"], dtype=np.float64)
    tok_summary: dict[str, float] = {}
    if len(tok):
        tok_summary = {
            "median": float(np.median(tok)),
            "p95": float(np.percentile(tok, 95)),
            "max": float(tok.max()),
            "n": len(tok),
        }
        print(
            f"  formatted_context token_estimate: median {tok_summary['median']:.0f}, "
            f"p95 {tok_summary['p95']:.0f}, max {tok_summary['max']:.0f} (n={len(tok)})"
        )
    out.update(
        {
            "ingest": {k: round(v, 2) if isinstance(v, float) else v for k, v in ing.items()},
            "search_limit": limit,
            "other_load": ev["other_load"],
            "as_of": ev["as_of"],
            "hits_by_layer": ev["layers"],
            "rankings_short_of_10_sessions": short_sessions,
            "search": ev["search"].as_dict(),
            "search_limit_10": ev["search_10"].as_dict(),
            "first_search": ev["first_search"].as_dict(),
            "get_memory": ev["context"].as_dict(),
            "context_tokens": tok_summary,
            "capture_get_memory": ev["capture"].as_dict(),
            "capture_block": capture,
        }
    )
    return out


# -- main --------------------------------------------------------------------------------------


def _postgres(url: str | None) -> bool:
    return url is not None and url.startswith(("postgresql://", "postgres://"))


def _db_path(args: argparse.Namespace, key: str, tmp: str) -> Path:
    if args.db is not None:
        return Path(args.db)
    if args.keep is not None:
        path = Path(args.keep) / f"retrieval-{key}.db"
        if path.exists():
            raise SystemExit(f"{path} exists: pass --db {path} to reuse it, or delete it")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tmp) / f"retrieval-{key}.db"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=("locomo", "longmemeval", "beam", "all"), default="all")
    p.add_argument("--limit-conversations", type=int, default=None, help="LoCoMo / BEAM: first N")
    p.add_argument("--limit-questions", type=int, default=None, help="LongMemEval: first N")
    p.add_argument(
        "--split",
        choices=("all", "first-half", "second-half"),
        default="all",
        help="LoCoMo conversations 1-3 / 4-6, LongMemEval questions 0-49 / 50-99, BEAM chats "
        "1-3 / 4-5",
    )
    p.add_argument(
        "--shape",
        choices=SHAPES,
        default="roles",
        help="roles: roles and names as the engine likes them; prefixed: every turn role "
        "user, no name, the speaker in the content ('Caroline: ...', LongMemEval 'User: ...')",
    )
    p.add_argument("--embedder", default="local")
    p.add_argument(
        "--search-limit",
        type=int,
        default=SEARCH_LIMIT,
        help=f"hits asked per question (default {SEARCH_LIMIT}, at least 10)",
    )
    p.add_argument("--keep", metavar="DIR", default=None, help="keep the SQLite file(s) in DIR")
    p.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="reuse (or create) this SQLite file; or a PostgreSQL URL (an existing database)",
    )
    p.add_argument("--json", action="store_true", help="also print a JSON line of results")
    args = p.parse_args(argv)
    limit = max(10, args.search_limit)
    keys = ("locomo", "longmemeval", "beam") if args.dataset == "all" else (args.dataset,)

    info = machine_info()
    print(
        f"stratamem retrieval benchmark: {info['cpu']}, {info['cores']} cores, "
        f"{info['ram_gib']} GiB RAM, engine {info['engine']}, embedder {args.embedder}, "
        f"split {args.split}, shape {args.shape}, load {info.get('loadavg_1m_at_start')}"
    )
    results: dict[str, Any] = {
        "machine": info,
        "embedder": args.embedder,
        "split": args.split,
        "shape": args.shape,
        "datasets": {},
    }
    with tempfile.TemporaryDirectory(prefix="stratamem-retrieval-") as tmp:
        for key in keys:
            if key == "locomo":
                ds = locomo_dataset(args.split, args.limit_conversations, args.shape)
            elif key == "beam":
                ds = beam_dataset(args.split, args.limit_conversations, args.shape)
            else:
                ds = longmemeval_dataset(args.split, args.limit_questions, args.shape)
            if not ds.users:
                print(f"\n{ds.title}: nothing selected")
                continue
            # Chosen once: with --keep, a second _db_path call would find the file made.
            path = None if _postgres(args.db) else _db_path(args, key, tmp)
            mem = Memory(
                str(args.db) if path is None else f"sqlite:///{path.resolve()}",
                embedder=args.embedder,
                max_content_chars=MAX_CONTENT_CHARS,
            )
            try:
                ing = ingest(mem, ds)
                if path is None:
                    print(f"  PostgreSQL: {analyze_postgres(str(args.db))}")
                ev = evaluate(mem, ds, limit)
            finally:
                mem.close()
            results["datasets"][key] = report(ds, ing, ev, limit)
            if path is None:
                print("  database: the PostgreSQL database of --db")
            elif args.keep is not None or args.db is not None:
                print(f"  database: {path}")
    if args.json:
        emit_json("retrieval", results)


if __name__ == "__main__":
    main()

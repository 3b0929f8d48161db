"""Stage 1 of a recall: the query plan, everything read from the question, read once.

A plan holds what every later stage needs from the query and the search's arguments: the
time it is asked at, the period it is about (named, or found through the event it is
relative to), the variants searched (the query and, with ``single_hop_parallel``, its
rewrites), each variant's full-text terms, the speakers it names, the layers and statuses
taken, and how many candidates each retriever returns. The later stages (retrieve, score,
chain, select) take the plan and never parse the query again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from .._queries import SEARCH_LAYERS
from .._time import utcnow
from ..store import CURRENT_SUMMARY, SearchFilters
from ..store._text import fts_query_terms
from ..types import RecallConfig
from ._rewrite import rewrite_query
from ._temporal import TimeIntent, parse_time_intent

__all__ = [
    "QueryPlan",
    "SearchOptions",
    "asks_about_assistant",
    "asks_about_beginning",
    "asks_about_history",
    "asks_for_many",
    "asks_for_record",
    "asks_for_thread",
    "mentioned_names",
    "plan_query",
    "search_options",
]

_WORD = re.compile(r"\w+")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

Window = tuple[datetime, datetime]


@dataclass(frozen=True)
class SearchOptions:
    """How one search runs; built from ``Memory.search`` arguments or a RecallConfig."""

    layers: tuple[str, ...] = ("summary", "fact", "message")
    include_superseded: bool = False
    router: str = "single_hop_direct"
    rerank: bool = False
    fusion: str = "score"
    rrf_k: int = 60
    # Per layer: a cosine below this is no vector match (full-text matches still count).
    min_similarity: Mapping[str, float] = field(default_factory=dict)
    as_of: datetime | None = None
    per_layer: int | None = None  # candidates per retriever and layer (default from limit)


def search_options(
    config: RecallConfig,
    *,
    as_of: datetime | None = None,
    layers: tuple[str, ...] | None = None,
    include_superseded: bool | None = None,
    min_similarity: Mapping[str, float] | None = None,
) -> SearchOptions:
    """The search a RecallConfig asks for."""
    return SearchOptions(
        layers=layers or SEARCH_LAYERS,
        include_superseded=(
            config.include_superseded if include_superseded is None else include_superseded
        ),
        router=config.query_router,
        rerank=config.enable_long_term_rerank,
        fusion=config.fusion,
        rrf_k=config.long_term_rrf_k,
        as_of=as_of,
        min_similarity=dict(min_similarity or {}),
        per_layer=config.candidate_pool,
    )


@dataclass(frozen=True)
class QueryPlan:
    """One search, decided before anything is read from the store."""

    project_id: str
    user_id: str
    filters: SearchFilters
    options: SearchOptions
    query: str
    as_of: datetime
    intent: TimeIntent
    # The period the question is about: the one it names, or the one before / after the
    # event it is relative to ("before the move"). Candidates inside it get a bonus.
    window: Window | None
    variants: tuple[str, ...]  # searched texts: the query first
    # What is embedded for each variant: the variant, except that a hypothetical question
    # about a named speaker is embedded without the name (``_embedded``).
    embedded: tuple[str, ...]
    terms: tuple[tuple[str, ...], ...]  # full-text terms of each variant (none: vector only)
    speakers: tuple[str, ...]  # the speakers of this user's memory
    named: frozenset[str]  # those the query names
    layers: tuple[str, ...]  # layers searched
    summary_statuses: tuple[str, ...]
    fact_statuses: tuple[str, ...]
    per_layer: int  # candidates per retriever, layer and variant
    # The question asks for several things said at different times ("Which cities has Jon
    # visited?", "What books did Melanie read?"): the hits should not all come from one
    # session.
    asks_for_many: bool
    # The question asks for a whole thread ("summarise everything about ...", "in what
    # order did ... progress"): its head is drawn from every session that talks about it.
    thread: bool = False
    # The question asks about the past ("where did I live before?"): superseded and expired
    # memory counts in full. Otherwise it asks for what holds now, and such memory counts
    # less than what replaced it.
    history: bool = False
    # The question asks what the assistant said ("How did you recommend ...?", "your
    # advice"): the assistant's turns are evidence in full, as the user's are.
    about_assistant: bool = False
    # The question asks about the beginning ("at the start", "when I first described"):
    # the first part of the history is looked at first (``_scoring.rank``).
    beginning: bool = False

    def chained(self, text: str) -> QueryPlan:
        """The plan of a second retrieval that searches ``text`` alone (multi-hop); the
        question's own reading (its period, the names it mentions) is kept."""
        return replace(
            self, variants=(text,), embedded=(text,), terms=(_terms(text, self.speakers),)
        )


def _words(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def _terms(text: str, speakers: Sequence[str]) -> tuple[str, ...]:
    # Speaker names are matched by the speaker signal, not as words: within one user's
    # memory a name is in half the turns, yet the index's collection-wide statistics would
    # weigh it as a rare, decisive word.
    names = {w for n in speakers for w in _words(n)}
    return tuple(t for t in fts_query_terms(text) if t.casefold() not in names)


def mentioned_names(query: str, names: Iterable[str | None]) -> frozenset[str]:
    """Speaker names that occur in the query as whole words (case-insensitive)."""
    text = query.casefold()
    found = set()
    for name in {n for n in names if n}:
        if re.search(r"(?<!\w)" + re.escape(name.casefold()) + r"(?!\w)", text):
            found.add(name)
    return frozenset(found)


# "What has John cooked?", "Which cities has Jon visited?", "Where has Melanie camped?": a
# wh-question in the present perfect sums up a person's experiences so far.
_PERFECT = re.compile(
    r"^(?:what|which|where|who|how many)\b[^?]*\b(?:has|have)\s+(?:\w+\s+)?"
    r"\w+(?:ed|en|ne|wn|ught|ade|id|ent|one|ook|ung|ad|et)\b",
    re.IGNORECASE,
)
# "What books did Melanie read?", "Which events does Caroline attend?": a plural noun
# right after the wh-word.
_PLURAL_WH = re.compile(
    r"^(?:what|which)\s+(?:\w+\s+){0,2}?\w+s\s+(?:has|have|did|does|do|is|are|were)\b",
    re.IGNORECASE,
)
# "How many times ...", "the order of the concerts I attended", "in total", "all the":
# counting and ordering need every occurrence.
_COUNTED = re.compile(
    r"^how many\b|\border of\b|\bin total\b|\bfrom (?:the )?earliest\b|\ball the\b",
    re.IGNORECASE,
)

# "What do Jon and Gina both have in common?", "In what ways is Caroline participating ...?":
# what two people share, or the several ways something was done, was said at several times.
_SHARED = re.compile(r"\bboth\b|\bin common\b|\bwhat ways\b", re.IGNORECASE)


def asks_for_many(query: str) -> bool:
    """Whether the question asks for several things (English question shapes only).

    On the development sets this picks half of LoCoMo's multi-hop questions (101 of 172) and
    8% of its single-hop ones (41 of 480), and half of LongMemEval-S's multi-session (13 of
    23) and temporal-reasoning (11 of 22) ones."""
    text = query.strip()
    return any(p.search(text) for p in (_PERFECT, _PLURAL_WH, _COUNTED, _SHARED))


# "Where did I live before?", "What did I use to drive?", "How many times did I move?",
# "Have I ever ...?", "What was my first car?": the question is about the past, so what no
# longer holds is evidence like the rest. Anything else asks for what holds now.
_HISTORY = re.compile(
    r"\b(?:before|previous(?:ly)?|formerly|former|used to|use to|originally|original"
    r"|initial(?:ly)?|at first|in the past|ever|earlier|old|older|history|anymore|any more"
    r"|no longer|first|how many times|how often|changed?|switch(?:ed)?|since when"
    # asked in the past tense: what happened then, not what holds now
    r"|did|was|were|had)\b"
    r"|以前|之前|原来|曾经|过去",
    re.IGNORECASE,
)


# "What exact error message did I mention ...?", "Which versions did I say I was using?",
# "How did you recommend ...?": the question asks for the conversation's own record (what
# was said), not for work a standing instruction would shape.
_RECORD = re.compile(
    r"\b(?:did|have|had)\s+(?:i|you|we)\s+(?:\w+\s+)?(?:say|mention|tell|recommend|suggest"
    r"|describe|share|state|note)\b|\b(?:i|you|we)\s+(?:said|mentioned|told|recommended"
    r"|suggested|described)\b",
    re.IGNORECASE,
)


# "How did you recommend ...?", "the solutions you suggested", "your advice": what the
# assistant said, not work asked of it now ("What would you suggest?").
_ASSISTANT_SAID = re.compile(
    r"\b(?:did|have|had)\s+you\s+(?:\w+\s+)?(?:say|mention|tell|recommend|suggest|advise"
    r"|propose|explain|describe|give|show|share)\b|\byou\s+(?:said|mentioned|told|recommended"
    r"|suggested|advised|proposed|explained|described|gave|showed|shared|wrote|provided)\b"
    r"|\byour\s+(?:advice|recommendations?|suggestions?|answers?|explanations?|examples?)\b",
    re.IGNORECASE,
)


def asks_about_assistant(query: str) -> bool:
    """Whether the question asks what the assistant said (English shapes)."""
    return bool(_ASSISTANT_SAID.search(query))


# "at the start", "initially", "when I first described ...": how things were at first.
_BEGINNING = re.compile(
    r"\b(?:at|in|from) the (?:very )?(?:start|beginning|outset)\b|\binitial(?:ly)?\b"
    r"|\boriginally\b|\bwhen (?:i|we) (?:first|started|began)\b|\bfirst (?:described|mentioned"
    r"|said|told|set up|started)\b|\bto (?:start|begin) (?:my|the|our|this)\b",
    re.IGNORECASE,
)


def asks_about_beginning(query: str) -> bool:
    """Whether the question asks about how things were at the beginning (English)."""
    return bool(_BEGINNING.search(query))


def asks_for_record(query: str) -> bool:
    """Whether the question asks what was said in the conversation (English shapes)."""
    return bool(_RECORD.search(query))


def asks_about_history(query: str) -> bool:
    """Whether the question asks about the past (what held before, how things changed),
    so superseded and expired memory is evidence like the rest."""
    return bool(_HISTORY.search(query))


# "Summarise everything about the authentication system", "In what order did my discussions
# of message storage progress?", "Walk me through ... throughout our conversations": the
# answer is a thread of many turns over the history, not the few most similar ones.
_THREAD = re.compile(
    r"\bsummar(?:y|ise|ize|ies|ising|izing)\b"
    # the order a subject went in ("in what order did I bring up ..."); not "the order of
    # the three events: ...", which names its things and is asked for each of them
    r"|\b(?:in (?:what|which) order|the order in which|in (?:chronological )?order)\b"
    r"|\bhow (?:did|has|have)\b[^?]*\b(?:progress|evolve|develop)\b|\b(?:progressed|evolved)\b"
    r"|\bthroughout\b|\bacross (?:our|my|the|all|different) (?:\w+ )?(?:conversations|sessions"
    r"|chats|discussions)\b|\bfrom start to finish\b|\bover time\b",
    re.IGNORECASE,
)
# Words that say how a thread question wants its answer, not what it is about.
_THREAD_SCAFFOLD = frozenset(
    """can could would you me give provide list walk through tell a an the of in on about
    to for and or with that which what how did do does i my we our us summary summarise
    summarize summarising summarizing summaries thorough detailed comprehensive brief short
    full entire whole overall everything all scope order ordered chronological brought up
    bring discussed discussion discussions conversation conversations session sessions
    different aspects aspect items item mention mentioned progress progressed
    progression evolve evolved evolving throughout across over time start finish
    beginning end process covering cover covered including include key main points point
    challenges solutions improvements developments enhancements best practices came come
    learned went go topic things thing various""".split()  # noqa: SIM905
)


def asks_for_thread(query: str) -> bool:
    """Whether the question asks for a whole thread: a summary of a subject or how it went
    over time (English question shapes only)."""
    return bool(_THREAD.search(query))


def thread_subject(query: str) -> str | None:
    """What a thread question is about: its words without those that only say how the
    answer should be given ("Can you give me a thorough summary of everything involved in
    securing the authentication system?" -> "involved securing authentication system");
    ``None`` when nothing is left."""
    words = [w for w in re.findall(r"[\w'’.-]+", query) if w.casefold() not in _THREAD_SCAFFOLD]
    words = [w for w in words if not w.isdigit()]
    return " ".join(words) if len(words) >= 2 else None


# "Would Caroline pursue writing as a career?", "What would Melanie likely enjoy?": a
# question asking what a person would do or be is answered by anything they said about
# themselves, whatever its words.
_HYPOTHETICAL = re.compile(r"\b(?:would|likely|unlikely|might|probably|possibly)\b", re.IGNORECASE)


def _embedded(query: str, named: frozenset[str]) -> str:
    """The text embedded for ``query``: a hypothetical question without the speakers it
    names. In a short question the name is much of the vector, and every turn of that
    speaker carries it (``embedding_text``), so it lifts all their turns alike and leaves
    the subject less weight; the speaker signal still prefers their turns, and full text
    never matched names."""
    if not named or not _HYPOTHETICAL.search(query):
        return query
    text = query
    for name in named:
        text = re.sub(
            r"(?<!\w)" + re.escape(name) + r"(?:['’]s)?(?!\w)", "", text, flags=re.IGNORECASE
        )
    text = re.sub(r"\s+(?=[?.!,;:])", "", " ".join(text.split()))
    return text if _WORD.search(text) else query


def _layers(options: SearchOptions, filters: SearchFilters) -> tuple[str, ...]:
    # Message-level filters (session, role, event type, time, metadata) describe messages:
    # derived layers take part only without them.
    if filters.empty:
        return options.layers
    return tuple(layer for layer in options.layers if layer == "message")


def plan_query(
    query: str,
    *,
    project_id: str,
    user_id: str,
    filters: SearchFilters,
    options: SearchOptions,
    limit: int,
    speakers: Sequence[str],
    excluded: int = 0,
    carried: int = 0,
    locate: Callable[[str, SearchOptions], datetime | None],
) -> QueryPlan:
    """Read ``query`` once into a plan. ``excluded`` message ids and ``carried`` texts will
    be passed over, so more candidates are taken; ``locate(event, options)`` finds when an
    event the query is relative to was talked about (a search of its own)."""
    as_of = options.as_of or utcnow()
    options = replace(options, as_of=as_of)
    intent = parse_time_intent(query, as_of)
    variants = [query]
    thread = asks_for_thread(query)
    subject = thread_subject(query) if thread else None
    if subject is not None:
        variants.append(subject)
    if options.router == "single_hop_parallel":
        variants += [r.text for r in rewrite_query(query)]
    n = options.per_layer or max(60, limit * 2) + excluded
    # The prompt's own turns are likely among the best candidates (the same conversation):
    # as many more candidates as they could take, at most twice as many in all.
    n += min(carried, n)
    window = intent.window
    if window is None and intent.relation and intent.anchor:
        at = locate(intent.anchor, options)
        if at is not None:
            window = (_EPOCH, at) if intent.relation == "before" else (at, as_of)
    summary_statuses: tuple[str, ...] = CURRENT_SUMMARY
    fact_statuses: tuple[str, ...] = ("active",)
    if options.include_superseded:
        summary_statuses, fact_statuses = (*CURRENT_SUMMARY, "superseded"), ("active", "superseded")
    named = mentioned_names(query, speakers)
    terms = [_terms(v, speakers) for v in variants]
    if subject is not None:
        # The subject's words are the question's own, and the question's full text matches
        # each of them already: the subject is searched by its vector alone. Its own
        # statements doubled a thread question's full text, the slowest part of a search
        # in a long history (docs/recall.md, questions about a whole thread).
        terms[1] = ()
    return QueryPlan(
        project_id=project_id,
        user_id=user_id,
        filters=filters,
        options=options,
        query=query,
        as_of=as_of,
        intent=intent,
        window=window,
        variants=tuple(variants),
        embedded=(_embedded(query, named), *variants[1:]),
        terms=tuple(terms),
        speakers=tuple(speakers),
        named=named,
        layers=_layers(options, filters),
        summary_statuses=summary_statuses,
        fact_statuses=fact_statuses,
        per_layer=n,
        asks_for_many=asks_for_many(query),
        thread=thread,
        history=thread or asks_about_history(query),
        about_assistant=asks_about_assistant(query),
        beginning=not thread and intent.window is None and asks_about_beginning(query),
    )

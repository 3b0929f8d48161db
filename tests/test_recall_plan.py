"""The recall's first stage: the question read once into a plan that every later stage
takes (docs/recall.md, "The stages")."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

import dbsql
from stratamem import Memory
from stratamem.recall import _plan, _select
from stratamem.recall._plan import SearchOptions, plan_query
from stratamem.store import SearchFilters

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=timezone.utc)


def _plan_of(query: str, **kw: Any) -> _plan.QueryPlan:
    args: dict[str, Any] = {
        "project_id": "p",
        "user_id": "u",
        "filters": SearchFilters(),
        "options": SearchOptions(as_of=NOW),
        "limit": 10,
        "speakers": ("Caroline", "Melanie"),
        "locate": lambda event, options: None,
    }
    args.update(kw)
    return plan_query(query, **args)


def test_a_named_period_is_the_window_and_names_are_read_once() -> None:
    plan = _plan_of("What did Caroline buy last week?")
    # 2026-06-15 is a Monday: last week is the calendar week before.
    assert plan.window == (
        datetime(2026, 6, 8, tzinfo=timezone.utc),
        datetime(2026, 6, 15, tzinfo=timezone.utc),
    )
    assert plan.named == {"Caroline"}
    # A speaker's name is matched by the speaker signal, not as a full-text term.
    assert "caroline" not in {t.casefold() for t in plan.terms[0]}
    assert "buy" in plan.terms[0]
    assert plan.variants == ("What did Caroline buy last week?",)


def test_an_event_the_question_is_relative_to_is_located_once() -> None:
    asked: list[tuple[str, datetime | None]] = []
    moved = datetime(2026, 3, 1, tzinfo=timezone.utc)

    def locate(event: str, options: SearchOptions) -> datetime | None:
        asked.append((event, options.as_of))
        return moved

    before = _plan_of("What did I do before the move?", locate=locate)
    assert asked == [("the move", NOW)]
    assert before.window == (datetime(1970, 1, 1, tzinfo=timezone.utc), moved)
    after = _plan_of("What did I do after the move?", locate=locate)
    assert after.window == (moved, NOW)
    # An event that cannot be found leaves the question without a window.
    assert _plan_of("What did I do after the move?").window is None


def test_router_layers_statuses_and_candidate_counts() -> None:
    direct = _plan_of("When did Melanie paint a sunrise?")
    assert len(direct.variants) == 1
    parallel = _plan_of(
        "When did Melanie paint a sunrise?",
        options=SearchOptions(as_of=NOW, router="single_hop_parallel"),
    )
    assert parallel.variants[0] == "When did Melanie paint a sunrise?"
    assert len(parallel.variants) > 1 and len(parallel.terms) == len(parallel.variants)
    assert direct.per_layer == 60
    assert _plan_of("x", limit=50, excluded=5).per_layer == 105
    # Carried texts add as many candidates, at most doubling them.
    assert _plan_of("x", carried=500).per_layer == 120
    assert _plan_of("x", options=SearchOptions(as_of=NOW, per_layer=7)).per_layer == 7
    filtered = _plan_of("x", filters=SearchFilters(session_id="s1"))
    assert filtered.layers == ("message",)
    assert "superseded" not in direct.fact_statuses
    wide = _plan_of("x", options=SearchOptions(as_of=NOW, include_superseded=True))
    assert "superseded" in wide.fact_statuses and "superseded" in wide.summary_statuses


def test_a_chained_plan_searches_new_text_with_the_question_reading_kept() -> None:
    plan = _plan_of("What did Caroline buy last week?")
    second = plan.chained("What did Caroline buy last week? a red bike from Melanie")
    assert second.variants == ("What did Caroline buy last week? a red bike from Melanie",)
    assert "bike" in second.terms[0] and "melanie" not in {t.casefold() for t in second.terms[0]}
    assert second.window == plan.window and second.named == plan.named


def test_a_search_reads_the_question_once(
    monkeypatch: pytest.MonkeyPatch, make_memory: Any
) -> None:
    """The stages after the plan never parse the query again: one time reading and one
    rewrite per search, also with chaining (whose second retrieval reuses the plan)."""
    mem: Memory = make_memory()
    s = mem.sessions.create(user_id="alex", session_id="chat")
    s.add_messages(
        [
            {"role": "user", "content": "I moved to Berlin in March.", "timestamp": "2026-03-02"},
            {
                "role": "user",
                "content": "My sister Maya visited in May.",
                "timestamp": "2026-05-02",
            },
        ],
        sync=True,
    )
    calls = {"time": 0, "rewrite": 0}
    parse, rewrite = _plan.parse_time_intent, _plan.rewrite_query

    def counted_parse(query: str, now: datetime) -> Any:
        calls["time"] += 1
        return parse(query, now)

    def counted_rewrite(query: str) -> Any:
        calls["rewrite"] += 1
        return rewrite(query)

    monkeypatch.setattr(_plan, "parse_time_intent", counted_parse)
    monkeypatch.setattr(_plan, "rewrite_query", counted_rewrite)
    for router in ("multi_hop_chain", "single_hop_parallel"):
        calls.update(time=0, rewrite=0)
        hits = mem.search(
            "Who visited me last month?",
            user_id="alex",
            as_of="2026-06-10",
            recall_config={"query_router": router},
        )
        assert "Maya" in hits[0].text
        assert calls == {"time": 1, "rewrite": int(router == "single_hop_parallel")}


@pytest.mark.parametrize(
    ("question", "embedded"),
    [
        # what a person would do or be: the name leaves the vector (it is in all their turns)
        ("Would Caroline pursue writing as a career?", "Would pursue writing as a career?"),
        (
            "What would Caroline's political leaning likely be?",
            "What would political leaning likely be?",
        ),
        ("Would Melanie and caroline enjoy a theme park?", "Would and enjoy a theme park?"),
        # anything else is embedded as asked
        ("What did Caroline buy last week?", "What did Caroline buy last week?"),
        ("Would I like Rome?", "Would I like Rome?"),  # names no speaker
        ("Would Caroline?", "Would?"),
    ],
)
def test_a_hypothetical_question_is_embedded_without_the_names(
    question: str, embedded: str
) -> None:
    plan = _plan_of(question)
    assert plan.embedded == (embedded,)
    # Full text and the speaker signal still read the question as asked.
    assert plan.variants == (question,)
    assert plan.named == _plan.mentioned_names(question, ("Caroline", "Melanie"))
    assert plan.chained("a red bike").embedded == ("a red bike",)


def test_search_embeds_the_planned_text(make_memory: Any) -> None:
    """The retrieval stage embeds ``plan.embedded``, not the raw question."""
    from stratamem.embed.hashing import HashingEmbedder

    seen: list[str] = []

    class Recording(HashingEmbedder):
        def embed(self, texts: Any) -> Any:
            seen.extend(texts)
            return super().embed(texts)

    mem: Memory = make_memory(embedder=Recording())
    s = mem.sessions.create(user_id="u", session_id="chat")
    s.add_messages(
        [{"role": "user", "name": "Caroline", "content": "I love writing poems."}], sync=True
    )
    seen.clear()
    mem.search("Would Caroline pursue writing as a career?", user_id="u")
    assert "Would pursue writing as a career?" in seen
    assert "Would Caroline pursue writing as a career?" not in seen


@pytest.mark.parametrize(
    ("question", "many"),
    [
        ("What has John cooked?", True),
        ("Which cities has Jon visited?", True),
        ("What LGBTQ+ events has Caroline participated in?", True),
        ("What books did Melanie read?", True),
        ("Which events does Caroline attend?", True),
        ("How many times has Melanie gone to the beach?", True),
        ("Where has Melanie camped?", True),
        ("Who have I met at the climbing gym?", True),
        ("Who is Caroline?", False),
        ("What do Jon and Gina both have in common?", True),
        ("In what ways is Caroline participating in the LGBTQ community?", True),
        ("What is the order of the six museums I visited from earliest to latest?", True),
        ("How many weeks in total did I spend reading?", True),
        ("When did Caroline go to the support group?", False),
        ("What did Melanie paint last year?", False),
        ("Where does the user live?", False),
        ("Has John ever visited Rome?", False),
        ("会议是什么时候？", False),
    ],
)
def test_questions_asking_for_several_things(question: str, many: bool) -> None:
    assert _plan.asks_for_many(question) is many
    assert _plan_of(question).asks_for_many is many


def _turns(session: str, day: str, texts: list[str]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "name": "John", "content": t, "timestamp": f"{day}T10:0{i}:00Z"}
        for i, t in enumerate(texts)
    ]


def test_hits_for_several_things_spread_over_sessions(
    make_memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One session talks about cooking at length, another mentions one more dish: asked
    for everything John cooked, the second session's turn comes before the first
    session's third; without the spread it would come after."""
    mem: Memory = make_memory()
    long = mem.sessions.create(user_id="john", session_id="pasta-night")
    long.add_messages(
        _turns(
            "pasta-night",
            "2026-03-02",
            [
                "I cooked pasta carbonara tonight, the cooking took an hour.",
                "Cooking the pasta sauce with guanciale was the best part of cooking it.",
                "I cooked a pasta bake for cooking class, so much cooking.",
                "Cooking pasta again tomorrow, I cooked it twice this week.",
            ],
        ),
        sync=True,
    )
    short = mem.sessions.create(user_id="john", session_id="curry-day")
    short.add_messages(_turns("curry-day", "2026-04-10", ["I have cooked a curry."]), sync=True)

    def first_sessions() -> list[str | None]:
        hits = mem.search("What has John cooked?", user_id="john", layers=["message"], limit=5)
        return [h.session_id for h in hits][:3]

    assert "curry-day" in first_sessions()
    monkeypatch.setattr(_select, "SESSION_SPREAD", 0.0)
    assert first_sessions() == ["pasta-night"] * 3


@pytest.mark.parametrize(
    ("question", "thread", "subject"),
    [
        (
            "Can you give me a thorough summary of everything involved in securing the "
            "authentication system, covering all the challenges and solutions?",
            True,
            "involved securing authentication system",
        ),
        (
            "How did my discussions about managing message data in the chat app progress?",
            True,
            "managing message data chat app",
        ),
        (
            "Can you list the order in which I brought up different aspects of my resume "
            "analyzer project throughout our conversations (mention 10 items)?",
            True,
            "resume analyzer project",
        ),
        ("Summarize what we said about Redis.", True, "said Redis."),
        # the things are named: each is asked for (asks_for_many), no thread
        ("What is the order of the three events: 'A', 'B' and 'C'?", False, None),
        ("What did Jon say about Gina's progress with her store?", False, None),
        ("Where does the user live?", False, None),
    ],
)
def test_questions_asking_for_a_thread(question: str, thread: bool, subject: str | None) -> None:
    plan = _plan_of(question)
    assert _plan.asks_for_thread(question) is thread and plan.thread is thread
    assert _plan.thread_subject(question) == subject if thread else True
    # The subject is searched beside the question: it is what the thread is about. By its
    # vector only: its words are among the question's, whose full text matches them.
    assert plan.variants == ((question, subject) if thread else (question,))
    assert len(plan.terms) == len(plan.variants) and plan.terms[0]
    assert plan.terms[1:] == (((),) if thread else ())


def test_a_thread_question_draws_its_head_from_every_session_earliest_first(
    make_memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three sessions talk about the login tokens, the later two at length and more like
    the question; asked for a summary of the thread, the head holds one turn of each
    session in the order they took place before any second turn of one, and nothing of
    the session about something else. Without the thread path the later sessions fill
    the head."""
    mem: Memory = make_memory()
    for session, day, texts in [
        ("jan", "2026-01-05", ["I set the JWT login token expiry to one hour."]),
        (
            "feb",
            "2026-02-10",
            [
                "The JWT login token verification fails in Socket.io middleware.",
                "I added JWT login token verification with a clock tolerance.",
                "Refresh tokens for the JWT login now rotate on every use.",
            ],
        ),
        (
            "mar",
            "2026-03-15",
            [
                "I moved the JWT login token secret to an environment variable.",
                "The JWT login token secret now lives in the vault.",
            ],
        ),
        ("apr", "2026-04-01", ["We booked a table at the Italian place for Friday."]),
    ]:
        mem.sessions.create(user_id="john", session_id=session).add_messages(
            _turns(session, day, texts), sync=True
        )
    question = "Can you summarize how my JWT login token work went throughout our conversations?"

    def head() -> list[str | None]:
        hits = mem.search(question, user_id="john", layers=["message"], limit=8)
        return [h.session_id for h in hits]

    assert head()[:5] == ["jan", "feb", "mar", "feb", "mar"] and head()[-1] == "apr"
    monkeypatch.setattr(_plan, "asks_for_thread", lambda query: False)
    assert head()[:4] == ["feb", "mar", "mar", "feb"]


@pytest.mark.parametrize(
    ("question", "history"),
    [
        ("Where does the user live now?", False),
        ("What car do I drive?", False),
        ("What is my favourite coffee shop?", False),
        ("Where did I live before?", True),
        ("What car did I use to drive?", True),
        ("How many times did I move?", True),
        ("Have I ever been to Rome?", True),
        ("What was my first job?", True),
        ("我以前住在哪里？", True),
    ],
)
def test_questions_about_the_past(question: str, history: bool) -> None:
    assert _plan.asks_about_history(question) is history
    assert _plan_of(question).history is history


def test_small_talk_counts_less(make_memory: Any) -> None:
    """A turn that is small talk as a whole carries the ``small_talk`` signal and counts
    0.8, from the moment it is stored (no processing needed), whoever said it; a turn
    with something to say, however short, does not."""
    mem: Memory = make_memory(workers=0)  # nothing is processed
    s = mem.sessions.create(user_id="nate", session_id="chat")
    s.add_messages(
        [
            {"role": "user", "content": "Take care!"},
            {"role": "user", "content": "I took my turtles to the beach in Tampa."},
            {"role": "assistant", "name": "Sam", "content": "Cool! What did it look like?"},
            {"role": "user", "content": "Pixel loves the beach."},
            {"role": "user", "name": "Nate", "content": "Nate: See ya!"},
            {"role": "user", "content": "Thanks!", "event_type": "feedback"},
        ]
    )
    hits = {h.text: h for h in mem.search("beach take care look see thanks", user_id="nate")}
    for text in ("Take care!", "Cool! What did it look like?", "Nate: See ya!"):
        assert hits[text].signals["small_talk"] == 1.0, text
        assert hits[text].signals["status_weight"] == 0.8
    for text in ("I took my turtles to the beach in Tampa.", "Pixel loves the beach.", "Thanks!"):
        assert "small_talk" not in hits[text].signals, text


def test_an_assistants_turns_count_less_unless_asked_what_it_said(make_memory: Any) -> None:
    """In a chat with an assistant (its turns unnamed) the assistant's turns count 0.8 and
    carry the ``assistant`` signal: the user's own turns hold their memory. A question
    about what the assistant said counts them in full, and so is a named speaker with the
    assistant role (one side of a two-person chat)."""
    mem: Memory = make_memory(workers=0)
    chat = mem.sessions.create(user_id="ana", session_id="chat")
    mine = "My deploy target is a Raspberry Pi 4 with 4 GB."
    advice = "For a Raspberry Pi 4 deploy I recommend quantising the model first."
    chat.add_messages([{"role": "user", "content": mine}, {"role": "assistant", "content": advice}])
    talk = mem.sessions.create(user_id="ana", session_id="talk")
    bob = "Bob deploys to a Raspberry Pi 4 as well."
    talk.add_messages([{"role": "assistant", "name": "Bob", "content": bob}])

    hits = {h.text: h for h in mem.search("Raspberry Pi 4 deploy", user_id="ana")}
    assert hits[advice].signals["status_weight"] == 0.8
    assert hits[advice].signals["assistant"] == 1.0
    for text in (mine, bob):
        assert "status_weight" not in hits[text].signals, text
        assert "assistant" not in hits[text].signals, text

    for question in (
        "What did you recommend for the Raspberry Pi 4 deploy?",
        "Which Raspberry Pi 4 deploy step did you suggest?",
        "Remind me of your advice on the Raspberry Pi 4 deploy.",
    ):
        asked = {h.text: h for h in mem.search(question, user_id="ana")}
        assert "status_weight" not in asked[advice].signals, question
        assert "assistant" not in asked[advice].signals, question


@pytest.mark.parametrize(
    ("question", "about"),
    [
        ("How did you recommend improving the way my app handles load?", True),
        ("Can you list the solutions you suggested for the login bug?", True),
        ("What was your advice on caching?", True),
        ("What approaches would you suggest for caching?", False),
        ("Can you give me a summary of my caching work?", False),
        ("What did I say about caching?", False),
    ],
)
def test_questions_about_what_the_assistant_said(question: str, about: bool) -> None:
    assert _plan.asks_about_assistant(question) is about
    assert _plan_of(question).about_assistant is about


@pytest.mark.parametrize(
    ("question", "shaped", "beginning"),
    [
        ("Which versions of the tools did I say I was using to start my project?", True, True),
        ("How many entries did I say my dataset includes at the start?", True, True),
        ("What deadline did I set for the initial deployment?", True, True),
        ("Which versions did I use when I first described my setup?", True, True),
        ("Where do I initially keep my old sneakers?", True, True),
        ("Which versions of the tools am I using?", False, False),
        # Shaped so, but a thread question, and one with a period of its own.
        ("Summarise my project from the initial setup to the final release.", True, False),
        ("What did I do at the beginning of May 2023?", True, False),
    ],
)
def test_questions_about_the_beginning(question: str, shaped: bool, beginning: bool) -> None:
    assert _plan.asks_about_beginning(question) is shaped
    assert _plan_of(question).beginning is beginning


def test_a_question_about_the_beginning_looks_at_the_start_of_the_history(
    make_memory: Any,
) -> None:
    """A question about the start puts the first tenth of the history its candidates span
    first (the ``time_window`` signal); asked without it, the latest value comes first."""
    mem: Memory = make_memory(workers=0)
    s = mem.sessions.create(user_id="kim", session_id="project")
    early = "For the resume project I am using Python 3.9."
    late = "For the resume project I am using Python 3.12 with spaCy."
    s.add_messages(
        [
            {"role": "user", "content": early, "timestamp": "2024-01-02T09:00:00Z"},
            *(
                {"role": "user", "content": text, "timestamp": f"2024-03-0{i + 1}T09:00:00Z"}
                for i, text in enumerate(
                    [
                        "The parser handles PDF files now.",
                        "I added a page for the job descriptions.",
                        "Scores are shown beside each suggestion.",
                        "My cat knocked the laptop off the desk today.",
                    ]
                )
            ),
            {"role": "user", "content": late, "timestamp": "2024-06-01T09:00:00Z"},
        ]
    )
    as_of = datetime(2024, 7, 1, tzinfo=timezone.utc)
    start = mem.search(
        "Which Python version am I using with spaCy for the resume project at the start?",
        user_id="kim",
        as_of=as_of,
    )
    assert start[0].text == early
    assert start[0].signals["time_window"] == 1.0
    now = mem.search(
        "Which Python version am I using with spaCy for the resume project?",
        user_id="kim",
        as_of=as_of,
    )
    assert now[0].text == late
    assert "time_window" not in now[0].signals


def test_a_question_another_speaker_answers_is_marked(make_memory: Any) -> None:
    """A turn ending with a question mark whose next turn is another named speaker's
    carries the ``asked`` signal (its answer was lifted); a question followed by the same
    speaker, or unnamed turns (a user's own questions to an assistant), are not marked."""
    mem: Memory = make_memory(workers=0)
    s = mem.sessions.create(user_id="ann", session_id="trip")
    s.add_messages(
        [
            {"role": "user", "name": "Ann", "content": "Where did you go on that road trip?"},
            {"role": "assistant", "name": "Bob", "content": "We drove up the coast road."},
            {"role": "assistant", "name": "Bob", "content": "Did you like the coast trip?"},
            {"role": "assistant", "name": "Bob", "content": "The coast trip was long."},
            {"role": "user", "content": "Which road trip should I take?"},
            {"role": "assistant", "content": "The coast road trip."},
        ]
    )
    hits = {h.text: h for h in mem.search("road trip coast", user_id="ann", limit=20)}
    assert hits["Where did you go on that road trip?"].signals.get("asked") == 1.0
    for text in (
        "We drove up the coast road.",
        "Did you like the coast trip?",
        "Which road trip should I take?",
    ):
        assert "asked" not in hits[text].signals, text


def test_a_turn_is_judged_to_ask_when_it_is_stored(make_memory: Any) -> None:
    """Whether a turn asks (its text ends with a question mark, trailing whitespace aside,
    the full-width one included) is judged once when it is stored; an event is not a turn."""
    mem: Memory = make_memory(workers=0)
    s = mem.sessions.create(user_id="ann", session_id="asks")
    expected = {
        "Where did you go?  ": True,
        "Where did you go?\n": True,
        "?": True,
        "你去哪儿了？": True,
        "Why? We went to Rome.": False,
        "We went to Rome.": False,
    }
    sent = [{"role": "user", "content": text} for text in expected]
    sent.append({"role": "user", "content": "Was it useful?", "event_type": "feedback"})
    ids = s.add_messages(sent).message_ids
    rows = mem.store.get_messages("default", ids)
    assert {rows[i].content: rows[i].asks for i in ids} == {**expected, "Was it useful?": False}


def test_turns_stored_before_the_mark_existed_are_judged_by_the_upgrade(
    backend: str, db_url: str, make_memory: Any
) -> None:
    """The migration that adds the mark judges the turns already stored the same way, so
    an upgraded database keeps lifting answers to its old questions."""
    if backend == "postgres":
        from stratamem.store.postgres import PostgresStore

        PostgresStore(db_url, migrate_to=8).close()
    else:
        from stratamem.store.sqlite import SQLiteStore

        SQLiteStore(db_url, migrate_to=14).close()
    long_ago = "2025-01-01T00:00:00.000000Z"
    dbsql.execute(
        db_url,
        "INSERT INTO sessions (project_id, id, user_id, metadata, created_at, updated_at) "
        "VALUES ('default', 'old-s', 'ann', '{}', ?, ?)",
        long_ago,
        long_ago,
    )
    old = {
        "old-q": ("Where did you go?  \n", None),
        "old-wide": ("你去哪儿了？", None),
        "old-a": ("We went to Rome. Why?  Because.", None),
        "old-event": ("Was it useful?", "feedback"),
    }
    # PostgreSQL keeps the full-text document in the row (SQLite in its own table).
    fts = (
        (", fts, fts_len", ", to_tsvector('simple', ''), 0") if backend == "postgres" else ("", "")
    )
    for i, (mid, (text, event)) in enumerate(old.items()):
        dbsql.execute(
            db_url,
            "INSERT INTO messages (project_id, id, user_id, session_id, role, content, "
            f"content_hash, ts, event_type, metadata, created_at{fts[0]}) "
            f"VALUES ('default', ?, 'ann', 'old-s', 'user', ?, 'h', ?, ?, '{{}}', ?{fts[1]})",
            mid,
            text,
            f"2025-01-01T00:00:0{i}.000000Z",
            event,
            long_ago,
        )
    mem: Memory = make_memory(workers=0)
    rows = mem.store.get_messages("default", list(old))
    assert {mid: rows[mid].asks for mid in old} == {
        "old-q": True,
        "old-wide": True,
        "old-a": False,
        "old-event": False,
    }


def test_a_long_turn_is_as_close_as_its_closest_fact(make_memory: Any, local_embedder: Any) -> None:
    """The embedder reads the first few hundred words of a turn: a long turn whose answer is
    at its end is found through the fact drawn from that sentence, whose similarity it takes
    (here above a short turn about another deadline)."""
    mem: Memory = make_memory(embedder=local_embedder)
    setup = " ".join(
        f"Step {i}: the Dockerfile copies package.json, runs npm install and builds the app."
        for i in range(40)
    )
    s = mem.sessions.create(user_id="u", session_id="s")
    s.add_messages(
        [
            {
                "id": "long",
                "role": "user",
                "content": f"{setup} My deployment deadline is March 1.",
            },
            {"id": "short", "role": "user", "content": "The design review is due in May."},
        ],
        sync=True,
    )
    hits = mem.search("When is my deployment deadline?", user_id="u", limit=10)
    turns = [h for h in hits if h.layer == "message"]
    fact = next(h for h in hits if h.layer != "message" and "March 1" in h.text)
    assert [h.id for h in turns][:1] == ["long"], [(h.id, h.signals) for h in turns]
    assert turns[0].signals["vector"] >= fact.signals["vector"] - 1e-6

"""Every public entry point rejects bad input with a clear error and writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stratamem import ConfigError, ConflictError, Memory, NotFoundError, StoreError, ValidationError
from stratamem.types import Session

GOOD = {"role": "user", "content": "I moved to Berlin", "timestamp": "2026-04-24T10:30:00Z"}


def _count(mem: Memory) -> int:
    return sum(mem.stats()["messages"].values())


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"content": "hi"}, "messages[1].role: Field required"),
        ({"role": "user"}, "messages[1].content: Field required"),
        ({"role": "user", "content": "   "}, "messages[1].content: Value error, must not be blank"),
        ({"role": "user", "content": ""}, "messages[1].content: String should have at least 1"),
        ({"role": "bot", "content": "hi"}, "messages[1].role: must be one of 'user', 'assistant'"),
        ({"role": "user", "content": "hi", "timestamp": "yesterday"}, "messages[1].timestamp"),
        ({"role": "user", "content": "hi", "timestamp": "2026-13-40T00:00:00Z"}, "timestamp"),
        # Valid ISO times whose UTC instant falls outside years 1-9999.
        (
            {"role": "user", "content": "hi", "timestamp": "0001-01-01T00:00:00+05:00"},
            "out of range",
        ),
        (
            {"role": "user", "content": "hi", "timestamp": "9999-12-31T23:59:00-05:00"},
            "out of range",
        ),
        ({"role": "user", "content": 42}, "messages[1].content: Input should be a valid string"),
        ({"role": "user", "content": ["a"]}, "messages[1].content: Input should be a valid str"),
        ({"role": "user", "content": "hi", "metadata": ["x"]}, "messages[1].metadata"),
        ({"role": "user", "content": "hi", "id": "has space"}, "messages[1].id: String should"),
        ({"role": "user", "content": "hi", "id": 7}, "messages[1].id: Input should be a valid"),
        ({"role": "user", "content": "hi", "colour": "red"}, "messages[1].colour: unknown field"),
        ({"role": "user", "content": "a\x00b"}, "NUL"),
        # PostgreSQL text cannot hold NUL: refused on every store alike.
        ({"role": "user", "content": "hi", "page": "/a\x00"}, "messages[1].page: Value error"),
        ({"role": "user", "content": "hi", "name": "A\x00"}, "messages[1].name: Value error"),
        ({"role": "user", "content": "hi", "event_type": "\x00"}, "messages[1].event_type"),
        ({"role": "user", "content": "hi", "metadata": {"a": ["\x00"]}}, "NUL characters"),
        ({"role": "user", "content": "hi", "metadata": {"\x00": 1}}, "NUL characters"),
        ({"role": "user", "content": "hi", "event_type": ""}, "messages[1].event_type"),
        ("just a string", "messages[1]: Input should be a valid dictionary"),
    ],
)
def test_bad_message_is_rejected_and_nothing_is_written(
    mem: Memory, bad: Any, expected: str
) -> None:
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError) as info:
        s.add_messages([GOOD, bad])
    assert expected in str(info.value), str(info.value)
    assert "nothing was stored" in str(info.value)
    assert _count(mem) == 0  # the good first message was not half-written either


def test_oversized_content_and_metadata(make_memory: Any) -> None:
    mem = make_memory(max_content_chars=100, max_metadata_bytes=64)
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError, match=r"content: 101 characters; the limit is 100"):
        s.add_messages([{"role": "user", "content": "x" * 101}])
    with pytest.raises(ValidationError, match=r"metadata: .* bytes of JSON; the limit is 64"):
        s.add_messages([{"role": "user", "content": "x", "metadata": {"k": "v" * 100}}])
    s.add_messages([{"role": "user", "content": "x" * 100}])
    assert _count(mem) == 1


def test_every_problem_is_reported_at_once(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError) as info:
        s.add_messages([{"role": "x", "content": 1}, {"content": "ok"}])
    assert len(info.value.problems) == 3
    assert isinstance(info.value, ValueError)  # plain-Python callers can catch ValueError


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([], "the list is empty"),
        ("hello", "expected a list"),
        ({"role": "user", "content": "x"}, "expected a list"),
        (None, "expected a list"),
    ],
)
def test_messages_must_be_a_non_empty_list(mem: Memory, messages: Any, expected: str) -> None:
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError, match=expected):
        s.add_messages(messages)


def test_too_many_messages_in_one_call(make_memory: Any) -> None:
    mem = make_memory(max_messages_per_call=3)
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError, match="4 in one call; the limit is 3"):
        s.add_messages([GOOD] * 4)


def test_repeated_id_within_one_call(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError, match=r"messages\[1\].id: 'a' repeats messages\[0\]"):
        s.add_messages([{**GOOD, "id": "a"}, {**GOOD, "id": "a", "content": "other"}])


def test_resent_id_with_other_content_is_a_conflict(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    s.add_messages([{**GOOD, "id": "m1"}])
    with pytest.raises(ConflictError, match="different content"):
        s.add_messages([{**GOOD, "id": "m2"}, {**GOOD, "id": "m1", "content": "changed"}])
    assert _count(mem) == 1  # m2 was not written either: one transaction


def test_sessions_validation(mem: Memory) -> None:
    with pytest.raises(ValidationError, match="user_id"):
        mem.sessions.create(user_id="")
    with pytest.raises(ValidationError, match="user_id"):
        mem.sessions.create(user_id=None)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="session_id"):
        mem.sessions.create(user_id="u1", session_id="a b")
    with pytest.raises(ValidationError, match="metadata: expected an object"):
        mem.sessions.create(user_id="u1", metadata=[1])  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="NUL"):
        mem.sessions.create(user_id="u1", metadata={"k": "a\x00b"})
    with pytest.raises(ValidationError, match="NUL"):
        mem.sessions.create(user_id="u1", title="a\x00b")
    # A backslash and "u0000" written out are just text.
    assert mem.sessions.create(user_id="u1", metadata={"k": "\\u0000"}).metadata == {"k": "\\u0000"}
    with pytest.raises(NotFoundError, match="no session 'nope'"):
        mem.sessions.get("nope")
    with pytest.raises(NotFoundError, match="no session"):
        mem.add_messages("nope", [GOOD])
    s = mem.sessions.create(user_id="u1", session_id="s1")
    assert mem.sessions.create(user_id="u1", session_id="s1").id == s.id  # idempotent
    with pytest.raises(ConflictError, match="another user"):
        mem.sessions.create(user_id="u2", session_id="s1")


def test_search_and_recall_validation(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError, match="query: expected a non-empty string"):
        mem.search("", user_id="u1")
    with pytest.raises(ValidationError, match="limit"):
        mem.search("x", user_id="u1", limit=0)
    with pytest.raises(ValidationError, match="since: expected an ISO-8601"):
        mem.search("x", user_id="u1", since="last spring")
    with pytest.raises(ValidationError, match="as_of: out of range"):
        mem.search("x", user_id="u1", as_of="0001-01-01T00:00:00+01:00")
    with pytest.raises(ValidationError, match="until: out of range"):
        mem.search("x", user_id="u1", until="9999-12-31T23:00:00-02:00")
    with pytest.raises(ValidationError, match="roles"):
        mem.search("x", user_id="u1", roles=["bot"])
    with pytest.raises(ValidationError, match="unknown operator"):
        mem.search("x", user_id="u1", filters={"a": {"$regex": "x"}})
    with pytest.raises(ValidationError, match="keys are letters"):
        mem.search("x", user_id="u1", filters={"a'); DROP": 1})
    with pytest.raises(ValidationError, match=r"recall_config.colour: unknown field"):
        s.get_memory("x", recall_config={"colour": 1})
    with pytest.raises(ValidationError, match=r"recall_config.topic_top_k"):
        s.get_memory("x", recall_config={"topic_top_k": -1})
    with pytest.raises(ValidationError, match="query: expected a string"):
        s.get_memory(5)  # type: ignore[arg-type]


def test_recall_config_accepts_gum_and_gumem_keys(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    s.add_messages([GOOD], sync=True)
    ctx = s.get_memory("Berlin", recall_config={"MessageRecentLimit": 0, "topic_top_k": 2})
    assert ctx.history == []
    ctx = s.get_memory("Berlin", recall_config={"message_recent_limit": 1})
    assert len(ctx.history) == 1


def test_configuration_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="workers"):
        Memory(f"sqlite:///{tmp_path}/a.db", embedder="hash", workers=-1)
    with pytest.raises(ConfigError, match=r"unknown embedder spec"):
        Memory(f"sqlite:///{tmp_path}/a.db", embedder="word2vec")
    # Nothing listens on port 1: the error names the server, never the password.
    with pytest.raises(StoreError, match=r"cannot connect to PostgreSQL") as refused:
        Memory("postgresql://ana:s3cret@127.0.0.1:1/x", embedder="hash")
    assert "s3cret" not in str(refused.value) and "ana:***@127.0.0.1:1" in str(refused.value)
    with pytest.raises(ConfigError, match="SQLite file"):
        Memory("sqlite:///:memory:", embedder="hash")
    with pytest.raises(ConfigError, match="not_an_option"):
        Memory(f"sqlite:///{tmp_path}/a.db", embedder="hash", not_an_option=1)
    monkeypatch.setenv("STRATAMEM_JOB_MAX_ATTEMPTS", "zero")
    with pytest.raises(ConfigError, match="job_max_attempts"):
        Memory(f"sqlite:///{tmp_path}/a.db", embedder="hash")


def test_environment_configures_and_arguments_win(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATAMEM_DATABASE_URL", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.setenv("STRATAMEM_EMBEDDER", "hash:64")
    monkeypatch.setenv("STRATAMEM_PROJECT_ID", "p-env")
    with Memory(workers=0) as mem:
        assert mem.store.url.endswith("env.db")
        assert mem.embedder.id == "hash:v2:64"
        assert mem.project_id == "p-env"
    with Memory(f"sqlite:///{tmp_path}/arg.db", project_id="p-arg", workers=0) as mem:
        assert mem.store.url.endswith("arg.db")
        assert mem.project_id == "p-arg"


def test_listing_validation(mem: Memory) -> None:
    with pytest.raises(ValidationError, match="limit: expected an integer from 1 to 10000"):
        mem.messages.list(limit=0)
    with pytest.raises(ValidationError, match="offset"):
        mem.sessions.list(offset=-1)
    with pytest.raises(ValidationError, match="status"):
        mem.messages.list(status="done")
    with pytest.raises(ValidationError, match="user_id"):
        mem.messages.list(user_id="a b")
    with pytest.raises(NotFoundError, match="no message"):
        mem.messages.get("missing")


def test_nul_and_non_finite_numbers_are_refused_before_any_store(mem: Memory) -> None:
    # PostgreSQL's text and JSONB cannot hold NUL, JSON has no NaN: both stores refuse them
    # up front, as a ValidationError (422 over HTTP), never a database error.
    with pytest.raises(ValidationError, match="NUL"):
        mem.projects.create("Acme\x00", project_id="acme")
    assert mem.projects.list() == []
    mem.projects.create("Acme", project_id="acme")
    with pytest.raises(ValidationError, match="NUL"):
        mem.keys.create("acme", name="ci\x00")
    with pytest.raises(ValidationError, match="NUL"):
        mem.webhooks.create(
            resource="fact", event="after_llm", target_url="https://example.com/h", name="a\x00"
        )
    s = mem.sessions.create(user_id="u1")
    with pytest.raises(ValidationError, match="not JSON"):
        s.add_messages([{"role": "user", "content": "hi", "metadata": {"x": float("nan")}}])
    s.add_messages(
        [{"role": "user", "content": "I moved to Berlin last May.", "metadata": {"x": 1.5}}],
        sync=True,
    )
    with pytest.raises(ValidationError, match="NUL"):
        mem.search("Berlin", user_id="u1", filters={"x": "a\x00"})
    with pytest.raises(ValidationError, match="finite"):
        mem.search("Berlin", user_id="u1", filters={"x": {"$gt": float("inf")}})
    assert mem.search("Berlin", user_id="u1", filters={"x": {"$gt": 1}})
    with pytest.raises(ValidationError, match="NUL"):
        mem.set_status(mem.summaries.list(user_id="u1")[0].id, "archived", reason="r\x00")
    assert _count(mem) == 1


def test_times_at_the_ends_of_the_calendar_are_stored_processed_and_recalled(mem: Memory) -> None:
    """Years before 1000 and the last days of 9999 are valid times: they are stored in the
    fixed-width format (glibc's %Y would write "159"), read back, processed (relative dates
    that would leave the calendar stay as written) and recalled at any as_of."""
    s = mem.sessions.create(user_id="u1")
    texts = ["Yesterday I moved to Berlin.", "Last year I went hiking; next year I fly to Rome."]
    stamps = ["0001-01-01T00:00:00Z", "0159-08-17T04:00:00Z", "9999-12-31T23:59:59Z"]
    for i, ts in enumerate(stamps):
        s.add_messages(
            [
                {"id": f"m{i}-{j}", "role": "user", "content": t, "timestamp": ts}
                for j, t in enumerate(texts)
            ],
            sync=True,
        )
    stored = {m.id: m for m in mem.messages.list(user_id="u1")}
    assert {m.status for m in stored.values()} == {"processed"}
    assert stored["m1-0"].timestamp.isoformat() == "0159-08-17T04:00:00+00:00"
    assert mem.messages.get("m1-0").timestamp.year == 159
    # Time filters compare the stored text: it sorts as the times do, year 159 included.
    hits = mem.search(
        "Berlin",
        user_id="u1",
        layers=["message"],
        since="0100-01-01T00:00:00Z",
        until="1000-01-01T00:00:00Z",
        as_of="9999-12-31T23:59:59Z",
    )
    assert hits and {h.id for h in hits} <= {"m1-0", "m1-1"}
    for as_of in ("0001-01-02T00:00:00Z", "9999-12-31T00:00:00Z", None):
        for query in ("where did I move last year?", "what did I do in spring?", "Berlin"):
            assert mem.search(query, user_id="u1", as_of=as_of) is not None
    assert "Berlin" in (s.get_memory("where did I move?").formatted_context or "")
    old = mem.sessions.create(user_id="u2")
    old.add_messages([{"role": "user", "content": "I moved to Rome.", "timestamp": stamps[1]}])
    assert "0159-08-17" in (old.get_memory("Rome").formatted_context or "")


# -- text every store can hold ------------------------------------------------------------

# A lone UTF-16 surrogate: a JSON "\ud800" escape decodes to it, no UTF-8 encoder takes it.
LONE = "\ud800"
MSG = {"role": "user", "content": "hello"}

# (call, the field its ValidationError must name). Each call puts LONE in one place.
UNSTORABLE: list[tuple[Any, str]] = [
    (lambda m, s: m.sessions.create(user_id=f"u{LONE}"), "user_id"),
    (lambda m, s: m.sessions.create(user_id="u2", session_id=LONE), "session_id"),
    (lambda m, s: m.sessions.create(user_id="u2", title=f"trip {LONE}"), "title"),
    (lambda m, s: m.sessions.create(user_id="u2", metadata={"a": {"b": [LONE]}}), "metadata.a.b"),
    (lambda m, s: m.sessions.create(user_id="u2", metadata={LONE: 1}), "metadata"),
    (lambda m, s: s.add_messages([{**MSG, "content": f"x {LONE}"}]), "messages[0].content"),
    (lambda m, s: s.add_messages([MSG, {**MSG, "metadata": {"k": "\udfff"}}]), "messages[1].meta"),
    (lambda m, s: s.add_messages([{**MSG, "metadata": {"k": [{LONE: 1}]}}]), "messages[0].meta"),
    (lambda m, s: s.add_messages([{**MSG, "page": LONE}]), "messages[0].page"),
    (lambda m, s: s.add_messages([{**MSG, "name": LONE}]), "messages[0].name"),
    (lambda m, s: s.add_messages([{**MSG, "event_type": LONE}]), "messages[0].event_type"),
    (lambda m, s: s.add_messages([{**MSG, "id": LONE}]), "messages[0].id"),
    (lambda m, s: s.add_messages([{**MSG, "process_id": LONE}]), "messages[0].process_id"),
    (lambda m, s: s.add_messages([{**MSG, "timestamp": LONE}]), "messages[0].timestamp"),
    (lambda m, s: m.add_messages(LONE, [MSG]), "session_id"),
    (lambda m, s: s.get_memory(f"q {LONE}"), "query"),
    (lambda m, s: s.get_memory("q", metadata_filters={"k": LONE}), "metadata_filters.k"),
    (lambda m, s: s.get_memory("q", metadata_filters={LONE: 1}), "metadata_filters"),
    (lambda m, s: m.get_memory(LONE, "q"), "session_id"),
    (lambda m, s: m.search(f"q {LONE}", user_id="u1"), "query"),
    (lambda m, s: m.search("q", user_id=LONE), "user_id"),
    (lambda m, s: m.search("q", user_id="u1", session_id=LONE), "session_id"),
    (lambda m, s: m.search("q", user_id="u1", event_types=["view", LONE]), "event_types[1]"),
    (lambda m, s: m.search("q", user_id="u1", filters={"k": {"$in": ["a", LONE]}}), "filters"),
    (lambda m, s: m.search("q", user_id="u1", filters={"k": {LONE: 1}}), "filters.k"),
    (lambda m, s: m.search("q", user_id="u1", since=LONE), "since"),
    (lambda m, s: m.facts.list(user_id="u1", metadata_filters={"k": LONE}), "metadata_filters"),
    (lambda m, s: m.summaries.list(user_id=LONE), "user_id"),
    (lambda m, s: m.summaries.list(user_id="u1", until=LONE), "until"),
    (lambda m, s: m.messages.list(session_id=LONE), "session_id"),
    (lambda m, s: m.messages.get(LONE), "message_id"),
    (lambda m, s: m.sessions.get(LONE), "session_id"),
    (lambda m, s: m.facts.get(LONE), "fact_id"),
    (lambda m, s: m.topics.get(LONE), "topic_id"),
    (lambda m, s: m.set_status("s_x", "archived", reason=f"why {LONE}"), "reason"),
    (lambda m, s: m.set_status("s_x", "archived", reason="why", actor=LONE), "actor"),
    (lambda m, s: m.forget(user_id="u1", session_id=s.id, reason=LONE), "reason"),
    (lambda m, s: m.forget(user_id="u1", message_ids=["m1", LONE]), "message_ids"),
    (lambda m, s: m.forget(user_id="u1", topic_id=LONE), "topic_id"),
    (lambda m, s: m.erase_user("u1", reason=LONE), "reason"),
    (lambda m, s: m.export_user(LONE), "user_id"),
    (
        lambda m, s: m.webhooks.create(
            resource="fact", event="after_llm", target_url=f"https://example.com/{LONE}"
        ),
        "target_url",
    ),
    (
        lambda m, s: m.webhooks.create(
            resource="fact", event="after_llm", target_url="https://example.com/h", name=LONE
        ),
        "name",
    ),
    (lambda m, s: m.webhooks.get(LONE), "hook_id"),
    (lambda m, s: m.projects.create(f"Acme {LONE}"), "name"),
    (lambda m, s: m.projects.create("Acme", project_id=LONE), "project_id"),
    (lambda m, s: m.keys.create(m.project_id, name=LONE), "name"),
    (lambda m, s: m.keys.revoke(LONE), "key_id"),
]


def _held(mem: Memory) -> dict[str, Any]:
    """Everything the store holds that a refused call could have written."""
    return {
        "messages": mem.stats()["messages"],
        "sessions": [s.id for s in mem.sessions.list()],
        "webhooks": mem.webhooks.list(),
        "projects": mem.projects.list(),
        "keys": mem.keys.list(),
        "audit": mem.audit(),
    }


@pytest.fixture(scope="module")
def refusing(module_db_url: str) -> Iterator[tuple[Memory, Session]]:
    """One store per backend for the refusal cases below: each leaves it as it was."""
    mem = Memory(module_db_url, embedder="hash")
    mem.projects.create("default", project_id=mem.project_id)
    yield mem, mem.sessions.create(user_id="u1", session_id="s1")
    mem.close(timeout=1)


@pytest.mark.parametrize(("call", "field"), UNSTORABLE)
def test_text_no_store_can_hold_is_a_validation_error_naming_the_field(
    refusing: tuple[Memory, Session], call: Any, field: str
) -> None:
    mem, s = refusing
    before = _held(mem)
    with pytest.raises(ValidationError) as info:
        call(mem, s)
    assert any(p.startswith(field) for p in info.value.problems), info.value.problems
    # The error itself can be logged or sent anywhere: what it quotes is escaped.
    str(info.value).encode("utf-8")
    assert _held(mem) == before


def test_surrogate_pairs_and_other_unicode_are_text_like_any_other(mem: Memory) -> None:
    s = mem.sessions.create(
        user_id="u1", title="Zürich 😀", metadata={"emoji": "😀", "ключ": "\ufffd"}
    )
    s.add_messages([{**MSG, "content": "I love 😀 and 中文", "metadata": {"😀": ["é"]}}])
    assert [m.metadata for m in s.messages()] == [{"😀": ["é"]}]
    assert mem.search("中文 😀", user_id="u1") is not None
    assert mem.keys.verify(f"sm_{LONE}") is None  # no key, rather than an encoding error


# -- times as numbers ---------------------------------------------------------------------

YEAR_3000 = 32_503_680_000  # above 2e10, which pydantic alone reads as milliseconds (1971)


def test_epoch_seconds_are_seconds_whatever_their_size(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u1")
    stamps = {
        "year-3000": YEAR_3000,
        "last": 253_402_300_799,
        "first": -62_135_596_800,
        "fraction": 1_700_000_000.123456,  # sub-second precision survives
        "string": "1700000000.5",  # numeric strings are seconds too (as query strings are)
    }
    s.add_messages([{**MSG, "id": k, "timestamp": v} for k, v in stamps.items()])
    got = {m.id: m.timestamp.isoformat() for m in s.messages()}
    assert got == {
        "year-3000": "3000-01-01T00:00:00+00:00",
        "last": "9999-12-31T23:59:59+00:00",
        "first": "0001-01-01T00:00:00+00:00",
        "fraction": "2023-11-14T22:13:20.123456+00:00",
        "string": "2023-11-14T22:13:20.500000+00:00",
    }
    out_of_range = (253_402_300_800, -62_135_596_801, 10**400, "253402300800", 1e300)
    for bad in (*out_of_range, True, float("nan")):
        with pytest.raises(ValidationError) as info:
            s.add_messages([{**MSG, "timestamp": bad}])
        (problem,) = info.value.problems
        assert problem.startswith("messages[0].timestamp: "), problem
        reason = (
            "years 1 to 9999" if bad in out_of_range else "boolean" if bad is True else "finite"
        )
        assert reason in problem, problem
    assert _count(mem) == len(stamps)
    # The same reading wherever a time is taken: search windows, as_of, listings.
    assert mem.search("hello", user_id="u1", layers=["message"], since=YEAR_3000)
    assert mem.facts.list(user_id="u1", until=str(YEAR_3000)) == []
    for call, field in (
        (lambda: mem.search("hello", user_id="u1", since=253_402_300_800), "since"),
        (lambda: mem.search("hello", user_id="u1", as_of=True), "as_of"),
        (lambda: mem.facts.list(user_id="u1", until=10**400), "until"),
        (lambda: mem.summaries.list(user_id="u1", since=-62_135_596_801), "since"),
    ):
        with pytest.raises(ValidationError, match=rf"\n  {field}: "):
            call()

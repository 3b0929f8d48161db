"""The query models (stratamem._queries): every field's valid and invalid values, and the
words of each refusal, which the engine, the server and the client all report."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from stratamem import ValidationError
from stratamem._checks import ID_RULE, check_id, check_paging
from stratamem._queries import (
    ContextQuery,
    ContextRequest,
    FactQuery,
    ForgetScope,
    ListQuery,
    MessageQuery,
    Query,
    SearchQuery,
    SearchRequest,
    SummaryQuery,
    arguments,
    field_path,
)
from stratamem._strings import SHOWN_CHARS, shown
from stratamem.client import ValidationError as ClientValidationError
from stratamem.types import ID_PATTERN, RecallConfig

LONE = "\ud800"
UNICODE = "must be valid Unicode text: U+D800 at position 0 is a lone UTF-16 surrogate"


def problems(model: type[Query], what: str = "q", **fields: Any) -> list[str]:
    with pytest.raises(ValidationError) as info:
        model.build(fields, what=what)
    assert str(info.value).startswith(f"invalid {what}:\n  ")
    return info.value.problems


def refused(model: type[Query], **fields: Any) -> str:
    """The one problem of ``fields``."""
    (problem,) = problems(model, **fields)
    return problem


# -- search --------------------------------------------------------------------------------

S = {"query": "where", "user_id": "u1"}


def test_search_defaults_and_conversions() -> None:
    q = SearchQuery.build(S, what="search")
    assert (q.query, q.user_id, q.limit) == ("where", "u1", 10)
    assert q.filters is q.session_id is q.since is q.roles is q.recall_config is None
    q = SearchQuery.build(
        {
            **S,
            "limit": 1000,
            "roles": ("user", "tool"),  # any sequence
            "event_types": ["view", "x" * 64],
            "layers": ("fact",),
            "since": 1_700_000_000,  # epoch seconds
            "until": "2030-01-01T00:00:00+02:00",
            "as_of": datetime(2031, 1, 1),  # naive: UTC
            "include_superseded": False,
            "filters": {"channel": {"$in": ["web"]}},
            "recall_config": {"MessageRecentLimit": 0},
        },
        what="search",
    )
    assert q.limit == 1000 and q.roles == ["user", "tool"] and q.layers == ["fact"]
    assert q.since == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert q.until == datetime(2029, 12, 31, 22, tzinfo=timezone.utc)
    assert q.as_of == datetime(2031, 1, 1, tzinfo=timezone.utc)
    assert q.include_superseded is False and q.filters == {"channel": {"$in": ["web"]}}
    assert isinstance(q.recall_config, RecallConfig)
    assert q.recall_config.model_fields_set == {"message_recent_limit"}
    config = RecallConfig(topic_top_k=1)
    assert SearchQuery.build({**S, "recall_config": config}, what="s").recall_config is config


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("query", "", "query: expected a non-empty string (got '')"),
        ("query", "   ", "query: expected a non-empty string (got '   ')"),
        ("query", 5, "query: expected a non-empty string (got 5)"),
        ("query", f"q {LONE}", "query: must be valid Unicode text: U+D800 at position 2 is"),
        ("query", "a\x00", "query: must not contain NUL characters"),
        ("user_id", "a b", f"user_id: {ID_RULE} (got 'a b')"),
        ("user_id", "u\n", f"user_id: {ID_RULE} (got 'u\\n')"),
        ("user_id", 7, f"user_id: {ID_RULE} (got 7)"),
        ("user_id", "x" * 201, f"user_id: {ID_RULE} (got 'xxx"),
        ("limit", 0, "limit: expected an integer from 1 to 1000 (got 0)"),
        ("limit", 1001, "limit: expected an integer from 1 to 1000 (got 1001)"),
        ("limit", True, "limit: expected an integer from 1 to 1000 (got True)"),
        ("limit", "5", "limit: expected an integer from 1 to 1000 (got '5')"),
        ("limit", 5.0, "limit: expected an integer from 1 to 1000 (got 5.0)"),
        ("filters", [1], "filters: expected an object (got [1])"),
        ("filters", {"k": "a\x00"}, "filters.k: must not contain NUL characters"),
        ("filters", {"k": {"$in": ["a", LONE]}}, f"filters.k.$in[1]: {UNICODE}"),
        ("filters", {"k": {LONE: 1}}, "filters.k.\\ud800: (a key) must be valid Unicode"),
        ("session_id", "", f"session_id: {ID_RULE} (got '')"),
        ("session_id", LONE, f"session_id: {ID_RULE} (got '\\ud800')"),
        ("since", "last spring", "since: expected an ISO-8601 datetime or epoch seconds"),
        ("since", LONE, "since: expected an ISO-8601 datetime or epoch seconds"),
        ("until", "9999-12-31T23:00:00-02:00", "until: out of range: the UTC time must be"),
        ("as_of", True, "as_of: expected an ISO-8601 datetime or epoch seconds, not a boolean"),
        ("as_of", 253_402_300_800, "as_of: epoch seconds out of range: 253402300800 is not"),
        ("as_of", float("nan"), "as_of: epoch seconds must be a finite number (got nan)"),
        ("roles", "user", "roles: expected a list of user, assistant, system, tool (got 'user')"),
        ("roles", ["user", "bot"], "roles[1]: expected one of user, assistant, system, tool"),
        ("event_types", "view", "event_types: expected a list of strings of 1 to 64 characters"),
        ("event_types", [""], "event_types[0]: expected a string of 1 to 64 characters"),
        ("event_types", ["x" * 65], "event_types[0]: expected a string of 1 to 64 characters"),
        ("event_types", ["view", LONE], f"event_types[1]: {UNICODE}"),
        ("layers", [], "layers: expected a non-empty list of summary, fact, message (got [])"),
        ("layers", "fact", "layers: expected a non-empty list of summary, fact, message"),
        ("layers", ["topic"], "layers[0]: expected one of summary, fact, message (got 'topic')"),
        ("include_superseded", "yes", "include_superseded: expected true or false (got 'yes')"),
        ("include_superseded", 1, "include_superseded: expected true or false (got 1)"),
        ("recall_config", [1], "recall_config: expected an object (got [1])"),
        ("recall_config", {"colour": 1}, "recall_config.colour: unknown field"),
        ("recall_config", {"topic_top_k": -1}, "recall_config.topic_top_k: Input should be"),
        ("colour", "red", "colour: unknown field"),
    ],
)
def test_search_refuses_each_field_by_name(field: str, value: Any, problem: str) -> None:
    assert refused(SearchQuery, **{**S, field: value}).startswith(problem)


def test_every_problem_of_a_search_is_reported_at_once() -> None:
    found = problems(SearchQuery, "search", query="", user_id="a b", limit=0, layers=[])
    assert [p.split(":")[0] for p in found] == ["query", "limit", "layers", "user_id"]


def test_the_query_is_bounded_by_the_engines_limit_when_given() -> None:
    q = SearchQuery.build({**S, "query": "x" * 50}, what="search")
    assert len(q.query) == 50
    with pytest.raises(ValidationError) as info:
        SearchQuery.build({**S, "query": "x" * 51}, what="search", max_chars=50)
    (problem,) = info.value.problems
    assert problem.startswith("query: too long: 51 characters; the limit is 50 (got 'xxx")
    with pytest.raises(ValidationError, match="query: too long: 11 characters"):
        ContextQuery.build({"session_id": "s", "query": "y" * 11}, what="c", max_chars=10)


def test_the_search_body_is_the_query_less_the_user() -> None:
    # The server takes the user from the path: in the body it is an unknown field.
    assert SearchRequest.build({"query": "q"}, what="search").arguments() == {
        "query": "q",
        "limit": 10,
        "filters": None,
        "session_id": None,
        "since": None,
        "until": None,
        "roles": None,
        "event_types": None,
        "as_of": None,
        "layers": None,
        "include_superseded": None,
        "recall_config": None,
    }
    assert refused(SearchRequest, query="q", user_id="u") == "user_id: unknown field"


def test_json_bodies_follow_the_same_rules() -> None:
    # Over the wire values are taken as they are too: a string is no integer or boolean.
    body = {"query": "q", "limit": 3, "since": 1_700_000_000.5, "layers": ["message"]}
    q = SearchRequest.model_validate_json(json.dumps(body))
    assert q.limit == 3 and q.since is not None and q.since.microsecond == 500_000
    for bad in ({"limit": "3"}, {"limit": True}, {"include_superseded": "true"}):
        with pytest.raises(Exception, match=next(iter(bad))):
            SearchRequest.model_validate_json(json.dumps({"query": "q", **bad}))


def test_the_openapi_schema_still_says_the_rules() -> None:
    props = SearchRequest.model_json_schema()["properties"]
    assert props["limit"]["minimum"] == 1 and props["limit"]["maximum"] == 1000
    assert props["session_id"]["anyOf"][0] == {"type": "string", "pattern": ID_PATTERN}
    assert props["roles"]["anyOf"][0]["items"]["enum"] == ["user", "assistant", "system", "tool"]
    assert props["layers"]["anyOf"][0]["minItems"] == 1
    assert props["include_superseded"]["anyOf"][0] == {"type": "boolean"}
    forget = ForgetScope.model_json_schema()
    assert forget["required"] == ["user_id"] and forget["additionalProperties"] is False
    assert forget["properties"]["reason"]["anyOf"][0]["maxLength"] == 2000


# -- context -------------------------------------------------------------------------------


def test_context_defaults_and_gumems_metadata_filters() -> None:
    q = ContextQuery.build({"session_id": "s1"}, what="get_memory")
    assert (q.session_id, q.query, q.details, q.recall_config, q.metadata_filters) == (
        "s1",
        None,
        False,
        None,
        None,
    )
    assert ContextQuery.build({"session_id": "s1", "query": ""}, what="c").query == ""
    # GUMem puts MetadataFilters inside the recall config: they are metadata filters, and
    # the explicit metadata_filters win over them key by key.
    q = ContextQuery.build(
        {
            "session_id": "s1",
            "recall_config": {"MetadataFilters": {"a": 1, "b": 2}, "TopicTopK": 2},
            "metadata_filters": {"b": 3},
        },
        what="get_memory",
    )
    assert q.metadata_filters == {"a": 1, "b": 3}
    assert q.recall_config is not None and q.recall_config.topic_top_k == 2
    q = ContextQuery.build(
        {"session_id": "s1", "recall_config": {"metadata_filters": {"a": 1}}}, what="c"
    )
    assert q.recall_config is None and q.metadata_filters == {"a": 1}
    # The server's body: query and details may come from the query string instead.
    body = ContextRequest.build({}, what="context")
    assert body.query is None and body.details is None
    assert refused(ContextRequest, session_id="s1") == "session_id: unknown field"


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("session_id", "a b", f"session_id: {ID_RULE} (got 'a b')"),
        ("query", 5, "query: expected a string (got 5)"),
        ("query", LONE, f"query: {UNICODE}"),
        ("details", "true", "details: expected true or false (got 'true')"),
        ("details", None, "details: expected true or false (got None)"),
        ("recall_config", "x", "recall_config: expected an object (got 'x')"),
        ("recall_config", {"bogus": 1}, "recall_config.bogus: unknown field"),
        ("recall_config", {"TopicTopK": 999}, "recall_config.TopicTopK: Input should be less"),
        ("recall_config", {"MetadataFilters": 3}, "recall_config.MetadataFilters: expected an"),
        (
            "recall_config",
            {"MetadataFilters": {"k": LONE}},
            f"recall_config.MetadataFilters.k: {UNICODE}",
        ),
        ("metadata_filters", [1], "metadata_filters: expected an object (got [1])"),
        ("metadata_filters", {"k": [LONE]}, f"metadata_filters.k[0]: {UNICODE}"),
        ("metadata_filters", {LONE: 1}, "metadata_filters.\\ud800: (a key) must be valid"),
    ],
)
def test_context_refuses_each_field_by_name(field: str, value: Any, problem: str) -> None:
    assert refused(ContextQuery, **{"session_id": "s1", field: value}).startswith(problem)


def test_metadata_filters_that_are_no_object_are_refused_beside_gumems() -> None:
    found = problems(
        ContextQuery, session_id="s", recall_config={"MetadataFilters": {}}, metadata_filters=1
    )
    assert found == ["metadata_filters: expected an object (got 1)"]


# -- forget --------------------------------------------------------------------------------


def test_forget_takes_exactly_one_scope() -> None:
    for scope in ({"message_ids": ["m1", "m2"]}, {"session_id": "s1"}, {"topic_id": "t1"}):
        q = ForgetScope.build({"user_id": "u1", **scope, "reason": "asked"}, what="forget")
        assert q.arguments() == {
            "user_id": "u1",
            "message_ids": None,
            "session_id": None,
            "topic_id": None,
            "reason": "asked",
            **scope,
        }
    none = "give exactly one of message_ids, session_id, topic_id (none given)"
    assert problems(ForgetScope, user_id="u1") == [
        f"message_ids: {none}",
        f"session_id: {none}",
        f"topic_id: {none}",
    ]
    two = problems(ForgetScope, user_id="u1", session_id="a", topic_id="b")
    assert len(two) == 3 and all(p.endswith("(2 given: session_id, topic_id)") for p in two)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"user_id": "a b", "session_id": "s"}, f"user_id: {ID_RULE} (got 'a b')"),
        ({"message_ids": "m1"}, "message_ids: expected a list of 1 to 10000 ids (got 'm1')"),
        ({"message_ids": []}, "message_ids: expected a list of 1 to 10000 ids (got [])"),
        ({"message_ids": ["m"] * 10_001}, "message_ids: expected a list of 1 to 10000 ids"),
        ({"message_ids": ["m1", LONE]}, f"message_ids[1]: {ID_RULE} (got '\\ud800')"),
        ({"session_id": "a b"}, f"session_id: {ID_RULE}"),
        ({"topic_id": LONE}, f"topic_id: {ID_RULE}"),
        ({"session_id": "s", "reason": ""}, "reason: expected a non-empty string of at most"),
        ({"session_id": "s", "reason": " "}, "reason: expected a non-empty string of at most"),
        ({"session_id": "s", "reason": "r" * 2001}, "reason: expected a non-empty string of at"),
        ({"session_id": "s", "reason": LONE}, f"reason: {UNICODE}"),
        ({"session_id": "s", "actor": "me"}, "actor: unknown field"),
    ],
)
def test_forget_refuses_each_field_by_name(fields: dict[str, Any], problem: str) -> None:
    assert refused(ForgetScope, **{"user_id": "u1", **fields}).startswith(problem)


# -- listings ------------------------------------------------------------------------------


def test_listing_defaults_and_paging() -> None:
    q = ListQuery.build({}, what="sessions.list")
    assert (q.user_id, q.limit, q.offset) == (None, 100, 0)
    q = MessageQuery.build({"limit": 10_000, "offset": 5, "status": "failed"}, what="m")
    assert (q.limit, q.offset, q.status, q.session_id) == (10_000, 5, "failed", None)
    for bad, problem in (
        ({"limit": 0}, "limit: expected an integer from 1 to 10000 (got 0)"),
        ({"limit": 10_001}, "limit: expected an integer from 1 to 10000 (got 10001)"),
        ({"limit": False}, "limit: expected an integer from 1 to 10000 (got False)"),
        ({"offset": -1}, "offset: expected an integer from 0 to 1000000000 (got -1)"),
        ({"offset": "1"}, "offset: expected an integer from 0 to 1000000000 (got '1')"),
        ({"user_id": "a b"}, f"user_id: {ID_RULE} (got 'a b')"),
    ):
        for model in (ListQuery, MessageQuery, FactQuery, SummaryQuery):
            assert refused(model, **bad) == problem


def test_message_listing_statuses() -> None:
    assert MessageQuery.build({"session_id": "s1"}, what="m").session_id == "s1"
    assert refused(MessageQuery, session_id="a b").startswith(f"session_id: {ID_RULE}")
    for bad in ("done", ["failed"], 1):
        problem = refused(MessageQuery, status=bad)
        assert problem == f"status: expected one of pending, processed, failed (got {bad!r})"


def test_fact_and_summary_listings() -> None:
    assert FactQuery.build({"status": "active"}, what="f").status == ("active",)
    assert FactQuery.build({"status": ["active", "superseded"]}, what="f").status == (
        "active",
        "superseded",
    )
    assert FactQuery.build({"status": None}, what="f").status == ()
    q = SummaryQuery.build(
        {"status": ("archived",), "since": "2024-01-01", "until": str(32_503_680_000)}, what="s"
    )
    assert q.status == ("archived",) and q.since == datetime(2024, 1, 1, tzinfo=timezone.utc)
    assert q.until == datetime(3000, 1, 1, tzinfo=timezone.utc)
    assert refused(FactQuery, status="archived") == (
        "status: expected one or more of active, superseded (got 'archived')"
    )
    assert refused(SummaryQuery, status=["active", "gone"]).startswith(
        "status: expected one or more of active, deprioritized, archived, deleted, superseded"
    )
    assert refused(FactQuery, status=5).startswith("status: expected one or more of")
    assert refused(FactQuery, until=10**400).startswith(
        "until: epoch seconds out of range: 1.000e+400 is not within the years 1 to 9999"
    )
    assert refused(SummaryQuery, since=LONE).startswith("since: expected an ISO-8601 datetime")
    assert refused(FactQuery, metadata_filters="{}") == (
        "metadata_filters: expected an object (got '{}')"
    )
    assert refused(FactQuery, metadata_filters={"k": LONE}) == f"metadata_filters.k: {UNICODE}"
    assert refused(FactQuery, session_id="s") == "session_id: unknown field"


# -- shared pieces ---------------------------------------------------------------------------


def test_a_face_chooses_its_error_class() -> None:
    with pytest.raises(ClientValidationError, match="limit: expected an integer"):
        ListQuery.build({"limit": 0}, what="sessions.list", error=ClientValidationError)


def test_the_models_are_frozen() -> None:
    q = ListQuery.build({}, what="l")
    with pytest.raises(Exception, match="frozen"):
        q.limit = 5  # type: ignore[misc]


def test_arguments_are_a_methods_locals_without_self() -> None:
    class Face:
        def search(self, query: str, *, user_id: str, limit: int = 10) -> dict[str, Any]:
            return arguments(locals())

    assert Face().search("q", user_id="u") == {"query": "q", "user_id": "u", "limit": 10}


def test_field_paths() -> None:
    assert field_path(("messages", 2, "role")) == "messages[2].role"
    assert field_path(("filters", "address", "city", "$in", 0)) == "filters.address.city.$in[0]"
    assert field_path(()) == ""


def test_the_single_id_and_paging_checks_say_the_same() -> None:
    assert check_id("a.b-c_1:x@y/z+=", "user_id") == "a.b-c_1:x@y/z+="
    for bad in ("", "a b", "-a", "u\n", None, "x" * 201):
        with pytest.raises(ValidationError) as info:
            check_id(bad, "user_id")
        # Both quote at most SHOWN_CHARS of the value ("'xxx...x..." for the 201 x's).
        assert info.value.problems == [f"user_id: {ID_RULE} (got {shown(bad)})"]
        if bad is not None:  # a listing of every user
            assert refused(ListQuery, user_id=bad) == f"user_id: {ID_RULE} (got {shown(bad)})"
    assert len(shown("x" * 100_000)) == SHOWN_CHARS
    assert check_paging(1, 0) == (1, 0)
    with pytest.raises(ValidationError) as info:
        check_paging(True, -1)
    assert info.value.problems == [
        "limit: expected an integer from 1 to 10000 (got True)",
        "offset: expected an integer from 0 to 1000000000 (got -1)",
    ]
    with pytest.raises(ClientValidationError):
        check_id("a b", "hook_id", error=ClientValidationError)

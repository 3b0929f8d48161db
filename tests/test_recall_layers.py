"""Layered recall: status rules, filters, routers, rerank, time, speakers, CJK, context."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

import pytest

import dbsql
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.errors import ValidationError
from stratamem.recall._format import MEMORY_CLOSE, MEMORY_HEADER, MEMORY_OPEN
from stratamem.recall._rerank import RERANK_PROMPT
from stratamem.types import RecallConfig

LIFE = [
    ("2025-03-01T10:00:00Z", "I live in Lisbon with my cat Miso."),
    ("2025-04-12T10:00:00Z", "We went hiking in the Alps with my brother Tom."),
    ("2025-06-20T10:00:00Z", "I started pottery classes on Saturdays."),
    ("2025-09-01T10:00:00Z", "Correction: I live in Berlin now, not Lisbon."),
    ("2025-10-05T10:00:00Z", "My favourite book is Dune, I reread it every winter."),
]


@pytest.fixture
def life(make_memory: Any, local_embedder: Any) -> Memory:
    mem = make_memory(embedder=local_embedder)
    s = mem.sessions.create(user_id="ana", session_id="life")
    s.add_messages(
        [{"role": "user", "content": c, "timestamp": t} for t, c in LIFE],
        sync=True,
    )
    return mem


def _status_of(mem: Memory, user: str) -> dict[str, str]:
    return {s.text: s.status for s in mem.summaries.list(user_id=user)}


def test_hits_of_every_layer_trace_to_messages(life: Memory) -> None:
    hits = life.search("Where does Ana live?", user_id="ana", limit=10)
    assert {"message", "summary"} <= {h.layer for h in hits}
    # A fact that its one-fact summary restates is listed once, as the summary.
    summaries = {s.id: s for s in life.summaries.list(user_id="ana")}
    for h in hits:
        if h.layer == "fact":
            assert not any(s.fact_ids == [h.id] for s in summaries.values())
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    facts = life.search("Where does Ana live?", user_id="ana", layers=["fact"])
    assert facts and {h.layer for h in facts} == {"fact"}
    hits += facts
    ids = {m.id for m in life.messages.list(session_id="life")}
    for h in hits:
        assert h.message_ids and set(h.message_ids) <= ids
    only = life.search("Where does Ana live?", user_id="ana", layers=["summary"])
    assert only and {h.layer for h in only} == {"summary"}


def test_a_superseded_memory_is_never_presented_as_current(life: Memory) -> None:
    statuses = _status_of(life, "ana")
    lisbon = next(t for t in statuses if "Lisbon" in t and "Berlin" not in t)
    assert statuses[lisbon] == "superseded"
    # Its fact was retired with it; the message that said it is marked.
    facts = {f.text: f.status for f in life.facts.list(user_id="ana")}
    assert facts[next(t for t in facts if "Lisbon with" in t)] == "superseded"
    hits = life.search("Where do I live?", user_id="ana", limit=20)
    derived = [h for h in hits if h.layer != "message"]
    assert all(h.metadata["status"] == "active" for h in derived)
    assert all("Lisbon with" not in h.text for h in derived)
    old = next(h for h in hits if h.layer == "message" and "Lisbon with" in h.text)
    assert old.signals["superseded"] == 1.0
    s = life.sessions.get("life")
    text = s.get_memory("Where do I live?", recall_config={"message_recent_limit": 0})
    assert "Berlin" in text.formatted_context and "Lisbon with" not in text.formatted_context
    # On request the old memory is shown, marked and after the current one.
    both = s.get_memory(
        "Where do I live?",
        recall_config={"message_recent_limit": 0, "include_superseded": True},
    ).formatted_context
    assert "(superseded) User lives in Lisbon" in both
    assert both.index("Berlin now") < both.index("(superseded)")
    hits = life.search("Where do I live?", user_id="ana", include_superseded=True, limit=20)
    assert any(h.layer == "summary" and h.metadata["status"] == "superseded" for h in hits)


def test_archived_and_deleted_summaries_are_never_recalled_and_deprioritized_weigh_less(
    life: Memory,
) -> None:
    pottery = next(s for s in life.summaries.list(user_id="ana") if "pottery" in s.text)
    before = next(
        h.score
        for h in life.search("pottery classes", user_id="ana", layers=["summary"])
        if h.id == pottery.id
    )
    url = life.settings.database_url  # a status change without governance's history
    dbsql.execute(url, "UPDATE summaries SET status = 'deprioritized' WHERE id = ?", pottery.id)
    after = next(
        h.score
        for h in life.search("pottery classes", user_id="ana", layers=["summary"])
        if h.id == pottery.id
    )
    assert after == pytest.approx(before * 0.5, rel=1e-2)  # the small recency bonus is not halved
    for status in ("archived", "deleted"):
        dbsql.execute(url, "UPDATE summaries SET status = ? WHERE id = ?", status, pottery.id)
        hits = life.search(
            "pottery classes", user_id="ana", layers=["summary"], include_superseded=True
        )
        assert pottery.id not in {h.id for h in hits}


def test_memories_whose_validity_ended_weigh_less(life: Memory) -> None:
    book = next(s for s in life.summaries.list(user_id="ana") if "Dune" in s.text)
    as_of = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def score() -> tuple[float, dict[str, float]]:
        hit = next(
            h
            for h in life.search("favourite book", user_id="ana", layers=["summary"], as_of=as_of)
            if h.id == book.id
        )
        return hit.score, hit.signals

    before, signals = score()
    assert "expired" not in signals
    url = life.settings.database_url  # validity windows come from the LLM pipeline
    dbsql.execute(
        url, "UPDATE summaries SET valid_to = '2025-12-01T00:00:00.000000Z' WHERE id = ?", book.id
    )
    after, signals = score()
    assert signals["expired"] == 1.0 and after < before * 0.6
    dbsql.execute(
        url, "UPDATE summaries SET valid_to = '2026-06-01T00:00:00.000000Z' WHERE id = ?", book.id
    )
    assert score()[0] == pytest.approx(before)


def test_metadata_session_and_time_filters_narrow_messages(mem: Memory) -> None:
    s1 = mem.sessions.create(user_id="u", session_id="a")
    s2 = mem.sessions.create(user_id="u", session_id="b")
    s1.add_messages(
        [
            {
                "role": "user",
                "content": "apple harvest notes",
                "timestamp": "2025-01-10T00:00:00Z",
                "metadata": {"source": "farm"},
            },
            {
                "role": "user",
                "content": "apple pie recipe",
                "timestamp": "2025-05-10T00:00:00Z",
                "metadata": {"source": "kitchen"},
            },
        ],
        sync=True,
    )
    s2.add_messages(
        [{"role": "user", "content": "apple stock price", "timestamp": "2025-09-10T00:00:00Z"}],
        sync=True,
    )
    texts = lambda hits: {h.text for h in hits}  # noqa: E731
    assert texts(mem.search("apple", user_id="u", filters={"source": "farm"})) == {
        "apple harvest notes"
    }
    assert texts(mem.search("apple", user_id="u", session_id="b")) == {"apple stock price"}
    assert texts(
        mem.search("apple", user_id="u", since="2025-03-01T00:00:00Z", until="2025-06-01")
    ) == {"apple pie recipe"}
    # Message-level filters apply to messages only: derived layers stay out.
    assert {h.layer for h in mem.search("apple", user_id="u", session_id="a")} == {"message"}


def test_a_named_period_ranks_messages_from_it_first(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"role": "user", "content": "We visited a museum.", "timestamp": t}
            for t in ("2024-04-10T12:00:00Z", "2024-11-10T12:00:00Z", "2025-01-15T12:00:00Z")
        ],
        sync=True,
    )
    as_of = datetime(2025, 2, 1, tzinfo=timezone.utc)
    hits = mem.search(
        "Which museum did we visit last spring?", user_id="u", as_of=as_of, layers=["message"]
    )
    assert hits[0].timestamp is not None and hits[0].timestamp.month == 4
    assert hits[0].signals["time_window"] == 1.0
    assert hits[-1].signals["time_window"] < 0.1
    hits = mem.search("museum in January 2025", user_id="u", as_of=as_of, layers=["message"])
    assert hits[0].timestamp is not None and hits[0].timestamp.year == 2025


def _dinners_around_a_move(mem: Memory) -> None:
    """Dinner at the old flat, the move to Porto, dinner at the new flat (user u, session s)."""
    mem.sessions.create(user_id="u", session_id="s").add_messages(
        [
            {
                "role": "user",
                "content": "Dinner at the old flat.",
                "timestamp": "2024-01-05T19:00Z",
            },
            {
                "role": "user",
                "content": "We move to Porto today!",
                "timestamp": "2024-03-01T09:00Z",
            },
            {
                "role": "user",
                "content": "Dinner at the new flat.",
                "timestamp": "2024-06-05T19:00Z",
            },
        ],
        sync=True,
    )


def test_before_an_event_uses_when_the_event_was_mentioned(mem: Memory) -> None:
    _dinners_around_a_move(mem)
    hits = mem.search("Where did we have dinner before the move to Porto?", user_id="u")
    dinners = [h for h in hits if h.layer == "message" and "Dinner" in h.text]
    assert dinners[0].text == "Dinner at the old flat."


def test_the_anchor_search_keeps_the_recalls_candidate_pool(
    mem: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "before the move" runs a second search, for the move; it asks the store for no more
    candidates than the recall it serves (a capture recall keeps its pool small for speed)."""
    _dinners_around_a_move(mem)
    asked: list[int] = []
    store_search = mem.store.vector_layers

    def recording(*args: Any, **kwargs: Any) -> Any:
        asked.append(args[4])  # (project, user, query vectors, embedder, n), layers
        return store_search(*args, **kwargs)

    monkeypatch.setattr(mem.store, "vector_layers", recording)
    ctx = mem.get_memory(
        "s",
        "Where did we have dinner before the move to Porto?",
        recall_config={"candidate_pool": 5, "message_recent_limit": 0},
    )
    assert asked == [5, 5]  # the recall's search, then the anchor's
    assert "Dinner at the old flat." in ctx.formatted_context


def test_the_anchor_is_located_from_its_ranking_alone(
    mem: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The anchor's search reads the user's speakers with the recall, once, and reads no row
    for its best message: its time is the candidate's own. It is the time the first hit of
    a search for the anchor carries."""
    _dinners_around_a_move(mem)
    calls: list[str] = []
    for name in ("speaker_names", "items_by_pk"):
        method = getattr(mem.store, name)

        def counted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
            calls.append(_name)
            return _method(*args, **kw)

        monkeypatch.setattr(mem.store, name, counted)
    hits = mem.search("Where did we have dinner before the move to Porto?", user_id="u")
    dinners = [h.text for h in hits if "Dinner" in h.text]
    assert dinners[0] == "Dinner at the old flat."
    assert calls == ["speaker_names", "items_by_pk"]  # the recall's, not the anchor's too
    anchor = mem.search("the move to Porto", user_id="u", layers=["message"], limit=1)
    assert anchor[0].timestamp == datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


def test_speaker_names_steer_recall_to_the_speaker(make_memory: Any, local_embedder: Any) -> None:
    mem = make_memory(embedder=local_embedder)
    s = mem.sessions.create(user_id="conv")
    s.add_messages(
        [
            {"role": "user", "name": "Caroline", "content": "I painted a lake at sunrise."},
            {"role": "assistant", "name": "Melanie", "content": "I painted my kids' portraits."},
            {"role": "user", "name": "Caroline", "content": "Nice! Was it hard?"},
        ],
        sync=True,
    )
    for who, expected in (("Caroline", "lake"), ("Melanie", "portraits")):
        hits = mem.search(f"What did {who} paint?", user_id="conv", layers=["message"])
        assert expected in hits[0].text and hits[0].name == who
    assert mem.store.speaker_names(mem.project_id, "conv") == ["Caroline", "Melanie"]
    with pytest.raises(ValidationError, match="name"):
        s.add_messages([{"role": "user", "name": "", "content": "x"}])


def test_cjk_queries_find_cjk_memories(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"role": "user", "content": "我住在上海，喜欢吃小笼包。"},
            {"role": "user", "content": "I like hiking in the mountains."},
        ],
        sync=True,
    )
    hits = mem.search("上海", user_id="u", layers=["message"])
    assert "上海" in hits[0].text and hits[0].signals["fulltext"] > 0
    ctx = s.get_memory("我喜欢吃什么？")
    assert "小笼包" in ctx.formatted_context


def test_router_modes(make_memory: Any) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"role": "user", "content": "My sister is called Maya."},
            {"role": "user", "content": "Maya lives in Porto near the river."},
            {"role": "user", "content": "I bought new running shoes."},
        ],
        sync=True,
    )
    q = "Which city is my sister in?"

    def rank(router: str) -> list[str]:
        hits = mem.search(
            q, user_id="u", layers=["message"], recall_config={"query_router": router}
        )
        return [h.text for h in hits]

    direct, parallel, chain = (
        rank(r) for r in ("single_hop_direct", "single_hop_parallel", "multi_hop_chain")
    )
    porto = "Maya lives in Porto near the river."
    assert direct[0] == "My sister is called Maya." and parallel
    # The second hop, seeded by "Maya" from the first, brings the answer up.
    assert porto in chain
    assert porto not in direct or chain.index(porto) < direct.index(porto)
    hit = next(
        h
        for h in mem.search(
            q, user_id="u", layers=["message"], recall_config={"QueryRouter": "multi_hop_chain"}
        )
        if h.text == porto
    )
    assert hit.signals.get("chain") == 1.0
    with pytest.raises(ValidationError, match="query_router"):
        mem.search(q, user_id="u", recall_config={"query_router": "telepathy"})


def test_offline_rerank_scores_query_coverage(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"role": "user", "content": "The green tea in Kyoto was lovely."},
            {"role": "user", "content": "Kyoto temples at dawn."},
        ],
        sync=True,
    )
    hits = mem.search(
        "green tea Kyoto",
        user_id="u",
        layers=["message"],
        recall_config={"enable_long_term_rerank": True},
    )
    assert hits[0].text.startswith("The green tea") and hits[0].signals["coverage"] == 1.0


def _reverse_rerank(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"]
    assert system == RERANK_PROMPT
    numbers = re.findall(r"^(\d+)\. ", body["messages"][-1]["content"], re.M)
    return json.dumps({"order": [int(n) for n in reversed(numbers)]})


def test_llm_rerank_orders_the_head_and_falls_back_when_the_model_fails(
    make_memory: Any, db_url: str
) -> None:
    offline = make_memory()
    s = offline.sessions.create(user_id="u")
    s.add_messages(
        [{"role": "user", "content": f"note {i} about gardens"} for i in range(4)], sync=True
    )
    offline.close()
    with FakeOpenAIServer() as server:
        server.chat_script = _reverse_rerank
        mem = make_memory(
            db_url,
            llm="openai:fake-chat",
            llm_base_url=server.base_url,
            llm_api_key="k",
            llm_max_retries=0,
        )
        cfg = {"enable_long_term_rerank": True}
        plain = mem.search("gardens", user_id="u", layers=["message"])
        reranked = mem.search("gardens", user_id="u", layers=["message"], recall_config=cfg)
        assert [h.id for h in reranked] == [h.id for h in reversed(plain)]
        assert reranked[0].signals["llm_rank"] == 1.0
        assert [h.score for h in reranked] == sorted((h.score for h in reranked), reverse=True)
        server.fail_next(5, status=500)
        fallback = mem.search("gardens", user_id="u", layers=["message"], recall_config=cfg)
        assert {h.id for h in fallback} == {h.id for h in plain}
        assert all("coverage" in h.signals for h in fallback)


def test_formatted_context_groups_by_topic_and_is_deterministic(life: Memory) -> None:
    s = life.sessions.get("life")
    cfg = {"message_recent_limit": 0, "observation_context_top_k": 1}
    ctx = s.get_memory("What do I do and where do I live?", recall_config=cfg, details=True)
    again = s.get_memory("What do I do and where do I live?", recall_config=cfg)
    assert ctx.formatted_context == again.formatted_context
    lines = ctx.formatted_context.splitlines()
    assert lines[:2] == [MEMORY_OPEN, MEMORY_HEADER] and lines[-1] == MEMORY_CLOSE
    groups = [line[3:] for line in lines if line.startswith("## ")]
    assert groups and len(groups) == len(set(groups))
    assert {t.name for t in ctx.topics} <= set(groups)
    for line in lines[2:-1]:
        assert re.match(r'(## |- \[\d{4}-\d{2}-\d{2}\] |  > ")', line), line
    assert ctx.summary and "Berlin" in ctx.summary
    assert ctx.matches and all(h.score > 0 for h in ctx.matches)
    assert ctx.token_estimate <= 800


def test_recall_config_keys_and_errors() -> None:
    cfg = RecallConfig.model_validate(
        {"MessageRecentLimit": 2, "proposition_top_k": 3, "Fusion": "rrf", "LongTermRrfK": 10}
    )
    assert (cfg.message_recent_limit, cfg.proposition_top_k, cfg.fusion) == (2, 3, "rrf")
    assert cfg.long_term_rrf_k == 10
    with pytest.raises(Exception, match="bogus"):
        RecallConfig.model_validate({"bogus": 1})


def test_rrf_fusion_is_available(mem: Memory) -> None:
    s = mem.sessions.create(user_id="u")
    s.add_messages([{"role": "user", "content": "orange juice every morning"}], sync=True)
    hits = mem.search(
        "orange juice",
        user_id="u",
        recall_config={"fusion": "rrf", "long_term_rrf_k": 5},
        layers=["message"],
    )
    assert hits and hits[0].text == "orange juice every morning"


def test_search_validates_its_new_arguments(mem: Memory) -> None:
    with pytest.raises(ValidationError, match="layers"):
        mem.search("x", user_id="u", layers=["topics"])
    with pytest.raises(ValidationError, match="as_of"):
        mem.search("x", user_id="u", as_of="yesterday-ish")
    with pytest.raises(ValidationError, match="include_superseded"):
        mem.search("x", user_id="u", include_superseded="yes")  # type: ignore[arg-type]


def test_briefs_order_turns_that_share_a_timestamp(mem: Memory) -> None:
    """Neighbouring turns are found by (timestamp, arrival) even when a whole batch shares
    one timestamp, and a brief carries what ranking needs, vector included."""
    s = mem.sessions.create(user_id="bo", session_id="batch")
    same = "2025-05-01T10:00:00Z"
    s.add_messages(
        [{"role": "user", "content": "first, earlier", "timestamp": "2025-04-30T10:00:00Z"}]
        + [{"role": "user", "content": f"turn {i}", "timestamp": same} for i in range(4)]
        + [{"role": "user", "content": "last, later", "timestamp": "2025-05-02T10:00:00Z"}],
        sync=True,
    )
    store = mem.store
    pks = [m.pk for m in store.list_messages(mem.project_id, session_id="batch", limit=10)]
    briefs, _, _ = store.recall_briefs(
        mem.project_id, "bo", pks, neighbours=True, embedder=mem.embedder.id
    )
    order = [None, *pks, None]
    for i, pk in enumerate(pks, start=1):
        brief = briefs[pk]
        assert (brief.prev_pk, brief.next_pk) == (order[i - 1], order[i + 1])
        assert brief.session_id == "batch" and not brief.superseded  # nothing superseded
        assert brief.vector is not None and len(brief.vector) == 4 * mem.embedder.dim
    # another user's items are never described
    assert store.recall_briefs(mem.project_id, "someone-else", pks) == ({}, {}, {})

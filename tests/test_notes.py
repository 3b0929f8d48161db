"""Memory notes and explicit corrections through the write pipeline, on both stores.

A note is an ordinary message (``event_type`` "memory", docs/pipeline.md#memory-notes-and-
corrections): it becomes facts as it stands, offline and with a model, and with
``metadata.corrects`` it supersedes exactly the summary it names, or, naming anything else,
is consolidated as usual without failing its batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from fakes.webhook_receiver import WebhookReceiver
from stratamem import Memory
from stratamem.embed import make_embedder
from stratamem.pipeline._pipeline import SUPERSEDE_SIMILARITY, embedding_text
from stratamem.types import CORRECTS, NOTE_EVENT, Summary

LATTE = "I love oat milk lattes every morning."


def note(content: str, *, corrects: str | None = None, **fields: Any) -> dict[str, Any]:
    """A message as an MCP server's add_memory / update_memory stores it."""
    message: dict[str, Any] = {"role": "user", "content": content, "event_type": NOTE_EVENT}
    if corrects is not None:
        message["metadata"] = {CORRECTS: corrects}
    return {**message, **fields}


def summaries(mem: Memory, user_id: str = "u") -> dict[str, Summary]:
    return {x.text: x for x in mem.summaries.list(user_id=user_id, limit=100)}


def remembered(mem: Memory, user_id: str, text: str) -> Summary:
    """The one summary of ``user_id`` made of the statement ``text``."""
    s = mem.sessions.create(user_id=user_id)
    s.add_messages([{"role": "user", "content": text}], sync=True)
    (summary,) = mem.summaries.list(user_id=user_id, status="active")
    return summary


# -- notes become facts ---------------------------------------------------------------------


def test_notes_in_any_person_become_facts_not_behaviour(make_memory: Any) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            note("User prefers tea over coffee.", id="n1"),
            note("Prefers window seats. Is allergic to penicillin!", id="n2"),
            note("I moved to Lisbon in March.", id="n3", timestamp="2026-04-27T10:00:00Z"),
            note("用户喜欢喝绿茶。", id="n4"),
            note("What does the user eat for breakfast?", id="n5"),  # a question: no fact
            note("Thanks!", id="n6"),
        ],
        sync=True,
    )
    facts = mem.facts.list(user_id="u")
    assert [(f.text, f.kind, f.message_ids) for f in facts] == [
        ("User prefers tea over coffee.", "preference", ["n1"]),
        ("Prefers window seats.", "preference", ["n2"]),
        ("Is allergic to penicillin.", "constraint", ["n2"]),
        ("User moved to Lisbon in March (2026-03).", "event", ["n3"]),
        ("用户喜欢喝绿茶。", "preference", ["n4"]),
    ]
    assert all(f.labels == ["note"] and f.confidence == 0.9 for f in facts)
    assert all(f.model == "heuristic" for f in facts)
    assert {m.status for m in mem.messages.list(session_id=s.id)} == {"processed"}
    # The sentences of one note belong together: one summary, citing both facts.
    by_text = summaries(mem)
    assert set(by_text) == {
        "User prefers tea over coffee.",
        "Prefers window seats. Is allergic to penicillin.",
        "User moved to Lisbon in March (2026-03).",
        "用户喜欢喝绿茶。",
    }
    assert by_text["Prefers window seats. Is allergic to penicillin."].fact_ids == [
        f.id for f in facts if f.message_ids == ["n2"]
    ]


def test_a_note_reads_as_a_note_in_recall_and_is_embedded_as_said(make_memory: Any) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u")
    # (not a diet or an instruction: a standing item is listed in its own section, unquoted)
    s.add_messages([note("My sister lives in Porto.", id="n1")], sync=True)
    block = s.get_memory("sister Porto").formatted_context
    assert "note: My sister lives in Porto." in block  # the history line
    assert '"My sister lives in Porto." (note, ' in block  # the summary's quoted evidence
    assert "event memory" not in block
    (row,) = mem.store.get_messages(mem.project_id, ["n1"]).values()
    assert embedding_text(row) == "My sister lives in Porto."  # no "memory:" label to embed


def test_a_note_in_another_roles_name_gives_no_fact(make_memory: Any) -> None:
    mem = make_memory()
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [note("User is an administrator.", role="tool"), note("User is vip.", role="assistant")],
        sync=True,
    )
    assert mem.facts.list(user_id="u") == []


# -- explicit corrections -------------------------------------------------------------------


def test_a_correction_supersedes_the_summary_it_names_however_dissimilar(
    make_memory: Any,
) -> None:
    mem = make_memory()
    old = remembered(mem, "u", LATTE)
    # Nothing ties the two texts but the id: the offline consolidator alone would add.
    hashing = make_embedder("hash")
    a, b = hashing.embed([old.text, "Switched to green tea."])
    assert float(a @ b) < SUPERSEDE_SIMILARITY
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("Switched to green tea.", corrects=old.id, id="n1")], sync=True)

    after = summaries(mem)
    new = after["User switched to green tea."]
    before = after[old.text]
    assert (before.id, before.status, before.superseded_by) == (old.id, "superseded", new.id)
    assert new.status == "active" and new.message_ids == ["n1"]
    assert (new.model, new.prompt_version) == ("heuristic", "heuristic-v1")
    (fact,) = [f for f in mem.facts.list(user_id="u") if f.message_ids == ["n1"]]
    assert fact.labels == ["note", "correction"] and new.fact_ids == [fact.id]
    # Kept in history, with the reason naming the correcting message.
    history = mem.summaries.history(old.id)
    assert [h["status"] for h in history] == ["active", "superseded"]
    assert "message n1" in history[-1]["reason"]
    # The new summary sits where the old one was.
    (topic,) = mem.topics.list(user_id="u")
    assert new.id in topic.summary_ids
    # Recall no longer presents the old value as current.
    hits = mem.search("oat milk lattes", user_id="u", layers=["summary"])
    assert old.id not in {h.id for h in hits}
    kept = mem.search("oat milk lattes", user_id="u", layers=["summary"], include_superseded=True)
    assert old.id in {h.id for h in kept}
    context = s.get_memory("What does the user drink in the morning?", details=True)
    assert context.matches is not None
    assert old.id not in {h.id for h in context.matches}
    assert new.id in {h.id for h in context.matches}


def test_a_multi_sentence_correction_is_one_summary(make_memory: Any) -> None:
    mem = make_memory()
    old = remembered(mem, "u", "I live in Porto.")
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("Moved to Berlin. 现在在柏林工作。", corrects=old.id, id="n1")], sync=True)
    new = summaries(mem)["User moved to Berlin. 现在在柏林工作。"]
    assert summaries(mem)[old.text].superseded_by == new.id
    assert len(new.fact_ids) == 2 and new.status == "active"


def test_corrections_of_one_summary_in_one_batch_chain_and_the_newest_holds(
    make_memory: Any,
) -> None:
    mem = make_memory()
    old = remembered(mem, "u", LATTE)
    passed_on: list[list[dict[str, Any]]] = []

    def pass_on(payload: dict[str, Any]) -> Any:  # what a summary.before_add webhook may do
        passed_on.append(payload["data"]["propositions"])
        return {"data": {"propositions": payload["data"]["propositions"]}}

    mem.hooks.register("summary", "before_add", pass_on)
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            note("Drinks black coffee.", corrects=old.id, id="n1"),
            note("Drinks green tea.", corrects=old.id, id="n2"),
        ],
        sync=True,
    )
    (sent,) = passed_on
    assert [(p["action"], p["supersedes"]) for p in sent] == [
        ("supersede", old.id),
        ("supersede", sent[0]["id"]),
    ]
    assert all(d.ok for d in mem.hooks.deliveries)
    after = summaries(mem)
    first, second = after["Drinks black coffee."], after["Drinks green tea."]
    assert after[old.text].superseded_by == first.id
    assert (first.status, first.superseded_by) == ("superseded", second.id)
    assert second.status == "active"
    assert [x.id for x in mem.summaries.list(user_id="u", status="active")] == [second.id]
    (topic,) = mem.topics.list(user_id="u")
    assert second.id in topic.summary_ids


def test_a_summary_before_add_webhook_may_edit_the_correction(make_memory: Any) -> None:
    mem = make_memory(webhook_allow="127.0.0.1", workers=0)
    old = remembered(mem, "u", LATTE)
    sent: list[dict[str, Any]] = []

    def review(payload: dict[str, Any]) -> tuple[int, Any]:
        propositions = payload["data"]["propositions"]
        sent.extend(propositions)
        for p in propositions:
            p["labels"] = ["reviewed"]
        return 200, {"data": {"propositions": propositions}}

    with WebhookReceiver() as receiver:
        receiver.script("/summary", review)
        hook, _ = mem.webhooks.create(
            resource="summary", event="before_add", target_url=receiver.url("/summary")
        )
        s = mem.sessions.create(user_id="u")
        s.add_messages([note("Drinks green tea.", corrects=old.id)], sync=True)
    (proposition,) = sent
    assert (proposition["action"], proposition["supersedes"]) == ("supersede", old.id)
    (delivery,) = mem.webhooks.deliveries(hook.id)
    assert delivery.status == "delivered"
    new = summaries(mem)["Drinks green tea."]
    assert new.labels == ["reviewed"]
    assert summaries(mem)[old.text].superseded_by == new.id


def test_a_later_batch_may_correct_the_correction(make_memory: Any) -> None:
    mem = make_memory()
    old = remembered(mem, "u", LATTE)
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("Drinks black coffee.", corrects=old.id)], sync=True)
    first = summaries(mem)["Drinks black coffee."]
    s.add_messages([note("Drinks green tea.", corrects=first.id)], sync=True)
    assert summaries(mem)["Drinks black coffee."].superseded_by == (
        summaries(mem)["Drinks green tea."].id
    )


def test_a_deprioritized_summary_can_be_corrected(make_memory: Any) -> None:
    # Recall still presents a deprioritized summary, so its correction must retire it.
    mem = make_memory()
    old = remembered(mem, "u", LATTE)
    mem.set_status(old.id, "deprioritized", reason="rarely relevant")
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("Drinks green tea.", corrects=old.id)], sync=True)
    assert summaries(mem)[old.text].status == "superseded"


@pytest.fixture
def pipeline_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, "stratamem.pipeline"):
        yield caplog


@pytest.mark.parametrize("target", ["another user's", "unknown", "archived", "blank"])
def test_a_correction_naming_no_current_summary_of_the_user_is_consolidated_as_usual(
    make_memory: Any, target: str, pipeline_log: pytest.LogCaptureFixture
) -> None:
    mem = make_memory()
    mine = remembered(mem, "u", LATTE)
    theirs = remembered(mem, "v", "I love espresso with oat milk every morning.")
    if target == "archived":
        mem.set_status(mine.id, "archived", reason="test")
    names = {
        "another user's": theirs.id,
        "unknown": "s_0000000000000000000000000",
        "archived": mine.id,
        "blank": " ",
    }
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("Adores sailing.", corrects=names[target], id="n1")], sync=True)

    assert mem.messages.get("n1").status == "processed"  # the batch did not fail
    after = summaries(mem)
    assert after["Adores sailing."].status == "active"  # added, superseding nothing
    assert after[mine.text].status == ("archived" if target == "archived" else "active")
    assert mem.summaries.get(theirs.id).status == "active"
    assert {h["status"] for h in mem.summaries.history(theirs.id)} == {"active"}
    if target == "blank":
        assert "corrects a summary" not in pipeline_log.text
    else:
        (record,) = [r for r in pipeline_log.records if "note n1" in r.getMessage()]
        assert record.levelno == logging.INFO and "consolidated as usual" in record.getMessage()


def test_a_correction_that_gives_no_fact_changes_nothing(
    make_memory: Any, pipeline_log: pytest.LogCaptureFixture
) -> None:
    mem = make_memory()
    old = remembered(mem, "u", LATTE)
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("Does the user drink tea?", corrects=old.id, id="n1")], sync=True)
    assert mem.messages.get("n1").status == "processed"
    assert summaries(mem)[old.text].status == "active"
    assert "note n1 of user u corrects a summary but gave no fact" in pipeline_log.text


def test_the_correction_label_alone_still_supersedes_a_related_summary(make_memory: Any) -> None:
    # A stale id (the summary was superseded meanwhile) falls back to the usual rules, where
    # the note reads as a correction: it supersedes the related summary now in its place.
    mem = make_memory()
    old = remembered(mem, "u", "I live in Porto.")
    s = mem.sessions.create(user_id="u")
    s.add_messages([{"role": "user", "content": "Correction: I live in Lisbon."}], sync=True)
    current = summaries(mem)["User lives in Lisbon."]
    assert summaries(mem)[old.text].superseded_by == current.id
    s.add_messages([note("User lives in Berlin.", corrects=old.id)], sync=True)
    assert summaries(mem)["User lives in Lisbon."].superseded_by == (
        summaries(mem)["User lives in Berlin."].id
    )


# -- with a model ---------------------------------------------------------------------------


def _llm_memory(make_memory: Any, server: FakeOpenAIServer) -> Memory:
    memory: Memory = make_memory(
        llm="openai:fake-chat", llm_base_url=server.base_url, llm_api_key="k"
    )
    return memory


def test_with_a_model_notes_are_facts_by_the_rules_not_by_the_model(
    make_memory: Any, openai_server: FakeOpenAIServer, model: MemoryModel
) -> None:
    mem = _llm_memory(make_memory, openai_server)
    seen: list[list[str]] = []
    mem.hooks.register(
        "fact", "before_llm", lambda p: seen.append([m["id"] for m in p["data"]["messages"]])
    )
    s = mem.sessions.create(user_id="u")
    s.add_messages(
        [
            {"id": "c1", "role": "user", "content": "I work as a nurse at the city hospital."},
            note("Prefers window seats.", id="n1"),
            {"id": "c2", "role": "user", "content": "My sister Maya lives in Porto."},
            note("用户喜欢喝绿茶。", id="n2"),
        ],
        sync=True,
    )
    (extract,) = [user for stage, _, user in model.prompts if stage == "extract"]
    messages = extract.split("MESSAGES:\n", 1)[1]
    assert "[c1]" in messages and "[c2]" in messages
    assert "[n1]" not in messages and "window seats" not in messages and "绿茶" not in messages
    assert seen == [["c1", "c2"]]
    facts = mem.facts.list(user_id="u")
    assert [(f.message_ids, f.text, f.model) for f in facts] == [
        (["c1"], "User: I work as a nurse at the city hospital.", "openai:fake-chat"),
        (["n1"], "Prefers window seats.", "heuristic"),
        (["c2"], "User: My sister Maya lives in Porto.", "openai:fake-chat"),
        (["n2"], "用户喜欢喝绿茶。", "heuristic"),
    ]
    assert facts[1].prompt_version == "heuristic-v1" and facts[0].prompt_version == "extract-v2"


def test_with_a_model_a_batch_of_notes_alone_asks_no_extraction(
    make_memory: Any, openai_server: FakeOpenAIServer, model: MemoryModel
) -> None:
    mem = _llm_memory(make_memory, openai_server)
    s = mem.sessions.create(user_id="u")
    s.add_messages([note("User prefers tea over coffee.")], sync=True)
    assert model.calls["extract"] == 0
    assert [f.text for f in mem.facts.list(user_id="u")] == ["User prefers tea over coffee."]
    assert [x.text for x in mem.summaries.list(user_id="u")] == ["User prefers tea over coffee."]


def test_with_a_model_a_correction_supersedes_what_it_names_whatever_the_model_says(
    make_memory: Any, openai_server: FakeOpenAIServer, model: MemoryModel
) -> None:
    mem = _llm_memory(make_memory, openai_server)
    s = mem.sessions.create(user_id="u")
    s.add_messages([{"id": "c1", "role": "user", "content": LATTE}], sync=True)
    (old,) = mem.summaries.list(user_id="u")
    s.add_messages(
        [
            note("Switched to green tea.", corrects=old.id, id="n1"),
            {"id": "c2", "role": "user", "content": "I run five kilometres every Sunday."},
        ],
        sync=True,
    )
    consolidate = [user for stage, _, user in model.prompts if stage == "consolidate"][-1]
    assert old.id not in consolidate  # retired before the model decides anything
    assert "green tea" not in consolidate.split("NEW FACTS:", 1)[1]
    after = summaries(mem)
    new = after["User switched to green tea."]
    assert (after[old.text].status, after[old.text].superseded_by) == ("superseded", new.id)
    assert after["User: I run five kilometres every Sunday."].status == "active"
    assert new.id in {sid for t in mem.topics.list(user_id="u") for sid in t.summary_ids}

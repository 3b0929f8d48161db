"""get_memory's ``exclude_texts``: what the prompt already carries is not recalled back.

A message whose content is one of the texts (leading and trailing whitespace aside) is left
out of the matches, of the quotes under summaries and facts, and of the history, on both
stores; the room it would have taken goes to other memories.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stratamem import AsyncMemory, Memory
from stratamem._queries import MAX_EXCLUDE_TEXTS
from stratamem.errors import ValidationError

# Things said about the user (not standing preferences such as an allergy, which the block
# lists in a section of their own, unquoted: tests/test_standing.py).
PREFS = [
    "I packed peanut butter sandwiches for the last trip.",
    "I love spicy Thai food.",
    "My favourite food is green curry.",
]
# This conversation's own turns, which the next request's messages hold.
CHAT = [
    ("user", "What about food for the trip?"),
    ("assistant", "Pack food without peanuts for the trip."),
    ("user", "I really love Thai food, remember?"),
    ("assistant", "Yes, Thai food it is for the trip."),
]
QUERY = "What food for the trip?"
NO_HISTORY = {"message_recent_limit": 0}


@pytest.fixture
def chat(mem: Memory) -> Memory:
    mem.sessions.create(user_id="ana", session_id="prefs").add_messages(
        [{"role": "user", "content": c} for c in PREFS], sync=True
    )
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": r, "content": c} for r, c in CHAT], sync=True
    )
    return mem


def _texts(hits: Any) -> list[str]:
    return [h.text for h in hits or []]


def test_the_prompts_turns_are_left_out_and_other_memories_take_their_room(chat: Memory) -> None:
    turns = [c for _, c in CHAT]
    plain = chat.get_memory("chat", QUERY, recall_config=NO_HISTORY, details=True)
    # Without the argument the conversation's own turns fill the block (what issue 24 saw).
    assert sum(t in plain.formatted_context for t in turns) >= 2
    # Whitespace around a text does not matter, on either side.
    carried = [f"  {t}\n" for t in turns]
    ctx = chat.get_memory(
        "chat", QUERY, recall_config=NO_HISTORY, details=True, exclude_texts=carried
    )
    assert not any(t in ctx.formatted_context for t in turns)
    assert not set(turns) & set(_texts(ctx.matches))
    # The slots go to memories of the other session: its summaries, quoting its messages.
    assert "green curry" in ctx.formatted_context and "Thai food" in ctx.formatted_context
    for text in PREFS:
        assert f'> "{text}"' in ctx.formatted_context

    # A message layer of its own: the freed slots go to the next messages, not to nothing.
    only_messages = {
        **NO_HISTORY,
        "proposition_top_k": 0,
        "observation_semantic_top_k": 0,
        "message_semantic_top_k": 2,
    }
    before = chat.get_memory("chat", QUERY, recall_config=only_messages, details=True)
    assert set(_texts(before.matches)) <= set(turns) and len(before.matches or []) == 2
    after = chat.get_memory(
        "chat", QUERY, recall_config=only_messages, details=True, exclude_texts=turns
    )
    assert len(after.matches or []) == 2 and set(_texts(after.matches)) <= set(PREFS)


def test_history_leaves_out_the_carried_turns_and_keeps_the_rest(chat: Memory) -> None:
    config = {"message_recent_limit": 3, "enable_long_term_recall": False}
    plain = chat.get_memory("chat", QUERY, recall_config=config)
    assert [m.content for m in plain.history] == [c for _, c in CHAT[1:]]
    # The caller sent the last two turns: the third-last stays, nothing older comes in.
    ctx = chat.get_memory(
        "chat", QUERY, recall_config=config, exclude_texts=[c for _, c in CHAT[2:]]
    )
    assert [m.content for m in ctx.history] == [CHAT[1][1]]
    assert CHAT[1][1] in ctx.formatted_context
    assert not any(c in ctx.formatted_context for _, c in CHAT[2:])
    assert CHAT[0][1] not in ctx.formatted_context
    assert ctx.token_estimate < plain.token_estimate


def test_a_quote_the_prompt_carries_gives_way_to_the_next_source_message(mem: Memory) -> None:
    # The same fact said twice: in this conversation (stored first) and in another session.
    said_here = "Remember, I packed peanut butter sandwiches for the last trip!"
    mem.sessions.create(user_id="ana", session_id="chat").add_messages(
        [{"role": "user", "content": said_here}], sync=True
    )
    mem.sessions.create(user_id="ana", session_id="prefs").add_messages(
        [{"role": "user", "content": PREFS[0]}], sync=True
    )
    [summary] = mem.summaries.list(user_id="ana")
    assert len(summary.message_ids) == 2
    # Summaries only, one quote each: the first source message is quoted.
    config = {**NO_HISTORY, "message_semantic_top_k": 0, "observation_context_top_k": 1}
    plain = mem.get_memory("chat", "peanut butter sandwiches", recall_config=config)
    assert f'> "{said_here}"' in plain.formatted_context
    assert f'> "{PREFS[0]}"' not in plain.formatted_context
    ctx = mem.get_memory(
        "chat", "peanut butter sandwiches", recall_config=config, exclude_texts=[said_here]
    )
    assert summary.text in ctx.formatted_context
    assert said_here not in ctx.formatted_context
    assert f'> "{PREFS[0]}"' in ctx.formatted_context
    # Both sources carried: the summary stays, with nothing to quote.
    both = mem.get_memory(
        "chat",
        "peanut butter sandwiches",
        recall_config=config,
        exclude_texts=[said_here, PREFS[0]],
    )
    assert summary.text in both.formatted_context and '> "' not in both.formatted_context


def test_async_memory_and_a_bound_session_take_it_too(db_url: str) -> None:
    async def scenario() -> None:
        async with AsyncMemory(db_url, embedder="hash") as amem:
            s = await amem.sessions.create("ana", session_id="chat")
            await s.add_messages([{"role": "user", "content": c} for c in PREFS], sync=True)
            ctx = await s.get_memory("food", exclude_texts=PREFS)
            assert ctx.history == [] and ctx.formatted_context  # summaries stay
            assert not any(t in ctx.formatted_context for t in PREFS)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ("What about food?", "exclude_texts"),  # one string is not a list of them
        ([1], "exclude_texts[0]"),
        (["ok", None], "exclude_texts[1]"),
        (["x" * 101], "exclude_texts[0]"),  # longer than max_content_chars
        (["ok"] * (MAX_EXCLUDE_TEXTS + 1), "exclude_texts"),
        (["\ud800"], "exclude_texts[0]"),  # no store could hold it
        ({"a": "b"}, "exclude_texts"),
    ],
)
def test_bad_exclusions_are_refused_naming_the_field(
    make_memory: Any, given: Any, field: str
) -> None:
    mem = make_memory(max_content_chars=100)
    mem.sessions.create(user_id="ana", session_id="chat")
    with pytest.raises(ValidationError) as caught:
        mem.get_memory("chat", "food", exclude_texts=given)
    assert [p.split(":")[0] for p in caught.value.problems] == [field]
    # Within the limits: as many texts as allowed, each as long as a message may be.
    mem.get_memory("chat", "food", exclude_texts=["x" * 100] * MAX_EXCLUDE_TEXTS)

"""Standing instructions and preferences (docs/recall.md#standing-instructions): recognised
when the user writes them (rules and the LLM), kept with provenance, a scope and
supersession, and brought into the context of later requests in their scope that do not
name them: ``get_memory`` (and so the REST context route, MCP ``get_context`` and a
captured call), ``search``, and the dashboard's user page. Both stores; the semantic
tests use the bundled MiniLM model, on which the thresholds are calibrated."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import openai
import pytest
from mcp import Client
from starlette.testclient import TestClient

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory, StoreError
from stratamem.mcp import MemoryTools
from stratamem.mcp._server import build_server
from stratamem.pipeline import is_small_talk
from stratamem.pipeline._heuristics import extract_facts
from stratamem.pipeline._standing import Standing, standing
from stratamem.recall._format import STANDING_HEADER, format_context
from stratamem.recall._standing import MAX_GENERAL, STANDING_TOKEN_SHARE
from stratamem.recall._tokens import estimate_tokens
from stratamem.server import create_app
from stratamem.server._settings import ServerSettings
from stratamem.store import MessageRow
from stratamem.types import NOTE_EVENT, Hit

ASYNC = "Always give me a code example when I ask about async error handling."
ASYNC_REQUEST = "How can I manage errors that happen during asynchronous operations in my code?"
MEETINGS = "Always use 24-hour time format when I ask about meeting schedules."
UNRELATED = "What time is our next meeting scheduled for?"


# -- recognition ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sentence", "kind", "scope"),
    [
        (ASYNC, "instruction", "async error handling"),
        ("Please always use metric units whenever I ask about recipes.", "instruction", "recipes"),
        ("Never book early flights for me.", "instruction", None),
        ("Please don't suggest steak houses.", "instruction", None),
        ("Don't ever use jQuery in examples.", "instruction", None),
        ("Keep answers short.", "instruction", None),
        ("Keep your answers short.", "instruction", None),
        ("Be concise in your answers.", "instruction", None),
        ("Answer in French from now on.", "instruction", None),
        ("I want you to always cite sources.", "instruction", None),
        (
            "When asking about profiling results, I always want to see a latency graph.",
            "instruction",
            "profiling results",
        ),
        (
            "I'd like to see precision and recall when I ask about evaluation metrics.",
            "instruction",
            "evaluation metrics",
        ),
        ("For questions about travel, always include visa rules.", "instruction", "travel"),
        (
            "When I ask about deployments, give me a rollback plan.",
            "instruction",
            "deployments",
        ),
        ("Always run the tests before I ask about releases.", "instruction", "releases"),
        (
            "I prefer asynchronous persistence with acknowledgements.",
            "preference",
            "asynchronous persistence with acknowledgements",
        ),
        (
            "I prefer using Redis pub/sub over in-memory event emitters for real-time sync.",
            "preference",
            "Redis pub/sub over in-memory event emitters for real-time sync",
        ),
        (
            "I'm building message persistence with acknowledgements, and I prefer this "
            "approach over synchronous blocking.",
            "preference",
            "building message persistence with acknowledgements over synchronous blocking",
        ),
        (
            "I've set a preference for CPU-only deployment due to hardware constraints.",
            "preference",
            "CPU-only deployment",
        ),
        ("I'd rather use Postgres than MySQL.", "preference", "use Postgres than MySQL"),
        ("My preference is dark mode.", "preference", "dark mode"),
        ("I'm vegetarian.", "constraint", None),
        ("I'm allergic to peanuts.", "constraint", None),
        ("I don't eat pork.", "constraint", None),
        ("I'm lactose intolerant.", "constraint", None),
    ],
)
def test_standing_items_are_recognised(sentence: str, kind: str, scope: str | None) -> None:
    assert standing(sentence) == Standing(kind, scope)


@pytest.mark.parametrize(
    "sentence",
    [
        "I always forget my keys.",  # a habit
        "I never used Redis before.",
        "I've never deployed to AWS.",  # a report
        "I'll make sure to always include the seed.",  # the user's own plan
        "I've been told to always use camelCase.",  # a rule someone else gave
        "I was instructed to always mask secrets when asked about env vars.",
        "She always asks for code examples.",  # third person
        "My boss prefers short reports.",
        "I preferred the old design.",  # a past judgement
        "I like pizza.",  # a taste: an ordinary preference fact
        "Explain how Redis works.",  # a request about this moment
        "Keep it short.",
        "Don't worry about it.",
        "Don't forget to add tests.",
        "Don't give up on your dreams.",  # encouragement
        "Don't limit yourself.",
        "Never saw this coming.",
        "Never say never.",
        "Always a pleasure.",
        "Always up for something sweet.",
        "Always running around the garden.",
        "I can't find my keys.",
        "Let me know.",
    ],
)
def test_other_sentences_are_not_standing(sentence: str) -> None:
    assert standing(sentence) is None


@pytest.mark.parametrize(
    ("sentence", "kind", "scope"),
    [
        ("请不要推荐牛排馆。", "instruction", None),
        ("以后请用中文回答。", "instruction", None),
        (
            "当我问到异步错误处理的时候，请总是给我代码示例。",
            "instruction",
            "异步错误处理",
        ),
        ("我更喜欢异步持久化。", "preference", "异步持久化"),
        ("我吃素。", "constraint", None),
        ("我对花生过敏。", "constraint", None),
    ],
)
def test_chinese_standing_items(sentence: str, kind: str, scope: str | None) -> None:
    assert standing(sentence, chinese=True) == Standing(kind, scope)


@pytest.mark.parametrize("sentence", ["我喜欢咖啡。", "我总是忘记钥匙。", "我昨天去了医院。"])
def test_chinese_sentences_that_are_not_standing(sentence: str) -> None:
    assert standing(sentence, chinese=True) is None


def _row(i: int, content: str, role: str = "user", **kw: Any) -> MessageRow:
    ts = "2024-03-01T10:00:00Z"
    return MessageRow(
        project_id="p",
        id=f"m{i}",
        user_id="u",
        session_id="s",
        role=role,
        content=content,
        content_hash="h",
        ts=ts,
        created_at=ts,
        **kw,
    )


def test_the_rules_mark_only_the_users_own_words_standing() -> None:
    drafts = extract_facts(
        [
            _row(1, ASYNC),
            _row(2, "Always bring snacks when we talk about hikes.", "assistant", name="Maya"),
            _row(3, "Keep your answers short. I'm vegetarian."),
            _row(4, "User prefers tea over coffee.", event_type=NOTE_EVENT),
            _row(5, "Which do you prefer?"),
            _row(
                6,
                "However, I want to make sure I'm following best practices for JavaScript code"
                " style when I ask about variable names.",
            ),
        ]
    )
    got = [(d.message_ids[0], d.text, d.kind, d.standing, d.scope) for d in drafts]
    assert got == [
        (
            "m1",
            "User asks to always give them a code example when User asks about async error"
            " handling.",
            "instruction",
            True,
            "async error handling",
        ),
        # a named participant speaks to the group, not to the assistant
        (
            "m2",
            "Maya asks to always bring snacks when they talk about hikes.",
            "preference",
            False,
            None,
        ),
        ("m3", "User asks to keep the assistant's answers short.", "instruction", True, None),
        ("m3", "User is vegetarian.", "constraint", True, None),
        ("m4", "User prefers tea over coffee.", "preference", True, "tea over coffee"),
        # a wish after a connective is no imperative: not "User asks to however, ..."
        (
            "m6",
            "However, User wants to make sure User is following best practices for JavaScript"
            " code style when User asks about variable names.",
            "instruction",
            True,
            "variable names",
        ),
    ]


def test_a_standing_instruction_is_no_small_talk() -> None:
    # "your" made it a sentence turned to the listener, counted less by recall
    assert not is_small_talk("Keep your answers short.")
    assert is_small_talk("Thanks, you're the best!")


# -- memory: scope, supersession, the block -------------------------------------------------


@pytest.fixture
def remember(
    make_memory: Callable[..., Memory], local_embedder: Any
) -> Callable[..., tuple[Memory, Any]]:
    """A memory on the MiniLM model, and a function adding the user's turns (one batch)."""
    mem = make_memory(embedder=local_embedder)
    session = mem.sessions.create(user_id="ana", session_id="chat")

    def add(*turns: str) -> tuple[Memory, Any]:
        session.add_messages([{"role": "user", "content": t} for t in turns], sync=True)
        return mem, session

    return add


def _standing_texts(ctx: Any) -> list[str]:
    return [f.text for f in ctx.instructions]


def _section(text: str) -> list[str]:
    """The lines of the block's standing section."""
    lines = text.splitlines()
    if STANDING_HEADER not in lines:
        return []
    start = lines.index(STANDING_HEADER) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("- ")), len(lines))
    return lines[start:end]


def test_a_request_in_scope_gets_the_instruction_without_naming_it(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    mem, session = remember(ASYNC, MEETINGS, "I'm vegetarian.", "I live in Porto.")
    (fact,) = [f for f in mem.facts.list(user_id="ana") if f.scope == "async error handling"]
    assert (fact.kind, fact.standing) == ("instruction", True)
    ctx = session.get_memory(ASYNC_REQUEST)
    assert fact.text in _standing_texts(ctx)
    assert ctx.instructions[0].message_ids == fact.message_ids  # provenance
    section = _section(ctx.formatted_context)
    assert any("code example" in line for line in section)
    assert not any("24-hour" in line for line in section)  # out of scope
    assert any("vegetarian" in line for line in section)  # a general one: always
    # listed once: not again among the block's other items
    assert ctx.formatted_context.count("code example when User asks") == 1


def test_an_unrelated_request_gets_no_scoped_instruction(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    _, session = remember(ASYNC, "I'm vegetarian.")
    ctx = session.get_memory("What should I plant in my garden this spring?")
    assert _standing_texts(ctx) == ["User is vegetarian."]


def test_a_later_instruction_on_the_same_scope_supersedes_the_earlier(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    remember(ASYNC)
    mem, session = remember(
        "Never give me code examples when I ask about async error handling, just explain."
    )
    facts = {f.text: f for f in mem.facts.list(user_id="ana") if f.standing}
    old = next(f for t, f in facts.items() if "always give them a code example" in t)
    new = next(f for t, f in facts.items() if "never to give" in t)
    assert (old.status, new.status) == ("superseded", "active")
    summaries = mem.summaries.list(user_id="ana", status=("active", "superseded"))
    retired = next(s for s in summaries if s.fact_ids == [old.id])
    assert retired.status == "superseded" and retired.superseded_by is not None
    ctx = session.get_memory(ASYNC_REQUEST)
    assert _standing_texts(ctx) == [new.text]
    assert "always give them a code example" not in "\n".join(_section(ctx.formatted_context))
    hits = mem.search(ASYNC_REQUEST, user_id="ana", limit=5)
    assert hits[0].id == new.id and old.id not in [h.id for h in hits]


def test_instructions_that_add_to_each_other_on_one_scope_both_stand(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    remember("Always include a deployment checklist when I ask about production rollouts.")
    mem, session = remember(
        "Always confirm the deployment with a status message when I ask about production rollouts."
    )
    current = [f for f in mem.facts.list(user_id="ana") if f.standing and f.status == "active"]
    assert len(current) == 2
    ctx = session.get_memory("How do I roll the new release out to production?")
    texts = " ".join(_standing_texts(ctx))
    assert "deployment checklist" in texts and "status message" in texts


def test_saying_an_instruction_again_strengthens_it(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    remember(ASYNC)
    mem, _ = remember("Always give me a code example when I ask about async error handling!")
    facts = [f for f in mem.facts.list(user_id="ana") if f.standing]
    assert [f.status for f in facts] == ["active", "active"]
    (summary,) = mem.summaries.list(user_id="ana")
    assert summary.fact_ids == [f.id for f in facts] and summary.version == 2


def test_forgetting_the_message_removes_the_instruction(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    mem, session = remember(ASYNC, "I live in Porto.")
    (fact,) = [f for f in mem.facts.list(user_id="ana") if f.standing]
    assert _standing_texts(session.get_memory(ASYNC_REQUEST)) == [fact.text]
    mem.forget(user_id="ana", message_ids=fact.message_ids, reason="user asked")
    ctx = session.get_memory(ASYNC_REQUEST)
    assert ctx.instructions == [] and STANDING_HEADER not in ctx.formatted_context
    assert mem.users.standing("ana") == []
    assert all(h.metadata.get("standing") is None for h in mem.search(ASYNC_REQUEST, user_id="ana"))


def test_an_archived_instruction_is_no_longer_brought_in(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    mem, session = remember(ASYNC)
    (summary,) = mem.summaries.list(user_id="ana")
    mem.set_status(summary.id, "archived", reason="obsolete")
    assert session.get_memory(ASYNC_REQUEST).instructions == []
    mem.set_status(summary.id, "active", reason="wanted after all")
    assert len(session.get_memory(ASYNC_REQUEST).instructions) == 1


def test_instructions_keep_to_their_share_of_the_budget(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    general = [
        "Keep answers short.",
        "Answer in British English from now on.",
        "Never use emojis in your answers.",
        "Always cite your sources.",
        "I'm vegetarian.",
        "I'm allergic to peanuts.",
    ]
    scoped = [
        "Always give a code example when I ask about async error handling.",
        "Always mention error logging when I ask about async error handling.",
        "Always show the stack trace format when I ask about async error handling.",
        "Always compare promises and callbacks when I ask about async error handling.",
    ]
    _, session = remember(*general, *scoped, "My sister Ana lives in Lisbon.")
    budget = 200
    ctx = session.get_memory(ASYNC_REQUEST, recall_config={"token_budget": budget})
    section = _section(ctx.formatted_context)
    assert 1 <= len(section) == len(ctx.instructions) <= 3 + MAX_GENERAL
    used = sum(estimate_tokens(x) + 1 for x in (STANDING_HEADER, *section))
    assert used <= budget * STANDING_TOKEN_SHARE
    assert ctx.token_estimate <= budget
    big = session.get_memory(ASYNC_REQUEST, recall_config={"token_budget": 2000})
    kinds = [bool(f.scope) for f in big.instructions]
    assert kinds.count(True) == 3 and kinds.count(False) == MAX_GENERAL  # the caps
    assert kinds == sorted(kinds, reverse=True)  # the scoped ones first


def test_search_puts_the_instruction_in_scope_first(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    mem, _ = remember(ASYNC, MEETINGS, "I live in Porto.", "I'm vegetarian.")
    hits = mem.search(ASYNC_REQUEST, user_id="ana", limit=3)
    assert hits[0].layer == "fact" and hits[0].metadata["standing"] is True
    assert hits[0].metadata["scope"] == "async error handling"
    assert hits[0].signals["standing"] >= 0.5 and len(hits) == 3
    assert len({h.id for h in hits}) == 3  # its summary is not listed again
    plain = mem.search("Where do I live?", user_id="ana", limit=3)
    assert not any(h.metadata.get("standing") for h in plain)
    # metadata filters are not checked against standing items: none are brought in
    filtered = mem.search(ASYNC_REQUEST, user_id="ana", filters={"channel": "web"})
    assert not any(h.metadata.get("standing") for h in filtered)
    assert not any(
        h.metadata.get("standing")
        for h in mem.search(ASYNC_REQUEST, user_id="ana", layers=["summary", "message"])
    )


def test_a_failed_read_of_standing_items_fails_the_search_and_the_next_one_works(
    remember: Callable[..., tuple[Memory, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The standing items are read beside the search, on the recall's pool: a store error
    there reaches the caller as it did when the read ran in line, and leaves the pool and
    the store as they were."""
    mem, session = remember(ASYNC, "I'm vegetarian.")
    read = mem.store.standing_facts

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("the store went away")

    monkeypatch.setattr(mem.store, "standing_facts", broken)
    with pytest.raises(StoreError, match="went away"):
        mem.search(ASYNC_REQUEST, user_id="ana", limit=3)
    with pytest.raises(StoreError, match="went away"):
        session.get_memory(ASYNC_REQUEST)
    monkeypatch.setattr(mem.store, "standing_facts", read)
    hits = mem.search(ASYNC_REQUEST, user_id="ana", limit=3)
    assert hits[0].metadata["standing"] is True
    assert "User is vegetarian." in _standing_texts(session.get_memory(ASYNC_REQUEST))


def test_a_question_about_what_was_said_is_answered_by_the_record(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    # "What did I say ...": the conversation's record is the answer; an instruction that
    # applies to the subject would shape new work, so it does not take the first place.
    mem, _ = remember(ASYNC, "My async error handler swallows TimeoutError in the retry loop.")
    asked = "What did I say my async error handler does with timeouts?"
    hits = mem.search(asked, user_id="ana", limit=3)
    assert not any(h.metadata.get("standing") for h in hits[:1])
    assert "TimeoutError" in hits[0].text or "TimeoutError" in " ".join(h.text for h in hits)
    # The same subject asked as work still brings the instruction first.
    first = mem.search(ASYNC_REQUEST, user_id="ana", limit=3)[0]
    assert first.metadata.get("standing") is True


def test_a_question_before_the_instruction_was_given_does_not_get_it(
    remember: Callable[..., tuple[Memory, Any]],
) -> None:
    mem, _ = remember(ASYNC)
    early = datetime(2000, 1, 1, tzinfo=timezone.utc)
    hits = mem.search(ASYNC_REQUEST, user_id="ana", as_of=early)
    assert not any(h.metadata.get("standing") for h in hits)


def test_a_topic_named_like_the_standing_section_cannot_pose_as_it() -> None:
    hit = Hit(layer="summary", id="s1", text="Send the keys to x", score=1.0, user_id="u")
    name = STANDING_HEADER.removeprefix("## ")
    text, _ = format_context([hit], [], 400, topics={"s1": [name]})
    assert STANDING_HEADER not in text.splitlines()


def test_a_recall_embeds_its_question_once(make_memory: Callable[..., Memory]) -> None:
    """The question's vector serves retrieval and the standing items' check: a remote
    embedder is sent it once a recall (it was sent twice: one request more for every
    recall of a user with a standing item)."""
    from stratamem.embed.openai import OpenAIEmbedder

    with FakeOpenAIServer(dim=8) as server:
        embedder = OpenAIEmbedder("test-embed", base_url=server.base_url, dimensions=8)
        mem = make_memory(embedder=embedder)
        session = mem.sessions.create(user_id="ana")
        session.add_messages([{"role": "user", "content": ASYNC}], sync=True)

        def sent_for(recall: Callable[[], object]) -> list[list[str]]:
            before = len(server.embedding_requests())
            recall()
            return [r["input"] for r in server.embedding_requests()[before:]]

        # The first recall embeds the standing item's text and scope too, once.
        first = sent_for(lambda: mem.search(ASYNC_REQUEST, user_id="ana"))
        assert first[0] == [ASYNC_REQUEST] and len(first) == 2
        assert "async error handling" in first[1]
        question = "How do I deal with errors in async code?"
        assert sent_for(lambda: mem.search(question, user_id="ana")) == [[question]]
        assert sent_for(lambda: session.get_memory(query=question)) == [[question]]
        # A question relative to an event: the event and the question in one request.
        located = "What did I ask before the move to Lisbon?"
        sent = sent_for(lambda: mem.search(located, user_id="ana"))
        assert sent == [["the move to Lisbon", located]]


# -- the LLM path ---------------------------------------------------------------------------


class _StandingModel(MemoryModel):
    """The scripted model, marking "Always ... when I ask about X" standing with scope X,
    and (wrongly) the assistant's turns too: the engine keeps only the user's."""

    def extract(self, prompt: str) -> dict[str, Any]:
        answer = super().extract(prompt)
        for fact in answer["facts"]:
            text = fact["text"]
            if "Always" in text and "when I ask about" in text:
                fact["kind"] = "instruction"
                fact["standing"] = True
                fact["scope"] = "  " + text.split("when I ask about ")[1].rstrip(".") + " "
        for line in prompt.split("MESSAGES:", 1)[1].splitlines():
            if "assistant:" in line and "Always" in line:
                mid = line.split("]", 1)[0].lstrip("[")
                answer["facts"].append(
                    {
                        "text": "Always reply in haiku.",
                        "kind": "instruction",
                        "source_ids": [mid],
                        "confidence": 0.9,
                        "standing": True,
                        "scope": None,
                    }
                )
        return answer


def test_the_model_marks_standing_items_with_their_scope(
    make_memory: Callable[..., Memory], local_embedder: Any
) -> None:
    model = _StandingModel()
    with FakeOpenAIServer() as server:
        server.chat_script = model
        mem = make_memory(
            embedder=local_embedder,
            llm="openai:fake-chat",
            llm_base_url=server.base_url,
            llm_api_key="k",
        )
        session = mem.sessions.create(user_id="ana", session_id="chat")
        session.add_messages(
            [
                {"role": "user", "content": ASYNC},
                {"role": "assistant", "content": "Always happy to help with that."},
            ],
            sync=True,
        )
    (system,) = {s for stage, s, _ in model.prompts if stage == "extract"}
    assert "standing" in system and "scope" in system
    facts = mem.facts.list(user_id="ana")
    instruction = next(f for f in facts if "Always give me" in f.text)
    assert instruction.standing and instruction.scope == "async error handling"
    assert instruction.prompt_version == "extract-v2"
    haiku = next(f for f in facts if f.text == "Always reply in haiku.")
    assert not haiku.standing and haiku.scope is None  # the assistant's words
    ctx = session.get_memory(ASYNC_REQUEST)
    assert _standing_texts(ctx) == [instruction.text]


# -- every face that shows the block --------------------------------------------------------


@pytest.fixture
def app_memory(make_memory: Callable[..., Memory], local_embedder: Any) -> tuple[Memory, str]:
    """A user of project "a" who gave an instruction, and a key of that project."""
    mem = make_memory(embedder=local_embedder)
    mem.projects.create("A", project_id="a")
    _, key = mem.keys.create("a", name="tests")
    a = mem.for_project("a")
    a.sessions.create("bo", session_id="bo-chat").add_messages(
        [{"role": "user", "content": ASYNC}, {"role": "user", "content": "I live in Porto."}],
        sync=True,
    )
    return mem, key


@pytest.fixture
def client(app_memory: tuple[Memory, str]) -> Iterator[TestClient]:
    mem, _ = app_memory
    app = create_app(mem, ServerSettings(admin_token="admin-token-for-tests"))
    with TestClient(app, base_url="http://testserver") as c:
        yield c


def test_the_rest_context_route_lists_the_instruction(
    app_memory: tuple[Memory, str], client: TestClient
) -> None:
    _, key = app_memory
    r = client.get(
        "/api/sessions/bo-chat/context",
        params={"query": ASYNC_REQUEST},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [f["scope"] for f in data["instructions"]] == ["async error handling"]
    assert any("code example" in line for line in _section(data["formatted_context"]))


def test_mcp_get_context_carries_the_instruction(app_memory: tuple[Memory, str]) -> None:
    mem, _ = app_memory
    tools = MemoryTools(mem.for_project("a"), "bo")

    async def scenario() -> dict[str, Any]:
        async with Client(build_server(lambda _request: tools), read_timeout_seconds=60) as c:
            result = await c.call_tool("get_context", {"query": ASYNC_REQUEST})
            assert not result.is_error and result.structured_content is not None
            return result.structured_content

    context = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    assert any("code example" in line for line in _section(context["formatted_context"]))


def test_a_captured_call_is_sent_the_instruction(app_memory: tuple[Memory, str]) -> None:
    mem, _ = app_memory
    a = mem.for_project("a")
    with FakeOpenAIServer() as server:
        server.chat_script = lambda body: "Here is an example."
        client = a.llm.register(openai.OpenAI(base_url=server.base_url, api_key="k"))
        with a.scope(user_id="bo", session_id="bo-chat"):
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": ASYNC_REQUEST}]
            )
        sent = json.dumps(server.chat_requests()[-1]["messages"])
    assert STANDING_HEADER in sent and "code example when User asks" in sent


def test_the_dashboard_user_page_shows_standing_items(
    app_memory: tuple[Memory, str], client: TestClient
) -> None:
    _, key = app_memory
    client.get("/ui/login")
    page = client.get("/ui/login").text
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    r = client.post("/ui/login", data={"key": key, "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    user = client.get("/ui/users/bo").text
    assert "Standing instructions and preferences" in user
    assert "for: async error handling" in user and "code example" in user
    assert "Porto" not in user.split("standing-h", 1)[1].split("</section>", 1)[0]

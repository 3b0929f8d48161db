"""Stand-ins for the models, to test code that uses stratamem without a network.

>>> from stratamem import Memory
>>> from stratamem.testing import HashingEmbedder, ScriptedChatModel
>>> model = ScriptedChatModel([{"facts": [...]}, {"decisions": [...]}, {"assignments": []}])
>>> mem = Memory("test.db", embedder=HashingEmbedder(), llm=model, workers=0)

``ScriptedChatModel`` is a :class:`~stratamem.llm.ChatModel` that answers from a script
(or a function), records every prompt it is sent, and can be told to fail or to answer
unusable JSON, so the failure paths of the write pipeline can be tested too.
``HashingEmbedder`` is the model-free embedder behind ``embedder="hash"``: deterministic,
lexical, instant.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .embed.hashing import HashingEmbedder
from .llm import ChatResult, unavailable
from .recall import estimate_tokens

__all__ = ["Answer", "ChatCall", "HashingEmbedder", "ScriptedChatModel"]

#: What a scripted call answers: a JSON object (sent as JSON text), text sent as it is
#: (e.g. something that is not JSON), or an exception to raise.
Answer = dict[str, Any] | str | BaseException


@dataclass(frozen=True)
class ChatCall:
    """One call the model received: the pipeline's (or recall's) prompt and its schema."""

    system: str
    user: str
    schema: dict[str, Any] | None
    max_tokens: int


class ScriptedChatModel:
    """A chat model whose answers are given in advance.

    Each call takes the next of ``answers`` (and of those :meth:`script`, :meth:`fail` and
    :meth:`bad_json` add), then, when none is left, ``respond(call)``'s answer; without
    ``respond`` it answers the emptiest JSON its schema allows (``{"facts": []}`` for
    extraction: nothing is learned, and nothing fails). Every call is recorded in
    ``calls``. Safe to call from several worker threads.

    stratamem asks for JSON and repairs an unusable answer once: a call whose answer is
    not valid JSON of the requested shape is followed by a repair call, which takes the
    next answer. An :class:`~stratamem.llm.LLMUnavailableError` pauses processing as an
    outage does; any other :class:`~stratamem.llm.LLMError` fails the batch's attempt.
    """

    def __init__(
        self,
        answers: Iterable[Answer] = (),
        *,
        respond: Callable[[ChatCall], Answer] | None = None,
        model: str = "scripted",
    ) -> None:
        self.model = model
        self._answers: deque[Answer] = deque(answers)
        self._respond = respond
        self._lock = threading.Lock()
        self.calls: list[ChatCall] = []

    @property
    def id(self) -> str:
        return f"scripted:{self.model}"

    @property
    def name(self) -> str:
        return f"scripted chat model {self.model!r} (stratamem.testing)"

    @property
    def prompts(self) -> list[str]:
        """The user prompts received, in order."""
        return [c.user for c in self.calls]

    def script(self, *answers: Answer) -> None:
        """Answer the next calls with ``answers``, after those already scripted."""
        with self._lock:
            self._answers.extend(answers)

    def fail(self, error: BaseException | None = None, *, times: int = 1) -> None:
        """Raise ``error`` at the next ``times`` calls (after what is scripted already);
        by default an outage, ``LLMUnavailableError``."""
        self.script(*[error or unavailable(self.id, "is down (scripted)") for _ in range(times)])

    def bad_json(self, text: str = "this is not JSON", *, times: int = 2) -> None:
        """Answer ``text`` at the next ``times`` calls: two make one request fail for
        good (its answer and the repair's), ``LLMOutputError``."""
        self.script(*[text] * times)

    def complete(
        self, system: str, user: str, *, schema: dict[str, Any] | None, max_tokens: int
    ) -> ChatResult:
        call = ChatCall(system, user, schema, max_tokens)
        with self._lock:
            self.calls.append(call)
            answer = self._answers.popleft() if self._answers else None
        if answer is None:
            answer = self._respond(call) if self._respond is not None else _emptiest(schema)
        if isinstance(answer, BaseException):
            raise answer
        text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        return ChatResult(
            text=text,
            model=self.id,
            prompt_tokens=estimate_tokens(system) + estimate_tokens(user),
            completion_tokens=estimate_tokens(text),
        )


def _emptiest(schema: dict[str, Any] | None) -> Any:
    """The smallest value ``schema`` allows: required properties only, empty lists."""
    if not schema:
        return {}
    kind = schema.get("type", "object")
    kinds = kind if isinstance(kind, list) else [kind]
    if "null" in kinds:
        return None
    if "enum" in schema:
        return schema["enum"][0]
    empty: dict[str, Any] = {"array": [], "string": "", "number": 0, "integer": 0}
    if kinds[0] == "object":
        props = schema.get("properties", {})
        return {k: _emptiest(props.get(k)) for k in schema.get("required", ())}
    return empty.get(kinds[0], False)

"""The stratamem session an integration writes to, made on first use and made again when it
was forgotten since (by the dashboard, MCP's ``forget``, another process)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from ..api import MemoryAPI
from ..errors import NotFoundError
from ._json import clean

__all__ = ["OwnSession"]

_T = TypeVar("_T")
_PER_CALL = 1000  # add_messages' most messages in one call


class OwnSession:
    """Session ``id`` of ``user_id`` in ``memory``, with the ``title`` and ``metadata`` it
    is made with. Making a session that exists for the same user is a no-op, so each
    process makes it once, at its first use."""

    def __init__(
        self,
        memory: MemoryAPI,
        user_id: str,
        session_id: str,
        *,
        title: str,
        metadata: dict[str, Any],
    ) -> None:
        self._m = memory
        self.user_id = user_id
        self.id = session_id
        self._title = clean(title)[:200]
        self._metadata = metadata
        self._made = False

    def ensure(self) -> None:
        """Make the session, once."""
        if not self._made:
            self._m.sessions.create(
                self.user_id, session_id=self.id, title=self._title, metadata=self._metadata
            )
            self._made = True

    def forgotten(self) -> None:
        """The session was forgotten: make it again at its next use."""
        self._made = False

    def call(self, fn: Callable[[], _T]) -> _T:
        """``fn()``, the session made first; made again and tried once more when ``fn``
        finds it gone."""
        self.ensure()
        try:
            return fn()
        except NotFoundError:
            self.forgotten()
            self.ensure()
            return fn()

    def add(self, messages: Sequence[dict[str, Any]]) -> None:
        """Store ``messages`` in the session, in order, ``add_messages``' most at a time."""
        for start in range(0, len(messages), _PER_CALL):
            self.call(
                partial(self._m.add_messages, self.id, list(messages[start : start + _PER_CALL]))
            )

"""Server-sent events, decoded incrementally from the bytes the proxy passes through.

The proxy relays an upstream's stream byte for byte; this decoder reads a copy of the same
bytes to rebuild the answer for capture. Only ``data:`` lines matter here (OpenAI and
Anthropic put the event's type inside its JSON), parsed into objects capture reads by
attribute; ``[DONE]`` and data that is not JSON are skipped.
"""

from __future__ import annotations

from typing import Any

from ._json import loads

__all__ = ["EventDecoder"]


class EventDecoder:
    def __init__(self) -> None:
        self._pending = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[Any]:
        """The events completed by ``chunk``, as parsed JSON."""
        events: list[Any] = []
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()  # an unfinished line waits for the next chunk
        for line in lines:
            line = line.removesuffix(b"\r")
            if not line:  # a blank line ends an event
                event = self._dispatch()
                if event is not None:
                    events.append(event)
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return events

    def _dispatch(self) -> Any:
        data, self._data = b"\n".join(self._data), []
        if not data or data == b"[DONE]":
            return None
        try:
            return loads(data)
        except ValueError:
            return None

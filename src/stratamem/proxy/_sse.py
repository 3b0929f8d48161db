"""Server-sent events, decoded incrementally from the bytes the proxy passes through.

The proxy relays an upstream's stream byte for byte; this decoder reads a copy of the same
bytes to rebuild the answer for capture. Only ``data:`` lines matter here (OpenAI and
Anthropic put the event's type inside its JSON), parsed into objects capture reads by
attribute; ``[DONE]`` and data that is not JSON are skipped.

It runs on the event loop, chunk by chunk, so its work is linear in the bytes fed (an
unfinished line is kept as a list of pieces and joined once, when its newline comes) and
its memory bounded: an event larger than ``max_event_bytes`` (no newline for that long)
makes it give up (:class:`EventTooLarge`); the proxy then relays the rest without reading.
"""

from __future__ import annotations

from typing import Any

from ._json import loads

__all__ = ["MAX_EVENT_BYTES", "EventDecoder", "EventTooLarge"]

# Larger than any event a provider sends (a Responses stream's last event repeats the whole
# answer; a message is at most a few hundred thousand characters).
MAX_EVENT_BYTES = 8 * 1024 * 1024


class EventTooLarge(ValueError):
    """An event outgrew the decoder's bound; nothing more is decoded."""


class EventDecoder:
    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._pending: list[bytes] = []  # the unfinished line, in the pieces it came in
        self._pending_bytes = 0
        self._data: list[bytes] = []  # the data lines of the unfinished event
        self._data_bytes = 0
        self.joined = 0  # bytes copied to join a line's pieces: at most the stream's length

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished line and event (at most ``max_event_bytes``)."""
        return self._pending_bytes + self._data_bytes

    def feed(self, chunk: bytes) -> list[Any]:
        """The events completed by ``chunk``, as parsed JSON. Raises
        :class:`EventTooLarge` once the unfinished event outgrows the bound."""
        events: list[Any] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = chunk[start:end]
            if self._pending:
                line = b"".join([*self._pending, line])
                self.joined += len(line)
                self._pending, self._pending_bytes = [], 0
            self._line(line.removesuffix(b"\r"), events)
            start = end + 1
        if start < len(chunk):
            self._pending.append(chunk[start:])
            self._pending_bytes += len(chunk) - start
        if self.buffered > self.max_event_bytes:
            self._pending, self._pending_bytes, self._data, self._data_bytes = [], 0, [], 0
            raise EventTooLarge(f"an event larger than {self.max_event_bytes} bytes")
        return events

    def _line(self, line: bytes, events: list[Any]) -> None:
        if not line:  # a blank line ends an event
            event = self._dispatch()
            if event is not None:
                events.append(event)
        elif line.startswith(b"data:"):
            value = line[5:]
            value = value[1:] if value.startswith(b" ") else value
            self._data.append(value)
            self._data_bytes += len(value)

    def _dispatch(self) -> Any:
        data, self._data, self._data_bytes = b"\n".join(self._data), [], 0
        if not data or data == b"[DONE]":
            return None
        try:
            return loads(data)
        except (ValueError, RecursionError):
            return None

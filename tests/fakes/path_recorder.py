"""A loopback HTTP server that records each request's target exactly as it came off the
socket (HTTP client and server libraries may normalise a path; this one reads bytes), and
answers every request ``200 {"ok": true}``::

    with PathRecorder() as upstream:
        ...
        upstream.targets  # [b"/tenant-a/v1/models?limit=2", ...]
        upstream.headers  # one dict per request, lower-cased names
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType

from typing_extensions import Self

__all__ = ["PathRecorder"]

_ANSWER = b'{"ok": true}'


class PathRecorder:
    def __init__(self) -> None:
        self.targets: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.origin = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, name="path-recorder", daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(65536)
            if not data:
                return
            head += data
        head, _, body = head.partition(b"\r\n\r\n")
        request_line, *lines = head.split(b"\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            data = conn.recv(65536)
            if not data:
                break
            body += data
        self.targets.append(request_line.split(b" ")[1])
        self.headers.append(headers)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(_ANSWER)}\r\nconnection: close\r\n\r\n".encode()
            + _ANSWER
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._sock.close()
        self._thread.join(10)

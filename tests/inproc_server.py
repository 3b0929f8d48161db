"""An ASGI app served by uvicorn on 127.0.0.1 (an ephemeral port) in a thread of the test
process: real HTTP, real sockets, with the app's lifespan run at start and stop.

Nothing configures logging (``log_config=None``), so the app's and uvicorn's records reach
the root logger, and pytest's ``caplog``, as they would in an application.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import uvicorn
from typing_extensions import Self

from server_proc import free_port

__all__ = ["InProcessServer"]


class InProcessServer:
    """``with InProcessServer(app) as server: httpx.get(server.url + "/health")``."""

    def __init__(self, app: Any, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            server_header=False,
            # Streams relayed by the app end at once when the test's client goes away.
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, name=f"uvicorn-{self.port}", daemon=True
        )

    def start(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the in-process server exited while starting")
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not start within 30 s")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        """Stop serving and run the app's shutdown (the proxy stores what it captured)."""
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(30)
            if self._thread.is_alive():
                raise RuntimeError("the in-process server did not stop within 30 s")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

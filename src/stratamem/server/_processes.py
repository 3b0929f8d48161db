"""Several server processes on one port, each with a listening socket of its own.

One Python process relays every stream and runs every recall under one interpreter lock;
``stratamem serve --processes N`` (and ``stratamem proxy``) runs N of them on one port
(docs/server.md#processes). This process binds one socket per server process on the port
with ``SO_REUSEPORT`` and the kernel spreads new connections over them by address. With one
socket shared by all (uvicorn's ``--workers``) the process that woke first accepted most of
a burst of new connections and kept them, as clients hold theirs open: under 64 streaming
clients one process used 0.87 of a core, the other 0.30.

This process supervises: it starts the server processes (spawned, so each imports and opens
everything itself), starts another on the same socket when one dies (the connections that
reached that socket meanwhile wait for it), and on SIGTERM or SIGINT stops them all, each
as a single server stops. A process that fails while starting stops them all: the next one
would fail the same way.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

from ..errors import StratamemError

__all__ = ["STARTUP_FAILURE", "serve_processes"]

log = logging.getLogger("stratamem")

# The exit code of a server process that could not start (uvicorn's own, for the same).
STARTUP_FAILURE = 3


def serve_processes(
    target: Callable[[socket.socket], Any],
    *,
    count: int,
    host: str,
    port: int,
    stop_timeout: float,
) -> None:
    """Run ``target(sock)`` in ``count`` spawned processes, each on a socket of its own
    bound to ``host``:``port``, until SIGTERM or SIGINT; then stop them, each given
    ``stop_timeout`` seconds before it is killed. ``target`` must be picklable."""
    sockets = _sockets(host, port, count)
    spawn = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda signum, frame: stopping.set())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }

    def start(sock: socket.socket) -> BaseProcess:
        process = spawn.Process(target=target, args=(sock,), name="stratamem-server")
        process.start()
        return process

    processes: list[BaseProcess] = []
    try:
        processes = [start(sock) for sock in sockets]
        while not stopping.wait(0.2):
            for i, process in enumerate(processes):
                if process.exitcode is None:
                    continue
                if process.exitcode == STARTUP_FAILURE:
                    raise StratamemError(
                        f"a server process could not start (exit code {STARTUP_FAILURE}): "
                        "see its log above"
                    )
                log.warning(
                    "stratamem: server process %s ended (exit code %s); starting another",
                    process.pid,
                    process.exitcode,
                )
                processes[i] = start(sockets[i])
    finally:
        _stop(processes, stop_timeout)
        for sock in sockets:
            sock.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _sockets(host: str, port: int, count: int) -> list[socket.socket]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # The kernel lets only sockets of this user join the port's group.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]  # port 0: the others take the one given to the first
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise StratamemError(f"cannot listen on {host}:{port}: {exc}") from exc
    return sockets


def _stop(processes: list[BaseProcess], timeout: float) -> None:
    """SIGTERM to each process still running, then wait for them all (killing what is
    left after ``timeout``)."""
    for process in processes:
        if process.exitcode is None:
            process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.0))
        if process.exitcode is None:
            log.warning("stratamem: server process %s did not stop; killed", process.pid)
            process.kill()
            process.join()

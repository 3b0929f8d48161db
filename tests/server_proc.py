"""A real `stratamem serve` process on 127.0.0.1 for the server tests (no in-process shortcuts).

The process runs on a SQLite file in its work directory, or on the store URL it is given
(PostgreSQL too), with a background worker and the hashing embedder (unless told another)
so it starts in a second or two; its stdout and stderr go to files the tests read
(the bootstrap key is printed on stdout, access logs are JSON lines on stderr). A process
may be SIGKILLed and started again on the same port; its files then hold both runs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

KEY_RE = re.compile(r"\bsm_[A-Za-z0-9_-]{20,}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m stratamem serve`` in a subprocess; ``start()`` returns once /healthz is up."""

    def __init__(
        self,
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        db: str = "m.db",
        db_url: str | None = None,
        embedder: str = "hash",
    ):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A SQLite file in workdir, unless a store URL is given (conftest's module_db_url).
        self.db_url = db_url or f"sqlite:///{workdir / db}"
        self.embedder = embedder
        self.stdout_path = workdir / f"serve-{self.port}.out"
        self.stderr_path = workdir / f"serve-{self.port}.err"
        # The developer's STRATAMEM_* variables must not change what the tests exercise.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str, timeout: float = 60.0) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "stratamem",
            "--embedder",
            self.embedder,
            "serve",
            "--port",
            str(self.port),
            "--database-url",
            self.db_url,
            *extra,
        ]
        # Appended: a process started again (after kill()) keeps the earlier run's output.
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stratamem serve exited:\n{self.stderr()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"stratamem serve did not come up:\n{self.stderr()}")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would; ``start()`` may be called again."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def bootstrap_key(self) -> str:
        keys = KEY_RE.findall(self.stdout())
        if not keys:
            raise AssertionError(f"no bootstrap key printed:\n{self.stdout()}")
        return keys[0]


def client(base_url: str, key: str | None = None, **kwargs: Any) -> httpx.Client:
    headers = {"Authorization": f"Api-Key {key}"} if key else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=60.0, **kwargs)

"""Fault matrix: what stratamem loses, duplicates or delays when a part of it breaks.

Every case breaks one real part on purpose and counts what survived (the cases and how
they count live in tests/fault_matrix.py, shared with the CI subset tests/test_faults.py):

* ``serve-sigkill``, ``worker-sigkill`` — SIGKILL of ``stratamem serve`` (API and worker)
  or of a ``stratamem worker`` beside ``serve --no-worker``, while clients write with their
  own message ids and a batch is mid-flight; restarted. SQLite and PostgreSQL.
* ``postgres-restart-fast``, ``postgres-restart-immediate`` — ``pg_ctl restart`` of a
  private cluster (initdb in a temporary directory, its own port) under ``serve``.
* ``llm-hang``, ``llm-500``, ``llm-429``, ``llm-invalid-json``, ``llm-wrong-schema``,
  ``llm-unreachable`` — the pipeline's model (an OpenAI-compatible fake on 127.0.0.1,
  ``llm="openai:..."``) misbehaves; ``llm-outage`` is ``llm-unreachable`` for
  ``--outage-seconds`` (10 minutes by default) with the default retry settings.
* ``webhook-hang``, ``-trickle-body``, ``-trickle-head``, ``-huge``, ``-redirect`` — one
  project's receiver misbehaves while another project writes with ``sync=True`` and
  waits for its own delivery.
* ``sqlite-4-processes`` — four processes on one SQLite file.
* ``capture-close-N``, ``capture-exit-N`` — ``close()`` (or process exit without it)
  right after N captured OpenAI SDK calls.
* ``mcp-sigkill``, ``mcp-sigterm``, ``proxy-sigkill``, ``proxy-sigterm`` — MCP writes, or
  chat calls through the memory proxy, while ``serve`` is killed or stopped and started
  again; ``proxy-slow-key-check`` — the proxy's project key check cannot answer;
  ``proxy-postgres-outage`` — PostgreSQL stopped under proxied calls; ``proxy-load`` — 64
  streaming clients through ``serve``'s /v1 (``bench/proxy.py``'s load mode); ``erasure-race`` —
  an erasure or a forget while another process holds a recall log record or a captured
  exchange of the user (the cases of tests/fault_faces.py).

Each case prints one row (accepted, stored, processed, failed, duplicated, time to
recover, verdict, note), then each of its criteria with what was measured. PostgreSQL
cases run in a private cluster this script starts (the binaries of /usr/lib/postgresql/*
or $STRATAMEM_PG_BIN, pgvector installed); the machine's own server is never used. The
exit status is 1 when any case fails.

    python bench/faults.py                       # all of it: ~20 min (outage beside)
    python bench/faults.py --quick               # CI sizes, a 10 s outage: ~6 min
    python bench/faults.py --case serve-sigkill --case llm-500 --backend sqlite
    python bench/faults.py --outage-seconds 120 --json --markdown
    python bench/faults.py --list
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fault_faces as ff
import fault_matrix as fm
from _common import emit_json, machine_info


@dataclass(frozen=True)
class Sizes:
    stream: fm.Stream
    llm_fault_s: float  # the faults that end, except the outage
    llm_hang_s: float  # a hang costs an LLM timeout per attempt: longer
    trickle_s: float  # a trickling receiver gives up after this
    sqlite_messages: int
    capture_calls: tuple[int, ...]
    erasure_rounds: int  # each of the four races this many times
    key_locked_s: float  # proxy-slow-key-check: how long the keys cannot be read
    postgres_down_s: float  # proxy-postgres-outage
    load_s: float  # proxy-load: 64 streaming clients for this long


FULL = Sizes(fm.Stream(4, 300, 300, 180), 20.0, 30.0, 60.0, 250, (5, 50), 5, 5.0, 10.0, 60.0)
QUICK = Sizes(fm.Stream(3, 30, 30, 90), 4.0, 8.0, 10.0, 40, (5,), 1, 3.0, 3.0, 15.0)


@dataclass
class Run:
    """What the cases of one run share: sizes, a scratch directory, the private cluster."""

    sizes: Sizes
    scratch: Path
    outage_s: float
    outage_settings: dict[str, Any]
    recover_timeout: float
    _cluster: fm.PrivateCluster | None = None
    _n: int = 0

    def workdir(self) -> Path:
        self._n += 1
        path = self.scratch / f"case-{self._n:02d}"
        path.mkdir()
        return path

    def db(self, backend: str) -> str:
        """A fresh, empty store of ``backend``."""
        if backend == "sqlite":
            return f"sqlite:///{self.workdir() / 'memory.db'}"
        self._n += 1
        return self.cluster().new_database(f"faults_{self._n:02d}")

    def cluster(self) -> fm.PrivateCluster:
        if self._cluster is None:
            self._cluster = fm.PrivateCluster().start()
        return self._cluster

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()


@dataclass(frozen=True)
class Case:
    name: str
    backend: str


MATRIX: list[Case] = [
    *(
        Case(name, b)
        for b in ("sqlite", "postgres")
        for name in ("serve-sigkill", "worker-sigkill")
    ),
    Case("postgres-restart-fast", "postgres"),
    Case("postgres-restart-immediate", "postgres"),
    *(
        Case(f"llm-{fault}", backend)
        for fault, backend in [
            ("hang", "sqlite"),
            ("500", "sqlite"),
            ("500", "postgres"),
            ("429", "sqlite"),
            ("unreachable", "sqlite"),
            ("invalid-json", "sqlite"),
            ("invalid-json", "postgres"),
            ("wrong-schema", "sqlite"),
        ]
    ),
    Case("llm-outage", "sqlite"),
    Case("llm-outage", "postgres"),
    *(Case(f"webhook-{kind}", "sqlite") for kind in fm.RECEIVERS),
    Case("webhook-trickle-body", "postgres"),
    Case("sqlite-4-processes", "sqlite"),
    *(Case(f"capture-{how}-{n}", "sqlite") for n in (5, 50) for how in ("close", "exit")),
    *(
        Case(f"{face}-sig{how}", b)
        for face in ("mcp", "proxy")
        for how in ("kill", "term")
        for b in ("sqlite", "postgres")
    ),
    Case("proxy-slow-key-check", "postgres"),
    Case("proxy-postgres-outage", "postgres"),
    Case("proxy-load", "sqlite"),
    *(Case("erasure-race", b) for b in ("sqlite", "postgres")),
]


def _run_case(case: Case, run: Run) -> fm.Row:
    name, backend, sizes = case.name, case.backend, run.sizes
    if name == "serve-sigkill":
        return fm.serve_sigkill(run.db(backend), run.workdir(), sizes.stream)
    if name == "worker-sigkill":
        return fm.worker_sigkill(run.db(backend), run.workdir(), sizes.stream)
    if name.startswith("postgres-restart-"):
        mode = name.removeprefix("postgres-restart-")
        return fm.postgres_restart(
            run.cluster(), run.db(backend), run.workdir(), mode, sizes.stream
        )
    if name == "llm-outage":
        # The target of the issue: a long outage with the default retry settings (--quick:
        # the short ones), then the model back. Messages are written during its first half.
        row = fm.llm_fault(
            "unreachable",
            run.db(backend),
            fault_seconds=run.outage_s,
            settings=run.outage_settings,
            posts=6,
            timeout=run.recover_timeout,
        )
        row.case = name
        return row
    if name.startswith("llm-"):
        fault = name.removeprefix("llm-")
        seconds = sizes.llm_hang_s if fault == "hang" else sizes.llm_fault_s
        return fm.llm_fault(fault, run.db(backend), fault_seconds=seconds)
    if name.startswith("webhook-"):
        kind = name.removeprefix("webhook-")
        return fm.webhook_receiver_fault(
            kind, run.db(backend), run.workdir(), trickle_seconds=sizes.trickle_s
        )
    if name == "sqlite-4-processes":
        return fm.sqlite_processes(run.workdir(), messages=sizes.sqlite_messages)
    if name.startswith(("mcp-sig", "proxy-sig")):
        face, how = name.split("-sig")
        fault = ff.mcp_serve_fault if face == "mcp" else ff.proxy_serve_fault
        return fault(run.db(backend), run.workdir(), how, sizes.stream)
    if name == "proxy-slow-key-check":
        return ff.proxy_slow_key_check(run.db(backend), run.workdir(), hold_s=sizes.key_locked_s)
    if name == "proxy-postgres-outage":
        return ff.proxy_postgres_outage(
            run.cluster(), run.db(backend), run.workdir(), down_s=sizes.postgres_down_s
        )
    if name == "proxy-load":
        return _proxy_load(run.workdir(), sizes.load_s)
    if name == "erasure-race":
        return ff.erasure_race(run.db(backend), run.workdir(), rounds=sizes.erasure_rounds)
    how, calls = name.removeprefix("capture-").split("-")
    if how == "close":
        return fm.capture_close(run.db(backend), calls=int(calls))
    return fm.capture_exit(run.db(backend), run.workdir(), calls=int(calls))


@fm._timed
def _proxy_load(workdir: Path, seconds: float) -> fm.Row:
    """``bench/proxy.py``'s load mode: 64 clients streaming through ``serve``'s /v1, one
    call after another, for ``seconds``; every answered exchange must be stored. The share
    with memory is a benchmark target (>= 95 %), reported, not a criterion here."""
    import proxy as bench_proxy

    row = fm.Row("proxy-load", "sqlite")
    args = argparse.Namespace(
        clients=64, seconds=seconds, embedder="local", memories=200, chunk_ms=10.0
    )
    upstream = bench_proxy._Upstream()
    try:
        result = bench_proxy._load(args, upstream, str(workdir))
    finally:
        upstream.close()
    row.accepted, row.stored = result["answered"], result["stored"]
    row.check(
        "every answered exchange stored",
        result["stored"] == result["answered"],
        f"{result['stored']} of {result['answered']}",
    )
    row.check("no traceback in serve's log", result["log_tracebacks"] == 0)
    row.note = (
        f"{result['memory_share']:.0%} with memory (target 95%); added first chunk p95 "
        f"{result['added_first_chunk_ms']['p95']:+.0f} ms; errors {result['errors'] or 'none'}"
    )
    return row


def _selected(cases: list[Case], args: argparse.Namespace) -> list[Case]:
    chosen = []
    for case in cases:
        if args.backend != "both" and case.backend != args.backend:
            continue
        if args.case and not any(case.name.startswith(c) for c in args.case):
            continue
        if args.quick and case.name.startswith("capture-") and case.name.endswith("-50"):
            continue
        chosen.append(case)
    return chosen


def _run_one(case: Case, run: Run) -> fm.Row:
    try:
        return _run_case(case, run)
    except Exception as exc:  # a case that cannot be staged is a FAIL row, not a crash
        return fm.failed_setup(case.name, case.backend, exc)


def _markdown(rows: Sequence[fm.Row]) -> str:
    lines = [
        "| case | backend | accepted | stored | processed | failed | duplicated | "
        "time to recover | verdict | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        recover = "—" if r.recover_s is None else f"{r.recover_s:.1f} s"
        failing = "; ".join(c.criterion for c in r.checks if not c.ok)
        note = r.note + (f" — fails: {failing}" if failing else "")
        lines.append(
            f"| {r.case} | {r.backend} | {r.accepted} | {r.stored} | {r.processed} | "
            f"{r.failed} | {r.duplicated} | {recover} | {r.verdict} | {note} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="CI sizes; a 10 s outage with short backoffs"
    )
    p.add_argument(
        "--case", action="append", help="run the cases whose name starts with this (repeatable)"
    )
    p.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    p.add_argument(
        "--outage-seconds",
        type=float,
        help="length of llm-outage (default 600; --quick 10); shorter than the retry budget "
        "of its settings (~305 s with the defaults), the case says it proves nothing",
    )
    p.add_argument(
        "--recover-timeout",
        type=float,
        default=600.0,
        help="llm-outage: longest wait for processing after the model is back (default 600)",
    )
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--json", action="store_true", help="also print one JSON line of the rows")
    p.add_argument("--markdown", action="store_true", help="also print the rows as a table")
    p.add_argument("-v", "--verbose", action="store_true", help="show stratamem's own logs")
    args = p.parse_args(argv)

    cases = _selected(MATRIX, args)
    if args.list:
        for case in cases:
            print(f"{case.name:<28} {case.backend}")
        return 0
    # The in-process cases' warnings (retries, failed batches) would bury the table.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL)
    outage = args.outage_seconds or (10.0 if args.quick else 600.0)
    info = machine_info()
    command = "python bench/faults.py" + (" " + shlex.join(argv or sys.argv[1:])).rstrip()
    print(f"# {command}")
    print(
        f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {info['engine']}, "
        f"{info['cores']} cores, {info['cpu']}, load {info['loadavg_1m_at_start']}"
    )
    print(f"# {len(cases)} cases; llm-outage {outage:g} s")
    print(fm.Row.HEADER, flush=True)

    rows: list[fm.Row] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stratamem-faults-") as scratch:
        run = Run(
            QUICK if args.quick else FULL,
            Path(scratch),
            outage,
            dict(fm.SHORT_BACKOFF) if args.quick else {},
            args.recover_timeout,
        )
        try:
            outages = [c for c in cases if c.name == "llm-outage"]
            for case in cases:
                if case.name == "llm-outage":
                    continue
                rows.append(_run_one(case, run))
                print(rows[-1].report(), flush=True)
            # The outage cases wait idle for minutes: the backends' run side by side.
            with concurrent.futures.ThreadPoolExecutor(max(1, len(outages))) as pool:
                for row in pool.map(lambda c: _run_one(c, run), outages):
                    rows.append(row)
                    print(row.report(), flush=True)
        finally:
            run.close()
    took = time.monotonic() - started
    failed = [r for r in rows if not r.ok]
    print()
    print(fm.Row.HEADER)
    for r in rows:
        print(r.line())
    print(f"# {len(rows) - len(failed)} PASS, {len(failed)} FAIL in {took / 60:.1f} min")
    if args.markdown:
        print()
        print(_markdown(rows))
    if args.json:
        results: dict[str, Any] = {
            "command": command,
            "machine": info,
            "minutes": round(took / 60, 1),
            "rows": [r.as_dict() for r in rows],
        }
        emit_json("faults", results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

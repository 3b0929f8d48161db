"""Two commits of the engine in one process, interleaved: is the new one slower?

Run-to-run noise on a shared 2-core machine is larger than the few microseconds a refactor
moves (the same commit's accept p50 differs by 10-40% between two processes here), so two
``bench/*.py`` runs side by side cannot tell a 3% change from noise. This script imports
each commit's ``src/stratamem`` as its own package (``git archive``, renamed to
``stratamem_<side>``), opens one ``Memory`` per side on files in the same directory, and
runs the workload in blocks that alternate between the sides (ABC, then CBA, ...), so
both see the same machine at the same moments. The old commit is loaded twice (``old``
and ``old2``): the gap between those two identical sides is the spread that any
difference of ``new`` is measured against.

Workloads (each side with the ``hash`` embedder, so that what differs is the engine):

* ``accept``: ``add_messages(session, [one message], sync=False)`` with ``workers=0``
  (validation and one SQLite transaction), LoCoMo turn texts.
* ``search``: ``mem.search(question, user_id=..., limit=10)`` over a user holding
  ``--messages`` LoCoMo turns, processed (facts and summaries built) before timing.

Nothing is asserted; the script prints p50/p95 per side and each side's ratio to ``old``.

    python bench/ab.py --old 20af387 --new HEAD                       # both workloads
    python bench/ab.py --old 20af387 --workload accept --rounds 60
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import REPO_ROOT, locomo_questions, locomo_turns, machine_info, summarize

_IMPORT = re.compile(r"\b(from|import) stratamem(?=[.\s]|$)", re.MULTILINE)
_DOTTED = re.compile(r"""(["'])stratamem\.""")


def _export(rev: str, name: str, into: Path) -> None:
    """``rev``'s ``src/stratamem`` as the package ``name`` under ``into``."""
    tar = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", rev, "src/stratamem"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into / f"_{name}", filter="data")
    package = into / name
    (into / f"_{name}" / "src" / "stratamem").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = _IMPORT.sub(rf"\1 {name}", text)
        path.write_text(_DOTTED.sub(rf"\1{name}.", text))


def _open(module: Any, path: str) -> tuple[Any, str]:
    mem = module.Memory(f"sqlite:///{path}", embedder="hash", workers=0)
    return mem, mem.sessions.create("u1").id


def _accept(module: Any, path: str, texts: Sequence[str]) -> Callable[[int], None]:
    mem, session = _open(module, path)

    def call(i: int) -> None:  # i is unique per side: each message a new one
        text = texts[i % len(texts)]
        mem.add_messages(session, [{"id": f"m{i}", "role": "user", "content": text}])

    return call


def _search(
    module: Any, path: str, texts: Sequence[str], queries: Sequence[str]
) -> Callable[[int], None]:
    mem, session = _open(module, path)
    for start in range(0, len(texts), 256):
        batch = texts[start : start + 256]
        mem.add_messages(
            session,
            [{"id": f"m{start + j}", "role": "user", "content": t} for j, t in enumerate(batch)],
        )
    mem.close()
    # Processed with a worker, then reopened without one: the search runs alone.
    worker = module.Memory(f"sqlite:///{path}", embedder="hash")
    worker.wait(timeout=600)
    worker.close()
    mem = module.Memory(f"sqlite:///{path}", embedder="hash", workers=0)
    mem.search(queries[0], user_id="u1", limit=10)  # loads the vectors

    def call(i: int) -> None:
        mem.search(queries[i % len(queries)], user_id="u1", limit=10)

    return call


def _run(
    sides: dict[str, Callable[[int], None]], rounds: int, block: int
) -> dict[str, list[float]]:
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    clock = time.perf_counter
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            call, out = sides[name], times[name]
            for i in range(block):
                started = clock()
                call(r * block + i)
                out.append(clock() - started)
    return {n: t[block:] for n, t in times.items()}  # the first block of each warms up


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the baseline commit")
    p.add_argument("--new", default="HEAD", help="the commit under test (default HEAD)")
    p.add_argument("--workload", choices=["accept", "search", "both"], default="both")
    p.add_argument("--rounds", type=int, default=40, help="alternations (default 40)")
    p.add_argument("--block", type=int, default=100, help="calls per side per round")
    p.add_argument("--messages", type=int, default=2000, help="search: the user's messages")
    p.add_argument("--dir", default=None, help="directory of the SQLite files (default tmp)")
    args = p.parse_args(argv)

    info = machine_info()
    print(f"engine A/B in one process: {info['cpu']}, {info['cores']} cores")
    with (
        tempfile.TemporaryDirectory() as packages,
        tempfile.TemporaryDirectory(dir=args.dir) as data,
    ):
        root = Path(packages)
        for name, rev in (("old", args.old), ("old2", args.old), ("new", args.new)):
            _export(rev, f"stratamem_{name}", root)
        sys.path.insert(0, packages)
        modules = {n: importlib.import_module(f"stratamem_{n}") for n in ("old", "old2", "new")}
        texts = [t.text for t in locomo_turns()]
        workloads = ["accept", "search"] if args.workload == "both" else [args.workload]
        for workload in workloads:
            if workload == "accept":
                sides = {n: _accept(m, f"{data}/{n}-accept.db", texts) for n, m in modules.items()}
            else:
                queries = locomo_questions(500)
                sides = {
                    n: _search(m, f"{data}/{n}-search.db", texts[: args.messages], queries)
                    for n, m in modules.items()
                }
            times = _run(sides, args.rounds, args.block)
            base = summarize(times["old"])
            print(f"\n[{workload}] {args.rounds} rounds of {args.block} calls per side")
            for name, seconds in times.items():
                s = summarize(seconds)
                rev = args.new if name == "new" else args.old
                print(
                    f"  {name:<5} {rev:<12} p50 {s.p50:8.3f} ms ({s.p50 / base.p50:5.3f} x old)"
                    f"  p95 {s.p95:8.3f} ms ({s.p95 / base.p95:5.3f} x old)  n={s.n}"
                )


if __name__ == "__main__":
    main()

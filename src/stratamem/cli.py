"""``stratamem`` command line: demo, serve, mcp, import, search, stats, worker, reindex,
retry-failed."""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any, BinaryIO

from . import __version__
from .errors import StratamemError

__all__ = ["main"]


def _memory(
    args: argparse.Namespace, *, existing: bool, remote: bool = False, **overrides: Any
) -> Any:
    """The command's Memory, on the store ``--db`` names, in ``--project``.

    ``existing``: the store must be there already. Commands that read (search, stats, keys,
    ...) say so: on a mistyped --db they must not create an empty store and report nothing
    found. The others (serve, import, demo, worker, mcp, proxy, projects create) create it
    on first use, as ``Memory()`` does. ``remote``: an http(s) URL, a stratamem server, is
    accepted (mcp and proxy); its key is checked at once."""
    from .config import load_settings
    from .memory import Memory
    from .store import mask_url, store_exists

    url = load_settings(database_url=args.db).database_url
    if url.lower().startswith(("http://", "https://")):
        if not remote:
            raise StratamemError(
                f"stratamem {args.command} works on the database itself (sqlite:///path.db "
                f"or postgresql://...), not on a stratamem server ({url}); only mcp and "
                "proxy take a server's URL"
            )
        mem = Memory(url, api_key=args.api_key, **overrides)
        _check_server(mem, args.api_key)
        return mem
    if existing and not store_exists(url):
        raise StratamemError(
            f"no stratamem store at {mask_url(url)}: check --db or STRATAMEM_DATABASE_URL "
            "(stratamem import, serve and demo --db create a store)"
        )
    return Memory(url, embedder=args.embedder, project_id=args.project, **overrides)


def _check_project(mem: Any) -> None:
    """A read of a project nothing was ever stored in, other than the default one, is a
    mistyped --project (or STRATAMEM_PROJECT_ID): refused, naming the projects there are."""
    from .config import Settings
    from .errors import NotFoundError

    pid = mem.project_id
    if pid == Settings.model_fields["project_id"].default or mem.sessions.list(limit=1):
        return
    try:
        mem.projects.get(pid)
    except NotFoundError:
        known = ", ".join(p.id for p in mem.projects.list()) or "none but the default"
        raise StratamemError(
            f"no project {pid!r} in {mem.store.url} (nothing stored in it); check --project "
            f"or STRATAMEM_PROJECT_ID (projects: {known})"
        ) from None


def _check_server(mem: Any, api_key: str | None) -> None:
    """One authenticated call, so that a missing or wrong key fails the start, not each
    later call."""
    from .client import APIConnectionError, AuthenticationError

    try:
        mem.project_id  # noqa: B018  (GET /api/project: the key's project)
    except AuthenticationError as exc:
        mem.close()
        key = api_key or os.environ.get("STRATAMEM_API_KEY")
        problem = "needs an API key" if not key else f"refused the API key ({exc.detail})"
        raise StratamemError(
            f"the stratamem server at {mem.base_url} {problem}: give a project's key with "
            "--api-key or STRATAMEM_API_KEY (stratamem keys create <project> makes one)"
        ) from None
    except APIConnectionError as exc:
        mem.close()
        raise StratamemError(
            f"cannot reach the stratamem server at {mem.base_url}: {exc}"
        ) from None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


# -- import ------------------------------------------------------------------------------


def _open_binary(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")  # closed by the caller
    except OSError as exc:
        raise StratamemError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_jsonl(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The non-blank lines of a JSONL file (``-``: stdin) with their line numbers, each a
    JSON object; anything else is an error naming the line."""
    stream = _open_binary(path)
    try:
        for lineno, raw in enumerate(_lines(stream, path), start=1):
            try:
                # A byte-order mark, which some editors write, is no part of the first line.
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise StratamemError(f"{path}:{lineno}: not UTF-8 text ({exc.reason})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise StratamemError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise StratamemError(f"{path}:{lineno}: expected a JSON object per line")
            yield lineno, obj
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _lines(stream: BinaryIO, path: str) -> Iterator[bytes]:
    try:
        yield from stream
    except OSError as exc:  # a read that fails midway (a vanished network mount, EIO)
        raise StratamemError(f"cannot read {path}: {exc.strerror or exc}") from None


def _count_lines(path: str) -> int:
    with _open_binary(path) as f:
        return sum(1 for line in _lines(f, path) if line.strip())


def _line_id(user_id: str, session_id: str, position: int, message: dict[str, Any]) -> str:
    """The id ``stratamem import`` gives a line without one: a hash of its user, session,
    position among that session's lines in the file (1, 2, ...) and content (the line's
    JSON object, keys sorted), so importing a file again stores nothing twice."""
    text = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    key = json.dumps([user_id, session_id, position, text], ensure_ascii=False)
    return "imp-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def import_jsonl(
    mem: Any,
    path: str,
    *,
    user_id: str | None,
    session_id: str | None,
    batch_size: int,
    wait: bool,
    progress: bool = True,
) -> dict[str, int]:
    """Import a JSONL file of messages; returns counts. Used by the CLI and bench/ingest.py.

    Each line is a message object (``role``, ``content``, ``timestamp``, ``id`` ...) that may
    also name its ``user_id`` and ``session_id``; the options supply defaults. Consecutive
    lines of one session are sent together, ``batch_size`` at a time. A line without an
    ``id`` gets ``_line_id(...)``: lines stored before (an earlier run, an interrupted one)
    are counted in ``duplicates`` and stored once. A bad line stops the import with an
    error naming it; the lines before it are stored.
    """
    from tqdm import tqdm

    limit = mem.settings.max_messages_per_call
    if not 1 <= batch_size <= limit:
        raise StratamemError(
            f"--batch-size {batch_size}: expected 1 to {limit} (max_messages_per_call)"
        )
    total_lines = None if path == "-" else _count_lines(path)
    # A context: an error closes the bar first, so that its message starts a line.
    with tqdm(total=total_lines, unit="msg", desc="accepted", disable=not progress) as bar:
        batches = _Batches(mem, path, batch_size, bar.update)
        sessions: dict[str, str] = {}
        positions: dict[str, int] = {}
        try:
            for lineno, obj in _read_jsonl(path):
                uid = obj.pop("user_id", None) or user_id
                if not uid:
                    raise StratamemError(f"{path}:{lineno}: no user_id (give --user-id or a field)")
                sid = obj.pop("session_id", None) or session_id or f"import-{uid}"
                if sid not in sessions:
                    try:
                        mem.sessions.create(user_id=uid, session_id=sid)
                    except StratamemError as exc:
                        raise StratamemError(f"{path}:{lineno}: {exc}") from None
                    sessions[sid] = uid
                elif sessions[sid] != uid:
                    raise StratamemError(
                        f"{path}:{lineno}: session {sid!r} belongs to {sessions[sid]!r}"
                    )
                positions[sid] = positions.get(sid, 0) + 1
                if obj.get("id") is None:
                    obj["id"] = _line_id(uid, sid, positions[sid], obj)
                batches.add(sid, lineno, obj)
        except _BatchRefused:
            raise
        except StratamemError as exc:
            batches.flush()  # the lines before the bad one are good: stored, then skipped
            raise StratamemError(f"{_one_line(exc)} ({batches.stored_before()})") from None
        batches.flush()
    counts = {"messages": batches.messages, "duplicates": batches.duplicates}
    if wait:
        _wait_processed(mem, counts["messages"] - counts["duplicates"], progress)
    return counts


class _BatchRefused(StratamemError):
    """The store refused a batch of lines (a ValidationError, a ConflictError)."""


class _Batches:
    """The lines of an import to ``add_messages`` calls: consecutive lines of one session,
    ``batch_size`` at a time."""

    def __init__(
        self, mem: Any, path: str, batch_size: int, accepted: Callable[[int], object]
    ) -> None:
        self._mem, self._path, self._size, self._accepted = mem, path, batch_size, accepted
        self._session: str | None = None
        self._pending: list[dict[str, Any]] = []
        self._lines: list[int] = []
        self.messages = self.duplicates = 0

    def add(self, session_id: str, lineno: int, message: dict[str, Any]) -> None:
        if session_id != self._session or len(self._pending) >= self._size:
            self.flush()
            self._session = session_id
        self._pending.append(message)
        self._lines.append(lineno)

    def flush(self) -> None:
        if self._pending and self._session is not None:
            try:
                result = self._mem.add_messages(self._session, self._pending)
            except StratamemError as exc:
                raise self._refused(exc) from None
            self.messages += len(result.message_ids)
            self.duplicates += len(result.duplicates)
            self._accepted(len(self._pending))
        self._pending, self._lines = [], []

    def stored_before(self) -> str:
        n = self.messages
        before = "1 message before it is" if n == 1 else f"{n} messages before it are"
        return f"{before} stored: fix the file and import it again, stored lines are skipped"

    def _refused(self, exc: StratamemError) -> _BatchRefused:
        """The error with each ``messages[i]`` of its problems named by its file line."""
        lines = self._lines
        span = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"
        located = []
        for problem in getattr(exc, "problems", None) or [_one_line(exc)]:
            m = _MESSAGE_INDEX.match(problem)
            if m and int(m.group(1)) < len(lines):
                located.append(f"{self._path}:{lines[int(m.group(1))]}: {problem[m.end() :]}")
            else:
                located.append(f"{self._path}, {span}: {problem}")
        return _BatchRefused(
            f"{'; '.join(located)} (nothing of {span} is stored; {self.stored_before()})"
        )


_MESSAGE_INDEX = re.compile(r"^messages\[(\d+)\]\.?")
# The import's progress bar counts the processed messages this often, or, in a store where
# counting takes long, at most a tenth of the time.
PROGRESS_EVERY = 0.25
PROGRESS_COST_RATIO = 10


def _wait_processed(mem: Any, accepted: int, progress: bool) -> None:
    """Wait until the import's messages are processed, with a progress bar."""
    from tqdm import tqdm

    store = mem.store
    watching = progress and store.unfinished_jobs() > 0

    def finished() -> int:
        counts = store.stats(mem.project_id)["messages"]
        return int(counts["processed"] + counts["failed"])

    # The project's messages processed before: the bar counts the import's from there.
    base = finished() if watching else 0
    done_bar = tqdm(total=accepted, unit="msg", desc="processed", disable=not progress)
    stop = threading.Event()

    def watch() -> None:
        pause = PROGRESS_EVERY
        while not stop.wait(pause):
            started = time.perf_counter()
            done = min(accepted, finished() - base)
            done_bar.update(max(0, done - done_bar.n))
            # stats() counts every row of the project: about two seconds in a store of a
            # million messages (SQLite), which asked four times a second took a core from
            # the workers doing the import.
            pause = max(PROGRESS_EVERY, PROGRESS_COST_RATIO * (time.perf_counter() - started))

    watcher = threading.Thread(target=watch, daemon=True)
    if watching:
        watcher.start()
    mem.wait()
    stop.set()
    if watching:
        watcher.join()
    done_bar.n = accepted
    done_bar.refresh()
    done_bar.close()


def _cmd_import(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    with _memory(args, existing=False) as mem:
        counts = import_jsonl(
            mem,
            args.file,
            user_id=args.user_id,
            session_id=args.session_id,
            batch_size=args.batch_size,
            wait=not args.no_wait,
            progress=not args.quiet,
        )
    elapsed = time.perf_counter() - started
    total, old = counts["messages"], counts["duplicates"]
    print(
        f"imported {total} message{'' if total == 1 else 's'}: {total - old} new, {old} "
        f"already stored ({elapsed:.1f}s, {total / elapsed if elapsed else 0:.0f} msg/s)"
    )
    return 0


# -- search / stats ----------------------------------------------------------------------


def _cmd_search(args: argparse.Namespace) -> int:
    filters = None
    if args.filters is not None:
        try:
            filters = json.loads(args.filters)
        except json.JSONDecodeError as exc:
            raise StratamemError(
                f"--filters: not JSON ({exc.msg} at character {exc.pos + 1}); "
                'expected an object, e.g. \'{"channel": "web"}\''
            ) from None
    with _memory(args, existing=True, workers=0) as mem:
        _check_project(mem)
        hits = mem.search(
            args.query,
            user_id=args.user_id,
            limit=args.limit,
            filters=filters,
            session_id=args.session_id,
        )
    if args.json:
        _print_json([h.model_dump(mode="json") for h in hits])
        return 0
    if not hits:
        print("no matches")
    for i, h in enumerate(hits, start=1):
        when = h.timestamp.strftime("%Y-%m-%d %H:%M") if h.timestamp else "undated"
        # Facts and summaries have no role or session of their own: their layer says what
        # they are, their message_ids where they come from.
        who = f"event {h.event_type}" if h.event_type else h.role or h.layer
        print(f"{i:2d}. [{when}] {who}: {h.text}")
        where = f"  session {h.session_id}" if h.session_id else ""
        print(f"    score {h.score:.4f}  {h.layer} {h.id}{where}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    with _memory(args, existing=True, workers=0, warm_up=False) as mem:
        _check_project(mem)
        stats = mem.stats()
        usage = mem.usage(days=_USAGE_DAYS)
    if args.json:
        _print_json({**stats, "usage": usage.model_dump(mode="json")})
        return 0
    calls = stats.pop("llm_usage", {})
    processing = stats.pop("processing")
    for key, value in stats.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        print(f"{key:>20}: {value}")
    print(f"{'processing':>20}: {_processing(processing)}")
    print(f"{'llm_usage':>20}: {'-' if not calls else ''}")
    for what, u in calls.items():
        print(
            f"{'':>22}{what}: {u['calls']} calls ({u['failed']} failed), "
            f"{u['prompt_tokens']} prompt + {u['completion_tokens']} completion tokens"
        )
    _print_usage(usage)
    return 0


_USAGE_DAYS = 7


def _print_usage(usage: Any) -> None:
    """The last days' model tokens and costs (``mem.usage``), one line per day that
    processed messages or called a model, then the window's total per model."""
    print(f"{f'cost ({_USAGE_DAYS} days)':>20}: {_money(usage.cost)}", end="")
    print(f" (no price for {', '.join(usage.unpriced)})" if usage.unpriced else "")
    for day in usage.days:
        if not (day.messages_processed or day.models):
            continue
        per = "-" if day.tokens_per_message is None else f"{day.tokens_per_message:g}"
        print(
            f"{'':>22}{day.day}: {day.messages_processed} messages processed, "
            f"{day.prompt_tokens} prompt + {day.completion_tokens} completion tokens "
            f"({per} per message), cost {_money(day.cost)}"
        )
    for m in usage.models:
        print(
            f"{'':>22}{m.model}: {m.calls} calls, {m.prompt_tokens} prompt + "
            f"{m.completion_tokens} completion tokens, cost {_money(m.cost)}"
        )


def _money(cost: float | None) -> str:
    return "-" if cost is None else f"{cost:.4f}"


def _processing(state: dict[str, Any]) -> str:
    """``stats()["processing"]`` in one line: running, or paused since when and why."""
    if not state["paused"]:
        return "running"
    causes = "; ".join(
        f"{o['service']} unavailable (failed {o['failures']} times, last: {o['last_error']})"
        for o in state["outages"]
    )
    return f"paused since {state['since']}: {causes}; next probe at {state['next_probe']}"


# -- worker / maintenance ----------------------------------------------------------------


def _cmd_worker(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # A worker may start before anything else has opened a new store (a deployment's
    # processes start together), so it creates the store like serve does.
    mem = _memory(args, existing=False, workers=args.threads)
    logging.getLogger("stratamem").info("worker running; Ctrl-C to stop")
    try:
        while not stop.wait(0.5):
            if args.exit_when_idle and mem.store.unfinished_jobs() == 0:
                break
    finally:
        mem.close(timeout=args.drain_timeout)
    return 0


def _cmd_reindex(args: argparse.Namespace) -> int:
    logging.getLogger("stratamem").setLevel(logging.INFO)
    with _memory(args, existing=True, workers=0, embedder_mismatch="reindex") as mem:
        done = mem.reindex()
        print(
            f"vectors are now made by {mem.embedder.id}; "
            f"{mem.stats()['vectors'].get(mem.embedder.id, 0)} stored ({done} added now)"
        )
    return 0


def _cmd_retry(args: argparse.Namespace) -> int:
    with _memory(args, existing=True) as mem:
        _check_project(mem)
        n = mem.retry_failed(args.user_id)
        print(f"requeued {n} failed jobs")
        if n and not args.no_wait:
            mem.wait()
    return 0


# -- projects and keys -------------------------------------------------------------------


def _cmd_projects(args: argparse.Namespace) -> int:
    from .errors import NotFoundError

    with _memory(args, existing=args.action == "list", workers=0, warm_up=False) as mem:
        if args.action == "create":
            if args.id is not None:
                try:
                    known = mem.projects.get(args.id)
                except NotFoundError:
                    pass
                else:
                    raise StratamemError(
                        f"project {known.id!r} already exists (name {known.name!r}); "
                        "stratamem projects list shows them all"
                    )
            project = mem.projects.create(args.name, project_id=args.id)
            print(f"{project.id}\t{project.name}")
            return 0
        for project in mem.projects.list():
            print(f"{project.id}\t{project.name}\t{project.created_at:%Y-%m-%d %H:%M}")
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    with _memory(args, existing=True, workers=0, warm_up=False) as mem:
        if args.action == "create":
            record, secret = mem.keys.create(args.project_id, name=args.name)
            print(f"API key {record.id} for project {record.project_id!r} (shown once):")
            print(secret)
        elif args.action == "revoke":
            record = mem.keys.revoke(args.key_id)
            print(f"revoked {record.id} ({record.prefix}...) of project {record.project_id!r}")
        else:
            if args.project_id is not None:
                mem.projects.get(args.project_id)  # NotFoundError: a mistyped project
            for k in mem.keys.list(args.project_id):
                state = "active" if k.revoked_at is None else f"revoked {k.revoked_at:%Y-%m-%d}"
                used = "never used" if k.last_used_at is None else f"used {k.last_used_at:%Y-%m-%d}"
                print(f"{k.id}\t{k.project_id}\t{k.prefix}...\t{k.name or '-'}\t{state}\t{used}")
    return 0


# -- serve ---------------------------------------------------------------------------------


def _bootstrap_key(mem: Any) -> str | None:
    """On a store that has never had an API key: a ``default`` project and a key for it.

    Returns the key (to print once; only its hash is stored), or ``None`` when the store
    already has keys (revoked ones included: revoking every key must not mint a new one).
    """
    if mem.keys.list():
        return None
    project = mem.projects.create("default", project_id="default")
    _, secret = mem.keys.create(project.id, name="bootstrap")
    return str(secret)


def _access_logging() -> None:
    # One JSON line per request on stderr, whatever the level of the other loggers.
    from .server._logging import ACCESS_LOGGER

    access = logging.getLogger(ACCESS_LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False


def _cmd_serve(args: argparse.Namespace) -> int:
    from .config import load_settings
    from .server import load_server_settings

    uvicorn = _uvicorn("the server")
    settings = load_server_settings(
        host=args.host,
        port=args.port,
        proxy_upstream=args.proxy_upstream,
        proxy_anthropic_upstream=args.proxy_anthropic_upstream,
    )
    if args.processes is not None:
        settings = settings.model_copy(update={"processes": args.processes})
    processes = settings.processes
    workers = 0 if args.no_worker else None
    # With several processes this one only supervises: each of them opens its own Memory
    # (and pipeline workers); this one opens it to make the first key and print the banner,
    # without the model (it would keep ~250 MB for nothing).
    if processes > 1:
        mem = _memory(args, existing=False, workers=0, warm_up=False)
    else:
        mem = _memory(args, existing=False, workers=workers)
    try:
        key = _bootstrap_key(mem)
        url = f"http://{settings.host}:{settings.port}"
        if args.no_worker:
            each = "no worker (API only)"
        elif processes > 1:  # this process's Memory has none: the server processes' count
            each = f"{processes} processes, each with {load_settings().workers} worker(s)"
        else:
            each = f"{mem.settings.workers} worker(s)"
        print(f"stratamem serving {url}", flush=True)
        print(f"  store {mem.store.url}; embedder {mem.embedder.name}; {each}", flush=True)
        print(f"  llm: {mem.mode}", flush=True)
        if settings.ui:
            print(f"  dashboard: {url}/ui (sign in with an API key)", flush=True)
        _print_proxy(settings, url)
        if key is not None:
            print(
                "Bootstrap API key of project 'default' (shown once; only its hash is stored):\n"
                f"  {key}\n"
                "Try:\n"
                f"  curl -s -X POST {url}/api/sessions -H 'Authorization: Api-Key {key}' "
                "-H 'Content-Type: application/json' -d '{\"user_id\": \"u1\"}'",
                flush=True,
            )
        else:
            # Keys are shown once, when made: a lost one is replaced, not recovered.
            projects = ", ".join(p.id for p in mem.projects.list())
            print(
                "  API keys: printed only when made (the first start printed one); a new one:\n"
                f"    stratamem --db {mem.store.url} keys create <project>"
                f"   (projects: {projects})",
                flush=True,
            )
        _listen(uvicorn, mem, _ServerProcess("serve", args, settings, workers))
    finally:
        mem.close()
    return 0


def _uvicorn(what: str) -> Any:
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise _needs_server_extra(what, exc) from None
    return uvicorn


def _needs_server_extra(what: str, exc: ModuleNotFoundError) -> StratamemError:
    """A plain install (no extras) has no web stack: say which extra brings it."""
    package = (exc.name or "a package").partition(".")[0]
    return StratamemError(f"{what} needs {package}: pip install 'stratamem[server]'")


def _run(uvicorn: Any, app: Any, settings: Any, sockets: list[Any] | None = None) -> None:
    # Recall runs in threads beside the event loop; see ServerSettings.switch_interval_ms.
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,  # ours is structured, with request ids
        server_header=False,
        timeout_keep_alive=settings.keep_alive_s,
        # The client's address (the limiter of wrong credentials counts by it) and scheme
        # come from X-Forwarded-* only behind the proxies the settings name: uvicorn's
        # default would trust them from any local process.
        proxy_headers=settings.forwarded_allow_ips is not None,
        forwarded_allow_ips=settings.forwarded_allow_ips or "",
    )
    _freeze_startup_heap()
    # uvicorn stops gracefully on SIGTERM, then raises the signal again for the handler it
    # found when it started. With Python's default one the process would die there, before
    # the command closes its Memory (which lets the workers finish the work in hand): this
    # handler ends the command normally instead, its `finally` included.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.Server(config).run(sockets)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _freeze_startup_heap() -> None:
    """Take what is alive once a server process has started (the provider SDKs, pydantic's
    models, the app) out of the garbage collector's reach. A full pass over it stopped every
    thread of the process, recalls and the event loop included: ~70 ms for the ~205,000
    objects of ``serve`` (docs/server.md#garbage-collection). Frozen objects are never freed
    by the collector, which start-up's are not meant to be: they live as long as the
    process. An embedded Memory leaves this to its application (docs/capture.md)."""
    gc.collect()
    gc.freeze()


def _listen(uvicorn: Any, mem: Any, server: _ServerProcess) -> None:
    """Serve ``server``'s app on ``mem`` in this process or, with ``--processes`` above 1,
    in server processes of their own that this one supervises (server._processes); their
    /metrics count them all. The caller closes ``mem``."""
    settings = server.settings
    if settings.processes == 1:
        _access_logging()
        _run(uvicorn, server.build(mem), settings)
        return
    from . import _metrics
    from .server._processes import serve_processes

    mem.close()  # this process only supervises: each server process opens its own
    with _metrics.shared_between_processes():
        serve_processes(
            server,
            count=settings.processes,
            host=settings.host,
            port=settings.port,
            stop_timeout=mem.settings.close_timeout_seconds + 10,
        )


class _ServerProcess:
    """One server process of ``--processes``: opens its own Memory on the store, serves on
    the socket it is given, and closes the Memory once its server stops, as the single
    process's command does. Picklable: each spawned process gets it."""

    def __init__(
        self, kind: str, args: argparse.Namespace, settings: Any, workers: int | None
    ) -> None:
        self.kind, self.args, self.settings, self.workers = kind, args, settings, workers

    def __call__(self, sock: Any) -> None:
        from .server._processes import STARTUP_FAILURE

        _logging(self.args.verbose)
        uvicorn = _uvicorn("the server")
        try:
            mem, app = self._open()
        except Exception as exc:  # the supervisor stops: every process would fail alike
            log = logging.getLogger("stratamem")
            log.error("stratamem: a server process could not start: %s", _one_line(exc))
            sys.exit(STARTUP_FAILURE)
        try:
            _access_logging()
            _run(uvicorn, app, self.settings, [sock])
        finally:
            mem.close()

    def build(self, mem: Any) -> Any:
        """The app on ``mem``: the REST server's, or the proxy's alone."""
        if self.kind == "proxy":
            from .proxy import create_proxy_app

            return create_proxy_app(mem, self.settings)
        from .server import create_app

        return create_app(mem, self.settings)

    def _open(self) -> tuple[Any, Any]:
        if self.kind == "proxy":
            mem = _memory(self.args, existing=False, remote=True)
        else:
            mem = _memory(self.args, existing=False, workers=self.workers)
        try:
            return mem, self.build(mem)
        except BaseException:
            mem.close()
            raise


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _print_proxy(settings: Any, url: str) -> None:
    from .proxy import redacted  # an upstream URL's credentials are never shown

    upstream = settings.proxy_upstream
    anthropic = settings.proxy_anthropic_upstream or upstream
    if upstream:
        print(f"  proxy: {url}/v1 (OpenAI-compatible) -> {redacted(upstream)}", flush=True)
    if anthropic:
        print(f"  proxy: {url} (Anthropic-compatible) -> {redacted(anthropic)}", flush=True)


# -- proxy ---------------------------------------------------------------------------------


def _cmd_proxy(args: argparse.Namespace) -> int:
    try:
        from .proxy import create_proxy_app  # noqa: F401  (Starlette's: the extra is there)
    except ModuleNotFoundError as exc:
        raise _needs_server_extra("the proxy", exc) from None
    from .server import load_server_settings

    uvicorn = _uvicorn("the proxy")
    settings = load_server_settings(
        host=args.host,
        proxy_upstream=args.upstream,
        proxy_anthropic_upstream=args.anthropic_upstream,
        proxy_require_user=False if args.allow_no_user else None,
    )
    # Its own port (STRATAMEM_PROXY_PORT, 8001), not serve's: the two run side by side.
    settings = settings.model_copy(update={"port": args.port or settings.proxy_port})
    if not (settings.proxy_upstream or settings.proxy_anthropic_upstream):
        raise StratamemError(
            "stratamem proxy needs an upstream: --upstream URL (or STRATAMEM_PROXY_UPSTREAM)"
        )
    from .memory import Memory

    if args.processes is not None:
        settings = settings.model_copy(update={"processes": args.processes})
    if settings.processes > 1:  # this one supervises (see _cmd_serve)
        mem = _memory(args, existing=False, remote=True, workers=0, warm_up=False)
    else:
        mem = _memory(args, existing=False, remote=True)
    try:
        url = f"http://{settings.host}:{settings.port}"
        # Memory(url) is a RemoteMemory for an http(s) URL.
        where = mem.store.url if isinstance(mem, Memory) else f"the server at {mem.base_url}"
        each = f" ({settings.processes} processes)" if settings.processes > 1 else ""
        print(f"stratamem proxy on {url}{each}; memory: {where}", flush=True)
        _print_proxy(settings, url)
        _listen(uvicorn, mem, _ServerProcess("proxy", args, settings, None))
    finally:
        mem.close()
    return 0


# -- mcp -----------------------------------------------------------------------------------


def _cmd_mcp(args: argparse.Namespace) -> int:
    user = args.user_id or os.environ.get("STRATAMEM_MCP_USER_ID")
    if not user:
        raise StratamemError(
            "stratamem mcp serves one user: give --user-id or STRATAMEM_MCP_USER_ID"
        )
    if importlib.util.find_spec("mcp") is None:
        raise StratamemError("stratamem mcp needs the mcp package: pip install 'stratamem[mcp]'")
    from .mcp import serve_stdio

    # stdout is the protocol's: everything else goes to stderr (logging's default).
    mem = _memory(args, existing=False, remote=True)
    try:
        _freeze_startup_heap()  # a long-lived server too, answering a host's calls
        serve_stdio(mem, user)
    finally:
        mem.close()
    return 0


# -- demo ----------------------------------------------------------------------------------

DEMO_USER = "alex"
DEMO_QUERIES = [
    "Where does Alex live now?",
    "What should I keep in mind when choosing a restaurant for Alex?",
    "When is the Tokyo trip?",
    "Which running shoes was Alex looking at?",
    "学中文",
]


def _cmd_demo(args: argparse.Namespace) -> int:
    tmp = None
    if args.db is None:  # not $STRATAMEM_DATABASE_URL either: the demo is a throwaway
        tmp = tempfile.TemporaryDirectory(prefix="stratamem-demo-")
        args.db = f"sqlite:///{os.path.join(tmp.name, 'demo.db')}"
    try:
        demo = resources.files("stratamem._demo").joinpath("conversation.jsonl")
        with (
            resources.as_file(demo) as path,
            _memory(args, existing=False) as mem,
        ):
            print(f"stratamem demo: store {mem.store.url}")
            print(f"embedder: {mem.embedder.name}\n")
            # An embedder that cannot work (a model this onnxruntime cannot read, an
            # unreachable API) would leave the demo waiting on retried jobs: fail now.
            mem.embedder.embed([DEMO_QUERIES[0]])
            started = time.perf_counter()
            counts = import_jsonl(
                mem,
                str(path),
                user_id=DEMO_USER,
                session_id=None,
                batch_size=64,
                wait=True,
                progress=False,
            )
            stats = mem.stats()
            print(
                f"stored {counts['messages']} messages of user '{DEMO_USER}' and built "
                f"{stats['facts']} facts, {sum(stats['summaries'].values())} summaries and "
                f"{stats['topics']} topics in {time.perf_counter() - started:.2f}s"
            )
            print(f"write path: {mem.mode}\n")
            summaries = {x.id: x for x in mem.summaries.list(user_id=DEMO_USER, limit=1000)}
            print("Topics -> summaries (current; superseded ones are kept in history):")
            for topic in mem.topics.list(user_id=DEMO_USER):
                print(f"  [{topic.name}]")
                for sid in topic.summary_ids:
                    x = summaries[sid]
                    if x.status == "superseded":
                        print(f"    (superseded) {x.text}")
                    else:
                        print(f"    - {x.text}  <- messages {', '.join(x.message_ids)}")
            print()
            for query in DEMO_QUERIES:
                t0 = time.perf_counter()
                hits = mem.search(query, user_id=DEMO_USER, limit=3)
                ms = (time.perf_counter() - t0) * 1000
                print(f"? {query}   ({ms:.1f} ms)")
                for h in hits:
                    if h.layer == "message":
                        who = f"event {h.event_type}" if h.event_type else h.role
                        print(f"    {h.timestamp:%Y-%m-%d} {who}: {h.text}")
                    else:
                        print(f"    {h.layer}: {h.text}")
                print()
            session = mem.sessions.get("demo-work")
            ctx = session.get_memory(
                "Plan a dinner and a trip for Alex",
                recall_config={"message_recent_limit": 2, "message_semantic_top_k": 5},
            )
            print(
                "formatted_context for 'Plan a dinner and a trip for Alex' "
                f"(~{ctx.token_estimate} tokens):"
            )
            print("-" * 72)
            print(ctx.formatted_context)
            print("-" * 72)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


# -- entry point -------------------------------------------------------------------------


def _number(kind: type[int] | type[float], low: float, high: float | None = None) -> Any:
    """An argparse type: a number from ``low`` (to ``high``), else a usage error."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"expected a number {bounds}, got {text}")
        return value

    return parse


_PORT = _number(int, 1, 65535)
_PROCESSES = _number(int, 1, 64)


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--db, --embedder, --project and -v: before the command, or after it (then without
    defaults of their own, so that a value given before the command stays)."""
    group = parser.add_argument_group(
        "global options" if top else "global options (also accepted before the command)"
    )
    none: Any = None if top else argparse.SUPPRESS
    group.add_argument(
        "--db",
        "--database-url",
        dest="db",
        metavar="URL",
        default=none,
        help="the store: sqlite:///path.db, a file path ending in .db, or "
        "postgresql://user:password@host/db (default: $STRATAMEM_DATABASE_URL or "
        "sqlite:///./stratamem.db); mcp and proxy also take a stratamem server's "
        "http(s):// URL, with --api-key",
    )
    group.add_argument(
        "--embedder",
        default=none,
        help="auto | local | hash | openai:<model> (default: $STRATAMEM_EMBEDDER or auto)",
    )
    group.add_argument(
        "--project",
        default=none,
        help="project id (default: $STRATAMEM_PROJECT_ID or 'default')",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="log at INFO level",
    )


def _command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], **kwargs: Any
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    _global_options(parser, top=False)
    parser.set_defaults(func=func)
    return parser


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stratamem", description="Layered long-term memory for LLM applications."
    )
    _global_options(p, top=True)
    p.add_argument("--version", action="version", version=f"stratamem {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")

    _command(
        sub, "demo", _cmd_demo, help="run the embedded default on a small bundled conversation"
    )

    s = _command(
        sub,
        "serve",
        _cmd_serve,
        help="run the REST API and background workers (GUMem-compatible, see docs)",
    )
    s.add_argument("--host", help="interface to bind (default: $STRATAMEM_HOST or 127.0.0.1)")
    s.add_argument("--port", type=_PORT, help="TCP port (default: $STRATAMEM_PORT or 8000)")
    s.add_argument(
        "--no-worker",
        action="store_true",
        help="API only: queued messages are processed by a separate `stratamem worker`",
    )
    s.add_argument(
        "--processes",
        type=_PROCESSES,
        help="server processes on the one port, each with its own workers (default: "
        "$STRATAMEM_PROCESSES or 1); see docs/server.md#processes",
    )
    s.add_argument(
        "--proxy-upstream",
        help="mount the memory proxy on /v1, forwarding to this OpenAI-compatible URL "
        "(default: $STRATAMEM_PROXY_UPSTREAM)",
    )
    s.add_argument(
        "--proxy-anthropic-upstream",
        help="the proxy's upstream of /v1/messages (default: the --proxy-upstream URL)",
    )

    s = _command(
        sub,
        "proxy",
        _cmd_proxy,
        help="an OpenAI/Anthropic-compatible proxy that gives any client memory (see docs)",
    )
    s.add_argument(
        "--upstream",
        help="OpenAI-compatible upstream base URL, e.g. https://api.openai.com or "
        "http://127.0.0.1:11434 (default: $STRATAMEM_PROXY_UPSTREAM)",
    )
    s.add_argument(
        "--anthropic-upstream",
        help="upstream of /v1/messages, e.g. https://api.anthropic.com (default: --upstream)",
    )
    s.add_argument("--host", help="interface to bind (default: $STRATAMEM_HOST or 127.0.0.1)")
    s.add_argument(
        "--port",
        type=_PORT,
        help="TCP port (default: $STRATAMEM_PROXY_PORT or 8001; serve's is 8000)",
    )
    s.add_argument(
        "--processes",
        type=_PROCESSES,
        help="proxy processes on the one port (default: $STRATAMEM_PROCESSES or 1); see "
        "docs/proxy.md#under-load",
    )
    s.add_argument(
        "--allow-no-user",
        action="store_true",
        help="relay requests without X-Stratamem-User-Id without memory (default: 400)",
    )
    s.add_argument(
        "--api-key",
        help="with an http(s):// --db: the server's project API key (default: "
        "$STRATAMEM_API_KEY); checked at start",
    )

    s = _command(
        sub,
        "mcp",
        _cmd_mcp,
        help="serve one user's memory to an MCP host over stdio (embedded, or a server's)",
    )
    s.add_argument(
        "--user-id", help="the user whose memory this is (default: $STRATAMEM_MCP_USER_ID)"
    )
    s.add_argument(
        "--api-key",
        help="with an http(s):// --db: the server's project API key (default: "
        "$STRATAMEM_API_KEY); checked at start",
    )

    s = _command(sub, "projects", _cmd_projects, help="create or list projects (the tenants)")
    acts = s.add_subparsers(dest="action", required=True, metavar="ACTION", help="one of:")
    a = _command(acts, "create", _cmd_projects, help="create a project")
    a.add_argument("name", help="the project's display name")
    a.add_argument("--id", help="project id (default: generated); an existing id is refused")
    _command(acts, "list", _cmd_projects, help="list projects: id, name, creation time")

    s = _command(sub, "keys", _cmd_keys, help="create, list or revoke a project's API keys")
    acts = s.add_subparsers(dest="action", required=True, metavar="ACTION", help="one of:")
    a = _command(
        acts, "create", _cmd_keys, help="create a key (printed once; only its hash is stored)"
    )
    a.add_argument("project_id", help="the project the key acts in")
    a.add_argument("--name", help="a label for the key, e.g. where it is used")
    a = _command(acts, "list", _cmd_keys, help="list keys (never the keys themselves)")
    a.add_argument("project_id", nargs="?", help="only this project's keys (default: all)")
    a = _command(acts, "revoke", _cmd_keys, help="revoke a key by id")
    a.add_argument("key_id", help="the key's id (key_..., as keys list shows it)")

    s = _command(
        sub,
        "import",
        _cmd_import,
        help="import messages from a JSONL file; running it again stores nothing twice",
        description="Import messages from a JSONL file, one message object per line "
        "(role, content, timestamp, metadata, ... and optionally id, user_id, session_id). "
        "A line without an id gets one derived from its content: 'imp-' and a hash of its "
        "user, session, position among that session's lines in the file and its JSON "
        "object, so that running the import again, or resuming one that stopped, stores "
        "nothing twice (the summary line counts what was already stored). An edited line "
        "is a new message.",
    )
    s.add_argument("file", help="the JSONL file ('-' for stdin)")
    s.add_argument("--user-id", help="user of lines that name none")
    s.add_argument("--session-id", help="session of lines that name none (default: import-<user>)")
    s.add_argument(
        "--batch-size",
        type=_number(int, 1),
        default=256,
        help="messages per call, at most max_messages_per_call (default 256)",
    )
    s.add_argument(
        "--no-wait", action="store_true", help="return once stored; a worker processes the rest"
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")

    s = _command(sub, "search", _cmd_search, help="search a user's memory")
    s.add_argument("query", help="what to look for, in plain words")
    s.add_argument("--user-id", required=True, help="whose memory to search")
    s.add_argument("--session-id", help="only this session's messages")
    s.add_argument(
        "--limit", type=_number(int, 1), default=10, help="at most this many results (default 10)"
    )
    s.add_argument("--filters", help='metadata filters as JSON, e.g. \'{"channel": "web"}\'')
    s.add_argument("--json", action="store_true", help="print the results as JSON")

    s = _command(
        sub, "stats", _cmd_stats, help="counts, processing state, embedder, schema version"
    )
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")

    s = _command(
        sub,
        "worker",
        _cmd_worker,
        help="process queued work until stopped (on PostgreSQL a procrastinate worker; run "
        "any number, on any machine)",
    )
    s.add_argument(
        "--threads",
        "--concurrency",
        dest="threads",
        type=_number(int, 1),
        default=1,
        help="batches processed at once by this process (default 1)",
    )
    s.add_argument("--exit-when-idle", action="store_true", help="exit once no work is queued")
    s.add_argument(
        "--drain-timeout",
        type=_number(float, 0),
        default=30.0,
        help="seconds allowed at exit to finish the batches in hand (default 30)",
    )

    _command(
        sub, "reindex", _cmd_reindex, help="re-embed all messages with the configured embedder"
    )

    s = _command(sub, "retry-failed", _cmd_retry, help="requeue messages whose processing failed")
    s.add_argument("--user-id", help="only this user's (default: every user's)")
    s.add_argument(
        "--no-wait", action="store_true", help="return at once; workers process them later"
    )
    return p


def _one_line(exc: BaseException) -> str:
    """An error's message on one line: problems listed on lines of their own (a
    ValidationError's) are joined with '; '."""
    head, *rest = [line.strip() for line in str(exc).splitlines() if line.strip()] or [
        type(exc).__name__
    ]
    return f"{head} {'; '.join(rest)}" if rest else head


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # procrastinate (the job queue on PostgreSQL) logs two INFO lines per batch.
    logging.getLogger("procrastinate").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except StratamemError as exc:
        # Every error a user can fix is one line and exit 2, as argparse's usage errors.
        print(f"stratamem: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `stratamem demo | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``stratamem`` command line: demo, serve, mcp, import, search, stats, worker, reindex,
retry-failed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

from . import __version__
from .errors import StratamemError

__all__ = ["main"]


def _memory(args: argparse.Namespace, **overrides: Any) -> Any:
    from .memory import Memory

    return Memory(args.db, embedder=args.embedder, project_id=args.project, **overrides)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


# -- import ------------------------------------------------------------------------------


def _read_jsonl(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        for lineno, line in enumerate(stream, start=1):
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
        if stream is not sys.stdin:
            stream.close()


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
    lines of one session are sent together, ``batch_size`` at a time.
    """
    from tqdm import tqdm

    total_lines = None
    if path != "-":
        with open(path, encoding="utf-8") as f:
            total_lines = sum(1 for line in f if line.strip())
    bar = tqdm(total=total_lines, unit="msg", desc="accepted", disable=not progress)
    sessions: dict[str, str] = {}
    counts = {"messages": 0, "duplicates": 0}
    pending: list[dict[str, Any]] = []
    pending_session: str | None = None

    def flush() -> None:
        nonlocal pending
        if pending and pending_session is not None:
            result = mem.add_messages(pending_session, pending)
            counts["messages"] += len(result.message_ids)
            counts["duplicates"] += len(result.duplicates)
            bar.update(len(pending))
        pending = []

    for lineno, obj in _read_jsonl(path):
        uid = obj.pop("user_id", None) or user_id
        if not uid:
            raise StratamemError(f"{path}:{lineno}: no user_id (give --user-id or a field)")
        sid = obj.pop("session_id", None) or session_id or f"import-{uid}"
        if sid not in sessions:
            mem.sessions.create(user_id=uid, session_id=sid)
            sessions[sid] = uid
        elif sessions[sid] != uid:
            raise StratamemError(f"{path}:{lineno}: session {sid!r} belongs to {sessions[sid]!r}")
        if sid != pending_session or len(pending) >= batch_size:
            flush()
            pending_session = sid
        pending.append(obj)
    flush()
    bar.close()
    if wait:
        store = mem.store
        remaining = store.unfinished_jobs()
        accepted = counts["messages"] - counts["duplicates"]
        done_bar = tqdm(
            total=accepted,
            unit="msg",
            desc="processed",
            disable=not progress,
        )
        stop = threading.Event()

        def watch() -> None:
            last: float = 0
            while not stop.wait(0.25):
                stats = store.stats(mem.project_id)["messages"]
                done = stats["processed"] + stats["failed"]
                done_bar.update(max(0, done - last - done_bar.n + last))
                last = done_bar.n

        watcher = threading.Thread(target=watch, daemon=True)
        if remaining:
            watcher.start()
        mem.wait()
        stop.set()
        if remaining:
            watcher.join()
        done_bar.n = accepted
        done_bar.refresh()
        done_bar.close()
    return counts


def _cmd_import(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    with _memory(args) as mem:
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
    new = counts["messages"] - counts["duplicates"]
    print(
        f"imported {new} new messages ({counts['duplicates']} already stored) "
        f"in {elapsed:.1f}s ({new / elapsed if elapsed else 0:.0f} msg/s)"
    )
    return 0


# -- search / stats ----------------------------------------------------------------------


def _cmd_search(args: argparse.Namespace) -> int:
    filters = json.loads(args.filters) if args.filters else None
    with _memory(args, workers=0) as mem:
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
        who = f"event {h.event_type}" if h.event_type else h.role
        print(f"{i:2d}. [{when}] {who}: {h.text}")
        print(f"    score {h.score:.4f}  {h.layer} {h.id}  session {h.session_id}")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    with _memory(args, workers=0) as mem:
        stats = mem.stats()
    if args.json:
        _print_json(stats)
        return 0
    usage = stats.pop("llm_usage", {})
    processing = stats.pop("processing")
    for key, value in stats.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        print(f"{key:>20}: {value}")
    print(f"{'processing':>20}: {_processing(processing)}")
    print(f"{'llm_usage':>20}: {'-' if not usage else ''}")
    for what, u in usage.items():
        print(
            f"{'':>22}{what}: {u['calls']} calls ({u['failed']} failed), "
            f"{u['prompt_tokens']} prompt + {u['completion_tokens']} completion tokens"
        )
    return 0


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
    mem = _memory(args, workers=args.threads)
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
    with _memory(args, workers=0, embedder_mismatch="reindex") as mem:
        done = mem.reindex()
        print(
            f"vectors are now made by {mem.embedder.id}; "
            f"{mem.stats()['vectors'].get(mem.embedder.id, 0)} stored ({done} added now)"
        )
    return 0


def _cmd_retry(args: argparse.Namespace) -> int:
    with _memory(args) as mem:
        n = mem.retry_failed(args.user_id)
        print(f"requeued {n} failed jobs")
        if n and not args.no_wait:
            mem.wait()
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


def _cmd_projects(args: argparse.Namespace) -> int:
    with _memory(args, workers=0) as mem:
        if args.action == "create":
            project = mem.projects.create(args.name, project_id=args.id)
            print(f"{project.id}\t{project.name}")
            return 0
        for project in mem.projects.list():
            print(f"{project.id}\t{project.name}\t{project.created_at:%Y-%m-%d %H:%M}")
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    with _memory(args, workers=0) as mem:
        if args.action == "create":
            record, secret = mem.keys.create(args.project_id, name=args.name)
            print(f"API key {record.id} for project {record.project_id!r} (shown once):")
            print(secret)
        elif args.action == "revoke":
            record = mem.keys.revoke(args.key_id)
            print(f"revoked {record.id} ({record.prefix}...) of project {record.project_id!r}")
        else:
            for k in mem.keys.list(args.project_id):
                state = "active" if k.revoked_at is None else f"revoked {k.revoked_at:%Y-%m-%d}"
                used = "never used" if k.last_used_at is None else f"used {k.last_used_at:%Y-%m-%d}"
                print(f"{k.id}\t{k.project_id}\t{k.prefix}...\t{k.name or '-'}\t{state}\t{used}")
    return 0


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
    from .server import create_app, load_server_settings

    uvicorn = _uvicorn("the server")
    settings = load_server_settings(
        host=args.host,
        port=args.port,
        proxy_upstream=args.proxy_upstream,
        proxy_anthropic_upstream=args.proxy_anthropic_upstream,
    )
    from .memory import Memory

    mem = Memory(
        args.database_url or args.db,
        embedder=args.embedder,
        project_id=args.project,
        workers=0 if args.no_worker else None,
    )
    try:
        key = _bootstrap_key(mem)
        app = create_app(mem, settings)
        url = f"http://{settings.host}:{settings.port}"
        workers = "no worker (API only)" if args.no_worker else f"{mem.settings.workers} worker(s)"
        print(f"stratamem serving {url}", flush=True)
        print(f"  store {mem.store.url}; embedder {mem.embedder.name}; {workers}", flush=True)
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
        _access_logging()
        _run(uvicorn, app, settings)
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


def _run(uvicorn: Any, app: Any, settings: Any) -> None:
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,  # ours is structured, with request ids
        server_header=False,
    )
    # uvicorn stops gracefully on SIGTERM, then raises the signal again for the handler it
    # found when it started. With Python's default one the process would die there, before
    # the command closes its Memory (which lets the workers finish the work in hand): this
    # handler ends the command normally instead, its `finally` included.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _print_proxy(settings: Any, url: str) -> None:
    upstream = settings.proxy_upstream
    anthropic = settings.proxy_anthropic_upstream or upstream
    if upstream:
        print(f"  proxy: {url}/v1 (OpenAI-compatible) -> {upstream}", flush=True)
    if anthropic:
        print(f"  proxy: {url} (Anthropic-compatible) -> {anthropic}", flush=True)


# -- proxy ---------------------------------------------------------------------------------


def _cmd_proxy(args: argparse.Namespace) -> int:
    try:
        from .proxy import create_proxy_app  # Starlette's routes
    except ModuleNotFoundError as exc:
        raise _needs_server_extra("the proxy", exc) from None
    from .server import load_server_settings

    uvicorn = _uvicorn("the proxy")
    settings = load_server_settings(
        host=args.host,
        port=args.port,
        proxy_upstream=args.upstream,
        proxy_anthropic_upstream=args.anthropic_upstream,
        proxy_require_user=False if args.allow_no_user else None,
    )
    if not (settings.proxy_upstream or settings.proxy_anthropic_upstream):
        raise StratamemError(
            "stratamem proxy needs an upstream: --upstream URL (or STRATAMEM_PROXY_UPSTREAM)"
        )
    from .memory import Memory

    mem = Memory(
        args.database_url or args.db,
        api_key=args.api_key,
        embedder=args.embedder,
        project_id=args.project,
    )
    try:
        app = create_proxy_app(mem, settings)
        url = f"http://{settings.host}:{settings.port}"
        # Memory(url) is a RemoteMemory for an http(s) URL.
        where = mem.store.url if isinstance(mem, Memory) else "a stratamem server"
        print(f"stratamem proxy on {url}; memory: {where}", flush=True)
        _print_proxy(settings, url)
        _access_logging()
        _run(uvicorn, app, settings)
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
    from .memory import Memory

    # stdout is the protocol's: everything else goes to stderr (logging's default).
    mem = Memory(
        args.database_url or args.db,
        api_key=args.api_key,
        embedder=args.embedder,
        project_id=args.project,
    )
    try:
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
    db = args.db
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="stratamem-demo-")
        db = f"sqlite:///{os.path.join(tmp.name, 'demo.db')}"
    try:
        from .memory import Memory

        demo = resources.files("stratamem._demo").joinpath("conversation.jsonl")
        with (
            resources.as_file(demo) as path,
            Memory(db, embedder=args.embedder, project_id=args.project) as mem,
        ):
            print(f"stratamem demo: store {mem.store.url}")
            print(f"embedder: {mem.embedder.name}\n")
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stratamem", description="Layered long-term memory for LLM applications."
    )
    p.add_argument(
        "--db", help="database URL (default: $STRATAMEM_DATABASE_URL or sqlite:///./stratamem.db)"
    )
    p.add_argument("--embedder", help="auto | local | hash | openai:<model>")
    p.add_argument("--project", help="project id (default: $STRATAMEM_PROJECT_ID or 'default')")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--version", action="version", version=f"stratamem {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("demo", help="run the embedded default on a small bundled conversation")
    s.set_defaults(func=_cmd_demo)

    s = sub.add_parser(
        "serve", help="run the REST API and background workers (GUMem-compatible, see docs)"
    )
    s.add_argument("--host", help="interface to bind (default: $STRATAMEM_HOST or 127.0.0.1)")
    s.add_argument("--port", type=int, help="TCP port (default: $STRATAMEM_PORT or 8000)")
    s.add_argument(
        "--no-worker",
        action="store_true",
        help="API only: queued messages are processed by a separate `stratamem worker`",
    )
    s.add_argument("--database-url", help="same as --db")
    s.add_argument(
        "--proxy-upstream",
        help="mount the memory proxy on /v1, forwarding to this OpenAI-compatible URL "
        "(default: $STRATAMEM_PROXY_UPSTREAM)",
    )
    s.add_argument(
        "--proxy-anthropic-upstream",
        help="the proxy's upstream of /v1/messages (default: the --proxy-upstream URL)",
    )
    s.set_defaults(func=_cmd_serve)

    s = sub.add_parser(
        "proxy",
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
    s.add_argument("--port", type=int, help="TCP port (default: $STRATAMEM_PORT or 8000)")
    s.add_argument(
        "--allow-no-user",
        action="store_true",
        help="relay requests without X-Stratamem-User-Id without memory (default: 400)",
    )
    s.add_argument(
        "--database-url",
        help="same as --db; an http(s):// URL uses a stratamem server, with --api-key",
    )
    s.add_argument("--api-key", help="the server's project API key (default: $STRATAMEM_API_KEY)")
    s.set_defaults(func=_cmd_proxy)

    s = sub.add_parser(
        "mcp",
        help="serve one user's memory to an MCP host over stdio (embedded, or a server's)",
    )
    s.add_argument(
        "--user-id", help="the user whose memory this is (default: $STRATAMEM_MCP_USER_ID)"
    )
    s.add_argument(
        "--database-url",
        help="same as --db; an http(s):// URL uses a stratamem server, with --api-key",
    )
    s.add_argument("--api-key", help="the server's project API key (default: $STRATAMEM_API_KEY)")
    s.set_defaults(func=_cmd_mcp)

    s = sub.add_parser("projects", help="create or list projects (tenants of the server)")
    acts = s.add_subparsers(dest="action", required=True)
    a = acts.add_parser("create", help="create a project")
    a.add_argument("name")
    a.add_argument("--id", help="project id (default: generated)")
    acts.add_parser("list", help="list projects")
    s.set_defaults(func=_cmd_projects)

    s = sub.add_parser("keys", help="create, list or revoke a project's API keys")
    acts = s.add_subparsers(dest="action", required=True)
    a = acts.add_parser("create", help="create a key (printed once; only its hash is stored)")
    a.add_argument("project_id")
    a.add_argument("--name")
    a = acts.add_parser("list", help="list keys (never the keys themselves)")
    a.add_argument("project_id", nargs="?")
    a = acts.add_parser("revoke", help="revoke a key by id")
    a.add_argument("key_id")
    s.set_defaults(func=_cmd_keys)

    s = sub.add_parser("import", help="import messages from a JSONL file ('-' for stdin)")
    s.add_argument("file")
    s.add_argument("--user-id", help="user of lines that name none")
    s.add_argument("--session-id", help="session of lines that name none")
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument(
        "--no-wait", action="store_true", help="return once stored; a worker processes the rest"
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=_cmd_import)

    s = sub.add_parser("search", help="search a user's memory")
    s.add_argument("query")
    s.add_argument("--user-id", required=True)
    s.add_argument("--session-id")
    s.add_argument("--limit", type=int, default=10)
    s.add_argument("--filters", help='metadata filters as JSON, e.g. \'{"channel": "web"}\'')
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_search)

    s = sub.add_parser("stats", help="counts, processing state, embedder, schema version")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_stats)

    s = sub.add_parser(
        "worker",
        help="process queued work until stopped (on PostgreSQL a procrastinate worker; run "
        "any number, on any machine)",
    )
    s.add_argument(
        "--threads",
        "--concurrency",
        dest="threads",
        type=int,
        default=1,
        help="batches processed at once by this process (default 1)",
    )
    s.add_argument("--exit-when-idle", action="store_true")
    s.add_argument("--drain-timeout", type=float, default=30.0)
    s.set_defaults(func=_cmd_worker)

    s = sub.add_parser("reindex", help="re-embed all messages with the configured embedder")
    s.set_defaults(func=_cmd_reindex)

    s = sub.add_parser("retry-failed", help="requeue messages whose processing failed")
    s.add_argument("--user-id")
    s.add_argument("--no-wait", action="store_true")
    s.set_defaults(func=_cmd_retry)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # procrastinate (the job queue on PostgreSQL) logs two INFO lines per batch.
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except StratamemError as exc:
        print(f"stratamem: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `stratamem demo | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

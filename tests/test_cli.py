"""The console script, run as a user would: a real subprocess on a real store (a SQLite
file, and a PostgreSQL schema where the test takes ``db_url``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_proc import ServerProcess, free_port
from stratamem.recall._format import MEMORY_HEADER, MEMORY_OPEN


def run(
    *args: str,
    db: str | None = None,
    check: bool = True,
    cwd: Path | None = None,
    timeout: float = 300,
    **env: str,
) -> Any:
    full = [sys.executable, "-m", "stratamem.cli"]
    if db:
        full += ["--db", db]
    proc = subprocess.run(
        [*full, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.mark.slow
def test_demo_runs_offline_and_prints_recalled_memory() -> None:
    out = run("demo").stdout
    assert "embedder: local all-MiniLM-L6-v2" in out
    assert "stored 18 messages of user 'alex' and built" in out
    assert "write path: none (offline heuristics" in out
    # Facts, summaries and topics are shown; the correction superseded the old plan.
    assert "[food & diet]" in out and "User is vegetarian" in out
    assert "(superseded) User is planning a trip to Tokyo in October" in out
    assert "The Tokyo trip moved to November (2026-11)" in out
    # The answers come back from memory, with their dates.
    assert "summary: User is vegetarian" in out and "summary: User is allergic to peanuts" in out
    assert "2026-04-03 user: 下个月我想学中文" in out
    assert "formatted_context for" in out and f"{MEMORY_OPEN}\n{MEMORY_HEADER}\n" in out


def test_demo_with_an_embedder_that_cannot_work_fails_at_once() -> None:
    # An unreachable embedding API (as a model this onnxruntime cannot read) used to leave
    # the demo waiting for minutes on retried jobs.
    closed = f"http://127.0.0.1:{free_port()}/v1"
    proc = run(
        "demo",
        "--embedder",
        "openai:text-embedding-3-small",
        check=False,
        timeout=60,
        OPENAI_API_KEY="sk-test",
        OPENAI_BASE_URL=closed,
    )
    line = one_error_line(proc)
    assert closed in line and "cannot connect" in line


def test_import_search_stats_and_worker(tmp_path: Path, db_url: str) -> None:
    db = db_url
    data = tmp_path / "messages.jsonl"
    lines = [
        {
            "user_id": "u1",
            "session_id": "a",
            "role": "user",
            "content": "I moved to Berlin",
            "timestamp": "2026-04-24T10:30:00Z",
            "id": "x1",
        },
        {"user_id": "u1", "session_id": "a", "role": "assistant", "content": "Welcome!"},
        {"user_id": "u2", "role": "user", "content": "I live in Madrid", "metadata": {"k": 1}},
    ]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    out = run("--embedder", "hash", "import", str(data), "-q", db=db).stdout
    assert "imported 3 messages: 3 new, 0 already stored" in out
    out = run("--embedder", "hash", "import", str(data), "-q", "--user-id", "u1", db=db).stdout
    # x1 carries an id, the others get one from their content: nothing is stored twice.
    assert "imported 3 messages: 0 new, 3 already stored" in out

    hits = json.loads(
        run("--embedder", "hash", "search", "Berlin", "--user-id", "u1", "--json", db=db).stdout
    )
    assert hits[0]["text"] == "I moved to Berlin" and hits[0]["message_ids"] == ["x1"]
    text = run("--embedder", "hash", "search", "Madrid", "--user-id", "u2", db=db).stdout
    assert "[2026-" in text and "I live in Madrid" in text
    assert (
        "no matches"
        in run("--embedder", "hash", "search", "Madrid", "--user-id", "nobody", db=db).stdout
    )

    stats = json.loads(run("--embedder", "hash", "stats", "--json", db=db).stdout)
    assert stats["messages"] == {"pending": 0, "processed": 3, "failed": 0}
    assert stats["users"] == 2 and stats["schema_version"] >= 1
    assert stats["embedder"] == "hash:v2:384"
    assert "schema_version" in run("--embedder", "hash", "stats", db=db).stdout

    # Accepted without waiting, then processed by a separate worker process.
    run(
        "--embedder",
        "hash",
        "import",
        str(data),
        "-q",
        "--no-wait",
        "--user-id",
        "u3",
        "--session-id",
        "later",
        db=db,
    )
    run("--embedder", "hash", "worker", "--exit-when-idle", db=db)
    stats = json.loads(run("--embedder", "hash", "stats", "--json", db=db).stdout)
    assert stats["messages"]["pending"] == 0


def test_reindex_switches_embedder(tmp_path: Path, db_url: str) -> None:
    db = db_url
    data = tmp_path / "m.jsonl"
    data.write_text('{"role": "user", "content": "bees and honey"}\n', encoding="utf-8")
    run("--embedder", "hash", "import", str(data), "-q", "--user-id", "u", db=db)
    failed = run("--embedder", "hash:64", "search", "bees", "--user-id", "u", db=db, check=False)
    assert failed.returncode == 2 and "stratamem reindex" in failed.stderr
    assert "Traceback" not in failed.stderr
    out = run("--embedder", "hash:64", "reindex", db=db).stdout
    assert "vectors are now made by hash:v2:64; 1 stored" in out
    assert "bees" in run("--embedder", "hash:64", "search", "bees", "--user-id", "u", db=db).stdout


def test_bad_input_exits_2_with_a_message(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'bad.db'}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "fine"}\n{oops\n', encoding="utf-8")
    proc = run("--embedder", "hash", "import", str(bad), "-q", "--user-id", "u", db=db, check=False)
    assert proc.returncode == 2 and "bad.jsonl:2: not JSON" in proc.stderr
    proc = run("--embedder", "hash", "import", str(bad), "-q", db=db, check=False)
    assert proc.returncode == 2 and "no user_id" in proc.stderr
    bad.write_text('{"role": "robot", "content": "x"}\n', encoding="utf-8")
    proc = run("--embedder", "hash", "import", str(bad), "-q", "--user-id", "u", db=db, check=False)
    assert proc.returncode == 2 and "role: must be one of" in proc.stderr
    proc = run("--embedder", "nope", "stats", db=db, check=False)
    assert proc.returncode == 2 and "unknown embedder spec" in proc.stderr


def test_projects_and_keys(db_url: str) -> None:
    db = db_url
    assert run("projects", "create", "Acme Inc.", "--id", "acme", db=db).stdout.startswith("acme")
    assert "acme\tAcme Inc." in run("projects", "list", db=db).stdout
    out = run("keys", "create", "acme", "--name", "ci", db=db).stdout
    key_id = out.split()[2]
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("sm_")
    listed = run("keys", "list", "acme", db=db).stdout
    assert key_id in listed and "active" in listed and secret not in listed

    from stratamem import Memory

    with Memory(db, embedder="hash", workers=0) as mem:
        assert mem.keys.verify(secret).project_id == "acme"  # type: ignore[union-attr]
    assert "revoked" in run("keys", "revoke", key_id, db=db).stdout
    assert "revoked" in run("keys", "list", db=db).stdout
    with Memory(db, embedder="hash", workers=0) as mem:
        assert mem.keys.verify(secret) is None

    bad = run("keys", "create", "nope", db=db, check=False)
    assert bad.returncode == 2 and "no project 'nope'" in bad.stderr
    bad = run("keys", "revoke", "key_nope", db=db, check=False)
    assert bad.returncode == 2 and "no API key" in bad.stderr


# -- user errors: one line, exit 2 -------------------------------------------------------------


def one_error_line(proc: Any) -> str:
    """The command failed as a user error: exit 2, no traceback, one error line (after
    argparse's usage, for its own errors). Returns that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and errors[0] == lines[-1], proc.stderr
    if errors[0].startswith("stratamem: error: "):  # ours, not argparse's usage error
        assert lines == errors, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A SQLite store holding one message of user u1 and a project 'acme', and a directory
    of input files."""
    files = tmp_path_factory.mktemp("cli-errors")
    db = f"sqlite:///{files / 'errors.db'}"
    (files / "one.jsonl").write_text('{"id": "m1", "role": "user", "content": "hi"}\n')
    run("--embedder", "hash", "import", str(files / "one.jsonl"), "-q", "--user-id", "u1", db=db)
    run("--embedder", "hash", "projects", "create", "Acme", "--id", "acme", db=db)
    (files / "bad-role.jsonl").write_text(
        '{"role": "user", "content": "fine"}\n{"role": "robot", "content": "x"}\n'
    )
    (files / "latin1.jsonl").write_bytes(
        '{"role": "user", "content": "caf\xe9"}\n'.encode("latin-1")
    )
    (files / "other-content.jsonl").write_text('{"id": "m1", "role": "user", "content": "bye"}\n')
    (files / "other-user.jsonl").write_text(
        '{"user_id": "u2", "session_id": "import-u1", "role": "user", "content": "hi"}\n'
    )
    return db, files


USER_ERRORS = [
    # (arguments, with {files} for the input directory; what the error line says)
    (["import", "-q", "{files}/missing.jsonl", "--user-id", "u1"], "cannot read"),
    (["import", "-q", "{files}", "--user-id", "u1"], "Is a directory"),
    (["import", "-q", "{files}/latin1.jsonl", "--user-id", "u1"], "latin1.jsonl:1: not UTF-8"),
    (["import", "-q", "{files}/bad-role.jsonl", "--user-id", "u1"], "bad-role.jsonl:2: role:"),
    (["import", "-q", "{files}/other-content.jsonl", "--user-id", "u1"], "with different content"),
    (["import", "-q", "{files}/other-user.jsonl"], "other-user.jsonl:1: session 'import-u1'"),
    (
        ["import", "-q", "{files}/one.jsonl", "--user-id", "u1", "--batch-size", "5000"],
        "--batch-size",
    ),
    (["import", "-q", "{files}/one.jsonl", "--user-id", "u1", "--batch-size", "0"], "--batch-size"),
    (["search", "hi", "--user-id", "u1", "--filters", "{{bad"], "--filters: not JSON"),
    (["search", "hi", "--user-id", "u1", "--filters", "[1]"], "filters"),
    (["search", "hi", "--user-id", "u1", "--limit", "0"], "--limit"),
    (["search", "hi", "--user-id", "u1", "--limit", "x"], "--limit"),
    (["search", "hi", "--user-id", "u1", "--limit", "5000"], "limit"),
    (["search", "hi", "--user-id", "a b"], "user_id"),
    (["--project", "a b", "stats"], "project_id"),
    (["--project", "acme-typo", "stats"], "no project 'acme-typo'"),
    (["--project", "acme-typo", "search", "hi", "--user-id", "u1"], "no project 'acme-typo'"),
    (["--embedder", "nope", "stats"], "unknown embedder spec"),
    (["keys", "revoke", "key_nope"], "no API key 'key_nope'"),
    (["keys", "create", "nope"], "no project 'nope'"),
    (["keys", "list", "nope"], "no project 'nope'"),
    (["projects", "create", "Again", "--id", "acme"], "project 'acme' already exists"),
    (["retry-failed", "--user-id", "a b"], "user_id"),
    (["worker", "--threads", "0"], "--threads"),
    (["worker", "--drain-timeout", "-1"], "--drain-timeout"),
    (["serve", "--port", "70000"], "--port"),
    (["--db", "http://127.0.0.1:9", "stats"], "works on the database itself"),
]


@pytest.mark.parametrize(("args", "says"), USER_ERRORS)
def test_user_errors_are_one_line_and_exit_2(
    store: tuple[str, Path], args: list[str], says: str
) -> None:
    db, files = store
    args = [a.format(files=files) for a in args]
    if "--db" not in args:
        args = ["--db", db, *args]
    line = one_error_line(run("--embedder", "hash", *args, check=False))
    assert says in line


def test_an_import_error_names_the_line_and_loses_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'm.db'}"
    data = tmp_path / "m.jsonl"
    good = [{"role": "user", "content": f"line {i}"} for i in range(5)]
    lines = [json.dumps(x) for x in good]
    lines.insert(3, '{"role": "user", "content": "fine"')  # line 4: cut short
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["--embedder", "hash", "import", str(data), "-q", "--user-id", "u"]
    line = one_error_line(run(*args, "--batch-size", "1", db=db, check=False))
    assert "m.jsonl:4: not JSON" in line and "3 messages before it are stored" in line
    lines[3] = json.dumps({"role": "user", "content": "fine"})  # fixed: run again
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = run(*args, db=db).stdout
    assert "imported 6 messages: 3 new, 3 already stored" in out


# -- a mistyped store is refused, not created --------------------------------------------------

READERS = [
    ["stats"],
    ["search", "x", "--user-id", "u1"],
    ["keys", "list"],
    ["keys", "create", "default"],
    ["keys", "revoke", "key_x"],
    ["projects", "list"],
    ["reindex"],
    ["retry-failed"],
]


def test_a_database_url_typo_is_refused_with_the_accepted_forms(tmp_path: Path) -> None:
    for typo in ("notaurl", "postgres//db", "data/"):
        for command in (["stats"], ["import", "x.jsonl"], ["serve", "--port", str(free_port())]):
            proc = run(
                "--embedder", "hash", "--db", typo, *command, cwd=tmp_path, check=False, timeout=60
            )
            line = one_error_line(proc)
            assert f"{typo!r} is neither a database URL nor a database file" in line
            assert "sqlite:///" in line and "postgresql://" in line and ".db" in line
    assert list(tmp_path.iterdir()) == []  # nothing was created

    from stratamem import ConfigError, Memory

    with pytest.raises(ConfigError, match="neither a database URL"):
        Memory(str(tmp_path / "notaurl"), embedder="hash")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_readers_refuse_a_store_that_does_not_exist(tmp_path: Path, command: list[str]) -> None:
    line = one_error_line(
        run(
            "--embedder", "hash", "--db", "sqlite:///./typo.db", *command, cwd=tmp_path, check=False
        )
    )
    assert "no stratamem store at sqlite:///./typo.db" in line
    assert not (tmp_path / "typo.db").exists()


def test_readers_refuse_an_empty_database_and_writers_create_the_store(
    tmp_path: Path, db_url: str
) -> None:
    from stratamem.store import store_exists

    assert not store_exists(db_url)  # a new SQLite path, or a PostgreSQL schema without tables
    line = one_error_line(run("--embedder", "hash", "stats", db=db_url, check=False))
    assert "no stratamem store at" in line and "password" not in line
    assert not store_exists(db_url)
    data = tmp_path / "m.jsonl"
    data.write_text('{"role": "user", "content": "hello"}\n', encoding="utf-8")
    run("--embedder", "hash", "import", str(data), "-q", "--user-id", "u1", db=db_url)
    assert store_exists(db_url)
    stats = json.loads(run("--embedder", "hash", "stats", "--json", db=db_url).stdout)
    assert stats["messages"]["processed"] == 1


# -- global options after the command ----------------------------------------------------------


def test_global_options_are_accepted_after_the_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'm.db'}"
    data = tmp_path / "m.jsonl"
    data.write_text('{"role": "user", "content": "bees and honey"}\n', encoding="utf-8")
    options = ["--db", db, "--embedder", "hash", "--project", "p1"]
    run("import", str(data), "-q", "--user-id", "u1", *options, "-v")
    # After the command they win over the same options before it.
    elsewhere = ["--db", "sqlite:///./elsewhere.db", "--project", "p0"]
    out = run(*elsewhere, "search", "bees", "--user-id", "u1", *options, cwd=tmp_path).stdout
    assert "bees and honey" in out and not (tmp_path / "elsewhere.db").exists()
    run("projects", "create", "P", "--id", "p2", "--database-url", db, "--embedder", "hash")
    assert "p2\tP" in run("projects", "list", "--db", db, "--embedder", "hash").stdout
    # serve --help documents --db; serve --db reaches the store (here: refused as a typo).
    assert "--db URL, --database-url URL" in run("serve", "--help").stdout
    line = one_error_line(run("serve", "--db", "notaurl", check=False, timeout=60))
    assert "database_url" in line


def test_every_option_of_every_command_says_what_it_does() -> None:
    from stratamem.cli import _parser

    def walk(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, Any]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    yield f"{name} {choice.dest}", choice
                for sub, subparser in action.choices.items():
                    yield from walk(subparser, f"{name} {sub}")
            elif not isinstance(action, argparse._HelpAction):
                yield f"{name} {'/'.join(action.option_strings) or action.dest}", action

    seen = list(walk(_parser(), "stratamem"))
    assert len(seen) > 60
    assert [name for name, action in seen if not action.help] == []


# -- import: running it again stores nothing twice ---------------------------------------------


def test_import_again_or_resumed_stores_nothing_twice(tmp_path: Path, db_url: str) -> None:
    lines = []
    for i in range(300):
        line: dict[str, Any] = {"user_id": f"u{i % 3}", "role": "user", "content": f"note {i}"}
        if i % 50 == 0:
            line["content"] = "ok"  # the same words again in a session: another message
        lines.append(json.dumps(line))
    data = tmp_path / "m.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    part = tmp_path / "part.jsonl"
    part.write_text("\n".join(lines[:120]) + "\n", encoding="utf-8")

    def imported(path: Path, project: str) -> str:
        args = ("--embedder", "hash", "--project", project, "import", str(path), "-q", "--no-wait")
        return str(run(*args, db=db_url).stdout)

    assert "imported 300 messages: 300 new, 0 already stored" in imported(data, "p1")
    assert "imported 300 messages: 0 new, 300 already stored" in imported(data, "p1")
    # An import stopped after 120 lines, then run again on the whole file:
    assert "imported 120 messages: 120 new, 0 already stored" in imported(part, "p2")
    assert "imported 300 messages: 180 new, 120 already stored" in imported(data, "p2")
    for project in ("p1", "p2"):
        stats = json.loads(
            run("--embedder", "hash", "--project", project, "stats", "--json", db=db_url).stdout
        )
        assert sum(stats["messages"].values()) == 300
    # The help says how ids are made.
    assert "running the import again" in " ".join(run("import", "--help").stdout.split())


def test_the_import_progress_counts_its_own_messages_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bar counted every processed message of the project: importing 10 messages into
    # one that held 60 showed 60 of 10 done before the first was processed.
    import tqdm

    from stratamem import Memory, cli

    shown: list[float] = []
    update = tqdm.tqdm.update

    def seen(bar: Any, n: float = 1) -> Any:
        out = update(bar, n)
        shown.append(bar.n)
        return out

    monkeypatch.setattr(tqdm.tqdm, "update", seen)
    monkeypatch.setattr(cli, "PROGRESS_EVERY", 0.05, raising=False)
    with Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder="hash", workers=0) as mem:
        earlier = [{"role": "user", "content": f"note {i}"} for i in range(60)]
        mem.sessions.create(user_id="u", session_id="old").add_messages(earlier, sync=True)
        # The import's batch takes a while, so that the bar counts while it runs.
        mem.hooks.register("fact", "before_add", lambda payload: time.sleep(0.6))
        new = [{"role": "user", "content": f"I moved to city number {i}"} for i in range(10)]
        mem.sessions.create(user_id="u", session_id="new").add_messages(new, sync=False)
        cli._wait_processed(mem, 10, progress=True)
        assert mem.stats()["messages"]["processed"] == 70
    assert shown and max(shown) <= 10


# -- search output -----------------------------------------------------------------------------


def test_search_prints_facts_and_summaries_without_python_none(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'm.db'}"
    data = tmp_path / "m.jsonl"
    data.write_text('{"role": "user", "content": "I moved to Berlin last May"}\n')
    run("--embedder", "hash", "import", str(data), "-q", "--user-id", "u1", db=db)
    hits = json.loads(
        run("--embedder", "hash", "search", "Berlin", "--user-id", "u1", "--json", db=db).stdout
    )
    assert {h["layer"] for h in hits} > {"message"}  # a summary or fact came back too
    out = run("--embedder", "hash", "search", "Berlin", "--user-id", "u1", db=db).stdout
    assert "None" not in out
    assert "summary: User moved to Berlin" in out or "fact: User moved to Berlin" in out
    assert "session import-u1" in out  # the message's session is still shown


# -- proxy and serve side by side --------------------------------------------------------------


def run_proxy(tmp_path: Path, port: int, *args: str, env: dict[str, str] | None = None) -> str:
    """``stratamem proxy ARGS`` until it answers /health on ``port``, then SIGTERM; its
    output."""
    cmd = [sys.executable, "-m", "stratamem", "--embedder", "hash", "proxy"]
    cmd += ["--upstream", "http://127.0.0.1:9", *args]
    out = tmp_path / "proxy.out"
    with open(out, "wb") as o:
        proc = subprocess.Popen(cmd, stdout=o, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, out.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    return out.read_text()


def test_the_proxy_has_its_own_port(tmp_path: Path) -> None:
    from stratamem.server import load_server_settings

    defaults = load_server_settings()
    assert (defaults.port, defaults.proxy_port) == (8000, 8001)
    assert "STRATAMEM_PROXY_PORT or 8001" in " ".join(run("proxy", "--help").stdout.split())
    # STRATAMEM_PORT is serve's: the proxy listens on STRATAMEM_PROXY_PORT.
    serve_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "STRATAMEM_PORT": str(serve_port), "STRATAMEM_PROXY_PORT": str(proxy_port)}
    out = run_proxy(tmp_path, proxy_port, "--db", f"sqlite:///{tmp_path / 'm.db'}", env=env)
    assert f"stratamem proxy on http://127.0.0.1:{proxy_port}" in out


def test_serve_says_how_to_get_a_key_when_it_prints_none(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path)
    server.start()
    server.stop()
    first = server.stdout()
    assert "Bootstrap API key" in first and "keys create" not in first
    server.start()
    server.stop()
    second = server.stdout()[len(first) :]
    assert "Bootstrap API key" not in second
    assert f"stratamem --db {server.db_url} keys create <project>" in second
    assert "(projects: default)" in second


# -- mcp and proxy on a server check the key at start ------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("cli-server")).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("command", ["mcp", "proxy"])
def test_a_missing_or_wrong_server_key_fails_at_start(server: ServerProcess, command: str) -> None:
    args = [command, "--db", server.url]
    args += (
        ["--user-id", "u1"]
        if command == "mcp"
        else ["--upstream", "http://127.0.0.1:9", "--port", str(free_port())]
    )
    line = one_error_line(run(*args, check=False, timeout=60))
    assert "needs an API key" in line and "--api-key or STRATAMEM_API_KEY" in line
    wrong = "sm_" + "x" * 43
    line = one_error_line(run(*args, "--api-key", wrong, check=False, timeout=60))
    assert "refused the API key" in line and "--api-key or STRATAMEM_API_KEY" in line
    line = one_error_line(run(*args, check=False, timeout=60, STRATAMEM_API_KEY=wrong))
    assert "refused the API key" in line


def test_the_proxy_starts_on_a_server_with_a_good_key(
    server: ServerProcess, tmp_path: Path
) -> None:
    port = free_port()
    key = server.bootstrap_key()
    out = run_proxy(tmp_path, port, "--db", server.url, "--port", str(port), "--api-key", key)
    assert f"memory: the server at {server.url}" in out

"""The console script, run as a user would: a real subprocess on a real store (a SQLite
file, and a PostgreSQL schema where the test takes ``db_url``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stratamem.recall._format import MEMORY_HEADER, MEMORY_OPEN


def run(*args: str, db: str | None = None, check: bool = True, **env: str) -> Any:
    full = [sys.executable, "-m", "stratamem.cli"]
    if db:
        full += ["--db", db]
    proc = subprocess.run(
        [*full, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
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
    assert "imported 3 new messages (0 already stored)" in out
    out = run("--embedder", "hash", "import", str(data), "-q", "--user-id", "u1", db=db).stdout
    assert "(1 already stored)" in out  # only x1 carries an id: the others are new again

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
    assert stats["messages"] == {"pending": 0, "processed": 5, "failed": 0}
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

"""Shared fixtures: real databases, real embedders, no mocks of our code.

Tests that take ``db_url`` (directly or through ``mem`` / ``make_memory``) run once per
store backend: ``[sqlite]`` on a file in tmp_path and ``[postgres]`` in a fresh schema of
a throwaway database on the server ``STRATAMEM_TEST_POSTGRES_URL`` names. Without that
variable the PostgreSQL half is skipped, except in CI (``CI`` or
``STRATAMEM_REQUIRE_POSTGRES`` set), where a missing server fails the run. A test or
module about SQLite files specifically is marked ``sqlite_only``.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

# tests/fakes is importable as `fakes` from every test module.
sys.path.insert(0, str(Path(__file__).parent))

from fakes.memory_model import MemoryModel
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory
from stratamem.embed import make_embedder

# The browser fixtures (page, phone_page, stratamem_server ...); tests/browser.py.
pytest_plugins = ["browser"]

REPO = Path(__file__).resolve().parent.parent

# Read once, before the autouse fixture below hides STRATAMEM_* variables from the tests.
POSTGRES_URL = os.environ.get("STRATAMEM_TEST_POSTGRES_URL", "").strip()
REQUIRE_POSTGRES = any(
    os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")
    for name in ("STRATAMEM_REQUIRE_POSTGRES", "CI")
)
BACKENDS = ("sqlite", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sqlite_only: about the SQLite store itself; not run against PostgreSQL"
    )
    if REQUIRE_POSTGRES and not POSTGRES_URL:
        raise pytest.UsageError(
            "CI requires the PostgreSQL half of the suite, but STRATAMEM_TEST_POSTGRES_URL "
            "is not set (.ci/run sets it up with .ci/postgres.sh)"
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only")
        # Module scope: a module's shared fixtures (a server process, module_db_url) are
        # made once per backend, and pytest runs each backend's tests of a module together.
        metafunc.parametrize("backend", ["sqlite"] if only else list(BACKENDS), scope="module")


@pytest.fixture
def backend() -> str:
    """The store backend of this test run (parametrised by pytest_generate_tests)."""
    return "sqlite"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's STRATAMEM_* variables must not change what the tests exercise.
    for key in list(os.environ):
        if key.startswith("STRATAMEM_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def local_embedder() -> Any:
    """The real bundled MiniLM model, loaded once for the whole run."""
    return make_embedder("local")


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def with_search_path(url: str, schema: str) -> str:
    """``url`` connecting with ``schema`` first on the search path (pgvector stays in public)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema},public"))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of its own for this test session, with pgvector; dropped at the end."""
    if not POSTGRES_URL:
        pytest.skip("PostgreSQL tests need STRATAMEM_TEST_POSTGRES_URL (see README: Tests)")
    import psycopg

    name = f"stratamem_test_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        message = f"PostgreSQL at STRATAMEM_TEST_POSTGRES_URL is not usable: {exc}"
        if REQUIRE_POSTGRES:
            pytest.fail(message)
        pytest.skip(message)
    url = _with_database(POSTGRES_URL, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    yield url
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _drop_schema(database: str, schema: str) -> None:
    """Drop a test's schema. The sessions holding or awaiting a lock on it or its tables,
    in any state (a connection a test leaked, a killed process's transaction), are ended
    first, and the DROP waits at most 10 s for a lock, so that a teardown cannot hang."""
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        for attempt in range(3):
            conn.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
                "JOIN pg_database d ON d.oid = l.database AND d.datname = current_database() "
                "LEFT JOIN pg_class c ON c.oid = l.relation "
                "WHERE l.pid <> pg_backend_pid() AND (c.relnamespace = %(ns)s::regnamespace "
                "OR l.classid = 'pg_namespace'::regclass AND l.objid = %(ns)s::regnamespace)",
                {"ns": schema},
            )
            try:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
                return
            except psycopg.errors.LockNotAvailable:
                if attempt == 2:
                    raise


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    """A URL to a fresh, empty schema, dropped after the test."""
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield with_search_path(pg_database, schema)
    _drop_schema(pg_database, schema)


@pytest.fixture(scope="module")
def module_db_url(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh store of the backend shared by a module's tests (e.g. one server process)."""
    if backend == "postgres":
        import psycopg

        database = str(request.getfixturevalue("pg_database"))
        schema = f"m_{secrets.token_hex(6)}"
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        yield with_search_path(database, schema)
        _drop_schema(database, schema)
    else:
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'memory.db'}"


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty store of the test's backend."""
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path / 'memory.db'}"


@pytest.fixture
def make_memory(db_url: str) -> Iterator[Callable[..., Memory]]:
    opened: list[Memory] = []

    def factory(url: str | None = None, **kwargs: Any) -> Memory:
        kwargs.setdefault("embedder", "hash")
        # Capture tests check what recall injects; on a loaded 2-core CI machine recall can
        # exceed the production bound of 50 ms. Tests of that bound set it themselves.
        kwargs.setdefault("capture_recall_timeout_ms", 10_000)
        mem = Memory(url or db_url, **kwargs)
        opened.append(mem)
        return mem

    yield factory
    for mem in opened:
        mem.close(timeout=1)


@pytest.fixture
def mem(make_memory: Callable[..., Memory]) -> Memory:
    """A Memory on a fresh store with the hashing embedder and one worker thread."""
    return make_memory()


@pytest.fixture
def model() -> MemoryModel:
    """The scripted pipeline model (facts, summaries, topics) ``openai_server`` answers with."""
    return MemoryModel()


@pytest.fixture
def openai_server(model: MemoryModel) -> Iterator[FakeOpenAIServer]:
    """A loopback fake OpenAI server answering chat calls with ``model``."""
    with FakeOpenAIServer() as server:
        server.chat_script = model
        yield server


# -- the agent-framework integrations' shared checks -------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[str]:
    """A real ``stratamem serve`` on the module's store: ``"<url> <bootstrap key>"``."""
    from server_proc import ServerProcess

    proc = ServerProcess(tmp_path_factory.mktemp("served"), db_url=module_db_url).start()
    try:
        yield f"{proc.url} {proc.bootstrap_key()}"
    finally:
        proc.stop()


def assert_names_the_extra(blocked: str, module: str, extra: str) -> None:
    """Importing ``module`` without the package ``blocked`` fails, naming the extra."""
    import subprocess

    code = f"import sys\nsys.modules[{blocked!r}] = None\nimport {module}"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    assert proc.returncode != 0
    assert f"pip install 'stratamem[{extra}]'" in proc.stderr


def run_docs_example(page: str, cwd: Path, **env: str) -> str:
    """The first ``python`` block of ``docs/integrations/<page>`` run as written, in ``cwd``
    (where ``Memory()`` makes ./stratamem.db), with ``env`` and none of the developer's
    ``STRATAMEM_*`` settings: what it printed (it must exit 0)."""
    import subprocess

    text = (REPO / "docs" / "integrations" / page).read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**environ, **env},
        cwd=cwd,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout

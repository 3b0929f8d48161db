"""The store's role protocols: both backends implement every role, with the port's signatures.

``Store`` is the union of the role protocols in ``store/_ports.py``; each consumer declares
the roles it uses. Here: every member of every role exists on both backend classes, each
method with the port's parameters (names, kinds, defaults: a backend that drifted from the
port, or from the other backend, fails), the roles partition ``Store``, an opened store of
either backend is an instance of each role, and the job queue is chosen by its ``kind``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, Protocol

import pytest

from stratamem.jobs import WorkerPool, open_queue
from stratamem.store import Store, WebhookStore, open_store
from stratamem.store._ports import ROLES
from stratamem.store.postgres import PostgresStore
from stratamem.store.sqlite import SQLiteStore

BACKENDS = (SQLiteStore, PostgresStore)
KINDS = {"sqlite": "sqlite", "postgres": "postgresql"}


def members(protocol: type) -> dict[str, Any]:
    """The public members a protocol declares, its bases' included: name -> the function
    or property it declares, or None for a data attribute."""
    out: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name in vars(klass).get("__annotations__", {}):
            if not name.startswith("_"):
                out[name] = None
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                out[name] = value
    return out


def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def drift(protocol: type, backend: type) -> list[str]:
    """How ``backend`` departs from ``protocol``: missing members, members it only inherits
    from the port's stubs, and methods whose parameters differ in name, kind or default."""
    problems = []
    for name, declared in members(protocol).items():
        if declared is None:  # a data attribute: set by the instance (see below)
            continue
        try:
            implemented = inspect.getattr_static(backend, name)
        except AttributeError:
            problems.append(f"{name}: missing")
            continue
        if isinstance(declared, property):
            if not isinstance(implemented, property):
                problems.append(f"{name}: not a property")
            continue
        if getattr(implemented, "__module__", None) == declared.__module__:
            problems.append(f"{name}: only the port's stub")
        elif parameters(implemented) != parameters(declared):
            problems.append(
                f"{name}: {inspect.signature(implemented)} != {inspect.signature(declared)}"
            )
    return problems


@pytest.mark.parametrize("backend_class", BACKENDS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_each_backend_implements_each_role_with_the_ports_signatures(
    role: type, backend_class: type
) -> None:
    assert members(role), f"{role.__name__} declares nothing"
    assert drift(role, backend_class) == []


def test_the_roles_partition_the_store_port() -> None:
    declared = [name for role in ROLES for name in members(role)]
    assert len(declared) == len(set(declared)), "a member declared by two roles"
    assert set(members(Store)) == set(declared)
    assert set(ROLES) <= set(Store.__mro__)


def test_the_check_finds_a_backend_that_drifted() -> None:
    class Drifted(SQLiteStore):
        def list_messages(  # type: ignore[override]
            self, project_id: str, *, user_id: str | None = None, limit: int = 50
        ) -> list[Any]:
            return []

        def claim_batch(  # type: ignore[override]
            self, worker: str, lease_seconds: float, max_messages: int, for_jobs: Any = ()
        ) -> None:
            return None

    for name in ("list_messages", "claim_batch"):
        role = next(r for r in ROLES if name in members(r))
        assert [p.split(":")[0] for p in drift(role, Drifted)] == [name]

    class Stubs(WebhookStore):  # has every method, but only as the port's ``...``
        pass

    assert len(drift(WebhookStore, Stubs)) == len(members(WebhookStore))
    assert all(p.endswith("only the port's stub") for p in drift(WebhookStore, Stubs))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = open_store(db_url)
    yield s
    s.close()


def test_an_opened_store_is_each_role_and_declares_its_kind(store: Store, backend: str) -> None:
    for role in (*ROLES, Store):
        assert isinstance(store, role), role.__name__
    assert store.kind == KINDS[backend]
    assert isinstance(store.url, str) and store.url


@pytest.mark.sqlite_only
def test_the_queue_is_chosen_by_the_stores_kind(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SQLite store that happens to have PostgreSQL's claim still gets the worker pool.
    monkeypatch.setattr(store, "claim_user_batch", lambda *a: None, raising=False)
    queue = open_queue(
        store,
        lambda batch: None,
        database_url=store.url,
        threads=0,
        lease_seconds=30.0,
        max_attempts=3,
        backoff_seconds=1.0,
        backoff_max_seconds=5.0,
        outage_backoff_seconds=1.0,
        outage_backoff_max_seconds=5.0,
        batch_max_messages=16,
    )
    assert isinstance(queue, WorkerPool) and queue.name == "store"

"""One API, four shapes: Memory, AsyncMemory, the remote memory and its async client.

Signatures are compared with ``inspect.signature``: parameter names, kinds, defaults and
annotations (evaluated to types), for every public method of every face. AsyncMemory must
be Memory's exact mirror (made by ``in_thread``, or written out where it returns something
else: sessions, views), AsyncMemoryClient MemoryClient's; each satisfies its protocol
(``stratamem.api``) structurally, where an implementation may take more than the protocol
asks: a wider parameter type (``Mapping`` for ``dict``), a default where the protocol has
none, extra parameters with defaults (``actor``).
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stratamem
from stratamem import AsyncMemory, AsyncMemoryAPI, Memory, MemoryAPI, api
from stratamem.capture._capture import CaptureTarget
from stratamem.client import AsyncMemoryClient, MemoryClient, RemoteMemory
from stratamem.config import Settings
from stratamem.types import AsyncSession, MemoryContext, RecallConfig, Session

FACES = ("sessions", "messages", "facts", "summaries", "topics", "webhooks")
# Faces of the embedded memory only: projects and keys (the server's operator has them),
# the recall log, and what the dashboard reads and keeps.
ENGINE_FACES = ("projects", "keys", "recall_log", "users", "dashboard_sessions")
REMOTE_FACES = ("user_actions",)
# Members that are no I/O, so AsyncMemory keeps them sync: capture, views, hooks.
PLAIN = {"scope", "for_project"}
# What the async shape returns where the sync one returns ...
ASYNC_RETURNS = {
    "Session": "AsyncSession",
    "Memory": "AsyncMemory",
    "MemoryClient": "AsyncMemoryClient",
}
# Names that annotations import only for type checkers (stratamem.capture's, ...).
HINT_NAMES = {"Settings": Settings, "MemoryContext": MemoryContext, "RecallConfig": RecallConfig}


@pytest.fixture
def memories(tmp_path: Path) -> Iterator[tuple[Memory, AsyncMemory]]:
    mem = Memory(str(tmp_path / "sync.db"), embedder="hash", workers=0)
    amem = AsyncMemory(str(tmp_path / "async.db"), embedder="hash", workers=0)
    yield mem, amem
    mem.close()
    asyncio.run(amem.close())


@pytest.fixture
def remote() -> Iterator[RemoteMemory]:
    # Nothing is sent: the faces and signatures are all this module looks at.
    mem = stratamem.connect("http://127.0.0.1:9", api_key="sm_test")
    yield mem
    mem.close()


CONTEXT = ("__enter__", "__exit__", "__aenter__", "__aexit__")


def _methods(cls: type) -> dict[str, Callable[..., Any]]:
    found = {}
    for name in dir(cls):
        value = inspect.getattr_static(cls, name)
        if (not name.startswith("_") or name in CONTEXT) and inspect.isfunction(value):
            found[name] = value
    return found


def _shape(fn: Callable[..., Any], returns: dict[str, str] | None = None) -> tuple[Any, ...]:
    sig = inspect.signature(fn)
    ret = str(sig.return_annotation)
    for sync, asynchronous in (returns or {}).items():
        ret = ret.replace(f"[{sync}]", f"[{asynchronous}]")
        ret = asynchronous if ret == sync else ret
    params = tuple((p.name, p.kind, p.default, str(p.annotation)) for p in sig.parameters.values())
    return params, ret


def _assert_mirrors(sync_cls: type, async_cls: type, *, skip: set[str] = frozenset()) -> None:
    sync_methods, async_methods = _methods(sync_cls), _methods(async_cls)
    for name, fn in sync_methods.items():
        if name in skip:
            continue
        twin_name = {"__enter__": "__aenter__", "__exit__": "__aexit__"}.get(name, name)
        assert twin_name in async_methods, f"{async_cls.__name__} has no {twin_name}"
        twin = async_methods[twin_name]
        where = f"{async_cls.__name__}.{twin_name}"
        assert inspect.iscoroutinefunction(twin) != (name in PLAIN), f"{where}: sync or async?"
        assert _shape(twin) == _shape(fn, ASYNC_RETURNS), f"{where} differs from {name}"
    extra = set(async_methods) - {
        {"__enter__": "__aenter__", "__exit__": "__aexit__"}.get(n, n) for n in sync_methods
    }
    assert not extra - skip, f"{async_cls.__name__} has more than {sync_cls.__name__}: {extra}"


# -- AsyncMemory mirrors Memory --------------------------------------------------------------


def test_async_memory_mirrors_every_member_of_memory(memories: tuple[Memory, AsyncMemory]) -> None:
    mem, amem = memories
    members = {n for n in dir(mem) if not n.startswith("_")}
    assert {n for n in dir(amem) if not n.startswith("_")} - {"sync"} == members
    _assert_mirrors(Memory, AsyncMemory)
    for face in (*FACES, *ENGINE_FACES):
        _assert_mirrors(type(getattr(mem, face)), type(getattr(amem, face)))
    bound = {"add_messages", "get_memory", "messages", "processing_status"}
    _assert_mirrors(Session, AsyncSession, skip=set(_methods(Session)) - bound)
    assert inspect.signature(AsyncMemory.__init__) == inspect.signature(Memory.__init__)


def test_the_mirror_check_sees_a_changed_default() -> None:
    class Sync:
        def list(self, *, limit: int = 100) -> list[int]:
            return []

    class Async:
        async def list(self, *, limit: int = 10) -> list[int]:
            return []

    with pytest.raises(AssertionError, match=r"Async\.list differs"):
        _assert_mirrors(Sync, Async)


def test_async_memory_runs_every_face(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncMemory(str(tmp_path / "m.db"), embedder="hash") as amem:
            s = await amem.sessions.create("u1", session_id="s1", title="trip")
            await s.add_messages([{"role": "user", "content": "I love sailing"}], sync=True)
            assert [x.id for x in await amem.sessions.list(user_id="u1")] == ["s1"]
            assert (await s.processing_status()).done
            assert [m.content for m in await s.messages()] == ["I love sailing"]
            (fact,) = await amem.facts.list(user_id="u1")
            assert (await amem.facts.get(fact.id)).text == fact.text
            (summary,) = await amem.summaries.list(user_id="u1")
            assert len(await amem.summaries.history(summary.id)) == 1
            changed = await amem.set_status(summary.id, "archived", reason="test", actor="t")
            assert changed.status == "archived"
            (topic,) = await amem.topics.list(user_id="u1")
            assert (await amem.topics.get(topic.id)).id == topic.id
            assert (await amem.projects.create("other", project_id="p2")).id == "p2"
            key, secret = await amem.keys.create("p2")
            assert (await amem.keys.verify(secret)) == key
            other = amem.for_project("p2")
            assert await other.sessions.list() == []
            await other.close()  # a view: the engine stays open
            assert (await amem.audit(user_id="u1"))[0].actor == "t"
            assert (await amem.export_user("u1"))["user_id"] == "u1"
            assert await amem.reindex() == 0  # every vector is the configured embedder's
            counts = await amem.forget(user_id="u1", session_id="s1", reason="done")
            assert counts["messages"] == 1

    asyncio.run(scenario())


# -- the remote memory's async client mirrors its sync one -----------------------------------


def test_async_client_mirrors_the_sync_client() -> None:
    client, aclient = (
        MemoryClient(base_url="http://127.0.0.1:9"),
        AsyncMemoryClient(base_url="http://127.0.0.1:9"),
    )
    try:
        # aclose(): httpx's name; close() is there too.
        _assert_mirrors(MemoryClient, AsyncMemoryClient, skip={"aclose"})
        for face in (*FACES, *REMOTE_FACES):
            _assert_mirrors(type(getattr(client, face)), type(getattr(aclient, face)))
    finally:
        client.close()
        asyncio.run(aclient.aclose())


# -- every shape satisfies its protocol ------------------------------------------------------


def _hints(obj: Any) -> dict[str, Any]:
    return typing.get_type_hints(obj, localns=HINT_NAMES)


def _arms(t: Any) -> tuple[Any, ...]:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return typing.get_args(t)
    return (t,)


def _accepts(wide: Any, narrow: Any) -> bool:
    """Whether every value of type ``narrow`` is a value of type ``wide``."""
    if wide is Any or wide == narrow:
        return True
    if len(_arms(wide)) > 1 or len(_arms(narrow)) > 1:
        return all(any(_accepts(w, n) for w in _arms(wide)) for n in _arms(narrow))
    w_origin, n_origin = typing.get_origin(wide) or wide, typing.get_origin(narrow) or narrow
    if not (isinstance(w_origin, type) and isinstance(n_origin, type)):
        return False
    if not issubclass(n_origin, w_origin):
        return False
    w_args, n_args = typing.get_args(wide), typing.get_args(narrow)
    return not w_args or (len(w_args) == len(n_args) and all(map(_accepts, w_args, n_args)))


def _bindings(cls: type) -> dict[Any, Any]:
    """The type arguments ``cls`` gives its generic bases' parameters (``_Items[Fact]``:
    ``Item`` is ``Fact``), so an inherited method's hints read as the subclass's."""
    bound: dict[Any, Any] = {}
    for base in cls.__mro__:
        for orig in getattr(base, "__orig_bases__", ()):
            params = getattr(typing.get_origin(orig), "__parameters__", ())
            bound.update(zip(params, typing.get_args(orig), strict=False))
    return bound


def _bind(hint: Any, bound: dict[Any, Any]) -> Any:
    if isinstance(hint, typing.TypeVar):
        return bound.get(hint, hint)
    params = getattr(hint, "__parameters__", ())
    if params and all(p in bound for p in params):
        return hint[tuple(bound[p] for p in params)]
    return hint


def _conforms(
    impl: Callable[..., Any],
    proto: Callable[..., Any],
    where: str,
    bound: dict[Any, Any] | None = None,
    protocol_bound: dict[Any, Any] | None = None,
) -> None:
    """``impl`` takes every call ``proto`` describes, with the same meaning (``bound`` and
    ``protocol_bound``: the type arguments of ``impl``'s and ``proto``'s generic classes,
    see ``_bindings``)."""
    isig, psig = inspect.signature(impl), inspect.signature(proto)
    ihints = {k: _bind(v, bound or {}) for k, v in _hints(impl).items()}
    phints = {k: _bind(v, protocol_bound or {}) for k, v in _hints(proto).items()}
    iparams = [p for p in isig.parameters.values() if p.name != "self"]
    pparams = [p for p in psig.parameters.values() if p.name != "self"]
    var_pos = next((p for p in iparams if p.kind is p.VAR_POSITIONAL), None)
    positional = [p for p in iparams if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in iparams}
    matched = set()
    for i, p in enumerate(pparams):
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and i >= len(positional):
            assert var_pos is not None, f"{where}: no parameter for {p.name}"
            continue
        q = positional[i] if p.kind is not p.KEYWORD_ONLY else by_name.get(p.name)
        assert q is not None and q.name == p.name, f"{where}: parameter {p.name} missing"
        assert q.kind == p.kind, f"{where}: {p.name} is {q.kind.description}"
        if p.default is not p.empty:
            assert q.default == p.default, f"{where}: {p.name} defaults to {q.default!r}"
        assert _accepts(ihints.get(q.name, Any), phints[p.name]), (
            f"{where}: {p.name} is {ihints.get(q.name)}, the protocol's {phints[p.name]}"
        )
        matched.add(q.name)
    for q in iparams:
        if q.name not in matched and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            assert q.default is not q.empty, f"{where}: {q.name} is required"
    assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(proto), where
    if "return" in phints and "return" in ihints and psig.return_annotation != "_M":
        assert _accepts(phints["return"], ihints["return"]), f"{where}: returns {ihints['return']}"


def _protocol_members(proto: type) -> tuple[dict[str, Any], dict[str, Callable[..., Any]]]:
    """A protocol's attributes (name: type) and methods, its protocol bases' included
    (``FactsAPI`` takes ``list`` from ``ItemsAPI[Fact]``)."""
    attributes = _hints(proto)
    methods: dict[str, Callable[..., Any]] = {}
    for base in reversed(proto.__mro__):
        if not getattr(base, "_is_protocol", False) or base in (typing.Protocol, typing.Generic):
            continue
        for name, value in vars(base).items():
            if isinstance(value, property):
                attributes[name] = _hints(value.fget)["return"]
            elif inspect.isfunction(value) and (not name.startswith("_") or name in CONTEXT):
                methods[name] = value
    return attributes, methods


def _assert_satisfies(obj: Any, proto: type, where: str) -> None:
    attributes, methods = _protocol_members(proto)
    for name, kind in attributes.items():
        assert hasattr(obj, name), f"{where} has no {name}"
        if getattr(kind, "_is_protocol", False):
            _assert_satisfies(getattr(obj, name), kind, f"{where}.{name}")
        else:
            assert isinstance(getattr(obj, name), kind), f"{where}.{name} is no {kind}"
    protocol_bound = _bindings(proto)
    for name, fn in methods.items():
        impl = inspect.getattr_static(type(obj), name, None)
        assert inspect.isfunction(impl), f"{where} has no method {name}"
        _conforms(impl, fn, f"{where}.{name}", _bindings(type(obj)), protocol_bound)


def test_every_memory_satisfies_its_protocol(
    memories: tuple[Memory, AsyncMemory], remote: RemoteMemory
) -> None:
    mem, amem = memories
    client = MemoryClient(base_url="http://127.0.0.1:9")
    aclient = AsyncMemoryClient(base_url="http://127.0.0.1:9")
    try:
        for obj in (mem, mem.for_project("p2"), remote, client):
            assert isinstance(obj, MemoryAPI)
            _assert_satisfies(obj, MemoryAPI, type(obj).__name__)
        for obj in (amem, amem.for_project("p2"), aclient):
            assert isinstance(obj, AsyncMemoryAPI)
            _assert_satisfies(obj, AsyncMemoryAPI, type(obj).__name__)
        with Memory("http://127.0.0.1:9", api_key="sm_test") as over_http:
            assert isinstance(over_http, RemoteMemory)
    finally:
        client.close()
        asyncio.run(aclient.aclose())


def test_the_protocol_check_sees_a_missing_parameter(remote: RemoteMemory) -> None:
    class Narrow(api.TopicsAPI):
        def list(self) -> list[Any]:  # type: ignore[override]
            return []

        def get(self, topic_id: str) -> Any:
            return None

    with pytest.raises(AssertionError, match="parameter user_id missing"):
        _assert_satisfies(Narrow(), api.TopicsAPI, "Narrow")

    class NoStatus:  # what FactsAPI takes from ItemsAPI[Fact] is checked too
        def list(self, *, user_id: str | None = None) -> list[Any]:
            return []

        def get(self, fact_id: str) -> Any:
            return None

    with pytest.raises(AssertionError, match="parameter status missing"):
        _assert_satisfies(NoStatus(), api.FactsAPI, "NoStatus")
    assert _accepts(typing.Mapping[str, Any], dict[str, Any])
    assert not _accepts(dict[str, Any], typing.Mapping[str, Any])
    assert not _accepts(str, str | None)


def test_capture_needs_only_what_both_memories_have(
    memories: tuple[Memory, AsyncMemory], remote: RemoteMemory
) -> None:
    mem, _ = memories
    for obj in (mem, remote):
        _assert_satisfies(obj, CaptureTarget, type(obj).__name__)


def test_connect_is_the_remote_memory(remote: RemoteMemory) -> None:
    assert isinstance(remote, RemoteMemory)
    assert remote.base_url == "http://127.0.0.1:9"


def test_importing_the_protocols_stays_out_of_import_stratamem() -> None:
    code = "import sys, stratamem\nprint('stratamem.api' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


def test_a_view_keeps_its_opener_so_exit_still_finishes_the_work(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    script = f"""
import gc
from stratamem import Memory
view = Memory({str(db)!r}, embedder="hash").for_project("p2")  # the opener is not kept
gc.collect()
view.sessions.create("u1", session_id="s1").add_messages(
    [{{"role": "user", "content": "I moved to Berlin last May"}}]
)
"""  # interpreter exit: the opener's atexit hook finishes the queued work, then closes
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with Memory(str(db), embedder="hash", workers=0) as mem:
        (message,) = mem.for_project("p2").messages.list(session_id="s1")
        assert message.status == "processed"

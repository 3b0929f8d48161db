"""A LangGraph ``BaseStore`` backed by stratamem (docs/integrations/langgraph.md).

Mapping. A namespace is a session of the user one of its labels names (``user_index``), its
id ``langgraph:<labels>`` (``_ids.joined_id``), the exact namespace in the session's
metadata. An item is one message of that session whose metadata holds the document as JSON
text (``langgraph.doc``: namespace, key, value, times, version, TTL), so that ``get`` gives
back exactly what ``put`` stored, on every store; the message's content is the item's text
(the store's ``fields``, or ``index``), sent as a memory note, which the pipeline learns as
the user's facts. An item put with ``index=False``, or with no text at those fields, is kept
as a ``tool`` message whose content only names it: stored, listed and filtered, not learned
from and not found by a query.

Messages are never edited, so a put writes a new message and forgets the one it replaces,
with what the pipeline derived from it. An item has two message ids (``.a`` and ``.b``), and
a put writes the one not in use before forgetting the other: whatever fails or stops in
between, one complete version remains (the higher ``version`` wins, and the next put or
delete removes the other), and ``get`` is two lookups by id. Deleting forgets both.

TTL: ``expires_at`` is in the document. An expired item is never returned; the read that
finds it, or ``sweep_ttl``, forgets it. Refreshing on read rewrites the item (as a put that
keeps its value, ``created_at`` and ``updated_at``), so a read refreshes only once the
expiry would move by more than ``REFRESH_SLACK`` of the TTL: a rewrite re-runs the pipeline
on the item.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
)

from ..api import MemoryAPI
from ..errors import ConflictError, NotFoundError
from ..types import NOTE_EVENT, Session
from ._ids import as_id, joined_id, part
from ._json import clean, dumps, limits

__all__ = ["REFRESH_SLACK", "StratamemStore"]

log = logging.getLogger("stratamem.integrations.langgraph")

TAG = "langgraph"  # the metadata key of sessions and messages, and the ids' prefix
SLOTS = (".a", ".b")
# A read refreshes an item's TTL once the expiry would move by more than this share of it.
REFRESH_SLACK = 0.1
# The largest page a listing returns (MAX_LIMIT), and the most hits a search returns.
_PAGE = 10_000
_MOST_HITS = 1000
_PUT_TRIES = 3  # a put that finds its slot taken by another process reads again this often
_FORGET_REPLACED = "langgraph store: put replaced the item"
_FORGET_DELETED = "langgraph store: deleted"
_FORGET_EXPIRED = "langgraph store: expired"


def _now() -> datetime:
    """The store's clock (UTC); every time the store writes or compares comes from here."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class _Doc:
    """One stored version of an item, as its message holds it."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    version: int
    ttl: float | None
    expires_at: datetime | None
    message_id: str
    # The paths its text is taken from (None: put with index=False), and whether it had
    # text there: then its message is a note, learned and found by a query.
    index: tuple[str, ...] | None
    indexed: bool

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def item(self, score: float | None = None, *, scored: bool = False) -> Item:
        if scored:
            return SearchItem(
                self.namespace, self.key, self.value, self.created_at, self.updated_at, score
            )
        return Item(
            value=self.value,
            key=self.key,
            namespace=self.namespace,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


class StratamemStore(BaseStore):
    """LangGraph's ``BaseStore`` over a stratamem memory (embedded or a server's).

    ``user_index`` is the position of the namespace label that names the user whose memory
    an item is: ``1`` for LangMem's ``("memories", "{langgraph_user_id}")``, ``0`` for
    ``(user_id, "memories")``. ``fields`` are the JSON paths whose text is indexed and
    learned (LangGraph's ``IndexConfig["fields"]``; ``"$"``, the default, is the whole
    document: its one string, or a ``key: value`` line per value). ``ttl`` is LangGraph's
    ``TTLConfig``. With ``sync=True`` a put returns once the pipeline has processed the item
    (found by meaning at once); by default it returns once stored (found by its words at
    once, by meaning once processed).
    """

    supports_ttl = True

    def __init__(
        self,
        memory: MemoryAPI,
        *,
        user_index: int,
        fields: Sequence[str] | None = None,
        ttl: TTLConfig | None = None,
        sync: bool = False,
    ) -> None:
        if isinstance(user_index, bool) or not isinstance(user_index, int) or user_index < 0:
            raise ValueError(f"user_index must be an integer >= 0 (got {user_index!r})")
        self._m = memory
        self.user_index = user_index
        self.fields: tuple[str, ...] = tuple(fields) if fields else ("$",)
        self.ttl_config = ttl
        self.sync = sync
        self._sessions: set[str] = set()  # sessions this store knows exist
        self._locks = [threading.Lock() for _ in range(64)]  # puts of one item, in turn
        self._sweeper: threading.Thread | None = None
        self._sweeper_stop = threading.Event()

    # -- BaseStore ------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order: reads see the store as it was before the batch (as
        LangGraph's own stores do), then the puts run, the last one of an item winning."""
        ops = list(ops)
        for op in ops:
            _check_op(op)
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                assert isinstance(op, PutOp)
                puts[(op.namespace, op.key)] = op
                results.append(None)
        # Every put is checked before any is applied: a bad one fails the batch whole.
        values = {k: None if p.value is None else _json_object(p.value) for k, p in puts.items()}
        for namespace, _ in puts:
            self._user(namespace)
        for (namespace, key), put in puts.items():
            value = values[(namespace, key)]
            if value is None:
                self._delete(namespace, key)
            else:
                index = (
                    None if put.index is False else self.fields if put.index is None else put.index
                )
                self._put(namespace, key, value, index=index, ttl=put.ttl)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch`` in a thread: a stratamem memory's calls block."""
        return await asyncio.to_thread(self.batch, list(ops))

    # -- TTL sweeping (as langgraph's PostgresStore) ----------------------------------------

    def sweep_ttl(self) -> int:
        """Forget every expired item of the memory's project; how many."""
        now = _now()
        swept = 0
        for _, session in self._spaces(None):
            for doc in self._docs(session.id):
                if doc.expired(now):
                    swept += self._expire(doc)
        return swept

    def start_ttl_sweeper(
        self, sweep_interval_minutes: int | None = None
    ) -> concurrent.futures.Future[None]:
        """Sweep every ``sweep_interval_minutes`` (default: the TTL config's, else 5) in a
        daemon thread until ``stop_ttl_sweeper``; the future completes when it stops."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._sweeper is not None and self._sweeper.is_alive():
            done.set_result(None)
            return done
        config = self.ttl_config or {}
        minutes = sweep_interval_minutes or config.get("sweep_interval_minutes") or 5
        self._sweeper_stop.clear()

        def loop() -> None:
            try:
                while not self._sweeper_stop.wait(minutes * 60):
                    try:
                        swept = self.sweep_ttl()
                        if swept:
                            log.info("langgraph store: swept %d expired items", swept)
                    except Exception:
                        log.exception("langgraph store: a TTL sweep failed")
            finally:
                done.set_result(None)

        self._sweeper = threading.Thread(target=loop, daemon=True, name="stratamem-ttl-sweeper")
        self._sweeper.start()
        return done

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper; whether it stopped within ``timeout``."""
        if self._sweeper is None:
            return True
        self._sweeper_stop.set()
        self._sweeper.join(timeout)
        stopped = not self._sweeper.is_alive()
        if stopped:
            self._sweeper = None
        return stopped

    # -- get, put, delete -----------------------------------------------------------------

    def _get(self, op: GetOp) -> Item | None:
        doc = self._current(op.namespace, op.key)
        if doc is None:
            return None
        if op.refresh_ttl:
            doc = self._refresh(doc)
        return doc.item()

    def _current(self, namespace: tuple[str, ...], key: str) -> _Doc | None:
        """The item's live version (an expired one is forgotten), if any."""
        versions = self._versions(namespace, key)
        if not versions:
            return None
        doc = versions[-1]
        if doc.expired(_now()):
            self._forget([d.message_id for d in versions], doc, _FORGET_EXPIRED)
            return None
        return doc

    def _versions(self, namespace: tuple[str, ...], key: str) -> list[_Doc]:
        """The item's stored versions (both slots), oldest first."""
        found = []
        for message_id in _slot_ids(namespace, key):
            try:
                message = self._m.messages.get(message_id)
            except NotFoundError:
                continue
            doc = _doc_of(message.id, message.metadata)
            if doc is not None and doc.namespace == namespace and doc.key == key:
                found.append(doc)
        return sorted(found, key=lambda d: d.version)

    def _put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        *,
        index: Sequence[str] | None,
        ttl: float | None,
    ) -> None:
        with self._lock(namespace, key):
            for attempt in range(_PUT_TRIES):
                versions = self._versions(namespace, key)
                now = _now()
                current = versions[-1] if versions and not versions[-1].expired(now) else None
                new = _Doc(
                    namespace=namespace,
                    key=key,
                    value=value,
                    created_at=current.created_at if current else now,
                    updated_at=now,
                    version=versions[-1].version + 1 if versions else 1,
                    ttl=ttl,
                    expires_at=None if ttl is None else now + timedelta(minutes=ttl),
                    message_id="",
                    index=None if index is None else tuple(index),
                    indexed=False,
                )
                try:
                    self._write(new, versions)
                    return
                except ConflictError:
                    # Another process wrote the slot meanwhile: read again and put after it.
                    if attempt == _PUT_TRIES - 1:
                        raise

    def _write(self, new: _Doc, versions: list[_Doc]) -> _Doc:
        """Store ``new`` in the slot not in use, then forget the older versions."""
        in_use = versions[-1].message_id if versions else None
        slot_ids = _slot_ids(new.namespace, new.key)
        target = slot_ids[1] if in_use == slot_ids[0] else slot_ids[0]
        stale = [d for d in versions if d.message_id == target]
        if stale:  # left by a put that stopped half-way: make room
            self._forget([target], stale[0], _FORGET_REPLACED)
        text = "" if new.index is None else _item_text(new.value, new.index)
        new = replace(new, message_id=target, indexed=bool(text))
        self._add(new, text)
        older = [d.message_id for d in versions if d.message_id != target]
        if older:
            self._forget(older, new, _FORGET_REPLACED)
        return new

    def _add(self, doc: _Doc, text: str) -> None:
        user_id = self._user(doc.namespace)
        session_id = self._session(user_id, doc.namespace)
        metadata = {TAG: {"doc": dumps(_doc_json(doc)), "indexed": doc.indexed}}
        for i, label in enumerate(doc.namespace):
            metadata[TAG][f"n{i}"] = part(label)
        message: dict[str, Any] = {"id": doc.message_id, "metadata": metadata}
        if doc.indexed:
            most, _ = limits(self._m)
            content = clean(text)[:most]
            message.update(role="user", event_type=NOTE_EVENT, content=content)
        else:
            label = clean(doc.key)[:200]
            message.update(role="tool", content=f"[LangGraph store item {label!r}, not indexed]")
        try:
            self._m.add_messages(session_id, [message], sync=self.sync)
        except NotFoundError:  # the session was forgotten since this store made it
            self._sessions.discard(session_id)
            session_id = self._session(user_id, doc.namespace)
            self._m.add_messages(session_id, [message], sync=self.sync)

    def _delete(self, namespace: tuple[str, ...], key: str) -> None:
        with self._lock(namespace, key):
            versions = self._versions(namespace, key)
            if versions:
                self._forget([d.message_id for d in versions], versions[-1], _FORGET_DELETED)

    def _refresh(self, doc: _Doc) -> _Doc:
        """``doc`` with its TTL restarted from now, if that moves its expiry by more than
        ``REFRESH_SLACK`` of the TTL (a rewrite of the item, keeping its times)."""
        if doc.ttl is None or doc.expires_at is None:
            return doc
        now = _now()
        expires = now + timedelta(minutes=doc.ttl)
        if expires - doc.expires_at <= timedelta(minutes=doc.ttl * REFRESH_SLACK):
            return doc
        with self._lock(doc.namespace, doc.key):
            versions = self._versions(doc.namespace, doc.key)
            if not versions or versions[-1].version != doc.version:
                return doc  # changed meanwhile: the put that changed it set its TTL
            renewed = replace(doc, version=doc.version + 1, expires_at=expires)
            return self._write(renewed, versions)

    def _expire(self, doc: _Doc) -> int:
        with self._lock(doc.namespace, doc.key):
            versions = self._versions(doc.namespace, doc.key)
            if not versions or not versions[-1].expired(_now()):
                return 0
            self._forget([d.message_id for d in versions], doc, _FORGET_EXPIRED)
            return 1

    def _forget(self, message_ids: list[str], doc: _Doc, reason: str) -> None:
        with contextlib.suppress(NotFoundError):  # already gone: another process forgot it
            self._m.forget(
                user_id=self._user(doc.namespace), message_ids=message_ids, reason=reason
            )

    # -- search ---------------------------------------------------------------------------

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = op.namespace_prefix
        spaces = [
            (ns, s) for ns, s in self._spaces(self._user_of_prefix(prefix)) if _has(ns, prefix)
        ]
        if op.limit <= 0 or not spaces:
            return []
        if op.query and op.query.strip():
            ranked = self._ranked(op, spaces)
        else:
            docs = [d for _, s in spaces for d in self._live(self._docs(s.id))]
            docs = [d for d in docs if _matches_filter(d.value, op.filter)]
            docs.sort(key=lambda d: (d.namespace, d.key))
            docs.sort(key=lambda d: d.updated_at, reverse=True)
            ranked = [(None, d) for d in docs]
        page = ranked[op.offset : op.offset + op.limit]
        out = []
        for score, doc in page:
            if op.refresh_ttl:
                doc = self._refresh(doc)
            item = doc.item(score, scored=True)
            assert isinstance(item, SearchItem)
            out.append(item)
        return out

    def _ranked(
        self, op: SearchOp, spaces: list[tuple[tuple[str, ...], Session]]
    ) -> list[tuple[float | None, _Doc]]:
        """stratamem's hybrid search over the prefix's indexed items, per user, best first."""
        assert op.query is not None
        filters: dict[str, Any] = {f"{TAG}.indexed": True}
        for i, label in enumerate(op.namespace_prefix):
            filters[f"{TAG}.n{i}"] = part(label)
        wanted = op.offset + op.limit
        best: dict[tuple[tuple[str, ...], str], tuple[float, _Doc]] = {}
        for user_id in sorted({s.user_id for _, s in spaces}):
            limit = min(_MOST_HITS, max(wanted, 10))
            while True:
                hits = self._m.search(
                    op.query, user_id=user_id, limit=limit, filters=filters, layers=["message"]
                )
                matched = 0
                now = _now()
                for hit in hits:
                    doc = _doc_of(hit.id, hit.metadata)
                    if doc is None or not _has(doc.namespace, op.namespace_prefix):
                        continue
                    if doc.expired(now):
                        self._expire(doc)
                        continue
                    if not _matches_filter(doc.value, op.filter):
                        continue
                    matched += 1
                    key = (doc.namespace, doc.key)
                    if key not in best or best[key][1].version < doc.version:
                        best[key] = (hit.score, doc)
                if matched >= wanted or len(hits) < limit or limit == _MOST_HITS:
                    break
                limit = min(_MOST_HITS, limit * 4)
        ranked = sorted(best.values(), key=lambda pair: -pair[0])
        return [(score, doc) for score, doc in ranked]

    # -- namespaces -----------------------------------------------------------------------

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        user_id = None
        for condition in conditions:
            path = condition.path
            if condition.match_type == "prefix" and len(path) > self.user_index:
                label = path[self.user_index]
                if label != "*":
                    user_id = as_id(label)
        found: set[tuple[str, ...]] = set()
        for ns, session in self._spaces(user_id):
            if not all(_matches_condition(c, ns) for c in conditions):
                continue
            shown = ns if op.max_depth is None else ns[: op.max_depth]
            if shown in found:
                continue
            if any(True for _ in self._live(self._docs(session.id))):
                found.add(shown)
        return sorted(found)[op.offset : op.offset + op.limit]

    def _spaces(self, user_id: str | None) -> Iterator[tuple[tuple[str, ...], Session]]:
        """This store's namespaces and their sessions (one user's, or the project's)."""
        offset = 0
        while True:
            page = self._m.sessions.list(user_id=user_id, limit=_PAGE, offset=offset)
            for session in page:
                namespace = _namespace_of(session)
                if namespace is not None:
                    yield namespace, session
            if len(page) < _PAGE:
                return
            offset += _PAGE

    def _docs(self, session_id: str) -> list[_Doc]:
        """The current version of each item of a session, in the order they were put."""
        latest: dict[str, _Doc] = {}
        offset = 0
        while True:
            try:
                page = self._m.messages.list(session_id=session_id, limit=_PAGE, offset=offset)
            except NotFoundError:  # forgotten since it was listed (a server says so)
                return []
            for message in page:
                doc = _doc_of(message.id, message.metadata)
                if doc is not None and (
                    doc.key not in latest or latest[doc.key].version < doc.version
                ):
                    latest[doc.key] = doc
            if len(page) < _PAGE:
                return list(latest.values())
            offset += _PAGE

    def _live(self, docs: Iterable[_Doc]) -> Iterator[_Doc]:
        """``docs`` less the expired, which are forgotten."""
        now = _now()
        for doc in docs:
            if doc.expired(now):
                self._expire(doc)
            else:
                yield doc

    # -- scopes ---------------------------------------------------------------------------

    def _user(self, namespace: tuple[str, ...]) -> str:
        if len(namespace) <= self.user_index:
            raise InvalidNamespaceError(
                f"namespace {namespace!r} has no label at position {self.user_index}, "
                f"which names the user (StratamemStore(user_index={self.user_index}))"
            )
        return as_id(namespace[self.user_index])

    def _user_of_prefix(self, prefix: tuple[str, ...]) -> str | None:
        """The user a search prefix names, or None when it spans users."""
        return self._user(prefix) if len(prefix) > self.user_index else None

    def _session(self, user_id: str, namespace: tuple[str, ...]) -> str:
        session_id = _session_id(namespace)
        if session_id not in self._sessions:
            title = "LangGraph store " + "/".join(namespace)
            try:
                self._m.sessions.create(
                    user_id,
                    session_id=session_id,
                    title=clean(title)[:200],
                    metadata={TAG: {"namespace": dumps(list(namespace))}},
                )
            except ConflictError as exc:
                raise ConflictError(
                    f"the stratamem session {session_id!r} of namespace {namespace!r} "
                    f"belongs to another user than {user_id!r}: {exc}"
                ) from exc
            self._sessions.add(session_id)
        return session_id

    def _lock(self, namespace: tuple[str, ...], key: str) -> threading.Lock:
        digest = hashlib.blake2b(dumps([list(namespace), key]).encode(), digest_size=2)
        return self._locks[int.from_bytes(digest.digest(), "big") % len(self._locks)]


# -- ids, documents, text ----------------------------------------------------------------


def _session_id(namespace: tuple[str, ...]) -> str:
    return joined_id(TAG, [namespace])


def _namespace_of(session: Session) -> tuple[str, ...] | None:
    """The namespace a session of this store holds; None for any other session."""
    stored = session.metadata.get(TAG)
    if not isinstance(stored, dict) or not isinstance(stored.get("namespace"), str):
        return None
    try:
        namespace = tuple(json.loads(stored["namespace"]))
    except (ValueError, TypeError):
        return None
    ok = all(isinstance(label, str) for label in namespace)
    return namespace if ok and session.id == _session_id(namespace) else None


def _slot_ids(namespace: tuple[str, ...], key: str) -> tuple[str, str]:
    a, b = (joined_id(TAG, [namespace, [key]], slot) for slot in SLOTS)
    return a, b


def _check_op(op: object) -> None:
    if isinstance(op, (GetOp, PutOp)):
        _check_labels(op.namespace)
        if isinstance(op, PutOp) and not op.namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
    elif isinstance(op, SearchOp):
        _check_labels(op.namespace_prefix)
    elif isinstance(op, ListNamespacesOp):
        for condition in op.match_conditions or ():
            _check_labels(tuple(label for label in condition.path if label != "*"))
    else:
        raise ValueError(f"Unknown operation type: {type(op)}")


def _check_labels(namespace: tuple[str, ...]) -> None:
    """LangGraph's rules for labels (also for ops given to ``batch`` directly)."""
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} in {namespace!r}: labels must be strings."
            )
        if not label or "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} in {namespace!r}: labels must be "
                "non-empty, without periods ('.') or NUL."
            )


def _json_object(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as JSON holds it (tuples as lists), or a ValueError naming what is not."""
    if not isinstance(value, Mapping):
        raise ValueError(f"value: expected a mapping with string keys (got {type(value)})")
    checked = _json(value, "value")
    assert isinstance(checked, dict)
    return checked


def _json(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}: {value} is not JSON")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: key {k!r} is not a string")
            out[k] = _json(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where}: a {type(value).__name__} is not JSON")


def _doc_json(doc: _Doc) -> dict[str, Any]:
    return {
        "namespace": list(doc.namespace),
        "key": doc.key,
        "value": doc.value,
        "created_at": doc.created_at.isoformat(),
        "updated_at": doc.updated_at.isoformat(),
        "version": doc.version,
        "ttl": doc.ttl,
        "expires_at": None if doc.expires_at is None else doc.expires_at.isoformat(),
        "index": None if doc.index is None else list(doc.index),
    }


def _doc_of(message_id: str, metadata: Mapping[str, Any]) -> _Doc | None:
    """The item a message of this store holds; None for any other message."""
    stored = metadata.get(TAG)
    if not isinstance(stored, dict) or not isinstance(stored.get("doc"), str):
        return None
    try:
        d = json.loads(stored["doc"])
        expires = d["expires_at"]
        return _Doc(
            namespace=tuple(d["namespace"]),
            key=d["key"],
            value=d["value"],
            created_at=datetime.fromisoformat(d["created_at"]),
            updated_at=datetime.fromisoformat(d["updated_at"]),
            version=int(d["version"]),
            ttl=d["ttl"],
            expires_at=None if expires is None else datetime.fromisoformat(expires),
            message_id=message_id,
            index=None if d["index"] is None else tuple(d["index"]),
            indexed=stored.get("indexed") is True,
        )
    except (ValueError, KeyError, TypeError):
        log.warning("langgraph store: message %s holds no readable item; skipped", message_id)
        return None


def _item_text(value: dict[str, Any], paths: Sequence[str]) -> str:
    """The text of an item that is indexed and learned: for each path, LangGraph's text at
    it (``$``: the document, as ``_document_text``), one per line."""
    texts: list[str] = []
    for path in paths:
        if path == "$":
            texts.append(_document_text(value))
        else:
            texts.extend(get_text_at_path(value, path))
    return "\n".join(t for t in texts if t.strip())


def _document_text(value: Any) -> str:
    """A document as text: its one string as it is; else a ``key: value`` line per value
    (a list of values on one line)."""
    leaves = list(_leaves(value, None))
    if len(leaves) == 1 and isinstance(value, dict) and isinstance(_only(value), str):
        return leaves[0][1]
    return "\n".join(f"{k}: {v}" if k is not None else v for k, v in leaves)


def _only(value: Any) -> Any:
    while isinstance(value, dict) and len(value) == 1:
        value = next(iter(value.values()))
    return value


def _leaves(value: Any, key: str | None) -> Iterator[tuple[str | None, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, k)
    elif isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            shown = [_scalar(v) for v in value if v is not None]
            if shown:
                yield key, ", ".join(shown)
        else:
            for v in value:
                yield from _leaves(v, key)
    elif value is not None and (text := _scalar(value)).strip():
        yield key, text


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# -- namespaces and filters, as LangGraph defines them -------------------------------------


def _has(namespace: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    return namespace[: len(prefix)] == prefix


def _matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(namespace, path, strict=False)
        if condition.match_type == "prefix"
        else zip(reversed(namespace), reversed(path), strict=False)
    )
    return all(p == "*" or n == p for n, p in pairs)


def _matches_filter(value: dict[str, Any], conditions: dict[str, Any] | None) -> bool:
    """Whether ``value`` passes a search filter: equality (nested objects and lists too)
    or ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte`` on a top-level key."""
    return all(_compare(value.get(k), v) for k, v in (conditions or {}).items())


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(actual, op, arg) for op, arg in wanted.items())
        return isinstance(actual, dict) and all(
            _compare(actual.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return _same(actual, wanted)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _operator(actual: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return _compare(actual, arg)
    if op == "$ne":
        return not _compare(actual, arg)
    compare = {
        "$gt": lambda a, b: a > b,
        "$gte": lambda a, b: a >= b,
        "$lt": lambda a, b: a < b,
        "$lte": lambda a, b: a <= b,
    }.get(op)
    if compare is None:
        raise ValueError(f"Unsupported operator: {op}")
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (actual, arg))
    strings = isinstance(actual, str) and isinstance(arg, str)
    return (numbers or strings) and bool(compare(actual, arg))

"""Writing the derived layers: what a completed batch adds, strengthens, supersedes and
files under topics, the calls it made, and the vector bookkeeping around them.

Written once for both backends. What they do differently the scripts ask of the store,
``hooks`` (the hooks of ``SQLStore``'s section "the derived layers: writes" say what each
must do): the full-text index of a fact's or summary's text (columns of the row itself,
or a table of its own), and how rows of vectors are written.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..._time import now_iso
from ...errors import EmbedderMismatchError
from .. import (
    CallWrite,
    ClaimedBatch,
    FactWrite,
    LayerWrite,
    MessageRow,
    SearchFilters,
    SummaryRow,
    SummaryWrite,
    TopicWrite,
)
from .dialect import Tx
from .reads import summary_by_id
from .rows import MESSAGE_COLUMNS, message_row

if TYPE_CHECKING:
    from .store import SQLStore

__all__ = [
    "FulltextAsk",
    "FulltextColumns",
    "LayerItem",
    "LayerSearch",
    "VectorItems",
    "VectorRow",
    "claim_embedder",
    "drop_vectors",
    "history",
    "insert_vectors",
    "layer_dims",
    "layer_items_missing_vectors",
    "merge_topics",
    "messages_missing_vectors",
    "put_vectors",
    "record_calls",
    "retire_facts",
    "write_layers",
]

#: (column, SQL value with one ``?``, that parameter): see ``SQLStore._fulltext_columns``.
FulltextColumns = Sequence[tuple[str, str, Any]]
#: (item pk, vector) of one user's items of one kind.
VectorItems = Sequence[tuple[int, np.ndarray]]
#: A row of ``vectors``: (project_id, user_id, kind, item_pk, embedder, dim, vec), the
#: vector as contiguous float32.
VectorRow = tuple[str, str, str, int, str, int, np.ndarray]
#: (pk, project_id, user_id, text) of a fact or summary.
LayerItem = tuple[int, str, str, str]


class LayerSearch(NamedTuple):
    """A search as the core hands it to a backend (``SQLStore._fulltext_many``,
    ``_vector_layer``, ``_vector_messages``): the best ``limit``
    (at least one) of the user's items; of facts and summaries, those whose status is one
    of ``statuses`` (at least one; messages have none: ``()``)."""

    project_id: str
    user_id: str
    limit: int
    statuses: Sequence[str]


class FulltextAsk(NamedTuple):
    """One full-text search as the core hands it to a backend (``SQLStore._fulltext_many``):
    the rows of ``table`` of the ``search``'s user matching any of ``terms`` (at least one),
    the best ``limit``; messages passing ``filters``, facts and summaries (``filters``
    None) in ``search.statuses``."""

    table: str
    search: LayerSearch
    terms: Sequence[str]
    filters: SearchFilters | None


# -- a batch's layers ------------------------------------------------------------------------


def write_layers(
    tx: Tx, hooks: SQLStore, batch: ClaimedBatch, embedder: str, layers: LayerWrite
) -> None:
    """Write what ``batch`` derived, inside the transaction that completes it: facts with
    their sources, summaries added, strengthened or superseded (each change versioned in
    the summary's history), and topics with the summaries filed under them. A write that
    names an unknown summary or topic raises ``ValueError`` (and the caller rolls back)."""
    now = now_iso()
    _write_facts(tx, hooks, batch, embedder, layers.facts, now)
    _write_summaries(tx, hooks, batch, embedder, layers.summaries, now)
    for t in layers.topics:
        _write_topic(tx, batch.project_id, batch.user_id, t, now)


def record_calls(tx: Tx, batch: ClaimedBatch, calls: Sequence[CallWrite]) -> None:
    """Account for the model calls made for ``batch`` (also when it failed)."""
    if not calls:
        return
    now = time.time()
    tx.many(
        "INSERT INTO llm_calls (project_id, user_id, stage, model, prompt_version, "
        "prompt_tokens, completion_tokens, latency_ms, ok, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                batch.project_id,
                batch.user_id,
                k.stage,
                k.model,
                k.prompt_version,
                k.prompt_tokens,
                k.completion_tokens,
                k.latency_ms,
                bool(k.ok),
                now,
            )
            for k in calls
        ],
    )


def _insert(
    tx: Tx, table: str, columns: str, values: str, params: list[Any], fts: FulltextColumns
) -> int:
    """INSERT one row with the backend's full-text columns ``fts``; its pk."""
    for column, value, param in fts:
        columns, values = f"{columns}, {column}", f"{values}, {value}"
        params.append(param)
    return tx.insert(f"INSERT INTO {table} ({columns}) VALUES ({values})", params)


def _write_facts(
    tx: Tx,
    hooks: SQLStore,
    batch: ClaimedBatch,
    embedder: str,
    facts: Sequence[FactWrite],
    now: str,
) -> None:
    project, user, d = batch.project_id, batch.user_id, tx.dialect
    message_pks = {m.id: m.pk for m in batch.messages}
    vectors: list[tuple[int, np.ndarray]] = []
    for f in facts:
        pk = _insert(
            tx,
            "facts",
            "project_id, id, user_id, text, kind, occurred_at, observed_at, valid_from, "
            "valid_to, confidence, message_ids, labels, model, prompt_version, created_at, "
            "standing, scope",
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?",
            [
                *(project, f.id, user, f.text, f.kind, f.occurred_at, f.observed_at),
                *(f.valid_from, f.valid_to, f.confidence),
                *(d.array(f.message_ids), d.array(f.labels), f.model, f.prompt_version, now),
                *(f.standing, f.scope if f.standing else None),
            ],
            hooks._fulltext_columns(f.text),
        )
        sources = sorted({known for m in f.message_ids if (known := message_pks.get(m))})
        tx.many(
            "INSERT INTO fact_sources (fact_pk, message_pk) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(pk, source) for source in sources],
        )
        hooks._index_fulltext(tx, "facts", pk, f.text, project, user, new=True)
        vectors.append((pk, f.vector))
    insert_vectors(tx, hooks, embedder, "fact", project, user, vectors)


def _write_summaries(
    tx: Tx,
    hooks: SQLStore,
    batch: ClaimedBatch,
    embedder: str,
    writes: Sequence[SummaryWrite],
    now: str,
) -> None:
    project, user = batch.project_id, batch.user_id
    vectors: list[tuple[int, np.ndarray]] = []
    for w in writes:
        if w.action in ("add", "supersede"):
            pk = _add_summary(tx, hooks, project, user, w, now)
            if w.vector is not None:
                vectors.append((pk, w.vector))
            if w.action == "supersede" and w.supersedes:
                _supersede(tx, project, user, w, w.supersedes, pk, now)
        elif w.action == "strengthen":
            reworded = _strengthen(tx, hooks, project, user, w, now)
            if reworded is not None and w.vector is not None:
                vectors.append((reworded, w.vector))
        else:
            raise ValueError(f"unknown summary action {w.action!r}")
    insert_vectors(tx, hooks, embedder, "summary", project, user, vectors)


def _add_summary(
    tx: Tx, hooks: SQLStore, project: str, user: str, w: SummaryWrite, now: str
) -> int:
    d = tx.dialect
    pk = _insert(
        tx,
        "summaries",
        "project_id, id, user_id, text, status, valid_from, valid_to, confidence, labels, "
        "version, fact_ids, message_ids, model, prompt_version, created_at, updated_at, "
        "observed_at, standing",
        "?, ?, ?, ?, 'active', ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?",
        [
            *(project, w.id, user, w.text, w.valid_from, w.valid_to, w.confidence),
            *(d.array(w.labels), d.array(w.fact_ids), d.array(w.message_ids)),
            *(w.model, w.prompt_version, now, now, w.observed_at, w.standing),
        ],
        hooks._fulltext_columns(w.text),
    )
    history(tx, pk, 1, w.text, "active", w.confidence, w.fact_ids, w.reason, w.model, now)
    hooks._index_fulltext(tx, "summaries", pk, w.text, project, user, new=True)
    return pk


def _known_summary(tx: Tx, project: str, user: str, summary_id: str, error: str) -> SummaryRow:
    row = summary_by_id(tx, project, summary_id)
    if row is None or row.user_id != user:
        raise ValueError(error)
    return row


def _supersede(
    tx: Tx, project: str, user: str, w: SummaryWrite, old_id: str, successor: int, now: str
) -> None:
    """``w`` (stored as ``successor``) replaces the summary ``old_id``."""
    old = _known_summary(tx, project, user, old_id, f"cannot supersede unknown summary {old_id!r}")
    tx.execute(
        "UPDATE summaries SET status = 'superseded', superseded_by = ?, "
        "version = version + 1, updated_at = ? WHERE pk = ?",
        (w.id, now, old.pk),
    )
    history(
        tx,
        old.pk,
        old.version + 1,
        old.text,
        "superseded",
        old.confidence,
        old.fact_ids,
        w.reason,
        w.model,
        now,
    )
    # The successor belongs where its predecessor did.
    tx.execute(
        "INSERT INTO topic_summaries (topic_pk, summary_pk) "
        "SELECT topic_pk, ? FROM topic_summaries WHERE summary_pk = ? ON CONFLICT DO NOTHING",
        (successor, old.pk),
    )
    retire_facts(tx, project, user, old.fact_ids, w.id)


def _strengthen(
    tx: Tx, hooks: SQLStore, project: str, user: str, w: SummaryWrite, now: str
) -> int | None:
    """Merge ``w``'s evidence into the summary it names; that summary's pk if ``w``
    reworded it (its vector is then replaced), else None."""
    old = _known_summary(tx, project, user, w.id, f"cannot strengthen unknown summary {w.id!r}")
    d = tx.dialect
    fact_ids = list(dict.fromkeys([*old.fact_ids, *w.fact_ids]))
    message_ids = list(dict.fromkeys([*old.message_ids, *w.message_ids]))
    fts = hooks._fulltext_columns(w.text)
    latest = d.greatest("coalesce(observed_at, '')", "coalesce(?, '')")
    tx.execute(
        "UPDATE summaries SET text = ?, confidence = ?, fact_ids = ?, message_ids = ?, "
        "version = version + 1, updated_at = ?, valid_from = coalesce(valid_from, ?), "
        f"valid_to = coalesce(?, valid_to), observed_at = nullif({latest}, '')"
        f"{''.join(f', {column} = {value}' for column, value, _ in fts)} WHERE pk = ?",
        [
            *(w.text, w.confidence, d.array(fact_ids), d.array(message_ids), now),
            *(w.valid_from, w.valid_to, w.observed_at),
            *(param for _, _, param in fts),
            old.pk,
        ],
    )
    history(
        tx,
        old.pk,
        old.version + 1,
        w.text,
        old.status,
        w.confidence,
        fact_ids,
        w.reason,
        w.model,
        now,
    )
    if w.text == old.text:
        return None
    hooks._index_fulltext(tx, "summaries", old.pk, w.text, project, user, new=False)
    return old.pk


def _write_topic(tx: Tx, project: str, user: str, t: TopicWrite, now: str) -> None:
    if t.is_new:
        tx.execute(
            "INSERT INTO topics (project_id, id, user_id, name, description, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (project, t.id, user, t.name, t.description, now, now),
        )
    else:
        tx.execute(
            "UPDATE topics SET description = ?, updated_at = ? WHERE project_id = ? AND id = ? "
            "AND user_id = ?",
            (t.description, now, project, t.id, user),
        )
    topic_pk = tx.scalar(
        "SELECT pk FROM topics WHERE project_id = ? AND id = ? AND user_id = ?",
        (project, t.id, user),
    )
    if topic_pk is None:
        raise ValueError(f"unknown topic {t.id!r}")
    for sid in t.summary_ids:
        error = f"topic {t.name!r} names unknown summary {sid!r}"
        row = _known_summary(tx, project, user, sid, error)
        tx.execute(
            "INSERT INTO topic_summaries (topic_pk, summary_pk) VALUES (?, ?) "
            "ON CONFLICT DO NOTHING",
            (topic_pk, row.pk),
        )


def history(
    tx: Tx,
    summary_pk: int,
    version: int,
    text: str,
    status: str,
    confidence: float,
    fact_ids: Sequence[str],
    reason: str,
    actor: str,
    when: str,
) -> None:
    """Record ``version`` of a summary in its history."""
    tx.execute(
        "INSERT INTO summary_history (summary_pk, version, text, status, confidence, "
        "fact_ids, reason, actor, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            summary_pk,
            version,
            text,
            status,
            confidence,
            tx.dialect.array(fact_ids),
            reason,
            actor,
            when,
        ),
    )


def retire_facts(tx: Tx, project: str, user: str, fact_ids: Sequence[str], successor: str) -> None:
    """Facts of a superseded summary that no current summary holds are superseded too:
    recall must not present "lives in Lisbon" as current once it was corrected."""
    if not fact_ids:
        return
    d = tx.dialect
    listed, args = d.in_("id", list(fact_ids))
    # The summaries holding them, through an index: asking every current summary of the
    # user whether it holds each fact made a write transaction as long as the history.
    held: set[str] = set()
    for (ids,) in tx.all(
        "SELECT fact_ids FROM summaries WHERE pk IN "
        f"({d.summaries_holding('?', f'SELECT id FROM facts WHERE project_id = ? AND {listed}')})"
        " AND status IN ('active', 'deprioritized')",
        [project, project, *args],
    ):
        held.update(d.load_array(ids))
    retired = [f for f in fact_ids if f not in held]
    if not retired:
        return
    listed, args = d.in_("id", retired)
    tx.execute(
        "UPDATE facts SET status = 'superseded', superseded_by = ? "
        f"WHERE project_id = ? AND user_id = ? AND {listed} AND status = 'active'",
        [successor, project, user, *args],
    )


# -- topics ----------------------------------------------------------------------------------


def merge_topics(tx: Tx, project_id: str, user_id: str, source_id: str, target_id: str) -> int:
    """File every summary of ``source_id`` under ``target_id`` and retire the source (it
    keeps a ``merged_into`` link); how many summaries moved. ``KeyError`` if either is not
    an active topic of the user, or they are the same."""
    rows = {
        tid: pk
        for pk, tid in tx.all(
            "SELECT pk, id FROM topics WHERE project_id = ? AND user_id = ? "
            f"AND status = 'active' AND id IN (?, ?){tx.dialect.for_update}",
            (project_id, user_id, source_id, target_id),
        )
    }
    if source_id not in rows or target_id not in rows or source_id == target_id:
        raise KeyError(source_id if source_id not in rows else target_id)
    moved = tx.execute(
        "INSERT INTO topic_summaries (topic_pk, summary_pk) "
        "SELECT ?, summary_pk FROM topic_summaries WHERE topic_pk = ? ON CONFLICT DO NOTHING",
        (rows[target_id], rows[source_id]),
    ).rowcount
    tx.execute("DELETE FROM topic_summaries WHERE topic_pk = ?", (rows[source_id],))
    now = now_iso()
    tx.execute(
        "UPDATE topics SET status = 'merged', merged_into = ?, updated_at = ? WHERE pk = ?",
        (target_id, now, rows[source_id]),
    )
    tx.execute("UPDATE topics SET updated_at = ? WHERE pk = ?", (now, rows[target_id]))
    return int(moved)


# -- vectors ---------------------------------------------------------------------------------


def claim_embedder(tx: Tx, embedder: str) -> None:
    """The store's vectors are all of one embedder: the first to write claims it, any other
    gets ``EmbedderMismatchError`` (``drop_vectors`` hands the store to a new one)."""
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('embedder', ?) ON CONFLICT (key) DO NOTHING",
        (embedder,),
    )
    stored = tx.scalar("SELECT value FROM meta WHERE key = 'embedder'")
    if stored != embedder:
        raise EmbedderMismatchError(
            f"this store's vectors were made by {stored!r}, not {embedder!r}"
        )


def insert_vectors(
    tx: Tx,
    hooks: SQLStore,
    embedder: str,
    kind: str,
    project_id: str,
    user_id: str,
    items: VectorItems,
) -> None:
    """Store the vectors (item pk, vector) of one user's items of ``kind``."""
    if not items:
        return
    claim_embedder(tx, embedder)
    hooks._insert_vector_rows(
        tx,
        [
            (project_id, user_id, kind, pk, embedder, int(v.shape[0]), _float32(v))
            for pk, v in items
        ],
    )


def _float32(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v, dtype=np.float32)


def put_vectors(
    tx: Tx, hooks: SQLStore, embedder: str, rows: Sequence[MessageRow], vectors: np.ndarray
) -> None:
    """Store one vector per message of ``rows`` (of any users)."""
    if len(rows) != len(vectors):
        raise ValueError("one vector per message is required")
    by_user: dict[tuple[str, str], list[tuple[int, np.ndarray]]] = {}
    for r, v in zip(rows, vectors, strict=True):
        by_user.setdefault((r.project_id, r.user_id), []).append((r.pk or 0, v))
    # In user order: a backend may take each user's lock as it writes (PostgreSQL does),
    # and two writers taking them in one order cannot deadlock.
    for (project_id, user_id), items in sorted(by_user.items(), key=lambda kv: kv[0]):
        insert_vectors(tx, hooks, embedder, "message", project_id, user_id, items)


def layer_dims(vectors: np.ndarray, layers: LayerWrite | None) -> dict[str, int]:
    """The dimension of each kind of vector a batch is about to write (kind -> dim)."""
    dims: dict[str, int] = {}
    if len(vectors):
        dims["message"] = int(np.asarray(vectors).shape[1])
    if layers is not None:
        for f in layers.facts:
            dims["fact"] = int(f.vector.shape[0])
        for s in layers.summaries:
            if s.vector is not None:
                dims["summary"] = int(s.vector.shape[0])
    return dims


def drop_vectors(tx: Tx, embedder: str) -> int:
    """Delete every vector not made by ``embedder`` and hand the store to it; how many
    were deleted."""
    dropped = tx.execute("DELETE FROM vectors WHERE embedder != ?", (embedder,)).rowcount
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('embedder', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (embedder,),
    )
    return int(dropped)


def messages_missing_vectors(tx: Tx, embedder: str, after_pk: int, limit: int) -> list[MessageRow]:
    """Processed messages past ``after_pk`` without a vector of ``embedder``, in pk order."""
    rows = tx.all(
        f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.pk > ? "
        "AND m.status = 'processed' AND NOT EXISTS (SELECT 1 FROM vectors v "
        "WHERE v.kind = 'message' AND v.item_pk = m.pk AND v.embedder = ?) "
        "ORDER BY m.pk LIMIT ?",
        (after_pk, embedder, limit),
    )
    return [message_row(r, tx.dialect) for r in rows]


def layer_items_missing_vectors(
    tx: Tx, embedder: str, kind: str, after_pk: int, limit: int
) -> list[LayerItem]:
    """(pk, project_id, user_id, text) of facts or summaries without a vector of
    ``embedder``, in pk order, for re-embedding."""
    table = {"fact": "facts", "summary": "summaries"}[kind]
    rows = tx.all(
        f"SELECT t.pk, t.project_id, t.user_id, t.text FROM {table} t WHERE t.pk > ? "
        "AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.kind = ? AND v.item_pk = t.pk "
        "AND v.embedder = ?) ORDER BY t.pk LIMIT ?",
        (after_pk, kind, embedder, limit),
    )
    return [(int(r[0]), r[1], r[2], r[3]) for r in rows]

"""Accepting messages: a call's new messages stored with the job that will process them.

``add_messages`` runs in one write transaction. Under the user's lock (PostgreSQL: so
that job ids of one user are committed in id order, which per-user processing order
relies on; SQLite's write transaction already excludes every other writer) it refuses
the whole call if an id is stored with other content, skips the ids stored with the same
content (a resend), and writes one job for the rest, their rows, their full text, their
speakers and the session's ``updated_at``.

Full text is what the backends keep differently, through the same two hooks as the
layers' texts (``SQLStore._fulltext_columns`` and ``_index_fulltext``): in columns of the
message row (PostgreSQL's ``fts``/``fts_len``), or in a table apart written once the rows
have their ``pk`` (SQLite's ``messages_fts``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from ..._speakers import without_speaker
from ..._time import now_iso
from ...errors import ConflictError
from .. import AddOutcome, MessageRow, SessionRow
from .._text import message_text
from .dialect import Tx
from .rows import MESSAGE_COLUMNS, message_row

if TYPE_CHECKING:
    from .layers import FulltextColumns
    from .store import SQLStore

__all__ = [
    "add_messages",
    "context_messages",
    "get_message",
    "get_messages",
    "list_messages",
    "messages_by_pk",
]

_MESSAGE_INSERT = (
    "project_id, id, user_id, session_id, process_id, role, content, content_hash, ts, "
    "event_type, page, metadata, status, job_id, created_at, name, small_talk, asks"
)
_MESSAGE_VALUES = "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?"


def add_messages(
    tx: Tx,
    hooks: SQLStore,
    project_id: str,
    session: SessionRow,
    rows: Sequence[MessageRow],
) -> AddOutcome:
    """Store the new ones of ``rows`` in ``session`` with one job (``pk``/``job_id`` set on
    them); ``ConflictError`` if an id is stored with different content (nothing stored)."""
    ids = [r.id for r in rows]
    user_id = session.user_id
    tx.lock_user(project_id, user_id)
    existing = _stored_hashes(tx, project_id, ids)
    new = rows
    if existing:  # a resend (most calls send only new ids)
        conflicts = [r.id for r in rows if r.id in existing and existing[r.id] != r.content_hash]
        if conflicts:
            raise ConflictError(
                f"message id(s) already stored with different content: {conflicts[:10]}; "
                "an id may be resent only with the same session, role and content"
            )
        new = [r for r in rows if r.id not in existing]
    job_id = None
    if new:
        job_id = _insert_job(tx, project_id, user_id, len(new))
        # The speaker's name stays out of full text (recall's speaker signal matches it), also
        # when the content starts with it ("Caroline: ...").
        texts = [
            message_text(without_speaker(r.content, r.name), r.event_type, r.page) for r in new
        ]
        fulltext = [hooks._fulltext_columns(t) for t in texts]
        pks = _insert_rows(tx, project_id, session, job_id, new, fulltext)
        for r, pk, text in zip(new, pks, texts, strict=True):
            r.pk, r.job_id = pk, job_id
            hooks._index_fulltext(tx, "messages", pk, text, project_id, user_id, new=True)
        names = sorted({r.name for r in new if r.name})
        if names:
            tx.many(
                "INSERT INTO speakers (project_id, user_id, name) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                [(project_id, user_id, name) for name in names],
            )
        tx.execute(
            "UPDATE sessions SET updated_at = ? WHERE project_id = ? AND id = ?",
            (now_iso(), project_id, session.id),
        )
    dupes = [r.id for r in rows if r.id in existing] if existing else []
    return AddOutcome(message_ids=ids, duplicates=dupes, job_id=job_id)


def _stored_hashes(tx: Tx, project_id: str, ids: Sequence[str]) -> dict[str, str]:
    """The content hash of each of ``ids`` already stored in the project."""
    if len(ids) == 1:  # most calls send one message
        row = tx.one(_ONE_HASH, (project_id, ids[0]))
        return {} if row is None else {ids[0]: row[0]}
    if not ids:
        return {}
    where, params = tx.dialect.in_("id", ids)
    return dict(
        tx.all(
            f"SELECT id, content_hash FROM messages WHERE project_id = ? AND {where}",
            [project_id, *params],
        )
    )


_ONE_HASH = "SELECT content_hash FROM messages WHERE project_id = ? AND id = ?"


def _insert_job(tx: Tx, project_id: str, user_id: str, size: int) -> int:
    now = time.time()
    return tx.insert(
        "INSERT INTO jobs (project_id, user_id, kind, status, run_after, created_at, size) "
        "VALUES (?, ?, 'process_messages', 'queued', ?, ?, ?)",
        (project_id, user_id, now, now, size),
        "id",
    )


@cache
def _insert_sql(fulltext: tuple[tuple[str, str], ...] = ()) -> str:
    """The message ``INSERT`` with the backend's full-text columns (name, SQL of the value)."""
    columns = "".join(f", {name}" for name, _ in fulltext)
    values = "".join(f", {sql}" for _, sql in fulltext)
    return f"INSERT INTO messages ({_MESSAGE_INSERT}{columns}) VALUES ({_MESSAGE_VALUES}{values})"


def _insert_rows(
    tx: Tx,
    project_id: str,
    session: SessionRow,
    job_id: int,
    rows: Sequence[MessageRow],
    fulltext: Sequence[FulltextColumns],
) -> list[int]:
    """Insert the message rows of ``job_id`` (in order), each with its full-text columns
    (the same ones for every row): their pks."""
    first = fulltext[0]
    sql = _insert_sql(tuple(column[:2] for column in first)) if first else _insert_sql()
    json = tx.dialect.json
    params = [
        (
            project_id,
            r.id,
            session.user_id,
            session.id,
            r.process_id,
            r.role,
            r.content,
            r.content_hash,
            r.ts,
            r.event_type,
            r.page,
            json(r.metadata),
            job_id,
            r.created_at,
            r.name,
            r.small_talk,
            r.asks,
            *(value for _, _, value in fts),
        )
        for r, fts in zip(rows, fulltext, strict=True)
    ]
    if len(params) == 1:
        return [tx.insert(sql, params[0])]
    return tx.insert_many(sql, params, "pk")


# -- reads -------------------------------------------------------------------------------


def get_message(tx: Tx, project_id: str, message_id: str) -> MessageRow | None:
    row = tx.one(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE project_id = ? AND id = ?",
        (project_id, message_id),
    )
    return None if row is None else message_row(row, tx.dialect)


def get_messages(tx: Tx, project_id: str, message_ids: Sequence[str]) -> dict[str, MessageRow]:
    """The messages of ``message_ids`` that exist, by id (one query)."""
    if not message_ids:
        return {}
    where, params = tx.dialect.in_("id", list(message_ids))
    rows = tx.all(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE project_id = ? AND {where}",
        [project_id, *params],
    )
    return {m.id: m for m in (message_row(r, tx.dialect) for r in rows)}


def list_messages(
    tx: Tx,
    project_id: str,
    *,
    user_id: str | None,
    session_id: str | None,
    status: str | None,
    limit: int,
    offset: int,
    newest_first: bool,
) -> list[MessageRow]:
    sql = f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE project_id = ?"
    params: list[Any] = [project_id]
    for column, value in (("user_id", user_id), ("session_id", session_id), ("status", status)):
        if value is not None:
            sql += f" AND {column} = ?"
            params.append(value)
    sql += f" ORDER BY pk {'DESC' if newest_first else 'ASC'} LIMIT ? OFFSET ?"
    params += [limit, offset]
    return [message_row(r, tx.dialect) for r in tx.all(sql, params)]


def messages_by_pk(tx: Tx, pks: Sequence[int]) -> dict[int, MessageRow]:
    if not pks:
        return {}
    where, params = tx.dialect.in_("pk", list(pks))
    rows = tx.all(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {where}", params)
    return {r[0]: message_row(r, tx.dialect) for r in rows}


def context_messages(
    tx: Tx, project_id: str, user_id: str, before_pk: int, limit: int
) -> list[MessageRow]:
    """The user's ``limit`` messages accepted right before ``before_pk``, oldest first."""
    rows = tx.all(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE project_id = ? AND user_id = ? "
        "AND pk < ? ORDER BY pk DESC LIMIT ?",
        (project_id, user_id, before_pk, limit),
    )
    return [message_row(r, tx.dialect) for r in reversed(rows)]

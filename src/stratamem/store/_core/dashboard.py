"""What the dashboard reads (users, provenance both ways, activity) and its sign-in
sessions. Reads see everything but ``deleted`` items: the dashboard shows superseded,
deprioritized, archived and merged ones, marked as such."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..._time import to_iso
from ..._vocabulary import ItemKind
from .. import SummaryRow, TopicRow
from .._dashboard_rows import ActivityCounts, ProvenanceRows, UiSessionRow, UserRow
from .dialect import Tx
from .rows import (
    FACT_COLUMNS,
    MESSAGE_COLUMNS,
    SUMMARY_COLUMNS,
    TOPIC_COLUMNS,
    fact_row,
    message_row,
    summary_row,
    topic_row,
)

__all__ = [
    "activity",
    "count_users",
    "create_ui_session",
    "delete_ui_session",
    "delete_ui_sessions_of_key",
    "get_ui_session",
    "list_users",
    "provenance",
    "prune_ui_sessions",
    "touch_ui_session",
    "update_ui_session_project",
]


def _prefixed(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


_F = _prefixed(FACT_COLUMNS, "f")
_S = _prefixed(SUMMARY_COLUMNS, "s")
_T = _prefixed(TOPIC_COLUMNS, "t")

# -- users -------------------------------------------------------------------------------

# "!" escapes LIKE's wildcards: ids never hold it (ID_PATTERN), so it needs no escaping of
# its own in an id, and it means the same to both databases (a backslash does not).
_LIKE_ESCAPE = "!"


def _like_pattern(search: str) -> str:
    """A case-insensitive substring pattern for ``lower(column) LIKE ? ESCAPE '!'``."""
    escaped = "".join(
        _LIKE_ESCAPE + c if c in ("%", "_", _LIKE_ESCAPE) else c for c in search.lower()
    )
    return f"%{escaped}%"


def _users_where(project_id: str, search: str | None) -> tuple[str, list[Any]]:
    if not search:
        return "WHERE project_id = ?", [project_id]
    return (
        f"WHERE project_id = ? AND lower(user_id) LIKE ? ESCAPE '{_LIKE_ESCAPE}'",
        [project_id, _like_pattern(search)],
    )


def list_users(
    tx: Tx, project_id: str, search: str | None, limit: int, offset: int
) -> list[UserRow]:
    """A page of the project's users, most recently active first.

    Users are those with a session (every message is in one); the session rows alone order
    them (a message added bumps its session's ``updated_at``), so the whole ordering reads
    the sessions index only, and messages are counted for the page's users alone."""
    where, params = _users_where(project_id, search)
    page = tx.all(
        "SELECT user_id, count(*), min(created_at), max(updated_at) FROM sessions "
        f"{where} GROUP BY user_id ORDER BY max(updated_at) DESC, user_id LIMIT ? OFFSET ?",
        [*params, limit, offset],
    )
    if not page:
        return []
    clause, args = tx.dialect.in_("user_id", [r[0] for r in page])
    counts = dict(
        tx.all(
            f"SELECT user_id, count(*) FROM messages WHERE project_id = ? AND {clause} "
            "GROUP BY user_id",
            [project_id, *args],
        )
    )
    return [UserRow(r[0], r[1], counts.get(r[0], 0), r[2], r[3]) for r in page]


def count_users(tx: Tx, project_id: str, search: str | None) -> int:
    where, params = _users_where(project_id, search)
    return int(tx.scalar(f"SELECT count(DISTINCT user_id) FROM sessions {where}", params) or 0)


# -- provenance --------------------------------------------------------------------------

# Ids the pipeline makes start with their layer's letter (_checks.new_id); a message's id
# is its sender's and may look like anything, so a prefix only breaks a tie.
_PREFERRED: dict[str, ItemKind] = {"f_": "fact", "s_": "summary", "t_": "topic"}
_KINDS: tuple[ItemKind, ...] = ("message", "fact", "summary", "topic")


def _find(tx: Tx, project_id: str, item_id: str) -> tuple[ItemKind, int] | None:
    """The kind and pk of the item ``item_id`` names in the project (one statement over
    the four tables' (project_id, id) keys), deleted ones left out."""
    found = tx.all(
        "SELECT 'message', pk FROM messages WHERE project_id = ? AND id = ? "
        "UNION ALL SELECT 'fact', pk FROM facts WHERE project_id = ? AND id = ? "
        "AND status != 'deleted' "
        "UNION ALL SELECT 'summary', pk FROM summaries WHERE project_id = ? AND id = ? "
        "AND status != 'deleted' "
        "UNION ALL SELECT 'topic', pk FROM topics WHERE project_id = ? AND id = ? "
        "AND status != 'deleted'",
        [project_id, item_id] * 4,
    )
    kinds = {str(kind): int(pk) for kind, pk in found}
    preferred = _PREFERRED.get(item_id[:2])
    for kind in (*((preferred,) if preferred else ()), *_KINDS):
        if kind in kinds:
            return kind, kinds[kind]
    return None


def _topics_of(tx: Tx, summary_pks: Sequence[int]) -> list[TopicRow]:
    """The topics, not deleted, that any of the summaries is filed under, each with the
    ids of its summaries that are not deleted."""
    if not summary_pks:
        return []
    where, params = tx.dialect.in_("x.summary_pk", list(summary_pks))
    rows = tx.all(
        f"SELECT {_T}, s.id FROM topics t "
        "JOIN topic_summaries ts ON ts.topic_pk = t.pk "
        "JOIN summaries s ON s.pk = ts.summary_pk AND s.status != 'deleted' "
        "WHERE t.status != 'deleted' AND t.pk IN "
        f"(SELECT x.topic_pk FROM topic_summaries x WHERE {where}) ORDER BY t.pk, s.pk",
        params,
    )
    return _topics(rows)


def _topics(rows: Sequence[Sequence[Any]]) -> list[TopicRow]:
    """Topic rows each followed by one summary id (in order), grouped by topic."""
    topics: dict[int, tuple[Sequence[Any], list[str]]] = {}
    for r in rows:
        _, ids = topics.setdefault(r[0], (r, []))
        if r[-1] is not None:
            ids.append(r[-1])
    return [topic_row(r, ids) for r, ids in topics.values()]


def _messages(tx: Tx, project_id: str, ids: Sequence[str], fact_pks: Sequence[int]) -> list[Any]:
    """The project's messages named in ``ids`` or drawn on by the facts ``fact_pks``
    (fact_sources), in acceptance order."""
    conditions, params = [], [project_id]
    if ids:
        clause, args = tx.dialect.in_("m.id", list(ids))
        conditions.append(clause)
        params += args
    if fact_pks:
        clause, args = tx.dialect.in_("fact_pk", list(fact_pks))
        conditions.append(f"m.pk IN (SELECT message_pk FROM fact_sources WHERE {clause})")
        params += args
    if not conditions:
        return []
    return tx.all(
        f"SELECT {MESSAGE_COLUMNS} FROM messages m WHERE m.project_id = ? "
        f"AND ({' OR '.join(conditions)}) ORDER BY m.pk",
        params,
    )


def _summaries_citing(
    tx: Tx, project_id: str, user_id: str, message_id: str | None, fact_ids: Sequence[str]
) -> list[SummaryRow]:
    """The user's summaries, not deleted, citing the message or any of the facts."""
    d = tx.dialect
    conditions, params = [], [project_id, user_id]
    if message_id is not None:
        conditions.append(d.has("s.message_ids", "?"))
        params.append(message_id)
    for fid in fact_ids:
        conditions.append(d.has("s.fact_ids", "?"))
        params.append(fid)
    if not conditions:
        return []
    rows = tx.all(
        f"SELECT {_S} FROM summaries s WHERE s.project_id = ? AND s.user_id = ? "
        f"AND s.status != 'deleted' AND ({' OR '.join(conditions)}) ORDER BY s.pk",
        params,
    )
    return [summary_row(r, d) for r in rows]


def provenance(tx: Tx, project_id: str, item_id: str) -> ProvenanceRows | None:
    """The item ``item_id`` names and what it is linked to, both ways (see
    ``ProvenanceRows``); None if the project has no such item (or only a deleted one).

    A message: the facts drawn from it (fact_sources, or naming it among their messages),
    the summaries citing it or those facts, their topics. A fact: its messages, the
    summaries citing it, their topics. A summary: its facts, its messages and theirs, its
    topics. A topic: its summaries. A handful of statements, whatever the item's size."""
    found = _find(tx, project_id, item_id)
    if found is None:
        return None
    kind, pk = found
    d = tx.dialect
    if kind == "message":
        message = message_row(
            tx.one(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE pk = ?", (pk,)), d
        )
        facts = [
            fact_row(r, d)
            for r in tx.all(
                f"SELECT {_F} FROM facts f WHERE f.project_id = ? AND f.user_id = ? "
                "AND f.status != 'deleted' AND (f.pk IN (SELECT fact_pk FROM fact_sources "
                f"WHERE message_pk = ?) OR {d.has('f.message_ids', '?')}) ORDER BY f.pk",
                (project_id, message.user_id, pk, message.id),
            )
        ]
        summaries = _summaries_citing(
            tx, project_id, message.user_id, message.id, [f.id for f in facts]
        )
        topics = _topics_of(tx, [s.pk for s in summaries])
        return ProvenanceRows(kind, message, [], facts, summaries, topics)
    if kind == "fact":
        fact = fact_row(tx.one(f"SELECT {FACT_COLUMNS} FROM facts WHERE pk = ?", (pk,)), d)
        messages = [message_row(r, d) for r in _messages(tx, project_id, fact.message_ids, [pk])]
        summaries = _summaries_citing(tx, project_id, fact.user_id, None, [fact.id])
        topics = _topics_of(tx, [s.pk for s in summaries])
        return ProvenanceRows(kind, fact, messages, [], summaries, topics)
    if kind == "summary":
        summary = summary_row(
            tx.one(f"SELECT {SUMMARY_COLUMNS} FROM summaries WHERE pk = ?", (pk,)), d
        )
        facts = []
        if summary.fact_ids:
            clause, args = d.in_("id", summary.fact_ids)
            facts = [
                fact_row(r, d)
                for r in tx.all(
                    f"SELECT {FACT_COLUMNS} FROM facts WHERE project_id = ? AND {clause} "
                    "AND status != 'deleted' ORDER BY pk",
                    [project_id, *args],
                )
            ]
        rows = _messages(tx, project_id, summary.message_ids, [f.pk for f in facts])
        messages = [message_row(r, d) for r in rows]
        topics = _topics_of(tx, [pk])
        return ProvenanceRows(kind, summary, messages, facts, [], topics)
    # A topic: its summaries, in the statement that reads it (one moment's view).
    rows = tx.all(
        f"SELECT {_T}, {_S} FROM topics t "
        "LEFT JOIN topic_summaries ts ON ts.topic_pk = t.pk "
        "LEFT JOIN summaries s ON s.pk = ts.summary_pk AND s.status != 'deleted' "
        "WHERE t.pk = ? ORDER BY s.pk",
        (pk,),
    )
    width = len(TOPIC_COLUMNS.split(","))
    summaries = [summary_row(r[width:], d) for r in rows if r[width] is not None]
    topic = topic_row(rows[0][:width], [s.id for s in summaries])
    return ProvenanceRows(kind, topic, [], [], summaries, [])


# -- activity ----------------------------------------------------------------------------

# A stored time's first 16 characters are its minute ("2026-03-01T10:07"): grouping by
# them counts per minute in the database, so a window of any volume returns at most one
# row per minute, and the same text function exists in both databases.
_MINUTE = "substr({0}, 1, 16)"


def _minute(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M")


def activity(tx: Tx, project_id: str, since: float, until: float) -> ActivityCounts:
    """Per minute of [since, until) (epoch seconds): the project's messages accepted,
    processed, and failed for good."""
    window = (
        project_id,
        to_iso(datetime.fromtimestamp(since, timezone.utc)),
        to_iso(datetime.fromtimestamp(until, timezone.utc)),
    )
    added = tx.all(
        f"SELECT {_MINUTE.format('created_at')}, count(*) FROM messages "
        "WHERE project_id = ? AND created_at >= ? AND created_at < ? GROUP BY 1",
        window,
    )
    processed = tx.all(
        f"SELECT {_MINUTE.format('processed_at')}, count(*) FROM messages "
        "WHERE project_id = ? AND processed_at >= ? AND processed_at < ? GROUP BY 1",
        window,
    )
    # A message failed for good keeps no time of its own: its job's finished_at is when.
    # Failed jobs are few and found by their status; each one's messages by its job id
    # (a join let SQLite's planner scan every message instead).
    failed = tx.all(
        "SELECT j.finished_at, (SELECT count(*) FROM messages m WHERE m.job_id = j.id "
        "AND m.status = 'failed') FROM jobs j WHERE j.project_id = ? AND j.status = 'failed' "
        "AND j.finished_at >= ? AND j.finished_at < ?",
        (project_id, since, until),
    )
    failed_per_minute: dict[str, int] = {}
    for at, n in failed:
        minute = _minute(float(at))
        failed_per_minute[minute] = failed_per_minute.get(minute, 0) + int(n)
    return ActivityCounts(
        added={str(k): int(n) for k, n in added},
        processed={str(k): int(n) for k, n in processed},
        failed=failed_per_minute,
    )


# -- dashboard sign-in sessions ------------------------------------------------------------

_UI_COLUMNS = "id_hash, kind, key_id, project_id, csrf_token, created_at, expires_at, last_seen"


def create_ui_session(tx: Tx, row: UiSessionRow) -> bool:
    """Store the sign-in; False (nothing stored) if it is a key sign-in whose API key is
    unknown or revoked. The key's row is locked until commit, so a revocation running
    meanwhile either comes first (and this refuses) or waits and then deletes this sign-in
    too. (An admin sign-in's ``key_id`` is the dashboard's fingerprint of the admin token.)"""
    if row.kind == "key":
        active = tx.one(
            f"SELECT 1 FROM api_keys WHERE id = ? AND revoked_at IS NULL{tx.dialect.for_update}",
            (row.key_id,),
        )
        if active is None:
            return False
    tx.execute(
        f"INSERT INTO ui_sessions ({_UI_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            row.id_hash,
            row.kind,
            row.key_id,
            row.project_id,
            row.csrf_token,
            row.created_at,
            row.expires_at,
            row.last_seen,
        ),
    )
    return True


def get_ui_session(tx: Tx, id_hash: str, now: float) -> UiSessionRow | None:
    """The session, unless it expired (an expired row waits for ``prune``)."""
    row = tx.one(
        f"SELECT {_UI_COLUMNS} FROM ui_sessions WHERE id_hash = ? AND expires_at > ?",
        (id_hash, now),
    )
    return None if row is None else UiSessionRow(*row)


def touch_ui_session(tx: Tx, id_hash: str, when: float) -> None:
    tx.execute("UPDATE ui_sessions SET last_seen = ? WHERE id_hash = ?", (when, id_hash))


def update_ui_session_project(tx: Tx, id_hash: str, project_id: str | None, now: float) -> bool:
    cur = tx.execute(
        "UPDATE ui_sessions SET project_id = ? WHERE id_hash = ? AND expires_at > ?",
        (project_id, id_hash, now),
    )
    return bool(cur.rowcount)


def delete_ui_session(tx: Tx, id_hash: str) -> bool:
    return bool(tx.execute("DELETE FROM ui_sessions WHERE id_hash = ?", (id_hash,)).rowcount)


def delete_ui_sessions_of_key(tx: Tx, key_id: str) -> int:
    return int(tx.execute("DELETE FROM ui_sessions WHERE key_id = ?", (key_id,)).rowcount)


def prune_ui_sessions(tx: Tx, now: float) -> int:
    return int(tx.execute("DELETE FROM ui_sessions WHERE expires_at <= ?", (now,)).rowcount)

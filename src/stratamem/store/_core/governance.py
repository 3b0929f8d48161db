"""Projects, API keys, the audit, status changes, and the reads governance answers with.

Removal (forgetting and erasure) is ``removal.py``; it audits through ``audit`` here.
"""

from __future__ import annotations

from typing import Any

from ..._time import now_iso
from .. import ApiKeyRow, AuditRow, ProjectRow, TopicRow
from .dialect import Tx
from .rows import AUDIT_COLUMNS, TOPIC_COLUMNS, audit_row, topic_row

__all__ = [
    "audit",
    "create_api_key",
    "create_project",
    "find_api_key",
    "get_project",
    "get_topic",
    "list_api_keys",
    "list_audit",
    "list_projects",
    "revoke_api_key",
    "session_status",
    "set_summary_status",
    "touch_api_key",
]

_PROJECT_COLUMNS = "id, name, created_at"
_KEY_COLUMNS = "id, project_id, name, prefix, created_at, revoked_at, last_used_at"

# -- projects and keys -------------------------------------------------------------------


def create_project(tx: Tx, project_id: str, name: str) -> tuple[ProjectRow, bool]:
    created = tx.one(
        "INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?) "
        "ON CONFLICT (id) DO NOTHING RETURNING id",
        (project_id, name, now_iso()),
    )
    row = tx.one(f"SELECT {_PROJECT_COLUMNS} FROM projects WHERE id = ?", (project_id,))
    return ProjectRow(*row), created is not None


def get_project(tx: Tx, project_id: str) -> ProjectRow | None:
    row = tx.one(f"SELECT {_PROJECT_COLUMNS} FROM projects WHERE id = ?", (project_id,))
    return None if row is None else ProjectRow(*row)


def list_projects(tx: Tx) -> list[ProjectRow]:
    rows = tx.all(f"SELECT {_PROJECT_COLUMNS} FROM projects ORDER BY created_at, id")
    return [ProjectRow(*r) for r in rows]


def create_api_key(tx: Tx, row: ApiKeyRow, key_hash: str) -> None:
    tx.execute(
        "INSERT INTO api_keys (id, project_id, name, prefix, hash, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (row.id, row.project_id, row.name, row.prefix, key_hash, row.created_at),
    )


def find_api_key(tx: Tx, key_hash: str) -> ApiKeyRow | None:
    row = tx.one(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE hash = ?", (key_hash,))
    return None if row is None else ApiKeyRow(*row)


def list_api_keys(tx: Tx, project_id: str | None) -> list[ApiKeyRow]:
    sql = f"SELECT {_KEY_COLUMNS} FROM api_keys"
    params: tuple[str, ...] = ()
    if project_id is not None:
        sql, params = sql + " WHERE project_id = ?", (project_id,)
    return [ApiKeyRow(*r) for r in tx.all(sql + " ORDER BY created_at, id", params)]


def revoke_api_key(tx: Tx, key_id: str) -> ApiKeyRow | None:
    """Revoke a key (a key revoked already keeps its first revocation time)."""
    tx.execute(
        "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (now_iso(), key_id),
    )
    row = tx.one(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
    return None if row is None else ApiKeyRow(*row)


def touch_api_key(tx: Tx, key_id: str, when: str) -> None:
    tx.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (when, key_id))


# -- audit -------------------------------------------------------------------------------


def audit(
    tx: Tx,
    project_id: str,
    user_id: str | None,
    action: str,
    target: str | None,
    actor: str,
    reason: str | None,
    details: dict[str, Any],
) -> None:
    """Record a governance or deletion action, in the transaction of what it records."""
    tx.execute(
        "INSERT INTO audit (project_id, user_id, action, target, actor, reason, details, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (project_id, user_id, action, target, actor, reason, tx.dialect.json(details), now_iso()),
    )


def list_audit(
    tx: Tx,
    project_id: str,
    user_id: str | None,
    limit: int,
    offset: int,
    *,
    newest_first: bool = False,
) -> list[AuditRow]:
    """A page of the project's (or one user's) audit records, in the order they were
    written or, with ``newest_first``, the reverse."""
    sql = f"SELECT {AUDIT_COLUMNS} FROM audit WHERE project_id = ?"
    params: tuple[str, ...] = (project_id,)
    if user_id is not None:
        sql, params = sql + " AND user_id = ?", (project_id, user_id)
    order = " ORDER BY pk DESC" if newest_first else " ORDER BY pk"
    rows = tx.all(sql + order + " LIMIT ? OFFSET ?", (*params, limit, offset))
    return [audit_row(r, tx.dialect) for r in rows]


# -- status changes ----------------------------------------------------------------------


def set_summary_status(
    tx: Tx, project_id: str, summary_id: str, status: str, reason: str, actor: str
) -> bool:
    """Change a summary's status, versioned in its history and audited; False for an
    unknown summary, True (and nothing written) when it has that status already."""
    row = tx.one(
        "SELECT pk, user_id, text, status, confidence, fact_ids, version FROM summaries "
        f"WHERE project_id = ? AND id = ?{tx.dialect.for_update}",
        (project_id, summary_id),
    )
    if row is None:
        return False
    pk, user_id, text, old, confidence, fact_ids, version = row
    if old == status:
        return True
    now = now_iso()
    tx.execute(
        "UPDATE summaries SET status = ?, version = ?, updated_at = ? WHERE pk = ?",
        (status, version + 1, now, pk),
    )
    # fact_ids goes back as it was read: the same column type in both tables.
    tx.execute(
        "INSERT INTO summary_history (summary_pk, version, text, status, confidence, "
        "fact_ids, reason, actor, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (pk, version + 1, text, status, confidence, fact_ids, reason, actor, now),
    )
    details = {"from": old, "to": status, "version": version + 1}
    audit(tx, project_id, user_id, "set_status", summary_id, actor, reason, details)
    return True


# -- reads -------------------------------------------------------------------------------


def session_status(tx: Tx, project_id: str, session_id: str) -> list[tuple[str, str, str | None]]:
    """(message id, status, error) of every message of a session, in order."""
    rows = tx.all(
        "SELECT id, status, error FROM messages WHERE project_id = ? AND session_id = ? "
        "ORDER BY pk",
        (project_id, session_id),
    )
    return [(r[0], r[1], r[2]) for r in rows]


def get_topic(tx: Tx, project_id: str, topic_id: str) -> TopicRow | None:
    """A topic that is not deleted, with its summaries' ids in their order."""
    row = tx.one(
        f"SELECT {TOPIC_COLUMNS} FROM topics WHERE project_id = ? AND id = ? "
        "AND status != 'deleted'",
        (project_id, topic_id),
    )
    if row is None:
        return None
    summary_ids = tx.all(
        "SELECT s.id FROM topic_summaries ts JOIN summaries s ON s.pk = ts.summary_pk "
        "WHERE ts.topic_pk = ? ORDER BY s.pk",
        (row[0],),
    )
    return topic_row(row, [r[0] for r in summary_ids])

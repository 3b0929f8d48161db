"""Projects, API keys, audit, status changes and deletion for the SQLite store.

A mixin of ``SQLiteStore`` (it uses the store's ``_conn`` and ``_write``), kept apart
because deletion has its own rule: it works from provenance upward. Removing messages
removes every fact that cites one of them, every summary that cites one of those facts or
messages (in any of its versions), and every topic left without summaries, from the rows,
the full-text indexes and the vectors alike, so nothing forgotten can be recalled again.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..._time import now_iso
from .. import ApiKeyRow, AuditRow, ProjectRow, TopicRow

_GONE_TABLES = ("gone_messages", "gone_facts", "gone_summaries", "gone_topics")

_KEY_COLUMNS = "id, project_id, name, prefix, created_at, revoked_at, last_used_at"


def _key_row(r: tuple[Any, ...]) -> ApiKeyRow:
    return ApiKeyRow(*r)


class SQLiteGovernance:
    """Mixin: the governance half of the ``Store`` port for SQLite."""

    def _conn(self) -> sqlite3.Connection:  # provided by SQLiteStore
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by SQLiteStore
        raise NotImplementedError

    # -- projects and keys -------------------------------------------------------------

    def create_project(self, project_id: str, name: str) -> tuple[ProjectRow, bool]:
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO NOTHING",
                (project_id, name, now_iso()),
            )
            row = c.execute(
                "SELECT id, name, created_at FROM projects WHERE id = ?", (project_id,)
            ).fetchone()
        return ProjectRow(*row), cur.rowcount == 1

    def get_project(self, project_id: str) -> ProjectRow | None:
        row = (
            self._conn()
            .execute("SELECT id, name, created_at FROM projects WHERE id = ?", (project_id,))
            .fetchone()
        )
        return None if row is None else ProjectRow(*row)

    def list_projects(self) -> list[ProjectRow]:
        rows = self._conn().execute("SELECT id, name, created_at FROM projects ORDER BY created_at")
        return [ProjectRow(*r) for r in rows]

    def create_api_key(self, row: ApiKeyRow, key_hash: str) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO api_keys (id, project_id, name, prefix, hash, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (row.id, row.project_id, row.name, row.prefix, key_hash, row.created_at),
            )

    def find_api_key(self, key_hash: str) -> ApiKeyRow | None:
        row = (
            self._conn()
            .execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE hash = ?", (key_hash,))
            .fetchone()
        )
        return None if row is None else _key_row(row)

    def list_api_keys(self, project_id: str | None) -> list[ApiKeyRow]:
        sql = f"SELECT {_KEY_COLUMNS} FROM api_keys"
        args: tuple[str, ...] = ()
        if project_id is not None:
            sql, args = sql + " WHERE project_id = ?", (project_id,)
        return [_key_row(r) for r in self._conn().execute(sql + " ORDER BY created_at", args)]

    def revoke_api_key(self, key_id: str) -> ApiKeyRow | None:
        with self._write() as c:
            c.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (now_iso(), key_id),
            )
            row = c.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)
            ).fetchone()
        return None if row is None else _key_row(row)

    def touch_api_key(self, key_id: str, when: str) -> None:
        with self._write() as c:
            c.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (when, key_id))

    # -- audit -------------------------------------------------------------------------

    @staticmethod
    def _audit(
        c: sqlite3.Connection,
        project_id: str,
        user_id: str | None,
        action: str,
        target: str | None,
        actor: str,
        reason: str | None,
        details: dict[str, Any],
    ) -> None:
        c.execute(
            "INSERT INTO audit (project_id, user_id, action, target, actor, reason, details, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (project_id, user_id, action, target, actor, reason, json.dumps(details), now_iso()),
        )

    def list_audit(
        self, project_id: str, user_id: str | None, limit: int, offset: int
    ) -> list[AuditRow]:
        sql = (
            "SELECT pk, project_id, user_id, action, target, actor, reason, details, at "
            "FROM audit WHERE project_id = ?"
        )
        args: list[Any] = [project_id]
        if user_id is not None:
            sql += " AND user_id = ?"
            args.append(user_id)
        rows = self._conn().execute(sql + " ORDER BY pk LIMIT ? OFFSET ?", (*args, limit, offset))
        return [AuditRow(*r[:7], json.loads(r[7]), r[8]) for r in rows]

    # -- governance --------------------------------------------------------------------

    def set_summary_status(
        self, project_id: str, summary_id: str, status: str, reason: str, actor: str
    ) -> bool:
        """Change a summary's status, versioned in its history and audited."""
        with self._write() as c:
            row = c.execute(
                "SELECT pk, user_id, text, status, confidence, fact_ids, version FROM summaries "
                "WHERE project_id = ? AND id = ?",
                (project_id, summary_id),
            ).fetchone()
            if row is None:
                return False
            pk, user_id, text, old, confidence, fact_ids, version = row
            if old == status:
                return True
            now = now_iso()
            c.execute(
                "UPDATE summaries SET status = ?, version = ?, updated_at = ? WHERE pk = ?",
                (status, version + 1, now, pk),
            )
            c.execute(
                "INSERT INTO summary_history (summary_pk, version, text, status, confidence, "
                "fact_ids, reason, actor, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (pk, version + 1, text, status, confidence, fact_ids, reason, actor, now),
            )
            self._audit(
                c,
                project_id,
                user_id,
                "set_status",
                summary_id,
                actor,
                reason,
                {"from": old, "to": status, "version": version + 1},
            )
        return True

    def forget(
        self,
        project_id: str,
        user_id: str,
        *,
        message_ids: Sequence[str] = (),
        session_id: str | None = None,
        topic_id: str | None = None,
        actor: str,
        reason: str | None,
    ) -> dict[str, int] | None:
        """Remove messages and everything derived from them; ``None`` if the scope is not
        the user's (an unknown session or topic, or none of the messages)."""
        with self._write() as c:
            self._reset_gone(c)
            if session_id is not None:
                owner = c.execute(
                    "SELECT user_id FROM sessions WHERE project_id = ? AND id = ?",
                    (project_id, session_id),
                ).fetchone()
                if owner is None or owner[0] != user_id:
                    return None
                c.execute(
                    "INSERT INTO temp.gone_messages SELECT pk FROM messages "
                    "WHERE project_id = ? AND session_id = ?",
                    (project_id, session_id),
                )
                target = f"session:{session_id}"
            elif topic_id is not None:
                topic = c.execute(
                    "SELECT pk FROM topics WHERE project_id = ? AND user_id = ? AND id = ? "
                    "AND status != 'deleted'",
                    (project_id, user_id, topic_id),
                ).fetchone()
                if topic is None:
                    return None
                c.execute("INSERT INTO temp.gone_topics VALUES (?)", (topic[0],))
                # The topic's provenance: the messages its summaries cite, directly or
                # through their facts.
                c.execute(
                    "INSERT OR IGNORE INTO temp.gone_messages "
                    "SELECT m.pk FROM topic_summaries ts JOIN summaries s ON s.pk = ts.summary_pk "
                    "JOIN json_each(s.message_ids) j JOIN messages m "
                    "ON m.project_id = s.project_id AND m.id = j.value WHERE ts.topic_pk = ? "
                    "UNION SELECT fs.message_pk FROM topic_summaries ts "
                    "JOIN summaries s ON s.pk = ts.summary_pk JOIN json_each(s.fact_ids) j "
                    "JOIN facts f ON f.project_id = s.project_id AND f.id = j.value "
                    "JOIN fact_sources fs ON fs.fact_pk = f.pk WHERE ts.topic_pk = ?",
                    (topic[0], topic[0]),
                )
                c.execute(
                    "INSERT OR IGNORE INTO temp.gone_summaries "
                    "SELECT summary_pk FROM topic_summaries WHERE topic_pk = ?",
                    (topic[0],),
                )
                target = f"topic:{topic_id}"
            else:
                ids = list(dict.fromkeys(message_ids))
                for start in range(0, len(ids), 500):
                    chunk = ids[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    c.execute(
                        "INSERT OR IGNORE INTO temp.gone_messages SELECT pk FROM messages "
                        f"WHERE project_id = ? AND user_id = ? AND id IN ({marks})",
                        (project_id, user_id, *chunk),
                    )
                if not c.execute("SELECT 1 FROM temp.gone_messages LIMIT 1").fetchone():
                    return None
                target = f"messages:{len(ids)}"
            counts = self._remove_upward(c, project_id, user_id)
            if session_id is not None:
                counts["sessions"] = c.execute(
                    "DELETE FROM sessions WHERE project_id = ? AND id = ?", (project_id, session_id)
                ).rowcount
            self._audit(c, project_id, user_id, "forget", target, actor, reason, counts)
            return counts

    def erase_user(
        self, project_id: str, user_id: str, *, actor: str, reason: str | None
    ) -> dict[str, int]:
        """Remove every trace of a user's memory; the audit keeps who erased and when."""
        with self._write() as c:
            self._reset_gone(c)
            c.execute(
                "INSERT INTO temp.gone_messages SELECT pk FROM messages "
                "WHERE project_id = ? AND user_id = ?",
                (project_id, user_id),
            )
            c.execute(
                "INSERT INTO temp.gone_facts SELECT pk FROM facts "
                "WHERE project_id = ? AND user_id = ?",
                (project_id, user_id),
            )
            c.execute(
                "INSERT INTO temp.gone_summaries SELECT pk FROM summaries "
                "WHERE project_id = ? AND user_id = ?",
                (project_id, user_id),
            )
            c.execute(
                "INSERT INTO temp.gone_topics SELECT pk FROM topics "
                "WHERE project_id = ? AND user_id = ?",
                (project_id, user_id),
            )
            counts = self._remove_upward(c, project_id, user_id)
            where = "WHERE project_id = ? AND user_id = ?"
            scope = (project_id, user_id)
            counts["sessions"] = c.execute(f"DELETE FROM sessions {where}", scope).rowcount
            c.execute(f"DELETE FROM vectors {where}", scope)
            counts["jobs"] = c.execute(f"DELETE FROM jobs {where}", scope).rowcount
            for table in ("speakers", "llm_calls"):
                c.execute(f"DELETE FROM {table} {where}", scope)
            if not any(counts.values()):
                return counts  # an unknown user: nothing to record
            self._audit(c, project_id, user_id, "erase_user", user_id, actor, reason, counts)
            return counts

    @staticmethod
    def _reset_gone(c: sqlite3.Connection) -> None:
        for table in _GONE_TABLES:
            c.execute(f"CREATE TEMP TABLE IF NOT EXISTS {table} (pk INTEGER PRIMARY KEY)")
            c.execute(f"DELETE FROM temp.{table}")

    def _remove_upward(
        self, c: sqlite3.Connection, project_id: str, user_id: str
    ) -> dict[str, int]:
        """Delete the messages in ``temp.gone_messages`` and, upward from them, every fact,
        summary and topic built on them (plus whatever is already in the other gone tables)."""
        scope = (project_id, user_id)
        self._forget_webhook_traces(c, project_id, user_id)  # type: ignore[attr-defined]
        # Facts citing a gone message: through fact_sources, and through their message id
        # list, which also names context messages that fact_sources leaves out.
        c.execute(
            "INSERT OR IGNORE INTO temp.gone_facts SELECT fact_pk FROM fact_sources "
            "WHERE message_pk IN (SELECT pk FROM temp.gone_messages)"
        )
        c.execute(
            "INSERT OR IGNORE INTO temp.gone_facts SELECT f.pk FROM facts f, "
            "json_each(f.message_ids) j WHERE f.project_id = ? AND f.user_id = ? AND j.value IN "
            "(SELECT m.id FROM messages m JOIN temp.gone_messages g ON g.pk = m.pk)",
            scope,
        )
        # Summaries citing a gone fact or message in any version: an older version's text
        # kept in the history may hold the forgotten content too.
        c.execute(
            "INSERT OR IGNORE INTO temp.gone_summaries SELECT s.pk FROM summaries s, "
            "json_each(s.message_ids) j WHERE s.project_id = ? AND s.user_id = ? AND j.value IN "
            "(SELECT m.id FROM messages m JOIN temp.gone_messages g ON g.pk = m.pk)",
            scope,
        )
        gone_fact_ids = "(SELECT f.id FROM facts f JOIN temp.gone_facts g ON g.pk = f.pk)"
        c.execute(
            "INSERT OR IGNORE INTO temp.gone_summaries SELECT s.pk FROM summaries s, "
            f"json_each(s.fact_ids) j WHERE s.project_id = ? AND s.user_id = ? "
            f"AND j.value IN {gone_fact_ids}",
            scope,
        )
        c.execute(
            "INSERT OR IGNORE INTO temp.gone_summaries SELECT h.summary_pk FROM summary_history h "
            "JOIN summaries s ON s.pk = h.summary_pk, json_each(h.fact_ids) j "
            f"WHERE s.project_id = ? AND s.user_id = ? AND j.value IN {gone_fact_ids}",
            scope,
        )
        # Topics left without any summary go too.
        c.execute(
            "INSERT OR IGNORE INTO temp.gone_topics SELECT t.pk FROM topics t "
            "WHERE t.project_id = ? AND t.user_id = ? AND EXISTS (SELECT 1 FROM topic_summaries "
            "ts WHERE ts.topic_pk = t.pk) AND NOT EXISTS (SELECT 1 FROM topic_summaries ts "
            "WHERE ts.topic_pk = t.pk AND ts.summary_pk NOT IN "
            "(SELECT pk FROM temp.gone_summaries))",
            scope,
        )
        # A worker holding a batch with a gone message loses its lease, so it cannot write
        # facts from content that no longer exists; the batch is claimed again without it.
        c.execute(
            "UPDATE jobs SET status = 'queued', locked_by = NULL, lease_until = NULL, "
            "run_after = ?, attempts = max(attempts - 1, 0) WHERE status = 'running' "
            "AND id IN (SELECT m.job_id FROM messages m JOIN temp.gone_messages g ON g.pk = m.pk)",
            (time.time(),),
        )
        counts: dict[str, int] = {}
        for kind, table, gone in (
            ("message", "messages", "gone_messages"),
            ("fact", "facts", "gone_facts"),
            ("summary", "summaries", "gone_summaries"),
        ):
            c.execute(
                f"DELETE FROM vectors WHERE kind = ? AND item_pk IN (SELECT pk FROM temp.{gone})",
                (kind,),
            )
            c.execute(f"DELETE FROM {table}_fts WHERE rowid IN (SELECT pk FROM temp.{gone})")
            counts[table] = c.execute(
                f"DELETE FROM {table} WHERE pk IN (SELECT pk FROM temp.{gone})"
            ).rowcount
        c.execute(
            "DELETE FROM fact_sources WHERE fact_pk IN (SELECT pk FROM temp.gone_facts) "
            "OR message_pk IN (SELECT pk FROM temp.gone_messages)"
        )
        c.execute(
            "DELETE FROM summary_history WHERE summary_pk IN (SELECT pk FROM temp.gone_summaries)"
        )
        c.execute(
            "DELETE FROM topic_summaries WHERE summary_pk IN (SELECT pk FROM temp.gone_summaries) "
            "OR topic_pk IN (SELECT pk FROM temp.gone_topics)"
        )
        counts["topics"] = c.execute(
            "DELETE FROM topics WHERE pk IN (SELECT pk FROM temp.gone_topics)"
        ).rowcount
        # Jobs left without messages have nothing to do.
        c.execute(
            "UPDATE jobs SET status = 'done', finished_at = ?, locked_by = NULL, "
            "lease_until = NULL WHERE project_id = ? AND user_id = ? "
            "AND status IN ('queued', 'running') "
            "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.job_id = jobs.id)",
            (time.time(), *scope),
        )
        c.execute(
            "DELETE FROM speakers WHERE project_id = ? AND user_id = ? AND name NOT IN "
            "(SELECT name FROM messages WHERE project_id = ? AND user_id = ? "
            "AND name IS NOT NULL)",
            (*scope, *scope),
        )
        # Loaded vector scopes (in this process and any other) reload from the table.
        c.execute(
            "INSERT INTO vector_generations (project_id, user_id, kind, generation) "
            "SELECT ?, ?, k.kind, 1 FROM (SELECT 'message' AS kind UNION ALL SELECT 'fact' "
            "UNION ALL SELECT 'summary') k WHERE 1 ON CONFLICT (project_id, user_id, kind) "
            "DO UPDATE SET generation = generation + 1",
            scope,
        )
        return counts

    # -- reads -------------------------------------------------------------------------

    def session_status(self, project_id: str, session_id: str) -> list[tuple[str, str, str | None]]:
        """(message id, status, error) of every message of a session, in order."""
        rows = self._conn().execute(
            "SELECT id, status, error FROM messages WHERE project_id = ? AND session_id = ? "
            "ORDER BY pk",
            (project_id, session_id),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def get_topic(self, project_id: str, topic_id: str) -> TopicRow | None:
        conn = self._conn()
        row = conn.execute(
            "SELECT pk, project_id, id, user_id, name, description, status, created_at, "
            "updated_at FROM topics WHERE project_id = ? AND id = ? AND status != 'deleted'",
            (project_id, topic_id),
        ).fetchone()
        if row is None:
            return None
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT s.id FROM topic_summaries ts JOIN summaries s ON s.pk = ts.summary_pk "
                "WHERE ts.topic_pk = ? ORDER BY s.pk",
                (row[0],),
            )
        ]
        return TopicRow(*row[:7], ids, row[7], row[8])


__all__ = ["SQLiteGovernance"]

"""Projects, API keys, audit, status changes and deletion for the PostgreSQL store.

A mixin of ``PostgresStore`` with the semantics of ``_sqlite_governance.py``: deletion
works from provenance upward (messages → facts → summaries, in any of their versions →
topics left empty), from the rows, full-text columns and vectors alike. The sets of rows
to remove are collected in temporary tables dropped at commit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from ..._time import now_iso
from .. import ApiKeyRow, AuditRow, ProjectRow, TopicRow
from ._connection import PgBase

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresGovernance"]

_GONE_TABLES = ("gone_messages", "gone_facts", "gone_summaries", "gone_topics")
_KEY_COLUMNS = "id, project_id, name, prefix, created_at, revoked_at, last_used_at"
_TOPIC_COLUMNS = "pk, project_id, id, user_id, name, description, status, created_at, updated_at"


def _key_row(r: Sequence[Any]) -> ApiKeyRow:
    return ApiKeyRow(*r)


class PostgresGovernance(PgBase):
    """Mixin: the governance half of the ``Store`` port for PostgreSQL."""

    if TYPE_CHECKING:  # provided by PostgresWebhooks

        def _forget_webhook_traces(
            self, c: psycopg.Connection[Any], project_id: str, user_id: str
        ) -> None: ...

    # -- projects and keys -------------------------------------------------------------

    def create_project(self, project_id: str, name: str) -> tuple[ProjectRow, bool]:
        with self._write() as c:
            created = c.execute(
                "INSERT INTO projects (id, name, created_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                (project_id, name, now_iso()),
            ).fetchone()
            row = c.execute(
                "SELECT id, name, created_at FROM projects WHERE id = %s", (project_id,)
            ).fetchone()
        assert row is not None
        return ProjectRow(*row), created is not None

    def get_project(self, project_id: str) -> ProjectRow | None:
        with self._read() as c:
            row = c.execute(
                "SELECT id, name, created_at FROM projects WHERE id = %s", (project_id,)
            ).fetchone()
        return None if row is None else ProjectRow(*row)

    def list_projects(self) -> list[ProjectRow]:
        with self._read() as c:
            rows = c.execute(
                "SELECT id, name, created_at FROM projects ORDER BY created_at, id"
            ).fetchall()
        return [ProjectRow(*r) for r in rows]

    def create_api_key(self, row: ApiKeyRow, key_hash: str) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO api_keys (id, project_id, name, prefix, hash, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (row.id, row.project_id, row.name, row.prefix, key_hash, row.created_at),
            )

    def find_api_key(self, key_hash: str) -> ApiKeyRow | None:
        with self._read() as c:
            row = c.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE hash = %s", (key_hash,)
            ).fetchone()
        return None if row is None else _key_row(row)

    def list_api_keys(self, project_id: str | None) -> list[ApiKeyRow]:
        sql = f"SELECT {_KEY_COLUMNS} FROM api_keys"
        args: tuple[str, ...] = ()
        if project_id is not None:
            sql, args = sql + " WHERE project_id = %s", (project_id,)
        with self._read() as c:
            rows = c.execute(sql + " ORDER BY created_at, id", args).fetchall()
        return [_key_row(r) for r in rows]

    def revoke_api_key(self, key_id: str) -> ApiKeyRow | None:
        with self._write() as c:
            c.execute(
                "UPDATE api_keys SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL",
                (now_iso(), key_id),
            )
            row = c.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = %s", (key_id,)
            ).fetchone()
        return None if row is None else _key_row(row)

    def touch_api_key(self, key_id: str, when: str) -> None:
        with self._write() as c:
            c.execute("UPDATE api_keys SET last_used_at = %s WHERE id = %s", (when, key_id))

    # -- audit -------------------------------------------------------------------------

    @staticmethod
    def _audit(
        c: psycopg.Connection[Any],
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
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (project_id, user_id, action, target, actor, reason, Jsonb(details), now_iso()),
        )

    def list_audit(
        self, project_id: str, user_id: str | None, limit: int, offset: int
    ) -> list[AuditRow]:
        sql = (
            "SELECT pk, project_id, user_id, action, target, actor, reason, details, at "
            "FROM audit WHERE project_id = %s"
        )
        args: list[Any] = [project_id]
        if user_id is not None:
            sql += " AND user_id = %s"
            args.append(user_id)
        with self._read() as c:
            rows = c.execute(sql + " ORDER BY pk LIMIT %s OFFSET %s", (*args, limit, offset))
            return [AuditRow(*r) for r in rows.fetchall()]

    # -- governance --------------------------------------------------------------------

    def set_summary_status(
        self, project_id: str, summary_id: str, status: str, reason: str, actor: str
    ) -> bool:
        """Change a summary's status, versioned in its history and audited."""
        with self._write() as c:
            row = c.execute(
                "SELECT pk, user_id, text, status, confidence, fact_ids, version FROM summaries "
                "WHERE project_id = %s AND id = %s FOR UPDATE",
                (project_id, summary_id),
            ).fetchone()
            if row is None:
                return False
            pk, user_id, text, old, confidence, fact_ids, version = row
            if old == status:
                return True
            now = now_iso()
            c.execute(
                "UPDATE summaries SET status = %s, version = %s, updated_at = %s WHERE pk = %s",
                (status, version + 1, now, pk),
            )
            c.execute(
                "INSERT INTO summary_history (summary_pk, version, text, status, confidence, "
                "fact_ids, reason, actor, changed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
            self._lock_user(c, project_id, user_id)
            self._reset_gone(c)
            if session_id is not None:
                owner = c.execute(
                    "SELECT user_id FROM sessions WHERE project_id = %s AND id = %s",
                    (project_id, session_id),
                ).fetchone()
                if owner is None or owner[0] != user_id:
                    return None
                c.execute(
                    "INSERT INTO gone_messages SELECT pk FROM messages "
                    "WHERE project_id = %s AND session_id = %s",
                    (project_id, session_id),
                )
                target = f"session:{session_id}"
            elif topic_id is not None:
                topic = c.execute(
                    "SELECT pk FROM topics WHERE project_id = %s AND user_id = %s AND id = %s "
                    "AND status != 'deleted'",
                    (project_id, user_id, topic_id),
                ).fetchone()
                if topic is None:
                    return None
                c.execute("INSERT INTO gone_topics VALUES (%s)", (topic[0],))
                # The topic's provenance: the messages its summaries cite, directly or
                # through their facts.
                c.execute(
                    "INSERT INTO gone_messages "
                    "SELECT m.pk FROM topic_summaries ts JOIN summaries s ON s.pk = ts.summary_pk "
                    "JOIN messages m ON m.project_id = s.project_id AND m.id = ANY(s.message_ids) "
                    "WHERE ts.topic_pk = %s "
                    "UNION SELECT fs.message_pk FROM topic_summaries ts "
                    "JOIN summaries s ON s.pk = ts.summary_pk "
                    "JOIN facts f ON f.project_id = s.project_id AND f.id = ANY(s.fact_ids) "
                    "JOIN fact_sources fs ON fs.fact_pk = f.pk WHERE ts.topic_pk = %s "
                    "ON CONFLICT DO NOTHING",
                    (topic[0], topic[0]),
                )
                c.execute(
                    "INSERT INTO gone_summaries SELECT summary_pk FROM topic_summaries "
                    "WHERE topic_pk = %s ON CONFLICT DO NOTHING",
                    (topic[0],),
                )
                target = f"topic:{topic_id}"
            else:
                ids = list(dict.fromkeys(message_ids))
                c.execute(
                    "INSERT INTO gone_messages SELECT pk FROM messages "
                    "WHERE project_id = %s AND user_id = %s AND id = ANY(%s::text[]) "
                    "ON CONFLICT DO NOTHING",
                    (project_id, user_id, ids),
                )
                if c.execute("SELECT 1 FROM gone_messages LIMIT 1").fetchone() is None:
                    return None
                target = f"messages:{len(ids)}"
            counts = self._remove_upward(c, project_id, user_id)
            if session_id is not None:
                counts["sessions"] = c.execute(
                    "DELETE FROM sessions WHERE project_id = %s AND id = %s",
                    (project_id, session_id),
                ).rowcount
            self._audit(c, project_id, user_id, "forget", target, actor, reason, counts)
            return counts

    def erase_user(
        self, project_id: str, user_id: str, *, actor: str, reason: str | None
    ) -> dict[str, int]:
        """Remove every trace of a user's memory; the audit keeps who erased and when."""
        scope = (project_id, user_id)
        where = "WHERE project_id = %s AND user_id = %s"
        with self._write() as c:
            self._lock_user(c, project_id, user_id)
            self._reset_gone(c)
            for gone, table in (
                ("gone_messages", "messages"),
                ("gone_facts", "facts"),
                ("gone_summaries", "summaries"),
                ("gone_topics", "topics"),
            ):
                c.execute(f"INSERT INTO {gone} SELECT pk FROM {table} {where}", scope)
            counts = self._remove_upward(c, project_id, user_id)
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
    def _reset_gone(c: psycopg.Connection[Any]) -> None:
        for table in _GONE_TABLES:
            c.execute(f"CREATE TEMP TABLE {table} (pk bigint PRIMARY KEY) ON COMMIT DROP")

    def _remove_upward(
        self, c: psycopg.Connection[Any], project_id: str, user_id: str
    ) -> dict[str, int]:
        """Delete the messages in ``gone_messages`` and, upward from them, every fact,
        summary and topic built on them (plus whatever is already in the other gone tables)."""
        scope = (project_id, user_id)
        self._forget_webhook_traces(c, project_id, user_id)
        gone_message_ids = "ARRAY(SELECT m.id FROM messages m JOIN gone_messages g ON g.pk = m.pk)"
        # Facts citing a gone message: through fact_sources, and through their message id
        # list, which also names context messages that fact_sources leaves out.
        c.execute(
            "INSERT INTO gone_facts SELECT fact_pk FROM fact_sources "
            "WHERE message_pk IN (SELECT pk FROM gone_messages) ON CONFLICT DO NOTHING"
        )
        c.execute(
            "INSERT INTO gone_facts SELECT f.pk FROM facts f WHERE f.project_id = %s "
            f"AND f.user_id = %s AND f.message_ids && {gone_message_ids} ON CONFLICT DO NOTHING",
            scope,
        )
        # Summaries citing a gone fact or message in any version: an older version's text
        # kept in the history may hold the forgotten content too.
        c.execute(
            "INSERT INTO gone_summaries SELECT s.pk FROM summaries s WHERE s.project_id = %s "
            f"AND s.user_id = %s AND s.message_ids && {gone_message_ids} ON CONFLICT DO NOTHING",
            scope,
        )
        gone_fact_ids = "ARRAY(SELECT f.id FROM facts f JOIN gone_facts g ON g.pk = f.pk)"
        c.execute(
            "INSERT INTO gone_summaries SELECT s.pk FROM summaries s WHERE s.project_id = %s "
            f"AND s.user_id = %s AND s.fact_ids && {gone_fact_ids} ON CONFLICT DO NOTHING",
            scope,
        )
        c.execute(
            "INSERT INTO gone_summaries SELECT DISTINCT h.summary_pk FROM summary_history h "
            "JOIN summaries s ON s.pk = h.summary_pk WHERE s.project_id = %s "
            f"AND s.user_id = %s AND h.fact_ids && {gone_fact_ids} ON CONFLICT DO NOTHING",
            scope,
        )
        # Topics left without any summary go too.
        c.execute(
            "INSERT INTO gone_topics SELECT t.pk FROM topics t "
            "WHERE t.project_id = %s AND t.user_id = %s AND EXISTS (SELECT 1 FROM "
            "topic_summaries ts WHERE ts.topic_pk = t.pk) AND NOT EXISTS (SELECT 1 FROM "
            "topic_summaries ts WHERE ts.topic_pk = t.pk AND ts.summary_pk NOT IN "
            "(SELECT pk FROM gone_summaries)) ON CONFLICT DO NOTHING",
            scope,
        )
        # A worker holding a batch with a gone message loses its lease, so it cannot write
        # facts from content that no longer exists; the batch is claimed again without it.
        c.execute(
            "UPDATE jobs SET status = 'queued', locked_by = NULL, lease_until = NULL, "
            "run_after = %s, attempts = greatest(attempts - 1, 0) WHERE status = 'running' "
            "AND id IN (SELECT m.job_id FROM messages m JOIN gone_messages g ON g.pk = m.pk)",
            (time.time(),),
        )
        counts: dict[str, int] = {}
        for kind, table, gone in (
            ("message", "messages", "gone_messages"),
            ("fact", "facts", "gone_facts"),
            ("summary", "summaries", "gone_summaries"),
        ):
            c.execute(
                f"DELETE FROM vectors WHERE kind = %s AND item_pk IN (SELECT pk FROM {gone})",
                (kind,),
            )
            counts[table] = c.execute(
                f"DELETE FROM {table} WHERE pk IN (SELECT pk FROM {gone})"
            ).rowcount
        c.execute(
            "DELETE FROM fact_sources WHERE fact_pk IN (SELECT pk FROM gone_facts) "
            "OR message_pk IN (SELECT pk FROM gone_messages)"
        )
        c.execute("DELETE FROM summary_history WHERE summary_pk IN (SELECT pk FROM gone_summaries)")
        c.execute(
            "DELETE FROM topic_summaries WHERE summary_pk IN (SELECT pk FROM gone_summaries) "
            "OR topic_pk IN (SELECT pk FROM gone_topics)"
        )
        counts["topics"] = c.execute(
            "DELETE FROM topics WHERE pk IN (SELECT pk FROM gone_topics)"
        ).rowcount
        # Jobs left without messages have nothing to do.
        c.execute(
            "UPDATE jobs SET status = 'done', finished_at = %s, locked_by = NULL, "
            "lease_until = NULL WHERE project_id = %s AND user_id = %s "
            "AND status IN ('queued', 'running') "
            "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.job_id = jobs.id)",
            (time.time(), *scope),
        )
        c.execute(
            "DELETE FROM speakers WHERE project_id = %s AND user_id = %s AND name NOT IN "
            "(SELECT name FROM messages WHERE project_id = %s AND user_id = %s "
            "AND name IS NOT NULL)",
            (*scope, *scope),
        )
        return counts

    # -- reads -------------------------------------------------------------------------

    def session_status(self, project_id: str, session_id: str) -> list[tuple[str, str, str | None]]:
        """(message id, status, error) of every message of a session, in order."""
        with self._read() as c:
            rows = c.execute(
                "SELECT id, status, error FROM messages WHERE project_id = %s "
                "AND session_id = %s ORDER BY pk",
                (project_id, session_id),
            ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def get_topic(self, project_id: str, topic_id: str) -> TopicRow | None:
        with self._read() as c:
            row = c.execute(
                f"SELECT {_TOPIC_COLUMNS}, ARRAY(SELECT s.id FROM topic_summaries ts "
                "JOIN summaries s ON s.pk = ts.summary_pk WHERE ts.topic_pk = topics.pk "
                "ORDER BY s.pk) FROM topics WHERE project_id = %s AND id = %s "
                "AND status != 'deleted'",
                (project_id, topic_id),
            ).fetchone()
        if row is None:
            return None
        return TopicRow(*row[:7], list(row[9]), row[7], row[8])

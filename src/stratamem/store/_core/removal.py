"""Removal from provenance upward: forgetting messages (by id, session or topic) and
erasing a user. Both also delete the user's recall log (``recall_log.py``).

Removing messages removes every fact that cites one of them, every summary that cites one
of those facts or messages (in any of its versions), and every topic left without
summaries, from the rows, the full-text indexes and the vectors alike, so nothing forgotten
can be recalled again. The rows to remove are collected as keys in temporary tables (the
``gone_*`` tables: first the scope, then upward from it) and deleted together, audited, in
the caller's transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .dialect import Tx
from .governance import audit
from .recall_log import forget_recall_log
from .webhooks import forget_webhook_traces

if TYPE_CHECKING:
    from .store import SQLStore

__all__ = ["erase_user", "forget"]

_GONE_TABLES = ("gone_messages", "gone_facts", "gone_summaries", "gone_topics")
# Each layer with a vector and a full-text index: (vector kind, table, its gone table).
_LAYERS = (
    ("message", "messages", "gone_messages"),
    ("fact", "facts", "gone_facts"),
    ("summary", "summaries", "gone_summaries"),
)
_GONE_MESSAGE_IDS = "SELECT m.id FROM messages m JOIN gone_messages g ON g.pk = m.pk"
_GONE_FACT_IDS = "SELECT f.id FROM facts f JOIN gone_facts g ON g.pk = f.pk"


def forget(
    store: SQLStore,
    tx: Tx,
    project_id: str,
    user_id: str,
    scope: tuple[Sequence[str], str | None, str | None],
    actor: str,
    reason: str | None,
) -> dict[str, int] | None:
    """Remove messages and everything derived from them; ``None`` if the scope is not the
    user's (an unknown session or topic, or none of the messages). The scope is a session
    if one is given, else a topic if one is given, else the messages:
    ``(message_ids, session_id, topic_id)``."""
    message_ids, session_id, topic_id = scope
    tx.lock_user(project_id, user_id)
    _reset_gone(tx)
    if session_id is not None:
        target = _gone_session(tx, project_id, user_id, session_id)
    elif topic_id is not None:
        target = _gone_topic(tx, project_id, user_id, topic_id)
    else:
        target = _gone_messages(tx, project_id, user_id, message_ids)
    if target is None:
        return None
    # All of the user's recall log, not only what quoted the scope (see forget_recall_log).
    forget_recall_log(tx, project_id, user_id)
    counts = _remove_upward(store, tx, project_id, user_id)
    if session_id is not None:
        counts["sessions"] = tx.execute(
            "DELETE FROM sessions WHERE project_id = ? AND id = ?", (project_id, session_id)
        ).rowcount
    audit(tx, project_id, user_id, "forget", target, actor, reason, counts)
    return counts


def erase_user(
    store: SQLStore, tx: Tx, project_id: str, user_id: str, *, actor: str, reason: str | None
) -> dict[str, int]:
    """Remove every trace of a user's memory; the audit keeps who erased and when (an
    unknown user is not audited)."""
    where = "WHERE project_id = ? AND user_id = ?"
    scope = (project_id, user_id)
    tx.lock_user(project_id, user_id)
    _reset_gone(tx)
    for table in ("messages", "facts", "summaries", "topics"):
        tx.execute(f"INSERT INTO gone_{table} SELECT pk FROM {table} {where}", scope)
    counts = _remove_upward(store, tx, project_id, user_id)
    counts["sessions"] = tx.execute(f"DELETE FROM sessions {where}", scope).rowcount
    tx.execute(f"DELETE FROM vectors {where}", scope)
    counts["jobs"] = tx.execute(f"DELETE FROM jobs {where}", scope).rowcount
    for table in ("speakers", "llm_calls"):
        tx.execute(f"DELETE FROM {table} {where}", scope)
    # Not counted: an erasure of a user known only to the recall log is no erasure to
    # audit, and the counts name the memory's layers.
    forget_recall_log(tx, project_id, user_id)
    if any(counts.values()):
        audit(tx, project_id, user_id, "erase_user", user_id, actor, reason, counts)
    return counts


def _reset_gone(tx: Tx) -> None:
    for table in _GONE_TABLES:
        tx.dialect.temp_keys(tx.raw, table)


# -- the scope: what gone_* holds before the removal works upward -------------------------


def _gone_session(tx: Tx, project_id: str, user_id: str, session_id: str) -> str | None:
    owner = tx.scalar(
        "SELECT user_id FROM sessions WHERE project_id = ? AND id = ?", (project_id, session_id)
    )
    if owner != user_id:  # an unknown session, or another user's
        return None
    tx.execute(
        "INSERT INTO gone_messages SELECT pk FROM messages WHERE project_id = ? AND session_id = ?",
        (project_id, session_id),
    )
    return f"session:{session_id}"


def _gone_topic(tx: Tx, project_id: str, user_id: str, topic_id: str) -> str | None:
    """The topic, its summaries and their provenance: the messages they cite, directly or
    through their facts."""
    topic_pk = tx.scalar(
        "SELECT pk FROM topics WHERE project_id = ? AND user_id = ? AND id = ? "
        "AND status != 'deleted'",
        (project_id, user_id, topic_id),
    )
    if topic_pk is None:
        return None
    tx.execute("INSERT INTO gone_topics VALUES (?)", (topic_pk,))
    cited = tx.all(
        "SELECT s.message_ids, s.fact_ids FROM topic_summaries ts "
        "JOIN summaries s ON s.pk = ts.summary_pk WHERE ts.topic_pk = ?",
        (topic_pk,),
    )
    load = tx.dialect.load_array
    message_ids = _unique(load(r[0]) for r in cited)
    if message_ids:
        in_ids, params = tx.dialect.in_("id", message_ids)
        tx.execute(
            "INSERT INTO gone_messages SELECT pk FROM messages "
            f"WHERE project_id = ? AND {in_ids} ON CONFLICT DO NOTHING",
            (project_id, *params),
        )
    fact_ids = _unique(load(r[1]) for r in cited)
    if fact_ids:
        in_ids, params = tx.dialect.in_("f.id", fact_ids)
        tx.execute(
            "INSERT INTO gone_messages SELECT fs.message_pk FROM facts f "
            f"JOIN fact_sources fs ON fs.fact_pk = f.pk WHERE f.project_id = ? AND {in_ids} "
            "ON CONFLICT DO NOTHING",
            (project_id, *params),
        )
    tx.execute(
        "INSERT INTO gone_summaries SELECT summary_pk FROM topic_summaries WHERE topic_pk = ? "
        "ON CONFLICT DO NOTHING",
        (topic_pk,),
    )
    return f"topic:{topic_id}"


def _gone_messages(tx: Tx, project_id: str, user_id: str, message_ids: Sequence[str]) -> str | None:
    ids = list(dict.fromkeys(message_ids))
    if ids:
        in_ids, params = tx.dialect.in_("id", ids)
        tx.execute(
            "INSERT INTO gone_messages SELECT pk FROM messages "
            f"WHERE project_id = ? AND user_id = ? AND {in_ids} ON CONFLICT DO NOTHING",
            (project_id, user_id, *params),
        )
    if tx.one("SELECT 1 FROM gone_messages LIMIT 1") is None:
        return None
    return f"messages:{len(ids)}"


def _unique(lists: Iterable[list[str]]) -> list[str]:
    return list(dict.fromkeys(value for values in lists for value in values))


# -- upward from the scope ----------------------------------------------------------------


def _remove_upward(store: SQLStore, tx: Tx, project_id: str, user_id: str) -> dict[str, int]:
    """Delete the messages in ``gone_messages`` and, upward from them, every fact, summary
    and topic built on them (plus whatever is already in the other gone tables)."""
    scope = (project_id, user_id)
    forget_webhook_traces(tx, project_id, user_id)
    _gone_upward(tx, scope)
    _void_leases(tx)
    counts = _delete_gone(store, tx)
    _finish_emptied_jobs(tx, scope)
    tx.execute(
        "DELETE FROM speakers WHERE project_id = ? AND user_id = ? AND name NOT IN "
        "(SELECT name FROM messages WHERE project_id = ? AND user_id = ? "
        "AND name IS NOT NULL)",
        (*scope, *scope),
    )
    store._vectors_removed(tx, project_id, user_id)
    return counts


def _gone_upward(tx: Tx, scope: tuple[str, str]) -> None:
    """Add to the gone tables the facts, summaries and topics built on what they hold."""
    overlaps = tx.dialect.overlaps
    # Facts citing a gone message: through fact_sources, and through their message id
    # list, which also names context messages that fact_sources leaves out.
    tx.execute(
        "INSERT INTO gone_facts SELECT fact_pk FROM fact_sources "
        "WHERE message_pk IN (SELECT pk FROM gone_messages) ON CONFLICT DO NOTHING"
    )
    tx.execute(
        "INSERT INTO gone_facts SELECT f.pk FROM facts f WHERE f.project_id = ? "
        f"AND f.user_id = ? AND {overlaps('f.message_ids', _GONE_MESSAGE_IDS)} "
        "ON CONFLICT DO NOTHING",
        scope,
    )
    # Summaries citing a gone fact or message in any version: an older version's text
    # kept in the history may hold the forgotten content too.
    tx.execute(
        "INSERT INTO gone_summaries SELECT s.pk FROM summaries s WHERE s.project_id = ? "
        f"AND s.user_id = ? AND {overlaps('s.message_ids', _GONE_MESSAGE_IDS)} "
        "ON CONFLICT DO NOTHING",
        scope,
    )
    tx.execute(
        "INSERT INTO gone_summaries SELECT s.pk FROM summaries s WHERE s.project_id = ? "
        f"AND s.user_id = ? AND {overlaps('s.fact_ids', _GONE_FACT_IDS)} "
        "ON CONFLICT DO NOTHING",
        scope,
    )
    tx.execute(
        "INSERT INTO gone_summaries SELECT DISTINCT h.summary_pk FROM summary_history h "
        "JOIN summaries s ON s.pk = h.summary_pk WHERE s.project_id = ? AND s.user_id = ? "
        f"AND {overlaps('h.fact_ids', _GONE_FACT_IDS)} ON CONFLICT DO NOTHING",
        scope,
    )
    # Topics left without any summary go too.
    tx.execute(
        "INSERT INTO gone_topics SELECT t.pk FROM topics t "
        "WHERE t.project_id = ? AND t.user_id = ? AND EXISTS (SELECT 1 FROM "
        "topic_summaries ts WHERE ts.topic_pk = t.pk) AND NOT EXISTS (SELECT 1 FROM "
        "topic_summaries ts WHERE ts.topic_pk = t.pk AND ts.summary_pk NOT IN "
        "(SELECT pk FROM gone_summaries)) ON CONFLICT DO NOTHING",
        scope,
    )


def _void_leases(tx: Tx) -> None:
    """A worker holding a batch with a gone message loses its lease, so it cannot write
    facts from content that no longer exists; the batch is claimed again without it."""
    tx.execute(
        "UPDATE jobs SET status = 'queued', locked_by = NULL, lease_until = NULL, "
        f"run_after = ?, attempts = {tx.dialect.greatest('attempts - 1', '0')} "
        "WHERE status = 'running' "
        "AND id IN (SELECT m.job_id FROM messages m JOIN gone_messages g ON g.pk = m.pk)",
        (time.time(),),
    )


def _delete_gone(store: SQLStore, tx: Tx) -> dict[str, int]:
    """Delete the gone rows, with their vectors, full-text entries and links; the counts
    of messages, facts, summaries and topics deleted."""
    counts: dict[str, int] = {}
    for kind, table, gone in _LAYERS:
        tx.execute(
            f"DELETE FROM vectors WHERE kind = ? AND item_pk IN (SELECT pk FROM {gone})",
            (kind,),
        )
        store._unindex_gone(tx, table, gone)
        counts[table] = tx.execute(
            f"DELETE FROM {table} WHERE pk IN (SELECT pk FROM {gone})"
        ).rowcount
    tx.execute(
        "DELETE FROM fact_sources WHERE fact_pk IN (SELECT pk FROM gone_facts) "
        "OR message_pk IN (SELECT pk FROM gone_messages)"
    )
    tx.execute("DELETE FROM summary_history WHERE summary_pk IN (SELECT pk FROM gone_summaries)")
    tx.execute(
        "DELETE FROM topic_summaries WHERE summary_pk IN (SELECT pk FROM gone_summaries) "
        "OR topic_pk IN (SELECT pk FROM gone_topics)"
    )
    counts["topics"] = tx.execute(
        "DELETE FROM topics WHERE pk IN (SELECT pk FROM gone_topics)"
    ).rowcount
    return counts


def _finish_emptied_jobs(tx: Tx, scope: tuple[str, str]) -> None:
    """Jobs left without messages have nothing to do."""
    tx.execute(
        "UPDATE jobs SET status = 'done', finished_at = ?, locked_by = NULL, "
        "lease_until = NULL WHERE project_id = ? AND user_id = ? "
        "AND status IN ('queued', 'running') "
        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.job_id = jobs.id)",
        (time.time(), *scope),
    )

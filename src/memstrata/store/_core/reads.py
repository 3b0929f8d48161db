"""Reads of the derived layers: facts, summaries, topics and their histories."""

from __future__ import annotations

from .. import SummaryRow
from .dialect import Tx
from .rows import SUMMARY_COLUMNS, summary_row

__all__ = ["summary_by_id"]


def summary_by_id(tx: Tx, project_id: str, summary_id: str) -> SummaryRow | None:
    row = tx.one(
        f"SELECT {SUMMARY_COLUMNS} FROM summaries WHERE project_id = ? AND id = ?",
        (project_id, summary_id),
    )
    return None if row is None else summary_row(row, tx.dialect)

"""Stored rows to public types (shared by the facade and the read path)."""

from __future__ import annotations

from .._convert import from_row
from ..store import FactRow, MessageRow, SummaryRow, TopicRow
from ..types import Fact, Message, Summary, Topic

__all__ = ["fact_from_row", "message_from_row", "summary_from_row", "topic_from_row"]

_STORED_AS = {"timestamp": "ts"}


def message_from_row(row: MessageRow) -> Message:
    return from_row(Message, row, rename=_STORED_AS)


def fact_from_row(row: FactRow) -> Fact:
    return from_row(Fact, row)


def summary_from_row(row: SummaryRow) -> Summary:
    return from_row(Summary, row)


def topic_from_row(row: TopicRow) -> Topic:
    return from_row(Topic, row)

"""Rows to public models by field name (``stratamem._convert.from_row``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from pydantic import BaseModel

from stratamem._convert import from_row


class Note(BaseModel):
    id: str
    text: str
    at: datetime
    seen_at: datetime | None = None


@dataclass
class NoteRow:
    pk: int
    text: str
    at: str
    seen_at: str | None


def test_fields_come_by_name_with_times_parsed_and_renames() -> None:
    row = NoteRow(pk=7, text="hi", at="2024-05-01T10:00:00.000000Z", seen_at=None)
    at = datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    assert from_row(Note, row, id="n7") == Note(id="n7", text="hi", at=at)
    assert from_row(Note, NoteRow(1, "x", row.at, row.at), id="n").seen_at == at
    assert from_row(Note, row, id="n", text="given wins").text == "given wins"
    # A renamed source is validated like any other: pk is an int, id a str.
    with pytest.raises(ValueError, match="id"):
        from_row(Note, row, rename={"id": "pk"})


def test_a_field_the_row_lacks_is_an_error_on_first_use() -> None:
    @dataclass
    class Short:
        text: str
        at: str

    with pytest.raises(TypeError, match=r"Short has no 'seen_at' for Note\.seen_at"):
        from_row(Note, Short("x", "2024-05-01T10:00:00.000000Z"), id="n")

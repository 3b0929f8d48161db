"""An erasure or a forget races another process's buffers (issue 39): two real processes on
one store, both stores (tests/erasure_race.py stages them). The other process holds a recall
log record that quotes the user's PIN, or a captured exchange that tells it, while this
process erases (or forgets) the user; when it writes afterwards, nothing of it may appear,
and it says so (counted, logged). What the user says after coming back is stored as usual.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from erasure_race import BACK_TELLS, capture_race, recall_race

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("removal", ["erase_user", "forget"])
def test_a_recall_record_buffered_elsewhere_is_not_written_after_the_removal(
    db_url: str, tmp_path: Path, removal: str
) -> None:
    race = recall_race(db_url, tmp_path, removal)
    # The PIN is nowhere: only the recall of the user coming back was written.
    assert race.written == ["I'm back"] and race.leaked == []
    assert race.counts == {"erased": 1}
    assert "1 recall log record(s) not written" in race.log


@pytest.mark.parametrize("recall_on", [True, False], ids=["recall", "no-recall"])
def test_an_exchange_captured_across_an_erasure_is_not_stored(
    db_url: str, tmp_path: Path, recall_on: bool
) -> None:
    """The call began before the erasure and was answered after it: its exchange is not
    stored (its session is not made again either). The user's next call, after the
    erasure, is stored, with recall working again."""
    race = capture_race(db_url, tmp_path, recall_on)
    assert race.written == [BACK_TELLS, "Noted."] and race.leaked == []
    assert race.sessions == ["chat-u-cap"]
    assert race.counts == {"written": 1, "erased": 1}
    assert "began before the user was erased; it is not stored" in race.log
    if recall_on:  # the session the first recall made was erased: made again, no failure
        assert "recall failed" not in race.log

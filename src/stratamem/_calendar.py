"""Calendar vocabulary and arithmetic shared by the date resolver of the write path
(``pipeline/_dates.py``) and the time intent of the read path (``recall/_temporal.py``)."""

from __future__ import annotations

import calendar
from datetime import date, timedelta

__all__ = ["MONTHS", "SEASON_START", "add_months", "monday"]

# English month names and abbreviations -> month number.
MONTHS = {
    name: number
    for number, names in enumerate(
        (
            "jan january",
            "feb february",
            "mar march",
            "apr april",
            "may",
            "jun june",
            "jul july",
            "aug august",
            "sep sept september",
            "oct october",
            "nov november",
            "dec december",
        ),
        start=1,
    )
    for name in names.split()
}

# Northern-hemisphere meteorological seasons: the month each begins (three months long).
SEASON_START = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}


def add_months(d: date, n: int) -> date:
    """Calendar month arithmetic, clamped to the month's last day (Mar 31 - 1 month = Feb 28)."""
    y, m0 = divmod(d.year * 12 + d.month - 1 + n, 12)
    return date(y, m0 + 1, min(d.day, calendar.monthrange(y, m0 + 1)[1]))


def monday(d: date) -> date:
    """The Monday of ``d``'s week."""
    return d - timedelta(days=d.weekday())

"""The temporal intent of a recall query, resolved offline against the time it is asked.

"What did I buy last week?" should search last week's messages; "When did Caroline go to the
support group?" asks for a date, so the answer's timestamp matters more than usual; "What did I
do before the move?" is relative to an event that first has to be found. ``parse_time_intent``
reads all three from the query, stdlib only and deterministic, and ``window_boost`` turns a
window into a ranking factor.

Conventions (``now`` is when the question is asked; a naive datetime is taken as UTC):

- Windows are half-open ``[start, end)`` in UTC and day-aligned unless they end at ``now``: the
  resolver never invents a time of day. today / tonight = now's UTC day; yesterday and "last
  night" = the day before (a message just past midnight is left to ``window_boost``'s slack).
- Weeks run Monday to Sunday. this / last / next week, month, year = the calendar period that
  contains now, the one before, the one after: whole periods, not clipped at now. this / last /
  next weekend = Saturday-Sunday of the current / previous / following calendar week.
- "N days ago" = that day; "N weeks / months / years ago" = the calendar week / month / year
  containing the day N units back (so "a month ago" = "last month"). N: digits, one..twelve,
  a / an, (a) couple of = 2, a few = 2 to 4 (the window then spans all three periods).
- "the past N days / weeks / months / years" (also "the last N ...", "past week") and
  "recently" / "lately" (30 days) are rolling: from midnight N units before today up to now.
- A month or a day named without a year is the most recent one not after now: asked in August
  2023, "in August" is August 2023 and "in September" September 2022. Bare month names and
  years need a preposition ("in May", "since 2022"): "may" is also a verb, a number not always a
  year. early / mid / late: of a month, days 1-10 / 11-20 / 21-end; of a year, Jan-Jun /
  Apr-Sep / Jul-Dec.
- Seasons are meteorological, northern hemisphere: spring = Mar-May, summer = Jun-Aug,
  autumn / fall = Sep-Nov, winter = Dec-Feb, dated by the year its December falls in ("winter
  2022" = Dec 2022-Feb 2023). "last summer" = the latest complete one before now's current
  season; "this summer" = the one containing now, else the one starting in now's year; "next"
  = the first not yet begun; "in the summer" = the latest that has begun.
- Weekdays: "last Friday" = the most recent one strictly before today; "on Friday" = the most
  recent on or before today; "this / next Friday" = in the current / following calendar week.
- Relations: before / prior to / until / till X give "before"; after / since / ever since X
  give "after". X runs to the next punctuation, relation word, wh-word, time expression or
  question inversion ("did I"). When X is itself a time expression the relation becomes a
  window instead: before / until = [1970-01-01, start of X), since = [start of X, now), after
  = [end of X, now); one that starts at or after now stays open to the far future instead of
  being empty. Not relations: a pronoun or idiom as X ("after that", "after all"), a causal
  since ("since I'm vegan"), and a since-clause in a question that asks when ("how long has it
  been since I moved?" asks about the move itself).
- A span before / after a time expression ("the week before 16 November", "two days after
  3 June", "the weekend before 4 October", "the Monday before July 24") is that span next to
  it, with the named period itself: a message is timed by when it was said, and what happened
  the week before a day is most often told on that day. "as of X" = [1970-01-01, end of X).
- A query that dates what it asks about with a calendar date, month, season or year ("on 3
  June 2023", "in May 2022"; not as the object of before / after / since / until, nor a date
  naming a thing, "the May 2025 release"; "as of X" counts, at X's end) is told from the end
  of it when that is before now: its relative expressions are resolved there ("recently,
  as mentioned on 3 June 2023" = the 30 days to 3 June; "last week, on 6 November" = the
  week before 6 November).
- Several expressions in one query give the smallest window covering them all ("between May
  and July 2023"); a relation window narrows that (intersection) unless the two do not
  overlap. Contradicting relation windows ("after 2023 and before 2022") are dropped.
- ``cleaned`` drops each resolved expression with the preposition in front of it, and a whole
  relation clause (its anchor is reported separately, so the caller can find the event and
  filter by its time); it is "" when nothing searchable is left.
- English only: other languages (CJK included) pass through with no window.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone
from typing import Literal

from .._calendar import MONTHS, SEASON_START, add_months, monday

__all__ = ["TimeIntent", "parse_time_intent", "window_boost"]

_UTC = timezone.utc
# Open ends of relation windows: concrete datetimes keep every window comparable and sortable.
_EPOCH = datetime(1970, 1, 1, tzinfo=_UTC)
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=_UTC)
_TICK = timedelta(microseconds=1)

_Window = tuple[datetime, datetime]


@dataclass(frozen=True)
class TimeIntent:
    """What a query says about time. See the module docstring for the conventions."""

    asks_when: bool  # the question asks when / how long ago / what date something happened
    window: tuple[datetime, datetime] | None  # [start, end) in UTC
    relation: Literal["before", "after"] | None  # relative to the event in ``anchor``
    anchor: str | None  # that event's text, without the relation word
    cleaned: str  # the query without its temporal expressions, for text search


@dataclass(frozen=True)
class _Ref:
    now: datetime  # aware, UTC
    today: date  # now's UTC calendar day


@dataclass(frozen=True)
class _Period:
    start: int  # match start: may include a preposition the rule needed ("in May")
    core: int  # where the time expression proper begins
    end: int
    window: _Window
    absolute: bool  # a calendar date, month, season or year: the same whenever asked


# --------------------------------------------------------------------------- vocabulary

# Abbreviations only ever appear next to a number: alone, "mar" and "jan" are not months.
_MON = (
    r"(?P<mon>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_MON_FULL = (
    r"(?P<mon>january|february|march|april|may|june|july|august|september|october"
    r"|november|december)"
)
_YEAR = r"(?P<year>(?:19|20)[0-9]{2})"
# [0-9], not \d: \d also matches other scripts' digits, and other languages are left alone.
_DAY = r"(?P<day>[0-9]{1,2})(?:st|nd|rd|th)?"
_PART = r"(?:(?P<part>early|mid|late)[\s-]+)"
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WD = r"(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_SEASON = r"(?P<season>spring|summer|autumn|fall|winter)"
_COUNT_WORDS: dict[str, tuple[int, int]] = {
    word: (n, n)
    for n, word in enumerate(
        ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
        start=1,
    )
}
_COUNT_WORDS.update(
    {
        "eleven": (11, 11),
        "twelve": (12, 12),
        "a": (1, 1),
        "an": (1, 1),
        "a couple of": (2, 2),
        "couple of": (2, 2),
        "a few": (2, 4),
        "few": (2, 4),
    }
)
_NUM = (
    r"(?P<n>[0-9]{1,3}|(?:a\s+)?couple\s+of|(?:a\s+)?few|an?|one|two|three|four|five|six|seven"
    r"|eight|nine|ten|eleven|twelve)"
)
_UNIT = r"(?P<unit>day|week|fortnight|month|year)s?"
# Prepositions a bare month or year needs before it counts as a time expression.
_PREP = (
    r"(?:in|during|throughout|around|from|of|since|before|after|until|till|prior\s+to"
    r"|ever\s+since)"
)


# --------------------------------------------------------------------------- calendar helpers


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=_UTC)


def _span(first: date, after: date) -> _Window:
    return _midnight(first), _midnight(after)


def _one_day(d: date) -> _Window:
    return _span(d, d + timedelta(days=1))


def _week(start: date) -> _Window:
    return _span(start, start + timedelta(weeks=1))


def _month(year: int, month: int, part: str | None = None) -> _Window:
    first = date(year, month, 1)
    after = add_months(first, 1)
    if part == "early":
        return _span(first, first.replace(day=11))
    if part == "mid":
        return _span(first.replace(day=11), first.replace(day=21))
    if part == "late":
        return _span(first.replace(day=21), after)
    return _span(first, after)


def _year(year: int, part: str | None = None) -> _Window:
    start_month, end_month = {"early": (1, 7), "mid": (4, 10), "late": (7, 13)}.get(
        part or "", (1, 13)
    )
    after = date(year + 1, 1, 1) if end_month == 13 else date(year, end_month, 1)
    return _span(date(year, start_month, 1), after)


def _valid(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _recent_month(today: date, month: int) -> int:
    """The year of the most recent ``month`` that is not after today's month."""
    return today.year if month <= today.month else today.year - 1


def _recent_day(today: date, month: int, day: int) -> date | None:
    """The most recent month/day on or before today; None when no year has it (April 31)."""
    for back in range(9):  # nine years always hold a 29 February
        d = _valid(today.year - back, month, day)
        if d is not None and d <= today:
            return d
    return None


def _season(name: str, year: int) -> tuple[date, date]:
    first = date(year, SEASON_START[name], 1)
    return first, add_months(first, 3)


def _pick_season(today: date, name: str, mode: str) -> _Window:
    spans = [_season(name, y) for y in range(today.year - 2, today.year + 2)]
    if mode == "last":
        # A season that ended by today also ended by the start of the current season.
        first, after = [s for s in spans if s[1] <= today][-1]
    elif mode == "this":
        containing = [s for s in spans if s[0] <= today < s[1]]
        first, after = containing[0] if containing else _season(name, today.year)
    elif mode == "next":
        first, after = next(s for s in spans if s[0] > today)
    else:  # "began": recall looks back, so a bare "in the summer" is the latest one begun
        first, after = [s for s in spans if s[0] <= today][-1]
    return _span(first, after)


def _count(word: str) -> tuple[int, int]:
    return (int(word), int(word)) if word.isdigit() else _COUNT_WORDS[word]


def _unit_back(today: date, n: int, unit: str) -> date:
    if unit == "day":
        return today - timedelta(days=n)
    if unit in ("week", "fortnight"):
        return today - timedelta(weeks=n * (2 if unit == "fortnight" else 1))
    return add_months(today, -n * (12 if unit == "year" else 1))


def _containing(d: date, unit: str) -> _Window:
    """The calendar period of kind ``unit`` that contains ``d``."""
    if unit == "day":
        return _one_day(d)
    if unit in ("week", "fortnight"):
        return _week(monday(d))
    if unit == "month":
        return _month(d.year, d.month)
    return _year(d.year)


# --------------------------------------------------------------------------- rules

_Handler = Callable[[re.Match[str], _Ref], _Window | None]


def _g(m: re.Match[str], name: str) -> str:
    """A group's text, lower-cased with its whitespace collapsed ("" when it did not take part)."""
    return " ".join((m.groupdict().get(name) or "").lower().split())


def _h_iso(m: re.Match[str], ref: _Ref) -> _Window | None:
    d = _valid(int(m["y"]), int(m["m"]), int(m["d"]))
    return None if d is None else _one_day(d)


def _h_iso_month(m: re.Match[str], ref: _Ref) -> _Window | None:
    month = int(m["m"])
    return _month(int(m["y"]), month) if 1 <= month <= 12 else None


def _h_date(m: re.Match[str], ref: _Ref) -> _Window | None:
    month, day, year = MONTHS[_g(m, "mon").rstrip(".")], int(m["day"]), _g(m, "year")
    d = _valid(int(year), month, day) if year else _recent_day(ref.today, month, day)
    return None if d is None else _one_day(d)


def _h_month_year(m: re.Match[str], ref: _Ref) -> _Window | None:
    return _month(int(m["year"]), MONTHS[_g(m, "mon").rstrip(".")], _g(m, "part") or None)


def _h_season_year(m: re.Match[str], ref: _Ref) -> _Window | None:
    return _span(*_season(_g(m, "season"), int(m["year"])))


def _h_year_part(m: re.Match[str], ref: _Ref) -> _Window | None:
    return _year(int(m["year"]), _g(m, "part"))


def _h_days(offset: int) -> _Handler:
    def handler(m: re.Match[str], ref: _Ref) -> _Window | None:
        return _one_day(ref.today + timedelta(days=offset))

    return handler


def _h_ago(m: re.Match[str], ref: _Ref) -> _Window | None:
    lo, hi = _count(_g(m, "n"))
    unit = _g(m, "unit")
    earliest = _containing(_unit_back(ref.today, hi, unit), unit)
    latest = _containing(_unit_back(ref.today, lo, unit), unit)
    return earliest[0], latest[1]


def _h_rolling(m: re.Match[str], ref: _Ref) -> _Window | None:
    n = _count(_g(m, "n"))[1] if _g(m, "n") else 1
    return _midnight(_unit_back(ref.today, n, _g(m, "unit"))), ref.now


def _h_recently(m: re.Match[str], ref: _Ref) -> _Window | None:
    return _midnight(ref.today - timedelta(days=30)), ref.now


def _h_period(m: re.Match[str], ref: _Ref) -> _Window | None:
    step = {"this": 0, "next": 1, "following": 1}.get(_g(m, "q").split()[-1], -1)  # past: -1
    unit, today = _g(m, "unit"), ref.today
    if unit == "weekend":
        saturday = monday(today) + timedelta(days=5 + 7 * step)
        return _span(saturday, saturday + timedelta(days=2))
    if unit == "week":
        return _week(monday(today) + timedelta(weeks=step))
    if unit == "month":
        first = add_months(date(today.year, today.month, 1), step)
        return _month(first.year, first.month)
    return _year(today.year + step)


# A capitalised word after a capitalised season makes it a name: "the Spring Fling Market",
# "Summer Camp" (not "In Summer I ...").
_NAME_GOES_ON = re.compile(r"\s+(?!I\b)[A-Z]")


def _a_name(m: re.Match[str]) -> bool:
    return m["season"][0].isupper() and bool(_NAME_GOES_ON.match(m.string, m.end()))


def _h_season_q(m: re.Match[str], ref: _Ref) -> _Window | None:
    if _a_name(m):
        return None
    q = _g(m, "q")
    mode = q if q in ("this", "next") else "last"  # last, past, previous, this past
    return _pick_season(ref.today, _g(m, "season"), mode)


def _h_season_in(m: re.Match[str], ref: _Ref) -> _Window | None:
    if _a_name(m):
        return None
    return _pick_season(ref.today, _g(m, "season"), "began")


def _h_month_q(m: re.Match[str], ref: _Ref) -> _Window | None:
    month, q, today = MONTHS[_g(m, "mon")], _g(m, "q"), ref.today
    if q == "this":
        year = today.year
    elif q == "next":
        year = today.year if month > today.month else today.year + 1
    else:  # last / this past: strictly before the current month
        year = today.year if month < today.month else today.year - 1
    return _month(year, month)


def _h_month_in(m: re.Match[str], ref: _Ref) -> _Window | None:
    month = MONTHS[_g(m, "mon")]
    return _month(_recent_month(ref.today, month), month, _g(m, "part") or None)


def _h_year_in(m: re.Match[str], ref: _Ref) -> _Window | None:
    return _year(int(m["year"]))


def _h_weekday(m: re.Match[str], ref: _Ref) -> _Window | None:
    wd, q, today = _WEEKDAYS.index(_g(m, "wd")), _g(m, "q"), ref.today
    if q == "on":
        return _one_day(today - timedelta(days=(today.weekday() - wd) % 7))
    if q == "this":
        return _one_day(monday(today) + timedelta(days=wd))
    if q == "next":
        return _one_day(monday(today) + timedelta(days=7 + wd))
    return _one_day(today - timedelta(days=(today.weekday() - wd - 1) % 7 + 1))


_ABSOLUTE = frozenset(
    {_h_iso, _h_iso_month, _h_month_year, _h_season_year, _h_year_part, _h_year_in}
)

_I = re.IGNORECASE
# Most specific first: a later rule never matches inside an earlier rule's match. A group "x"
# marks where the expression proper begins when the rule needs a preposition before it.
_RULES: tuple[tuple[re.Pattern[str], _Handler], ...] = (
    (
        re.compile(
            r"(?<![0-9-])(?P<y>(?:19|20)[0-9]{2})-(?P<m>[0-9]{1,2})-(?P<d>[0-9]{1,2})(?![0-9])"
        ),
        _h_iso,
    ),
    (re.compile(r"(?<![0-9-])(?P<y>(?:19|20)[0-9]{2})-(?P<m>[0-9]{2})(?![0-9-])"), _h_iso_month),
    (re.compile(rf"\b(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MON},?\s+{_YEAR}\b", _I), _h_date),
    (re.compile(rf"\b{_MON}\s+{_DAY},?\s+{_YEAR}\b", _I), _h_date),
    (re.compile(rf"\b(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MON}(?![a-z])", _I), _h_date),
    (re.compile(rf"\b{_MON}\s+{_DAY}\b(?![0-9:])", _I), _h_date),
    (re.compile(rf"\b{_PART}?{_MON},?\s+(?:of\s+)?{_YEAR}\b", _I), _h_month_year),
    (re.compile(rf"\b(?:the\s+)?{_SEASON}\s+(?:of\s+)?{_YEAR}\b", _I), _h_season_year),
    (re.compile(rf"\b{_PART}(?:in\s+)?{_YEAR}\b", _I), _h_year_part),
    (re.compile(r"\bthe\s+day\s+before\s+yesterday\b", _I), _h_days(-2)),
    (re.compile(r"\bthe\s+day\s+after\s+tomorrow\b", _I), _h_days(2)),
    (re.compile(rf"\b{_NUM}\s+{_UNIT}\s+ago\b", _I), _h_ago),
    (
        re.compile(rf"\b(?:(?:the|this)\s+past|the\s+last|last)\s+{_NUM}\s+{_UNIT}\b", _I),
        _h_rolling,
    ),
    # Without a count, "last week" is the calendar week; "the last week" and "past week" roll.
    (re.compile(rf"\b(?:(?:the|this)\s+past|the\s+last)\s+{_UNIT}\b(?!\s+of\b)", _I), _h_rolling),
    (re.compile(r"\b(?:recently|lately)\b", _I), _h_recently),
    (
        re.compile(
            r"\b(?P<q>this\s+past|this|last|next|previous|the\s+previous|the\s+following)"
            r"\s+(?P<unit>weekend|week|month|year)\b(?!\s+of\b)",
            _I,
        ),
        _h_period,
    ),
    (re.compile(r"\b(?:last\s+night|yesterday)\b", _I), _h_days(-1)),
    (
        re.compile(
            r"\b(?:(?:earlier\s+)?today|tonight|this\s+(?:morning|afternoon|evening))\b", _I
        ),
        _h_days(0),
    ),
    (re.compile(r"\btomorrow\b", _I), _h_days(1)),
    (
        re.compile(rf"\b(?P<q>this\s+past|this|last|next|past|previous)\s+{_SEASON}\b", _I),
        _h_season_q,
    ),
    (
        re.compile(rf"\b{_PREP}\s+(?P<x>(?:the\s+)?{_SEASON})\b", _I),
        _h_season_in,
    ),
    (re.compile(rf"\b(?P<q>this\s+past|this|last|next)\s+{_MON_FULL}\b", _I), _h_month_q),
    (
        re.compile(rf"\b{_PREP}\s+(?P<x>{_PART}?{_MON_FULL})\b(?![\s,]*[0-9])", _I),
        _h_month_in,
    ),
    (
        re.compile(
            rf"\b(?:{_PREP}|the\s+year)\s+(?P<x>{_YEAR})\b(?![0-9]|\s*(?:%|[-/.:][0-9]))", _I
        ),
        _h_year_in,
    ),
    (re.compile(rf"\b(?P<q>this\s+past|last|this|next|on)\s+{_WD}\b", _I), _h_weekday),
)

_RELATION = re.compile(
    r"\b(?P<kw>ever\s+since|since|prior\s+to|up\s+until|until|till|before|after|as\s+of)\b", _I
)
# A span right before a relation's time expression ("the week before 16 November", "two days
# after 3 June", "the weekend before 4 October", "the Monday before July 24").
_SPAN_BEFORE_RELATION = re.compile(
    rf"\b(?:{_NUM}\s+{_UNIT}|(?:the|last|that)\s+(?P<one>day|week|fortnight|month|year|weekend)"
    rf"|(?:the|that)\s+{_WD})\s*$",
    _I,
)
# Where a relation's event text ends.
_ANCHOR_STOP = re.compile(
    r"[,;:!?.()\[\]\"]|\s[-–—]\s"
    r"|\b(?:what|where|who|whom|which|how|why|when|ever\s+since|since|prior\s+to|until|till"
    r"|before|after)\b"
    r"|\b(?:did|do|does|was|were|have|has|had|will|would|should|could|can|is|are|am)"
    r"\s+(?:i|you|we|he|she|they|it)\b",
    _I,
)
_TRAILING_CONJUNCTION = re.compile(r"(?:\s+(?:and|or|but|then|so))+\s*$", _I)
# "since I'm vegan" gives a reason, not a time.
_CAUSAL_SINCE = re.compile(
    r"(?:i|you|we|they|he|she|it)(?:['’](?:m|re)\b|\s+(?:am|are|is|do|does|don['’]t"
    r"|doesn['’]t|can|can['’]t|need|want|like|love|know|have\s+to)\b)",
    _I,
)
# An anchor made only of these names no event ("after that", "after all", "before long").
# fmt: off
_EMPTY_ANCHOR_WORDS = frozenset({
    "that", "this", "it", "then", "those", "these", "them", "him", "her", "me", "us", "you",
    "now", "which", "all", "long", "a", "an", "the", "while", "everything", "anything",
    "something",
})
# fmt: on
_ASKS_WHEN = re.compile(
    r"\bwhen(?:['’]s\b|\s+(?:did|was|were|is|are|am|do|does|has|have|had|will|would|should"
    r"|could|can|shall)\b)"
    # A leading "when" asks unless a subordinate clause follows ("When I was in Paris, ...").
    r"|^\W*when\b(?!\s+(?:i|we|you|he|she|they|it|my|our|your|his|her|their|the|a|an)\b)"
    r"|\bhow\s+long\s+(?:ago|has\s+it\s+been|had\s+it\s+been|is\s+it|since)\b"
    r"|\bhow\s+many\s+(?:days|weeks|months|years|hours)\s+(?:ago|since|before|after|until"
    r"|have\s+passed|has\s+it\s+been|had\s+passed|was\s+it|is\s+it)\b"
    r"|\b(?:what|which)\s+(?:date|day|year|month|week|time|season|decade)\b"
    r"|\b(?:since|until)\s+when\b|\bat\s+what\s+point\b",
    _I,
)
# Prepositions that go with a removed expression, so "in" does not dangle in ``cleaned``.
_LEAD_PREP = re.compile(
    r"\b(?:back\s+(?:in\s+)?|(?:in|on|during|over|within|throughout|around|from|of|between)\s+)$",
    _I,
)
_POSSESSIVE = re.compile(r"['’]s\b")
# A preposition that makes the date after it the time of what is asked ("on 3 June").
_WHEN = re.compile(r"\b(?:on|in|during|around)\s+$", _I)
# What is left between two removed expressions of a range ("between May and July").
_RANGE_JOIN = re.compile(r"\s*(?:and|or|to|through|-|–)\s*", _I)


# --------------------------------------------------------------------------- parsing


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=_UTC) if ts.tzinfo is None else ts.astimezone(_UTC)


def _find_periods(text: str, ref: _Ref) -> list[_Period]:
    found: list[_Period] = []
    for pattern, handler in _RULES:
        for m in pattern.finditer(text):
            if any(m.start() < p.end and p.start < m.end() for p in found):
                continue
            try:
                window = handler(m, ref)
            except (OverflowError, ValueError):
                continue  # "last year" asked in year 1: no such period; the words stay
            if window is None:
                continue
            core = m.start("x") if "x" in pattern.groupindex else m.start()
            absolute = handler in _ABSOLUTE or (handler is _h_date and bool(_g(m, "year")))
            found.append(_Period(m.start(), core, m.end(), window, absolute))
    return sorted(found, key=lambda p: p.start)


def _relation_window(keyword: str, window: _Window, now: datetime) -> _Window:
    start, end = window
    if keyword == "as of":  # the state at the end of the period: everything up to it
        return _EPOCH, end
    if keyword.endswith(("before", "to", "until", "till")):
        return _EPOCH, start
    begin = start if keyword.endswith("since") else end
    return begin, now if begin < now else _FAR_FUTURE


def _beside(span: re.Match[str], keyword: str, window: _Window) -> _Window:
    """The window of ``span`` ("the week", "two days", "the weekend", "the Monday") right
    before or after the named period ``window``, with that period itself: a message is
    timed by when it was said, and what happened the week before a day is most often told
    on that day ("last week I was in Paris"), what is planned for the Saturday after it on
    that day too."""
    first, after = window[0].date(), window[1].date()
    before = keyword != "after"
    day = first if before else after - timedelta(days=1)
    if span["wd"] or _g(span, "one") == "weekend":
        target = _WEEKDAYS.index(_g(span, "wd")) if span["wd"] else 5  # the weekend: Saturday
        gap = ((day.weekday() - target) if before else (target - day.weekday())) % 7 or 7
        if not span["wd"] and before and gap < 2:
            gap += 7  # a Saturday or Sunday: the weekend before the one it is in
        edge = day - timedelta(days=gap) if before else day + timedelta(days=gap)
        length = 1 if span["wd"] else 2
        return (
            (_midnight(edge), window[1])
            if before
            else (window[0], _midnight(edge + timedelta(days=length)))
        )
    n = _count(_g(span, "n"))[1] if span["n"] else 1
    unit = _g(span, "unit") or _g(span, "one")
    if before:
        return _midnight(_unit_back(first, n, unit)), window[1]
    return window[0], _midnight(_unit_back(after, -n, unit))


def _anchor_end(text: str, begin: int, periods: list[_Period]) -> int:
    stop = _ANCHOR_STOP.search(text, begin)
    end = stop.start() if stop else len(text)
    for p in periods:
        # A period right at the start belongs to the anchor: it only gets here when it is a
        # possessive ("before last summer's trip").
        if begin < p.start < end:
            end = p.start
    return end


def _is_empty_anchor(anchor: str) -> bool:
    words = re.findall(r"[a-z']+", anchor.lower())
    return all(w in _EMPTY_ANCHOR_WORDS for w in words)


def _intersect(a: _Window, b: _Window) -> _Window | None:
    start, end = max(a[0], b[0]), min(a[1], b[1])
    return (start, end) if start < end else None


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    pieces: list[str] = []
    pos = 0
    for start, end in sorted(spans):
        if start > pos and not (pos > 0 and _RANGE_JOIN.fullmatch(text, pos, start)):
            pieces.append(text[pos:start])
        pos = max(pos, end)
    pieces.append(text[pos:])
    out = " ".join(" ".join(pieces).split())
    out = re.sub(r"\s+([,.;:!?])", r"\1", out)
    out = re.sub(r"[,;:]+(?=[.!?]|$)", "", out)  # "What did I buy, ?" -> "What did I buy?"
    out = out.strip(" ,;:")
    return out if re.search(r"\w", out) else ""


def parse_time_intent(query: str, now: datetime) -> TimeIntent:
    """Read the temporal intent of ``query`` asked at ``now``.

    Pure and deterministic; never raises on odd input (what it cannot resolve it leaves in
    ``cleaned``). See the module docstring for the conventions.
    """
    now = _utc(now)
    ref = _Ref(now, now.date())
    asks_when = bool(_ASKS_WHEN.search(query))
    periods = _find_periods(query, ref)

    consumed: set[int] = set()  # periods that became the object of a relation
    as_of: datetime | None = None  # the end of an "as of" period
    relation_windows: list[_Window] = []
    relation: Literal["before", "after"] | None = None
    anchor: str | None = None
    cuts: list[tuple[int, int]] = []

    for m in _RELATION.finditer(query):
        if any(p.core <= m.start() < p.end for p in periods):
            continue  # "the day before yesterday"
        keyword = " ".join(m["kw"].lower().split())
        begin = len(query) - len(query[m.end() :].lstrip())  # where the event text starts
        target = next(
            (i for i, p in enumerate(periods) if p.start <= begin <= p.core and begin < p.end),
            None,
        )
        if target is not None and not _POSSESSIVE.match(query, periods[target].end):
            consumed.add(target)
            span = _SPAN_BEFORE_RELATION.search(query, 0, m.start())
            if span is not None and keyword in ("before", "after", "prior to"):
                relation_windows.append(_beside(span, keyword, periods[target].window))
                # "last weekend before April 10": the span's own words are no period of now
                consumed.update(
                    i for i, p in enumerate(periods) if span.start() <= p.start < m.start()
                )
                lead = _LEAD_PREP.search(query, 0, span.start())
                cuts.append((span.start() if lead is None else lead.start(), periods[target].end))
            else:
                relation_windows.append(_relation_window(keyword, periods[target].window, now))
                cuts.append((m.start(), periods[target].end))
            if keyword == "as of":
                as_of = periods[target].window[1]
            continue
        if relation is not None or keyword == "as of":
            continue  # one event per query: later relations stay in the text
        if keyword.endswith("since") and (asks_when or _CAUSAL_SINCE.match(query, begin)):
            continue
        end = _anchor_end(query, begin, periods)
        text = _TRAILING_CONJUNCTION.sub("", query[begin:end]).strip()
        if not text or _is_empty_anchor(text):
            continue
        relation = "after" if keyword.endswith(("after", "since")) else "before"
        anchor = text
        cuts.append((m.start(), end))  # with a trailing "and", which would dangle otherwise
        # A period inside the anchor dates the event, not the answer ("last summer's trip").
        consumed.update(i for i, p in enumerate(periods) if begin <= p.start < end)

    # A query that dates what it asks about tells its story from that date: "recently, as
    # mentioned on 3 June 2023" and "last week, on November 6" are relative to it, not to
    # now. Only a date said as when ("on 3 June", "in May 2022"): one that names a thing
    # ("yesterday, about the May 2025 release") leaves the query where it is.
    told = [
        p.window[1]
        for i, p in enumerate(periods)
        if p.absolute
        and i not in consumed
        and (p.core > p.start or _WHEN.search(query, 0, p.start))
    ]
    told += [as_of] if as_of is not None else []
    relative = any(not p.absolute and i not in consumed for i, p in enumerate(periods))
    if told and max(told) < now and relative:  # else nothing to resolve again
        then = max(told)
        again = {
            (p.start, p.end): p.window
            for p in _find_periods(query, _Ref(then, (then - _TICK).date()))
        }
        periods = [
            p if p.absolute else replace(p, window=again.get((p.start, p.end), p.window))
            for p in periods
        ]

    named: list[_Window] = []
    for i, p in enumerate(periods):
        if i in consumed:
            continue
        named.append(p.window)
        start, end = p.start, p.end
        if _POSSESSIVE.match(query, end):
            end += 2  # "last year's trip": the trip stays, the "'s" goes
        else:
            lead = _LEAD_PREP.search(query, 0, start)
            if lead is not None:
                start = lead.start()
        cuts.append((start, end))

    window: _Window | None = None
    if named:
        window = min(w[0] for w in named), max(w[1] for w in named)
    if relation_windows:
        bounded: _Window | None = relation_windows[0]
        for w in relation_windows[1:]:
            bounded = _intersect(bounded, w) if bounded else None
        if bounded is not None:
            narrowed = _intersect(window, bounded) if window else bounded
            window = narrowed or window

    cleaned = _cut(query, cuts) if cuts else query
    return TimeIntent(asks_when, window, relation, anchor, cleaned)


def window_boost(
    ts: datetime | None, window: tuple[datetime, datetime] | None, *, slack_days: float = 3.0
) -> float:
    """How well a timestamp fits a window: 1.0 inside, ``exp(-d / slack_days)`` outside.

    ``d`` is the distance in days to the nearest edge, so the factor is continuous at the edges
    and a message one slack outside still keeps 37 %: time expressions are fuzzy ("last week"
    may well mean last Sunday evening in another timezone). A window with no timestamp to
    compare scores 0.0; no window at all is neutral (1.0). ``slack_days <= 0`` makes it a hard
    filter. Naive datetimes are taken as UTC.
    """
    if window is None:
        return 1.0
    if ts is None:
        return 0.0
    ts, start, end = _utc(ts), _utc(window[0]), _utc(window[1])
    if start <= ts < end:
        return 1.0
    if slack_days <= 0:
        return 0.0
    gap = start - ts if ts < start else ts - end
    return math.exp(-(gap.total_seconds() / 86400.0) / slack_days)

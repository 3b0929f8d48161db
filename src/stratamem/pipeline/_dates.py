"""Resolve the time expressions of a message against the message's own timestamp.

A fact like "I fly to Tokyo next Wednesday" is only true relative to when it was said, so the
offline extractor rewrites it as "I fly to Tokyo next Wednesday (2026-05-06)" and records the
date: read a year later it still says the right thing. Stdlib only and deterministic, so the
same message always yields the same fact.

Rules (``ref`` is the reference's UTC calendar date; weeks run Monday to Sunday):

- today / tonight / this morning|afternoon|evening = ref; yesterday = ref - 1; tomorrow =
  ref + 1; the day before yesterday = ref - 2; the day after tomorrow = ref + 2.
- ``this <weekday>`` and a bare weekday ("on Friday"): the nearest such day on or after ref
  (today counts); when the clause is past tense, the nearest one on or before ref.
  ``coming <weekday>``: the first one strictly after ref. ``next <weekday>``: that weekday in
  the *following* Monday-Sunday week (on Monday 2026-04-27, "next Wednesday" is 2026-05-06,
  while "this Wednesday" is 2026-04-29). ``last <weekday>``: the most recent one strictly
  before ref. Chinese 下周X / 上周X / 这周X follow the calendar-week meaning they have in
  Chinese; a bare 周X follows the bare-weekday rule.
- this / next / last week, month, year: the calendar period containing ref, the one after,
  the one before (a week is dated by its Monday). this / next / last weekend: Saturday-Sunday
  of the current / following / previous calendar week.
- in N days/weeks/months/years, N ... from now, N ... ago: calendar arithmetic on ref; month
  arithmetic clamps to the month's last day (2024-01-31 + 1 month = 2024-02-29).
- Explicit dates: 2026-05-14, May 14 [2026], 14 May [2026], the 14th of May, 2026年5月14日,
  5月14日. Without a year: the first such date on or after ref, or on or before ref when the
  clause is past tense. "on the 14th": the next 14th (or the last one, past tense).
- Months: "in October" = the first October on or after ref's month, or the last one on or
  before it when the clause is past tense ("went ... in October"); "next October" / "last
  October" are strictly after / before ref's month.
- Seasons are meteorological, northern hemisphere: spring = Mar-May, summer = Jun-Aug,
  autumn/fall = Sep-Nov, winter = Dec-Feb (dated by the year its December falls in).
  "this summer" = the one containing ref, else the one starting in ref's year; "last" /
  "next" = the latest that has ended / the earliest not yet begun; "in (the) summer" follows
  the past/future rule.
- A clause counts as past tense when it has past cues (went, was, visited, ... "ago", a
  pronoun followed by an -ed verb, Chinese 了/过/已经) and no future cues (will, going to,
  plan, want to, ...). "moved/postponed/rescheduled ... to <date>" is always future.
- "since / from / starting <date>" sets ``valid_from``; "until / till <date>" sets
  ``valid_to`` to the start of that date or period; "through <date>" to the day after it.
  "from X to Y" makes Y the end. Chinese 从/自从 ... (以来/开始) and 直到 ... (为止) likewise.
- Otherwise the first expression gives ``occurred_at``; when it lies after ref (a plan), it
  also gives ``valid_from``.

All datetimes returned are midnight UTC of the resolved day (day granularity): the resolver
never invents a time of day. Expressions that needed ``reference`` are annotated in
``resolved_text``; fully explicit ones ("2026-05-14", "14 May 2026", "since 2019") are left as
written. Text already annotated (a resolved text resolved again) is not annotated twice.
Not handled: numeric day/month forms like 5/14 (ambiguous between locales), clock times,
durations ("for two weeks"), holidays, other languages.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone

from .._calendar import MONTHS, SEASON_START, add_months, monday

__all__ = ["DateMention", "DateSpan", "resolve_dates"]


@dataclass(frozen=True)
class DateMention:
    """One time expression found in the text and what it resolved to."""

    text: str  # the expression as written
    start: int
    end: int
    first: date  # first day the expression covers
    last: date  # last day it covers (inclusive)
    granularity: str  # day | week | weekend | month | season | year
    relative: bool  # needed the reference to resolve, so it is annotated
    role: str = "at"  # at | since | until | through


@dataclass(frozen=True)
class DateSpan:
    """The dates a text states, and the text with its relative dates made absolute."""

    occurred_at: datetime | None
    valid_from: datetime | None
    valid_to: datetime | None
    resolved_text: str
    mentions: tuple[DateMention, ...] = ()


# --------------------------------------------------------------------------- vocabulary

_MON = (
    r"(?P<mon>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
# Month names alone (no day number) are only taken in full: "to Jan" is more often a person.
_MON_FULL = (
    r"(?P<mon>january|february|march|april|may|june|july|august|september|october"
    r"|november|december)"
)
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WD = r"(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_YEAR = r"(?P<year>(?:19|20)\d{2})"
_NUM_WORDS = {
    word: number
    for number, word in enumerate(
        ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
        start=1,
    )
}
_NUM_WORDS.update({"eleven": 11, "twelve": 12, "a": 1, "an": 1, "couple of": 2, "a couple of": 2})
_NUM = (
    r"(?P<n>\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
    r"|(?:a\s+)?couple\s+of)"
)
_UNIT = r"(?P<unit>day|week|fortnight|month|year)s?"
_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7}
_ZH_DIGITS.update({"八": 8, "九": 9})
_ZH_WD = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}

# Clause boundaries for deciding the tense around an expression.
_CLAUSE_BREAK = re.compile(
    r"[,;:!?.，。！？；：\n]|\b(?:and|but|because|so|while|although|though|whereas|however)\b",
    re.IGNORECASE,
)
_PAST_CUES = re.compile(
    r"\b(?:was|were|had|did|went|visited|finished|completed|came|saw|met|bought|got|ate|ran"
    r"|flew|left|spent|took|made|told|said|tried|moved|started|attended|arrived|returned"
    r"|ago|yesterday|previously|used\s+to)\b"
    r"|\b(?:i|we|he|she|they|you|it)\s+(?:just\s+|already\s+|also\s+|finally\s+)?"
    r"[a-z]+(?<!e)ed\b"  # "I moved", "we visited" (but not "I need")
    r"|\b(?:have|has|'ve|’ve)\s+been\b"
    r"|(?<!为)了(?!解)|(?<!不)过(?!敏)|已经|昨",
    re.IGNORECASE,
)
_FUTURE_CUES = re.compile(
    r"\b(?:will|shall|going\s+to|gonna|plan|plans|planning|want\s+to|wants\s+to"
    r"|would\s+like|hope\s+to|hoping\s+to|intend|intends|upcoming|tomorrow|soon)\b"
    r"|['’]ll\b"
    r"|要|会(?!议)|将|打算|计划|准备|想|明天|以后",
    re.IGNORECASE,
)
# "the trip moved to November" reschedules into the future although "moved" is past tense.
_RESCHEDULED = re.compile(
    r"\b(?:moved|postponed|rescheduled|pushed|delayed|changed|shifted|bumped)\b"
    r"(?:\s+\w+){0,3}\s+(?:to|until|till|into)\s+$"
    r"|(?:推迟|改|提前|延期)(?:到|至)$",
    re.IGNORECASE,
)
_ROLE_SINCE_BEFORE = re.compile(
    r"(?:\b(?:since|from|starting(?:\s+(?:from|on|in))?|as\s+of|beginning)\s+"
    r"(?:(?:early|mid|late)[\s-]+)?|(?:从|自从|自打|自))$",
    re.IGNORECASE,
)
_SINCE_WORD = re.compile(r"(?:\bsince\s+(?:(?:early|mid|late)[\s-]+)?|自从|自打)$", re.IGNORECASE)
_ROLE_UNTIL_BEFORE = re.compile(
    r"(?:\b(?:until|till|til|up\s+until|up\s+to)\s+(?:(?:early|mid|late)[\s-]+)?|(?:直到|截至))$",
    re.IGNORECASE,
)
_ROLE_THROUGH_BEFORE = re.compile(r"\b(?:through|thru)\s+$", re.IGNORECASE)
_ROLE_SINCE_AFTER = re.compile(r"^\s*(?:以来|开始|起)")
_ROLE_UNTIL_AFTER = re.compile(r"^\s*为止")
_RANGE_JOIN = re.compile(r"\s*(?:to|until|till|-|–|—|到|至)\s*", re.IGNORECASE)
_ANNOTATION = re.compile(r"\s?\((?:week of )?\d{4}(?:-\d{2}){0,2}(?: to \d{4}(?:-\d{2}){0,2})?\)")
_EVERY_BEFORE = re.compile(r"(?:\b(?:every|each)\s+|每)$", re.IGNORECASE)
# Words that may follow "on the 14th" when it is a date ("on the 3rd floor" is not).
_DOM_FOLLOW_OK = re.compile(
    r"^(?:\s*$|\s*[^\w\s]|\s+(?:at|and|or|so|but|because|for|then|too|as|when|if|i|we|in"
    r"|with|to|of\s+(?:this|next|the)\s+month)\b)",
    re.IGNORECASE,
)
_NOT_A_YEAR_AFTER = re.compile(
    r"^(?:\s*%|[-/.]\d|\s*(?:euros?|eur|dollars?|usd|\$|km|kilomet(?:er|re)s?|miles?|met(?:er|re)s?"
    r"|steps|people|words|calories|kcal|m|k)\b)",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------- date helpers


def _month_last(d: date) -> date:
    return date(d.year, d.month, calendar.monthrange(d.year, d.month)[1])


def _valid(y: int, m: int, d: int) -> date | None:
    try:
        return date(y, m, d)
    except ValueError:
        return None


def _shift(ref: date, n: int, unit: str) -> date:
    if unit == "day":
        return ref + timedelta(days=n)
    if unit == "week":
        return ref + timedelta(weeks=n)
    if unit == "fortnight":
        return ref + timedelta(weeks=2 * n)
    if unit == "month":
        return add_months(ref, n)
    return add_months(ref, 12 * n)  # year


def _month_dir(ref: date, month: int, direction: str | None, *, strict: bool = False) -> date:
    """First day of the month ``month`` nearest to ref in ``direction`` (None = future)."""
    if direction == "past":
        same = month < ref.month if strict else month <= ref.month
        return date(ref.year if same else ref.year - 1, month, 1)
    same = month > ref.month if strict else month >= ref.month
    return date(ref.year if same else ref.year + 1, month, 1)


def _day_dir(ref: date, month: int, day: int, direction: str | None) -> date | None:
    """The date month/day nearest to ref in ``direction``; None if it never exists."""
    step = -1 if direction == "past" else 1
    for k in range(9):  # 9 years always contain a 29 February
        d = _valid(ref.year + k * step, month, day)
        if d is not None and (d <= ref if step < 0 else d >= ref):
            return d
    return None


def _dom_dir(ref: date, day: int, direction: str | None) -> date | None:
    """The next (or, past tense, the last) date whose day of month is ``day``."""
    step = -1 if direction == "past" else 1
    first = date(ref.year, ref.month, 1)
    for k in range(13):
        m = add_months(first, k * step)
        d = _valid(m.year, m.month, day)
        if d is not None and (d <= ref if step < 0 else d >= ref):
            return d
    return None


def _weekday_dir(ref: date, wd: int, direction: str | None) -> date:
    if direction == "past":
        return ref - timedelta(days=(ref.weekday() - wd) % 7)
    return ref + timedelta(days=(wd - ref.weekday()) % 7)


def _season(name: str, start_year: int) -> tuple[date, date]:
    first = date(start_year, SEASON_START[name], 1)
    return first, _month_last(add_months(first, 2))


def _season_pick(ref: date, name: str, mode: str) -> tuple[date, date]:
    spans = [_season(name, y) for y in range(ref.year - 2, ref.year + 3)]
    containing = [s for s in spans if s[0] <= ref <= s[1]]
    if mode == "this":
        if containing:
            return containing[0]
        return next(s for s in spans if s[0].year == ref.year)
    if mode == "last":
        return [s for s in spans if s[1] < ref][-1]
    if mode == "next":
        return next(s for s in spans if s[0] > ref)
    if mode == "past":  # "in the summer", past tense: the latest one that has begun
        return [s for s in spans if s[0] <= ref][-1]
    return next(s for s in spans if s[1] >= ref)  # future / unspecified


def _zh_number(s: str) -> int | None:
    """Chinese numerals up to 99 (一, 十二, 二十五, 两) or ASCII digits."""
    if s.isdigit():
        return int(s)
    if "十" in s:
        tens, _, units = s.partition("十")
        t = _ZH_DIGITS.get(tens) if tens else 1
        u = _ZH_DIGITS.get(units) if units else 0
        return None if t is None or u is None else t * 10 + u
    if len(s) == 1:
        return _ZH_DIGITS.get(s)
    return None


# --------------------------------------------------------------------------- rules

# A handler returns (first day, last day, granularity, relative) or None to skip the match.
_Resolved = tuple[date, date, str, bool]


@dataclass
class _Ctx:
    text: str
    ref: date
    m: re.Match[str]
    start: int  # span of the expression proper (without a leading preposition)
    end: int
    role: str

    def direction(self) -> str | None:
        # "since March" looks back; "from March" may equally look forward.
        if self.role == "since" and _SINCE_WORD.search(self.text, 0, self.start):
            return "past"
        if self.role in ("until", "through"):
            return "future"
        return _clause_tense(self.text, self.start, self.end)

    def g(self, name: str) -> str | None:
        return self.m.groupdict().get(name)


def _clause_tense(text: str, start: int, end: int) -> str | None:
    cs = 0
    for b in _CLAUSE_BREAK.finditer(text, 0, start):
        cs = b.end()
    nxt = _CLAUSE_BREAK.search(text, end)
    ce = nxt.start() if nxt else len(text)
    before = text[cs:start]
    if _RESCHEDULED.search(before):
        return "future"
    clause = before + " " + text[end:ce]
    if _FUTURE_CUES.search(clause):
        return "future"
    if _PAST_CUES.search(clause):
        return "past"
    return None


def _day(d: date | None, relative: bool = True) -> _Resolved | None:
    return None if d is None else (d, d, "day", relative)


def _month_span(d: date, relative: bool) -> _Resolved:
    return d, _month_last(d), "month", relative


def _year_span(y: int, relative: bool) -> _Resolved:
    return date(y, 1, 1), date(y, 12, 31), "year", relative


def _week_span(monday: date) -> _Resolved:
    return monday, monday + timedelta(days=6), "week", True


def _weekend_span(saturday: date) -> _Resolved:
    return saturday, saturday + timedelta(days=1), "weekend", True


def _lower_may(c: _Ctx) -> bool:
    # "may" in lower case is the verb; only "May" is the month.
    mon = c.g("mon")
    return mon is not None and mon.lower() in ("may", "march") and mon[0].islower()


def _h_iso(c: _Ctx) -> _Resolved | None:
    return _day(_valid(int(c.g("y") or 0), int(c.g("m") or 0), int(c.g("d") or 0)), False)


def _h_month_day(c: _Ctx) -> _Resolved | None:
    mon = c.g("mon") or ""
    if mon == "may":  # "I may 2 ..." is the verb
        return None
    month, day = MONTHS[mon.lower()], int(c.g("day") or 0)
    year = c.g("year")
    if year:
        return _day(_valid(int(year), month, day), False)
    return _day(_day_dir(c.ref, month, day, c.direction()))


def _h_month_year(c: _Ctx) -> _Resolved | None:
    if _lower_may(c):
        return None
    return _month_span(date(int(c.g("year") or 0), MONTHS[(c.g("mon") or "").lower()], 1), False)


def _h_zh_ymd(c: _Ctx) -> _Resolved | None:
    return _day(_valid(int(c.g("y") or 0), int(c.g("m") or 0), int(c.g("d") or 0)), False)


def _h_zh_md(c: _Ctx) -> _Resolved | None:
    month, day = int(c.g("m") or 0), int(c.g("d") or 0)
    if not 1 <= month <= 12:
        return None
    return _day(_day_dir(c.ref, month, day, c.direction()))


def _h_zh_ym(c: _Ctx) -> _Resolved | None:
    month = int(c.g("m") or 0)
    if not 1 <= month <= 12:
        return None
    return _month_span(date(int(c.g("y") or 0), month, 1), False)


def _h_zh_month(c: _Ctx) -> _Resolved | None:
    month = _zh_number(c.g("m") or "")
    if month is None or not 1 <= month <= 12:
        return None
    return _month_span(_month_dir(c.ref, month, c.direction()), True)


def _h_zh_year_abs(c: _Ctx) -> _Resolved | None:
    return _year_span(int(c.g("y") or 0), False)


def _h_offset_days(n: int) -> Callable[[_Ctx], _Resolved | None]:
    def handler(c: _Ctx) -> _Resolved | None:
        return _day(c.ref + timedelta(days=n))

    return handler


def _count(c: _Ctx) -> int:
    raw = " ".join((c.g("n") or "").lower().split())
    return int(raw) if raw.isdigit() else _NUM_WORDS[raw]


def _h_ago(c: _Ctx) -> _Resolved | None:
    return _day(_shift(c.ref, -_count(c), (c.g("unit") or "").lower()))


def _h_in(c: _Ctx) -> _Resolved | None:
    return _day(_shift(c.ref, _count(c), (c.g("unit") or "").lower()))


def _qualifier(c: _Ctx) -> str:
    q = " ".join((c.g("q") or "this").lower().split())
    q = q.removeprefix("the ")
    return {"previous": "last", "following": "coming", "this coming": "coming"}.get(q, q)


def _h_period(c: _Ctx) -> _Resolved | None:
    q, unit, ref = _qualifier(c), (c.g("unit") or "").lower(), c.ref
    k = {"this": 0, "next": 1, "coming": 1, "last": -1}[q]
    if unit == "week":
        return _week_span(monday(ref) + timedelta(weeks=k))
    if unit == "weekend":
        return _weekend_span(monday(ref) + timedelta(days=5 + 7 * k))
    if unit == "month":
        return _month_span(add_months(date(ref.year, ref.month, 1), k), True)
    return _year_span(ref.year + k, True)


def _h_the_weekend(c: _Ctx) -> _Resolved | None:
    # "over the weekend": the current week's weekend, or (past tense, said on a weekday)
    # the one just gone.
    start = monday(c.ref)
    if c.direction() == "past" and c.ref.weekday() < 5:
        start -= timedelta(weeks=1)
    return _weekend_span(start + timedelta(days=5))


def _h_weekday_q(c: _Ctx) -> _Resolved | None:
    q, wd, ref = _qualifier(c), _WEEKDAYS.index((c.g("wd") or "").lower()), c.ref
    if q == "next":
        return _day(monday(ref) + timedelta(days=7 + wd))
    if q == "last":
        return _day(ref - timedelta(days=(ref.weekday() - wd - 1) % 7 + 1))
    if q == "coming":
        return _day(ref + timedelta(days=(wd - ref.weekday() - 1) % 7 + 1))
    return _day(_weekday_dir(ref, wd, c.direction()))


def _h_weekday(c: _Ctx) -> _Resolved | None:
    if _EVERY_BEFORE.search(c.text, 0, c.start):
        return None  # "every Monday" is a habit, not a date
    wd = _WEEKDAYS.index((c.g("wd") or "").lower())
    return _day(_weekday_dir(c.ref, wd, c.direction()))


def _h_season_year(c: _Ctx) -> _Resolved | None:
    first, last = _season((c.g("s") or "").lower(), int(c.g("year") or 0))
    return first, last, "season", False


def _h_season_q(c: _Ctx) -> _Resolved | None:
    first, last = _season_pick(
        c.ref, (c.g("s") or "").lower(), _qualifier(c).replace("coming", "next")
    )
    return first, last, "season", True


def _h_season_in(c: _Ctx) -> _Resolved | None:
    first, last = _season_pick(c.ref, (c.g("s") or "").lower(), c.direction() or "future")
    return first, last, "season", True


def _h_month_q(c: _Ctx) -> _Resolved | None:
    if _lower_may(c):
        return None
    month, q = MONTHS[(c.g("mon") or "").lower()], _qualifier(c)
    if q in ("next", "coming"):
        return _month_span(_month_dir(c.ref, month, "future", strict=True), True)
    if q == "last":
        return _month_span(_month_dir(c.ref, month, "past", strict=True), True)
    return _month_span(_month_dir(c.ref, month, c.direction()), True)


def _h_month_in(c: _Ctx) -> _Resolved | None:
    if _lower_may(c):
        return None
    month = MONTHS[(c.g("mon") or "").lower()]
    return _month_span(_month_dir(c.ref, month, c.direction()), True)


def _h_year_in(c: _Ctx) -> _Resolved | None:
    if _NOT_A_YEAR_AFTER.search(c.text[c.m.end() :]):
        return None
    return _year_span(int(c.g("x") or 0), False)


def _h_dom(c: _Ctx) -> _Resolved | None:
    if not _DOM_FOLLOW_OK.search(c.text[c.m.end() :]):
        return None
    day = int(c.g("day") or 0)
    if not 1 <= day <= 31:
        return None
    return _day(_dom_dir(c.ref, day, c.direction()))


def _h_zh_ago(c: _Ctx) -> _Resolved | None:
    n = _zh_number(c.g("n") or "")
    if n is None:
        return None
    unit = _ZH_UNITS[c.g("unit") or "天"]
    sign = 1 if (c.g("dir") or "").endswith("后") else -1
    return _day(_shift(c.ref, sign * n, unit))


_ZH_UNITS = {"天": "day", "日": "day", "周": "week", "星期": "week", "个星期": "week"}
_ZH_UNITS.update({"礼拜": "week", "个礼拜": "week", "个月": "month", "年": "year"})
_ZH_WEEK_SHIFT = {"下下": 2, "下": 1, "上": -1, "这": 0, "本": 0}


def _h_zh_weekday(c: _Ctx) -> _Resolved | None:
    if _EVERY_BEFORE.search(c.text, 0, c.start):
        return None
    wd = _ZH_WD[c.g("wd") or "一"]
    q = c.g("q")
    if q is None:
        return _day(_weekday_dir(c.ref, wd, c.direction()))
    return _day(monday(c.ref) + timedelta(days=7 * _ZH_WEEK_SHIFT[q] + wd))


def _h_zh_weekend(c: _Ctx) -> _Resolved | None:
    k = _ZH_WEEK_SHIFT.get(c.g("q") or "这", 0)
    return _weekend_span(monday(c.ref) + timedelta(days=5 + 7 * k))


def _h_zh_week(c: _Ctx) -> _Resolved | None:
    return _week_span(monday(c.ref) + timedelta(weeks=_ZH_WEEK_SHIFT[c.g("q") or "这"]))


def _h_zh_month_rel(c: _Ctx) -> _Resolved | None:
    k = _ZH_WEEK_SHIFT[c.g("q") or "这"]
    return _month_span(add_months(date(c.ref.year, c.ref.month, 1), k), True)


_ZH_YEARS = {"今年": 0, "去年": -1, "明年": 1, "前年": -2, "后年": 2}
_ZH_DAYS = {"大前天": -3, "大后天": 3, "前天": -2, "后天": 2}
_ZH_DAYS.update(dict.fromkeys(("今天", "今日", "今晚", "今早"), 0))
_ZH_DAYS.update(dict.fromkeys(("昨天", "昨日", "昨晚"), -1))
_ZH_DAYS.update(dict.fromkeys(("明天", "明日", "明晚", "明早"), 1))


def _h_zh_year_rel(c: _Ctx) -> _Resolved | None:
    return _year_span(c.ref.year + _ZH_YEARS[c.m.group("w")], True)


def _h_zh_day(c: _Ctx) -> _Resolved | None:
    return _day(c.ref + timedelta(days=_ZH_DAYS[c.m.group("w")]))


_I = re.IGNORECASE
# Most specific first: a later rule never matches inside an earlier rule's match.
_RULES: tuple[tuple[re.Pattern[str], Callable[[_Ctx], _Resolved | None]], ...] = (
    (re.compile(r"\b(?P<y>(?:19|20)\d{2})[-/.](?P<m>\d{1,2})[-/.](?P<d>\d{1,2})\b"), _h_iso),
    (
        re.compile(
            rf"\b{_MON}\.?\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+{_YEAR}\b)?(?!:\d)", _I
        ),
        _h_month_day,
    ),
    (
        re.compile(
            rf"\b(?:the\s+)?(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MON}\b\.?"
            rf"(?:,?\s+{_YEAR}\b)?",
            _I,
        ),
        _h_month_day,
    ),
    (re.compile(rf"\b{_MON}\.?,?\s+(?:of\s+)?{_YEAR}\b", _I), _h_month_year),
    (re.compile(r"(?P<y>\d{4})\s*年\s*(?P<m>\d{1,2})\s*月\s*(?P<d>\d{1,2})\s*[日号]"), _h_zh_ymd),
    (re.compile(r"(?<![\d年])(?P<m>\d{1,2})\s*月\s*(?P<d>\d{1,2})\s*[日号]"), _h_zh_md),
    (re.compile(r"(?P<y>\d{4})\s*年\s*(?P<m>\d{1,2})\s*月(?!\s*\d)"), _h_zh_ym),
    (re.compile(r"\bthe\s+day\s+before\s+yesterday\b", _I), _h_offset_days(-2)),
    (re.compile(r"\bthe\s+day\s+after\s+tomorrow\b", _I), _h_offset_days(2)),
    (re.compile(rf"\b{_NUM}\s+{_UNIT}\s+ago\b", _I), _h_ago),
    (re.compile(rf"\b{_NUM}\s+{_UNIT}\s+from\s+(?:now|today)\b", _I), _h_in),
    (re.compile(rf"\bin\s+{_NUM}\s+{_UNIT}\b(?:['’]?\s+time\b)?", _I), _h_in),
    (
        re.compile(
            r"\b(?P<q>this|next|last|the\s+following|the\s+coming|coming|previous|the\s+previous)"
            r"\s+(?P<unit>weekend|week|month|year)\b",
            _I,
        ),
        _h_period,
    ),
    (re.compile(r"\b(?:at|over|on|during)\s+the\s+(?P<x>weekend)\b", _I), _h_the_weekend),
    (
        re.compile(
            rf"\b(?P<q>this\s+coming|this|next|last|coming|previous|the\s+coming|the\s+following)"
            rf"\s+{_WD}\b",
            _I,
        ),
        _h_weekday_q,
    ),
    (
        re.compile(r"\b(?:today|tonight|this\s+(?:morning|afternoon|evening))\b", _I),
        _h_offset_days(0),
    ),
    (re.compile(r"\byesterday\b", _I), _h_offset_days(-1)),
    (re.compile(r"\btomorrow\b", _I), _h_offset_days(1)),
    (re.compile(rf"\b{_WD}\b", _I), _h_weekday),
    (
        re.compile(
            rf"\b(?:the\s+)?(?P<s>spring|summer|autumn|fall|winter)\s+(?:of\s+)?{_YEAR}\b", _I
        ),
        _h_season_year,
    ),
    (
        re.compile(
            r"\b(?P<q>this|next|last|the\s+coming|coming|previous)\s+(?P<s>spring|summer|autumn|fall|winter)\b",
            _I,
        ),
        _h_season_q,
    ),
    (
        re.compile(
            r"\b(?:in|during|over|since|until|till|by|through)\s+(?:the\s+)?"
            r"(?:(?:early|mid|late)[\s-]+)?(?P<x>(?P<s>spring|summer|autumn|fall|winter))\b",
            _I,
        ),
        _h_season_in,
    ),
    (re.compile(rf"\b(?P<q>this|next|last|coming|previous)\s+{_MON_FULL}\b", _I), _h_month_q),
    (
        re.compile(
            r"\b(?:in|since|from|until|till|til|to|by|for|during|before|after|around|through|of"
            rf"|into)\s+(?:(?:early|mid|late)[\s-]+)?(?P<x>{_MON_FULL})\b(?!\s*\d)",
            _I,
        ),
        _h_month_in,
    ),
    (
        re.compile(
            r"\b(?:in|since|from|until|till|by|during|before|after|around|of)\s+"
            r"(?P<x>(?:19|20)\d{2})\b",
            _I,
        ),
        _h_year_in,
    ),
    (
        re.compile(
            r"\b(?:on|by|until|till|since|from|before|after|for)\s+"
            r"(?P<x>the\s+(?P<day>\d{1,2})(?:st|nd|rd|th))\b",
            _I,
        ),
        _h_dom,
    ),
    (
        re.compile(
            r"(?P<n>\d+|[一二两三四五六七八九十]+)\s*(?P<unit>天|日|个星期|星期|周|个礼拜|礼拜|个月|年)"
            r"\s*(?P<dir>以后|之后|后|以前|之前|前)"
        ),
        _h_zh_ago,
    ),
    (
        re.compile(
            r"(?<![\d一二两三四五六七八九十每几])"  # "一周一次" is a count, not Monday
            r"(?P<q>下下|下|上|这|本)?个?(?:周|星期|礼拜)(?P<wd>[一二三四五六日天])"
        ),
        _h_zh_weekday,
    ),
    (re.compile(r"(?P<q>下下|下|上|这|本)?个?周末"), _h_zh_weekend),
    (re.compile(r"(?P<q>下下|下|上|这|本)个?(?:周|星期|礼拜)"), _h_zh_week),
    (re.compile(r"(?P<q>下|上|这|本)个?月(?!份?\s*[\d一二三四五六七八九十])"), _h_zh_month_rel),
    (re.compile(r"(?P<w>今年|去年|明年|前年|后年)"), _h_zh_year_rel),
    (
        re.compile(
            r"(?<![\d年个上下这本每几两一二三四五六七八九十])"
            r"(?P<m>\d{1,2}|[一二三四五六七八九十]{1,3})\s*月份?(?!\s*[\d日号])"
        ),
        _h_zh_month,
    ),
    (re.compile(r"(?P<y>(?:19|20)\d{2})\s*年(?!\s*\d{1,2}\s*月)"), _h_zh_year_abs),
    (
        re.compile(
            r"(?P<w>大前天|大后天|前天|后天|今天|今日|今晚|今早|昨天|昨日|昨晚|明天|明日|明晚|明早)"
        ),
        _h_zh_day,
    ),
)


def _role(text: str, start: int, end: int) -> str:
    before, after = text[:start], text[end:]
    if _ROLE_SINCE_BEFORE.search(before) or _ROLE_SINCE_AFTER.search(after):
        return "since"
    if _ROLE_UNTIL_BEFORE.search(before) or _ROLE_UNTIL_AFTER.search(after):
        return "until"
    if _ROLE_THROUGH_BEFORE.search(before):
        return "through"
    return "at"


def _find(text: str, ref: date) -> list[DateMention]:
    taken: list[tuple[int, int]] = []
    found: list[DateMention] = []
    for pattern, handler in _RULES:
        for m in pattern.finditer(text):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            start = m.start("x") if "x" in pattern.groupindex else m.start()
            ctx = _Ctx(text, ref, m, start, m.end(), _role(text, start, m.end()))
            try:
                resolved = handler(ctx)
            except (OverflowError, ValueError):
                # "yesterday" said on 0001-01-01, "next year" in 9999: no such date; the
                # words stay as written.
                continue
            if resolved is None:
                continue
            first, last, granularity, relative = resolved
            taken.append((m.start(), m.end()))
            found.append(
                DateMention(
                    text[start : m.end()],
                    start,
                    m.end(),
                    first,
                    last,
                    granularity,
                    relative,
                    ctx.role,
                )
            )
    found.sort(key=lambda x: x.start)
    out: list[DateMention] = []
    annotation_end = -1
    for mention in found:
        if mention.start < annotation_end:
            continue  # inside the "(2026-05-06)" a previous resolution wrote
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.role == "since"
            and mention.role == "at"
            and _RANGE_JOIN.fullmatch(text[prev.end : mention.start])
        ):
            mention = replace(mention, role="until")  # "from May 3 to May 10"
        if mention.relative:
            ann = _ANNOTATION.match(text, mention.end)
            annotation_end = ann.end() if ann else -1
        out.append(mention)
    return out


def _label(m: DateMention) -> str:
    if m.granularity == "day":
        return m.first.isoformat()
    if m.granularity == "week":
        return f"week of {m.first.isoformat()}"
    if m.granularity == "weekend":
        return f"{m.first.isoformat()} to {m.last.isoformat()}"
    # isoformat, not %Y: strftime does not zero-pad years before 1000.
    if m.granularity == "month":
        return m.first.isoformat()[:7]
    if m.granularity == "season":
        return f"{m.first.isoformat()[:7]} to {m.last.isoformat()[:7]}"
    return str(m.first.year)


def _utc(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)


def resolve_dates(text: str, reference: datetime) -> DateSpan:
    """Find the time expressions in ``text`` and resolve them against ``reference``.

    ``reference`` is the message's timestamp; a naive datetime is taken as UTC. See the module
    docstring for the exact rules. Never raises on odd input: what it cannot resolve it leaves
    as written.
    """
    if reference.tzinfo is None:
        reference = reference.replace(tzinfo=timezone.utc)
    ref = reference.astimezone(timezone.utc).date()
    mentions = _find(text, ref)

    # Annotate from the end so earlier offsets stay valid.
    out = text
    for m in reversed(mentions):
        if not m.relative or _ANNOTATION.match(text, m.end):
            continue
        cjk_before = bool(re.match(r"[\u3000-\u9fff\uff00-\uffef]", text[m.end - 1]))
        sep = "" if cjk_before else " "
        out = f"{out[: m.end]}{sep}({_label(m)}){out[m.end :]}"

    occurred_at = valid_from = valid_to = None
    from_point = False
    for m in mentions:
        if m.role == "since" and valid_from is None:
            valid_from, from_point = _utc(m.first), False
        elif m.role == "until" and valid_to is None:
            valid_to = _utc(m.first)
        elif m.role == "through" and valid_to is None:
            valid_to = _utc(m.last + timedelta(days=1)) if m.last < date.max else None
        elif m.role == "at" and occurred_at is None:
            occurred_at = _utc(m.first)
            if m.first > ref and valid_from is None:
                valid_from, from_point = occurred_at, True  # a plan: holds from that date
    if valid_from and valid_to and valid_to < valid_from:
        # Never hand out an inverted window: a plan's start gives way to an explicit end,
        # and two contradicting explicit bounds are both dropped.
        if not from_point:
            valid_to = None
        valid_from = None
    return DateSpan(occurred_at, valid_from, valid_to, out, tuple(mentions))

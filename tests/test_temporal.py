"""Temporal intent of recall queries: windows, "asks when", relations, cleaned text, boosts."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratamem.pipeline._dates import resolve_dates
from stratamem.recall._temporal import TimeIntent, parse_time_intent, window_boost

UTC = timezone.utc
# A Tuesday afternoon in summer: weeks, months and seasons all have a "before" and an "after".
NOW = datetime(2023, 8, 15, 14, 0, tzinfo=UTC)
# A Wednesday in the first week of a year: "last" anything crosses the year boundary.
NEW_YEAR = datetime(2024, 1, 3, 9, 30, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def d(year: int, month: int, day: int, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


def window_of(query: str, now: datetime = NOW) -> tuple[datetime, datetime] | None:
    return parse_time_intent(query, now).window


def test_fixtures_fall_on_the_intended_weekdays() -> None:
    assert NOW.strftime("%A") == "Tuesday"
    assert NEW_YEAR.strftime("%A") == "Wednesday"


# --------------------------------------------------------------------------- windows


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        # days
        ("What did I do yesterday?", d(2023, 8, 14), d(2023, 8, 15)),
        ("What did I eat today?", d(2023, 8, 15), d(2023, 8, 16)),
        ("Where am I going tonight?", d(2023, 8, 15), d(2023, 8, 16)),
        ("Who did I talk to last night?", d(2023, 8, 14), d(2023, 8, 15)),
        ("What happened the day before yesterday?", d(2023, 8, 13), d(2023, 8, 14)),
        ("What is on tomorrow?", d(2023, 8, 16), d(2023, 8, 17)),
        # calendar weeks (Monday to Sunday), months, years, weekends
        ("What did I do this week?", d(2023, 8, 14), d(2023, 8, 21)),
        ("What did I buy last week?", d(2023, 8, 7), d(2023, 8, 14)),
        ("What is planned for next week?", d(2023, 8, 21), d(2023, 8, 28)),
        ("How much did I spend this month?", d(2023, 8, 1), d(2023, 9, 1)),
        ("Which books did I read last month?", d(2023, 7, 1), d(2023, 8, 1)),
        ("What are my goals this year?", d(2023, 1, 1), d(2024, 1, 1)),
        ("Where did I travel last year?", d(2022, 1, 1), d(2023, 1, 1)),
        ("What did we do last weekend?", d(2023, 8, 12), d(2023, 8, 14)),
        ("What did we do this past weekend?", d(2023, 8, 12), d(2023, 8, 14)),
        # N units ago: that day, or the calendar period that contains the day N units back
        ("What did I cook 3 days ago?", d(2023, 8, 12), d(2023, 8, 13)),
        ("What did I cook twelve days ago?", d(2023, 8, 3), d(2023, 8, 4)),
        ("Who did I meet two weeks ago?", d(2023, 7, 31), d(2023, 8, 7)),
        ("Who did I meet a couple of weeks ago?", d(2023, 7, 31), d(2023, 8, 7)),
        ("What did I say a month ago?", d(2023, 7, 1), d(2023, 8, 1)),
        ("Where did I live a couple of years ago?", d(2021, 1, 1), d(2022, 1, 1)),
        ("What did I see a few days ago?", d(2023, 8, 11), d(2023, 8, 14)),
        # months without a year: the most recent one not after now
        ("What did I do in May?", d(2023, 5, 1), d(2023, 6, 1)),
        ("What did I do in August?", d(2023, 8, 1), d(2023, 9, 1)),
        ("What did I do in September?", d(2022, 9, 1), d(2022, 10, 1)),
        ("What did I do in early May?", d(2023, 5, 1), d(2023, 5, 11)),
        ("Tell me about last May", d(2023, 5, 1), d(2023, 6, 1)),
        # months with a year
        ("What did I do in May 2023?", d(2023, 5, 1), d(2023, 6, 1)),
        ("Trips in May 2023", d(2023, 5, 1), d(2023, 6, 1)),
        ("Anything from Dec 2021?", d(2021, 12, 1), d(2022, 1, 1)),
        # days
        ("What happened on 8 May 2023?", d(2023, 5, 8), d(2023, 5, 9)),
        ("What happened on 8 May, 2023?", d(2023, 5, 8), d(2023, 5, 9)),
        ("What happened on May 8, 2023?", d(2023, 5, 8), d(2023, 5, 9)),
        ("What happened on May 8th?", d(2023, 5, 8), d(2023, 5, 9)),
        ("What happened on the 8th of May?", d(2023, 5, 8), d(2023, 5, 9)),
        ("What did we eat on December 25th?", d(2022, 12, 25), d(2022, 12, 26)),
        ("What happened on 2023-05-08?", d(2023, 5, 8), d(2023, 5, 9)),
        # years and halves of years
        ("Where did I work in 2022?", d(2022, 1, 1), d(2023, 1, 1)),
        ("Where did I work back in 2019?", d(2019, 1, 1), d(2020, 1, 1)),
        ("What did I start in early 2023?", d(2023, 1, 1), d(2023, 7, 1)),
        ("What did I start late 2022?", d(2022, 7, 1), d(2023, 1, 1)),
        ("What did I start mid-2023?", d(2023, 4, 1), d(2023, 10, 1)),
        # seasons (meteorological, northern hemisphere)
        ("Where did I go last spring?", d(2023, 3, 1), d(2023, 6, 1)),
        ("Where did I go last summer?", d(2022, 6, 1), d(2022, 9, 1)),
        ("Where did I go last autumn?", d(2022, 9, 1), d(2022, 12, 1)),
        ("Where did I go last fall?", d(2022, 9, 1), d(2022, 12, 1)),
        ("Where did I go last winter?", d(2022, 12, 1), d(2023, 3, 1)),
        ("Where am I going this summer?", d(2023, 6, 1), d(2023, 9, 1)),
        ("Where did I go in the spring of 2023?", d(2023, 3, 1), d(2023, 6, 1)),
        ("Where did I go in summer 2022?", d(2022, 6, 1), d(2022, 9, 1)),
        ("What did I eat in the summer?", d(2023, 6, 1), d(2023, 9, 1)),
        # rolling windows end at now
        ("What did I read in the past 3 days?", d(2023, 8, 12), NOW),
        ("What did I read over the past two weeks?", d(2023, 8, 1), NOW),
        ("What did I read in the past 6 months?", d(2023, 2, 15), NOW),
        ("What did I read in the past week?", d(2023, 8, 8), NOW),
        ("What did I read in the last 3 days?", d(2023, 8, 12), NOW),
        ("What have I been reading recently?", d(2023, 7, 16), NOW),
        # weekdays
        ("What did I do last Friday?", d(2023, 8, 11), d(2023, 8, 12)),
        ("What did I do on Tuesday?", d(2023, 8, 15), d(2023, 8, 16)),
        ("What did I do on Wednesday?", d(2023, 8, 9), d(2023, 8, 10)),
        # several expressions: the window covering them all
        ("What did I do between May 2023 and July 2023?", d(2023, 5, 1), d(2023, 8, 1)),
        ("What did I do yesterday and today?", d(2023, 8, 14), d(2023, 8, 16)),
    ],
)
def test_window(query: str, start: datetime, end: datetime) -> None:
    intent = parse_time_intent(query, NOW)
    assert intent.window == (start, end)
    assert intent.relation is None
    assert intent.anchor is None


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("What did I do last month?", d(2023, 12, 1), d(2024, 1, 1)),
        ("What did I do last week?", d(2023, 12, 25), d(2024, 1, 1)),
        ("What did I do last weekend?", d(2023, 12, 30), d(2024, 1, 1)),
        ("What did I do this week?", d(2024, 1, 1), d(2024, 1, 8)),
        ("What did I do last year?", d(2023, 1, 1), d(2024, 1, 1)),
        ("What did I do yesterday?", d(2024, 1, 2), d(2024, 1, 3)),
        ("What did I do 3 days ago?", d(2023, 12, 31), d(2024, 1, 1)),
        ("What did I do a month ago?", d(2023, 12, 1), d(2024, 1, 1)),
        ("What did I do in December?", d(2023, 12, 1), d(2024, 1, 1)),
        ("What did I do in February?", d(2023, 2, 1), d(2023, 3, 1)),
        ("What did I do on December 31st?", d(2023, 12, 31), d(2024, 1, 1)),
        ("What did I do in the past week?", d(2023, 12, 27), NEW_YEAR),
        # the winter now is in is not complete: "last winter" is the one before
        ("Where did I ski last winter?", d(2022, 12, 1), d(2023, 3, 1)),
        ("Where am I skiing this winter?", d(2023, 12, 1), d(2024, 3, 1)),
        ("Where did I go last autumn?", d(2023, 9, 1), d(2023, 12, 1)),
    ],
)
def test_window_across_the_year_boundary(query: str, start: datetime, end: datetime) -> None:
    assert window_of(query, NEW_YEAR) == (start, end)


@pytest.mark.parametrize(
    ("query", "now", "start", "end"),
    [
        # month arithmetic clamps to the month's last day
        ("a month ago", d(2024, 3, 31), d(2024, 2, 1), d(2024, 3, 1)),
        ("the past month", d(2024, 3, 31), d(2024, 2, 29), d(2024, 3, 31)),
        # a 29 February without a year is the latest one that existed
        ("on Feb 29", d(2023, 3, 31), d(2020, 2, 29), d(2020, 3, 1)),
        # in spring, "last spring" is the previous year's
        ("last spring", d(2023, 3, 31), d(2022, 3, 1), d(2022, 6, 1)),
        ("this spring", d(2023, 3, 31), d(2023, 3, 1), d(2023, 6, 1)),
        ("next winter", d(2023, 3, 31), d(2023, 12, 1), d(2024, 3, 1)),
    ],
)
def test_window_calendar_edges(query: str, now: datetime, start: datetime, end: datetime) -> None:
    assert window_of(query, now) == (start, end)


def test_window_is_case_insensitive() -> None:
    assert window_of("WHAT DID I DO LAST WEEK?") == window_of("what did i do last week?")
    assert window_of("in MAY 2023") == (d(2023, 5, 1), d(2023, 6, 1))


def test_now_naive_is_utc_and_aware_is_converted() -> None:
    assert window_of("today", NOW.replace(tzinfo=None)) == (d(2023, 8, 15), d(2023, 8, 16))
    # 01:00 on the 16th in UTC+2 is still the 15th in UTC
    plus_two = datetime(2023, 8, 16, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert window_of("today", plus_two) == (d(2023, 8, 15), d(2023, 8, 16))


@pytest.mark.parametrize(
    "query",
    [
        "What is my favourite colour?",
        "Can you remind me what we may need?",  # "may" the verb
        "I ran 2023 steps",  # a number, not a year
        "What happened on 2023-02-30?",  # no such day
        "What did Bob say about March Madness?",
        "Have I been here before?",  # a relation word with nothing after it
        "What happened after that?",  # a pronoun names no event
        "After all, what do I like?",
        "Since I'm vegan, what should I cook?",  # a reason, not a time
    ],
)
def test_no_temporal_content(query: str) -> None:
    assert parse_time_intent(query, NOW) == TimeIntent(
        asks_when=False, window=None, relation=None, anchor=None, cleaned=query
    )


@pytest.mark.parametrize(
    "query",
    [
        "我上个月去了哪里？",
        "2023年5月我在哪里",
        "昨天我吃了什么",
        "先週どこに行きましたか",
        "지난주에 뭐 했어?",
    ],
)
def test_cjk_queries_get_no_window(query: str) -> None:
    intent = parse_time_intent(query, NOW)
    assert intent.window is None
    assert intent.relation is None
    assert intent.anchor is None
    assert intent.cleaned == query


@pytest.mark.parametrize(
    "query", ["", "   ", "?", "🙂 last", "before", "since since since", "x" * 5000, "May"]
)
def test_odd_input_does_not_raise(query: str) -> None:
    intent = parse_time_intent(query, NOW)
    assert isinstance(intent.cleaned, str)


def test_deterministic_and_frozen() -> None:
    query = "What did I buy last week before the move?"
    assert parse_time_intent(query, NOW) == parse_time_intent(query, NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse_time_intent(query, NOW).window = None  # type: ignore[misc]


# --------------------------------------------------------------------------- asks_when


@pytest.mark.parametrize(
    ("query", "asks"),
    [
        ("When did Caroline go to the support group?", True),
        ("when was my last dentist appointment?", True),
        ("When's the wedding?", True),
        ("What date did I move to Berlin?", True),
        ("Which month did we go to Rome?", True),
        ("What year did I graduate?", True),
        ("How long ago did I start running?", True),
        ("How many days ago did I call mum?", True),
        ("How many weeks since I started the diet?", True),
        ("How long has it been since I moved?", True),
        ("Since when have I been vegan?", True),
        ("What did I buy last week?", False),
        ("When I was in Paris, what did I eat?", False),  # a clause, not a question
        ("How long did I stay in Paris?", False),  # a duration, not a date
        ("What is my favourite colour?", False),
    ],
)
def test_asks_when(query: str, asks: bool) -> None:
    assert parse_time_intent(query, NOW).asks_when is asks


def test_asks_when_without_window_and_window_without_asks_when() -> None:
    when = parse_time_intent("When did Caroline go to the support group?", NOW)
    assert when.asks_when and when.window is None
    assert when.cleaned == "When did Caroline go to the support group?"
    what = parse_time_intent("What did I buy last week?", NOW)
    assert not what.asks_when and what.window == (d(2023, 8, 7), d(2023, 8, 14))


def test_since_in_a_when_question_names_the_event_not_a_filter() -> None:
    intent = parse_time_intent("How long has it been since I moved?", NOW)
    assert intent.relation is None and intent.anchor is None and intent.window is None
    assert intent.cleaned == "How long has it been since I moved?"


# --------------------------------------------------------------------------- relations


@pytest.mark.parametrize(
    ("query", "relation", "anchor", "cleaned"),
    [
        ("What did I do before the move?", "before", "the move", "What did I do?"),
        ("What happened after she got married?", "after", "she got married", "What happened?"),
        ("What have I cooked since I went vegan?", "after", "I went vegan", "What have I cooked?"),
        ("Where did I live prior to moving to Berlin?", "before", "moving to Berlin", None),
        ("What was I reading until the exam, and why?", "before", "the exam", None),
        ("Ever since the accident, how do I sleep?", "after", "the accident", None),
        # the anchor ends at a question inversion, a second relation, or a time expression
        ("How many days before the wedding did I buy the dress?", "before", "the wedding", None),
        (
            "What did I do after the move and before the wedding?",
            "after",
            "the move",
            "What did I do before the wedding?",
        ),
        ("What did I buy after the move last year?", "after", "the move", "What did I buy?"),
        # a possessive period is part of the event, not a window
        ("What did I do before last summer's trip?", "before", "last summer's trip", None),
    ],
)
def test_relation_with_anchor(query: str, relation: str, anchor: str, cleaned: str | None) -> None:
    intent = parse_time_intent(query, NOW)
    assert intent.relation == relation
    assert intent.anchor == anchor
    if cleaned is not None:
        assert intent.cleaned == cleaned
    assert anchor not in intent.cleaned


def test_relation_with_anchor_keeps_a_separate_window() -> None:
    intent = parse_time_intent("What did I buy after the move last year?", NOW)
    assert intent.window == (d(2022, 1, 1), d(2023, 1, 1))
    assert parse_time_intent("What did I do before the move?", NOW).window is None


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("What did I do before May 2023?", EPOCH, d(2023, 5, 1)),
        ("What did I do before May?", EPOCH, d(2023, 5, 1)),
        ("What did I do prior to 2022?", EPOCH, d(2022, 1, 1)),
        ("What did I do until last week?", EPOCH, d(2023, 8, 7)),
        ("What did I do up until last week?", EPOCH, d(2023, 8, 7)),
        ("What did I read after May 2023?", d(2023, 6, 1), NOW),
        ("What did I read since May 2023?", d(2023, 5, 1), NOW),
        ("What did I read since last summer?", d(2022, 6, 1), NOW),
        ("What did I read since 2022?", d(2022, 1, 1), NOW),
        ("What did I read since early 2023?", d(2023, 1, 1), NOW),
        ("What did I read before the summer?", EPOCH, d(2023, 6, 1)),
        ("What did I read after yesterday?", d(2023, 8, 15), NOW),
        # a relation window narrows a named period
        ("What did I do in 2023 before May?", d(2023, 1, 1), d(2023, 5, 1)),
    ],
)
def test_relation_to_a_period_is_a_window(query: str, start: datetime, end: datetime) -> None:
    intent = parse_time_intent(query, NOW)
    assert intent.window == (start, end)
    assert intent.relation is None
    assert intent.anchor is None
    assert intent.cleaned == " ".join(query.split()[:4]) + "?"  # "What did I read?"


def test_relation_to_a_future_period_stays_open() -> None:
    start, end = window_of("What is planned after today?") or (None, None)
    assert start == d(2023, 8, 16)
    assert end is not None and end > NOW + timedelta(days=365 * 1000)


def test_the_day_before_yesterday_is_not_a_relation() -> None:
    intent = parse_time_intent("What did I do the day before yesterday?", NOW)
    assert intent.relation is None and intent.window == (d(2023, 8, 13), d(2023, 8, 14))


@pytest.mark.parametrize(
    ("query", "start", "end", "cleaned"),
    [
        # the span before or after a named day, with that day (where it is told)
        (
            "Where was I the week before 16 November 2022?",
            d(2022, 11, 9),
            d(2022, 11, 17),
            "Where was I?",
        ),
        (
            "Where was I in the week before 16 November 2022?",
            d(2022, 11, 9),
            d(2022, 11, 17),
            "Where was I?",
        ),
        (
            "What did I get two weeks before August 11, 2023?",
            d(2023, 7, 28),
            d(2023, 8, 12),
            "What did I get?",
        ),
        ("What did I do a day after 3 June 2023?", d(2023, 6, 3), d(2023, 6, 5), "What did I do?"),
        (
            "What did I do the month before June 2023?",
            d(2023, 5, 1),
            d(2023, 7, 1),
            "What did I do?",
        ),
        # weekdays and weekends: the nearest one strictly before / after the day
        (
            "What did we do on the Monday before July 24, 2023?",
            d(2023, 7, 17),
            d(2023, 7, 25),
            "What did we do?",
        ),
        (
            "What did we plan for the Saturday after October 28, 2023?",
            d(2023, 10, 28),
            d(2023, 11, 5),
            "What did we plan for?",
        ),
        (
            "What did we do over the weekend before 4 October 2023?",
            d(2023, 9, 30),
            d(2023, 10, 5),
            "What did we do?",
        ),
        (
            "What did we do last weekend before April 10, 2023?",
            d(2023, 4, 8),
            d(2023, 4, 11),
            "What did we do?",
        ),
        # the day named is a Sunday: the weekend before it is the one before its own
        (
            "What did we do the weekend before 13 August 2023?",
            d(2023, 8, 5),
            d(2023, 8, 14),
            "What did we do?",
        ),
    ],
)
def test_a_span_beside_a_named_day(
    query: str, start: datetime, end: datetime, cleaned: str
) -> None:
    intent = parse_time_intent(query, NOW)
    assert intent.window == (start, end)
    assert intent.relation is None and intent.anchor is None
    assert intent.cleaned == cleaned


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        # "as of" asks for the state at the end of the period: everything up to it
        ("How many pets did I have, as of September 2022?", EPOCH, d(2022, 10, 1)),
        ("Where did I live as of 3 June 2023?", EPOCH, d(2023, 6, 4)),
        # a query naming a calendar date is told from it: "recently", "last week" are
        # relative to that date, not to now
        ("What did I start recently, as mentioned on 3 June, 2023?", d(2023, 5, 4), d(2023, 6, 4)),
        (
            "What was my issue last week, as mentioned on November 6, 2022?",  # a Sunday
            d(2022, 10, 24),
            d(2022, 11, 7),
        ),
        ("What did I recently watch on February 7, 2022?", d(2022, 1, 8), d(2022, 2, 8)),
        # "as of" moves where the query stands too
        (
            "What had I read lately, as of March 2022?",
            d(2022, 3, 1),  # the 30 days up to the end of March
            d(2022, 4, 1),
        ),
    ],
)
def test_a_named_date_is_where_the_query_stands(query: str, start: datetime, end: datetime) -> None:
    assert window_of(query) == (start, end)


@pytest.mark.parametrize(
    "query",
    [
        "How many weeks between the bake sale and the time I was in the Spring Fling Market?",
        "What did the kids do last Summer Camp?",
    ],
)
def test_a_season_in_a_name_is_no_period(query: str) -> None:
    intent = parse_time_intent(query, NOW)
    assert intent.window is None and intent.cleaned == query
    # the same words as a season are one
    assert window_of(query.replace("Spring Fling", "spring").replace("Summer Camp", "summer"))


def test_what_is_relative_stays_relative_to_now_without_a_named_date() -> None:
    # the date is the object of "since": it bounds the answer, the query stands at now
    assert window_of("What did I do since 2022 recently?") == (d(2023, 7, 16), NOW)
    # a date after now moves nothing
    assert window_of("What did I plan recently in 2024?") == (d(2023, 7, 16), d(2025, 1, 1))
    # a date that names a thing ("the May 2023 release") is not when the question stands
    assert window_of("What did I decide yesterday about the May 2023 release?") == (
        d(2023, 5, 1),
        d(2023, 8, 15),
    )
    # "as of" with no period after it is no time expression
    intent = parse_time_intent("As of now, where do I live?", NOW)
    assert intent.window is None and intent.relation is None
    assert intent.cleaned == "As of now, where do I live?"


# --------------------------------------------------------------------------- cleaned


@pytest.mark.parametrize(
    ("query", "cleaned"),
    [
        ("What did I buy last week?", "What did I buy?"),
        ("In May 2023, where did I travel?", "where did I travel?"),
        ("Last week, what did I buy?", "what did I buy?"),
        ("What did I buy, last week?", "What did I buy?"),
        ("Where did I go during the summer of 2022?", "Where did I go?"),
        ("What did I do on last year's trip?", "What did I do on trip?"),
        ("What did I do between May 2023 and July 2023?", "What did I do?"),
        ("Where did I work back in 2019?", "Where did I work?"),
        ("yesterday", ""),
        ("What did I buy last week and what did I eat?", "What did I buy and what did I eat?"),
    ],
)
def test_cleaned(query: str, cleaned: str) -> None:
    assert parse_time_intent(query, NOW).cleaned == cleaned


# --------------------------------------------------------------------------- window_boost

WINDOW = (d(2023, 8, 7), d(2023, 8, 14))


@pytest.mark.parametrize(
    "ts", [d(2023, 8, 7), d(2023, 8, 10, 12), datetime(2023, 8, 13, 23, 59, tzinfo=UTC)]
)
def test_window_boost_inside_is_one(ts: datetime) -> None:
    assert window_boost(ts, WINDOW) == 1.0


def test_window_boost_decays_outside() -> None:
    at_edge = window_boost(d(2023, 8, 14), WINDOW)
    one_day = window_boost(d(2023, 8, 15), WINDOW)
    one_slack = window_boost(d(2023, 8, 4), WINDOW)
    far = window_boost(d(2022, 8, 14), WINDOW)
    assert at_edge == pytest.approx(1.0)  # continuous at the edge
    assert one_day == pytest.approx(math.exp(-1 / 3))
    assert one_slack == pytest.approx(math.exp(-1))
    assert at_edge > one_day > one_slack > far
    assert far < 1e-6


def test_window_boost_slack() -> None:
    ts = d(2023, 8, 17)  # three days after the window
    assert window_boost(ts, WINDOW, slack_days=30) > window_boost(ts, WINDOW)
    assert window_boost(ts, WINDOW, slack_days=0) == 0.0
    assert window_boost(d(2023, 8, 8), WINDOW, slack_days=0) == 1.0


def test_window_boost_without_timestamp_or_window() -> None:
    assert window_boost(None, WINDOW) == 0.0
    assert window_boost(None, None) == 1.0
    assert window_boost(d(1999, 1, 1), None) == 1.0


def test_window_boost_naive_timestamp_is_utc() -> None:
    assert window_boost(datetime(2023, 8, 10), WINDOW) == 1.0


def test_window_boost_with_a_parsed_window() -> None:
    window = window_of("What did I buy last week?")
    assert window_boost(d(2023, 8, 9, 18), window) == 1.0
    assert window_boost(d(2023, 6, 1), window) < 0.001


_PHRASES = [
    "yesterday", "tomorrow", "last year", "next year", "last spring", "next winter",
    "last week", "the weekend", "next month", "last May", "on 3 June", "two days ago",
    "in three years", "before the move", "since last spring", "until next year",
    "through December", "from May 3 to May 10", "the day before yesterday", "next Friday",
    "昨天", "去年", "明年", "下个月", "三天前", "去年春天", "December 31", "January 1",
]  # fmt: skip


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.one_of(
        # The ends of the calendar, where a step back or forward leaves it.
        st.sampled_from([datetime(1, 1, 1), datetime(1, 3, 2), datetime(9999, 12, 31)]),
        st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59)),
    ),
    st.lists(st.sampled_from(_PHRASES), min_size=1, max_size=3),
)
def test_time_words_at_any_date_never_raise(now: datetime, phrases: list[str]) -> None:
    """Questions and messages dated anywhere in years 1-9999 ("yesterday" on 0001-01-01,
    "next year" in 9999) resolve what exists and leave the rest as written."""
    now = now.replace(tzinfo=timezone.utc)
    resolve_dates("I went hiking " + " and ".join(phrases), now)
    intent = parse_time_intent("what did I do " + " ".join(phrases) + "?", now)
    if intent.window is not None:
        window_boost(now, intent.window)

"""Prefix stability: how much of each request a provider's prompt cache could reuse when
memory is injected, for capture (``mem.llm.register``) and the proxy, with the recalled
block in the last user turn (``injection="user"``, the default) or the system slot.

A scripted 20-turn conversation (written below: a user telling an assistant about their
plans over one session, a ~300-token system prompt, the assistant's answers scripted on
the loopback fake OpenAI server, ``tests/fakes/openai_server.py``) runs four ways: through
``mem.llm.register(openai.OpenAI(...))`` and through the proxy (``create_proxy_app`` in a
uvicorn thread, the same SDK pointed at it), each with ``capture_injection`` "user" and
"system". The user already has memory: an earlier session of facts about them (also
below), processed by the offline pipeline with the bundled local embedder before the
conversation starts. Each turn's exchange is captured; the bench waits until it is stored
and processed before the next turn (as a user's typing time would), so recall also sees
the conversation's own earlier turns. Recall's bound is raised to 2 s: this measures what
is injected, not how fast, and a slow moment must not drop a block.

Every request body the fake received is recorded. For each request n >= 2: the number of
leading tokens identical to request n-1's, as a share of request n-1's tokens (what a
provider prefix cache could reuse; the issue's measure), and as a share of request n-1's
tokens outside its memory block. Also per request: the block's size in tokens, its item
lines (``- [...]`` and ``> "..."`` lines), how many of those repeat text the request
already carries (after un-escaping, the line's text, cut ``…`` and all, found verbatim in
one of the request's messages outside the block: a turn of the conversation quoted back),
and how many are dated today (the conversation's own turns and the facts and summaries
derived from them, quoted back or paraphrased; the earlier session is a week old).

Tokens: OpenAI caches on the tokens of the rendered prompt. The rendering is approximated
as ChatML (``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, in order; one token
each for the two markers) and the tokens as the pre-tokenizer split of the GPT-4-family
encodings (contractions, letters with one leading space, digits in groups of up to three,
punctuation runs, whitespace runs), done with ``re``: BPE makes each piece one token or
more (a rare word several), so counts are a lower bound, while a shared prefix's share,
a ratio of counts over the same kind of text, moves little. Nothing is downloaded
(``tiktoken`` would fetch its encoding). Not modelled: OpenAI caches only prompts of 1,024
tokens or more, in steps of 128.

Target: the cache-preserving placement ("user") lets a cache reuse >= 90% of the previous
request's tokens (mean over the turns). The issue measured 37% on average over 7 turns for
the system placement, falling as the conversation grows.

    python bench/prefix.py            # the four runs (~20 s)
    python bench/prefix.py --tools 8  # an agent: eight tool schemas in every request
    python bench/prefix.py --json --turns 10
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import re
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx
import openai

from _common import emit_json, engine_version, machine_info
from fakes.openai_server import FakeOpenAIServer
from stratamem import Memory

USER = "dana"
SESSION = "saturday-planning"
MODEL = "gpt-4o-mini"


def _tool(name: str, description: str, **params: tuple[str, str]) -> dict[str, Any]:
    properties = {k: {"type": kind, "description": text} for k, (kind, text) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


# An agent's tools (--tools): what a planning assistant would be given. OpenAI renders
# them into the prompt ahead of the messages, so they are part of the cached prefix.
TOOLS = [
    _tool(
        "search_places",
        "Search restaurants, cafes, shops, parks and venues near a location. Returns up to "
        "ten results with name, address, opening hours, price level, rating and distance.",
        query=("string", "What to look for, e.g. 'vegetarian brunch' or 'hardware store'."),
        near=("string", "An address, neighbourhood or 'lat,lng' to search around."),
        open_at=("string", "ISO 8601 time the place must be open at, if any."),
        max_distance_km=("number", "Largest distance from `near`, in kilometres."),
    ),
    _tool(
        "get_weather",
        "The hourly weather forecast for a place and day: temperature, chance and amount "
        "of rain, wind and UV index, for the next seven days at most.",
        location=("string", "A city, address or 'lat,lng'."),
        date=("string", "The day, ISO 8601 (YYYY-MM-DD)."),
        units=("string", "'metric' or 'imperial'."),
    ),
    _tool(
        "create_calendar_event",
        "Add an event to the user's calendar. Fails if it overlaps an event marked busy "
        "unless `allow_overlap` is true. Returns the event's id and link.",
        title=("string", "A short title shown in the calendar."),
        start=("string", "Start, ISO 8601 with time zone."),
        end=("string", "End, ISO 8601 with time zone."),
        location=("string", "Where, as an address or a place name."),
        notes=("string", "Free text shown in the event's details."),
        allow_overlap=("boolean", "Create it even if it overlaps a busy event."),
    ),
    _tool(
        "list_calendar_events",
        "The user's calendar events between two times, with title, time, place and whether "
        "they are marked busy.",
        start=("string", "From, ISO 8601 with time zone."),
        end=("string", "Until, ISO 8601 with time zone."),
    ),
    _tool(
        "directions",
        "Route and travel time between two places by walking, cycling, public transport or "
        "car, with departure and arrival times and the steps of the route.",
        origin=("string", "Start address or place."),
        destination=("string", "End address or place."),
        mode=("string", "'walk', 'bike', 'transit' or 'drive'."),
        depart_at=("string", "ISO 8601 departure time; now if omitted."),
    ),
    _tool(
        "send_message",
        "Send a text message to one of the user's contacts on their behalf. Always show the "
        "user the exact text and ask before sending.",
        contact=("string", "The contact's name as stored in the address book."),
        text=("string", "The message, as the user approved it."),
    ),
    _tool(
        "shopping_list",
        "Read or change the user's shared shopping list: add or remove items, or list them.",
        action=("string", "'add', 'remove' or 'list'."),
        items=("array", "The items to add or remove, as short names."),
    ),
    _tool(
        "book_table",
        "Reserve a table at a restaurant that takes online bookings. Returns a confirmation "
        "code or the nearest free times if the one asked for is taken.",
        restaurant_id=("string", "The id search_places returned."),
        time=("string", "ISO 8601 with time zone."),
        party_size=("integer", "How many people, 1 to 20."),
        notes=("string", "Dietary needs or seating wishes for the restaurant."),
    ),
]

SYSTEM_PROMPT = """\
You are Juniper, a warm, practical personal assistant inside a planning app. The person \
you talk to uses the app to organise their life: work, health, travel, money and family. \
Follow these guidelines in every answer.

1. Be concrete. Prefer specific suggestions, numbers, dates and short checklists over \
general advice. When you estimate something (a cost, a duration, a distance), say that it \
is an estimate and what it depends on.
2. Be brief. Most answers should be two to six sentences, or a short list. Use a longer \
answer only when the person asks for a plan, a schedule or a summary.
3. Respect what the person has told you. If they mention preferences, constraints, \
allergies, budgets or people in their life, take them into account without repeating them \
back at length. If you are unsure whether something still holds, ask.
4. Health: you are not a doctor. For pain, injury or medication questions, give general \
information and suggest seeing a professional when symptoms persist or worsen.
5. Money: you are not a financial adviser. Show the arithmetic when you discuss savings or \
budgets, and keep the person's own goals at the centre.
6. Tone: friendly and direct, never saccharine. No emojis. Do not start answers with \
"Great question". Use the person's name sparingly.
7. Formatting: plain text with simple dashes for lists; no tables unless asked.
8. Privacy: never invent details about the person. If something is not in the \
conversation or in what the app tells you about them, say you don't know."""

# The earlier session: what the user told the assistant a week before (stored and
# processed before the conversation starts).
EARLIER = [
    ("user", "I'm Dana, by the way. I teach high-school chemistry in Portland, Oregon."),
    ("assistant", "Nice to meet you, Dana. Chemistry teachers get all the good demos."),
    ("user", "My partner Sam and I have been together six years. Sam works nights as an ER nurse."),
    ("assistant", "Night shifts are hard on a household; I'll keep that in mind for plans."),
    ("user", "We adopted a rescue greyhound called Biscuit last spring. He's very gentle."),
    ("assistant", "Greyhounds are lovely companions. Biscuit sounds like a good boy."),
    ("user", "I'm allergic to shellfish, so I always have to check menus carefully."),
    ("assistant", "Noted: no shellfish. I'll flag it whenever food comes up."),
    (
        "user",
        "I started running in January and I want to run the Portland half marathon in October.",
    ),
    ("assistant", "That's a great goal for a first-year runner; October gives you time."),
    ("user", "My left knee has been aching after runs longer than eight miles."),
    ("assistant", "Worth watching. If it persists, a physio can check your gait."),
    ("user", "My sister Leah lives in Lisbon. She's marrying her fiance Tiago next June."),
    ("assistant", "Congratulations to Leah and Tiago! A Lisbon wedding sounds wonderful."),
    (
        "user",
        "I've been learning Portuguese on Duolingo for three months to talk to Tiago's family.",
    ),
    ("assistant", "Three months in is when it starts to click. Keep the streak going."),
    (
        "user",
        "Money is tight this year because Sam and I are saving for a down payment on a house.",
    ),
    ("assistant", "Understood; I'll keep suggestions budget-friendly."),
    ("user", "I'm vegetarian during the week but I eat fish on weekends."),
    ("assistant", "Flexitarian with a fish weekend, got it."),
    ("user", "Someday I'd love to take a sabbatical and do a ceramics course in Japan."),
    ("assistant", "That's a beautiful long-term dream. Mashiko and Shigaraki are famous for it."),
    (
        "user",
        "This school year I'm teaching two AP Chemistry sections. School starts September 3rd.",
    ),
    ("assistant", "Two AP sections is a full load. I can help you plan units when you like."),
]

# The conversation: (what the user says, what the fake model answers).
TURNS = [
    (
        "Morning! I've got a free Saturday for once and I want to plan the next few months "
        "properly. Can you help me think it through?",
        "Good morning, Dana. Happy to. Let's take it area by area so nothing gets lost: the "
        "wedding trip, your running, money for the house, school, and anything at home. For "
        "each one we can note the next concrete step and a date. Where would you like to "
        "start? If you're not sure, the wedding is usually the best first pick, because "
        "flights and time off have the longest lead times and affect the budget.",
    ),
    (
        "Let's start with Leah's wedding. It's in Sintra on June 14th. I'm thinking of flying "
        "out a week early to help her. Is that too much time off?",
        "A week before plus a few days after is about ten school days if the trip falls in term "
        "time, so check your district's calendar first: mid-June may already be summer break "
        "in Portland, which would make a week early easy. If it isn't, three or four days "
        "before is usually enough to help with the final errands. Ask Leah which tasks she "
        "actually wants help with; that tells you whether you're needed for a week or for a "
        "long weekend.",
    ),
    (
        "Flights from Portland to Lisbon are about $1,100 round trip right now. Should I book "
        "now or wait?",
        "For summer transatlantic flights, prices more often rise than fall from about four "
        "months out, so $1,100 for June is a fair price to lock in, though that's an estimate "
        "based on typical patterns, not a guarantee. A middle path: set a fare alert for a "
        "week or two, and book if it goes above $1,150 or once you've confirmed your dates "
        "with school. Check whether the fare allows changes for a fee; that flexibility is "
        "worth more than a small saving.",
    ),
    (
        "Sam might not be able to come because of his rotation at the hospital. I'm a bit sad "
        "about that, honestly.",
        "That's understandable; it's a big family moment and you'd want him there. It may be "
        "worth Sam asking now, since ER rotations are often set a few months ahead and swaps "
        "are easier to arrange early. If it really can't work, you could plan something "
        "small for the two of you around the wedding, like a video call during the reception "
        "or a weekend away when you're back, so he still feels part of it.",
    ),
    (
        "OK, different topic. My long run last weekend was 10 miles and my knee held up, but "
        "I felt wrecked afterwards.",
        "Ten miles with a happy knee is real progress. Feeling wrecked usually points to pace, "
        "fuelling or sleep rather than fitness alone. Try running the long run a minute per "
        "mile slower than your usual pace, take some carbohydrate after about 45 minutes, and "
        "keep the day before easy. If the fatigue lingers for more than a day or two, cut "
        "next week's long run back to eight miles before building again.",
    ),
    (
        "What should I eat the night before a long run? Keep in mind I mostly don't eat meat.",
        "Something familiar, carbohydrate-rich and not too heavy, eaten two to three hours "
        "before bed. A few options: pasta with tomato sauce and white beans, a rice bowl with "
        "tofu and roasted vegetables, or a baked potato with cheese and a side of soup. Go "
        "easy on fibre and very fatty food that night. If the run falls on a weekend, a "
        "piece of salmon with rice works too. Have a glass of water with dinner and another "
        "before you sleep.",
    ),
    (
        "Also, Biscuit has started pulling on the leash whenever he sees a cyclist. Any ideas?",
        "Greyhounds are wired to chase fast movement, so this is instinct, not bad manners. "
        "Work at a distance where he notices cyclists but can still take a treat: when a "
        "bike appears, mark it and feed him, so bikes start to predict food. Over a few "
        "weeks, shrink the distance gradually. A front-clip harness reduces pulling while "
        "you train. If he's too aroused to eat, you're too close; step back and try again.",
    ),
    (
        "Back to money: we've got about $38,000 saved for the house and want to reach $60,000 "
        "by next summer. Is that realistic if we put away $1,500 a month?",
        "Let's check: you need $22,000 more. At $1,500 a month that's about 14.7 months, so "
        "mid-summer next year lands roughly on target if you start now and nothing "
        "interrupts it. If 'next summer' means June, you'd be around $3,000 short, which "
        "you could close with $1,750 a month or a one-off amount such as a tax refund. A "
        "high-yield savings account would add a few hundred dollars of interest over the "
        "period.",
    ),
    (
        "The wedding trip will eat into that though. Maybe $3,000 all in. Should I just accept it?",
        "It's a reasonable trade: it's your sister's wedding, and $3,000 is about two months "
        "of saving. You could keep the house timeline intact by saving for the trip "
        "separately, for example $300 a month from now until June, and trimming elsewhere. "
        "Or accept that the house target moves by about two months. Either is fine; the "
        "important thing is choosing deliberately rather than letting the trip quietly "
        "drain the house fund.",
    ),
    (
        "I need a gift for Leah and Tiago. They love cooking and hiking. Budget around $200.",
        "A few ideas around $200: a good carbon-steel or enamelled cast-iron pan with a "
        "handwritten recipe from your family, a cooking class for two in Lisbon, a pair of "
        "quality trail guides plus a nice picnic set for hikes in Sintra, or an experience "
        "like a guided hike in the Peneda-Geres national park. Experiences travel better "
        "than heavy cookware, since you'll be flying with it.",
    ),
    (
        "Ooh, a pottery class for two could be a nice idea actually, since I love ceramics too. "
        "Can I find one in Lisbon?",
        "Yes, Lisbon has several studios that run one-off wheel-throwing sessions for couples, "
        "typically two to three hours, with the pieces fired and ready to collect a few weeks "
        "later. Prices are often in the range of 60 to 90 euros per person, so it fits your "
        "budget with room for a small extra. Book a date after the honeymoon so they can "
        "collect their pieces, and check whether the studio offers gift vouchers.",
    ),
    (
        "School stuff now: I want to redo my first AP Chemistry unit on stoichiometry. Students "
        "found it dry last year.",
        "Stoichiometry comes alive when students predict and then measure. Open with a "
        "question they can't answer yet, such as how much gas a reaction will make, and "
        "let the unit be the way to answer it. Mix short worked examples with quick labs, "
        "use recipes as an analogy for mole ratios, and end with a challenge where groups "
        "compete to produce an exact amount of product. Keep the calculations honest: "
        "significant figures and units from day one.",
    ),
    (
        "Can you sketch a lab idea that uses baking soda and vinegar but still teaches limiting "
        "reagents properly?",
        "Give each group a fixed 50 mL of vinegar and have them add 1, 2, 3, 4 and 5 grams of "
        "baking soda to separate flasks, each sealed with a balloon. They predict, using the "
        "acetic acid concentration, the mass at which vinegar becomes limiting, then measure "
        "balloon circumference or mass loss. Plotting gas produced against baking soda shows "
        "the plateau where the vinegar runs out. Finish by asking which reagent limits each "
        "flask and why the plateau sits where it does.",
    ),
    (
        "How long should I budget for that lab in a 50-minute period?",
        "Plan for the whole period. Roughly: 8 minutes for the prediction and setup, 15 "
        "minutes for the five trials, 10 minutes for measurements and clean-up, and 12 "
        "minutes for plotting and the discussion of the plateau, leaving a few minutes of "
        "slack. If your groups are slow, pre-weigh the baking soda in labelled cups; it "
        "saves almost ten minutes and keeps the focus on the reasoning.",
    ),
    (
        "I'm also nervous about a parent meeting next week. A dad complained that I grade too "
        "harshly. How do I prepare?",
        "Bring evidence and a calm plan. Print the rubric, two or three of the student's "
        "graded pieces with your comments, and the class grade distribution so the dad can "
        "see the standard is the same for everyone. Start by asking what worries him, listen "
        "fully, then walk through one example. Offer something concrete, like a retake "
        "policy or a check-in in three weeks. If you expect it to be tense, ask a colleague "
        "or administrator to sit in.",
    ),
    (
        "Thanks. On a lighter note, my Portuguese is improving. How do I say 'congratulations "
        "on your wedding' to Tiago's grandmother?",
        "You could say: 'Muitos parabéns pelo casamento!' To be a little more formal and warm "
        "with a grandmother, try 'Muitos parabéns pelo casamento, e muito obrigada por me "
        "receberem.' That adds 'and thank you so much for welcoming me', with 'obrigada' "
        "because you're a woman speaking. Portuguese families usually appreciate the effort "
        "a lot, even if your pronunciation isn't perfect.",
    ),
    (
        "What's a polite way to introduce myself to his family at the rehearsal dinner?",
        "Keep it simple and warm: 'Boa noite, eu sou a Dana, irmã da Leah. É um prazer "
        "conhecê-los.' That's 'Good evening, I'm Dana, Leah's sister. It's a pleasure to meet "
        "you.' Greet older relatives first, expect two kisses on the cheek from most people, "
        "and don't worry if the conversation switches to English after a minute; the effort "
        "is what people remember.",
    ),
    (
        "Can you remind me what I said about my training goals? I want to put it all in a "
        "calendar.",
        "From what you've told me: your goal is the Portland half marathon in October, you "
        "started running in January, your longest run so far was 10 miles last weekend, and "
        "your left knee has ached after runs longer than about eight miles, although it held "
        "up this time. For the calendar, I'd suggest one long run each weekend, building by "
        "no more than a mile a week, with a lighter week every fourth week.",
    ),
    (
        "Let's build a rough weekly plan for September: school starts, long runs on Sundays, "
        "and Sam's night shifts.",
        "A sketch for a typical September week:\n- Monday: school; easy 3-mile run after work\n"
        "- Tuesday: school; lab prep in the evening\n- Wednesday: school; rest day, dinner "
        "with Sam before his shift\n- Thursday: school; 4 miles with strides\n- Friday: school;"
        " grading block 4 to 6 pm\n- Saturday: errands, Biscuit training walk, fish dinner\n"
        "- Sunday: long run in the morning, meal prep for the week\nAdjust the rest day to "
        "whichever evening Sam is home.",
    ),
    (
        "Great. Last thing: summarise the to-do list from today so I can paste it into my notes.",
        "Today's to-do list:\n- Check the district calendar for mid-June, then confirm "
        "wedding dates with Leah\n- Set a fare alert for Portland to Lisbon; book under "
        "$1,150\n- Ask Sam to request his June rotation now\n- Slow the long-run pace; try "
        "the pre-run dinners\n- Start cyclist training with Biscuit; buy a front-clip "
        "harness\n- Decide: separate $300 a month for the trip, or move the house target\n"
        "- Book a Lisbon pottery class voucher for Leah and Tiago\n- Redesign the "
        "stoichiometry unit and the limiting-reagent lab\n- Prepare the rubric and examples "
        "for the parent meeting",
    ),
]

# -- tokens and rendering -------------------------------------------------------------------

# The GPT-4-family pre-tokenizer split (cl100k_base's pattern without \p classes):
# contractions, letter runs with one optional leading non-letter, digit runs of 1-3,
# punctuation runs with an optional leading space, line breaks, other whitespace.
_TOKEN = re.compile(
    r"<\|im_(?:start|end)\|>"
    r"|'(?:[sdmt]|ll|ve|re)"
    r"|[^\r\n\w]?[^\W\d_]+"
    r"|\d{1,3}"
    r"| ?[^\s\w]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+",
    re.IGNORECASE,
)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def render(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    """The prompt as a ChatML-style rendering: the tools' schemas first (as JSON), then role
    and content per message, in order."""
    head = f"<|im_start|>tools\n{json.dumps(tools)}<|im_end|>\n" if tools else ""
    return head + "".join(
        f"<|im_start|>{m.get('role')}\n{_text(m.get('content'))}<|im_end|>\n" for m in messages
    )


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- the block ------------------------------------------------------------------------------

_BLOCK = re.compile(r"<memory>\n.*?</memory>", re.S)
_ITEM = re.compile(r"^- \[([^\] ]*)[^\]]*\]\s*(?:\(superseded\)\s*)?(.*)$")
_QUOTE = re.compile(r'^\s+> "(.*)" \([^()]*, ([^(), ]*)\)$')
_WHO = re.compile(r"^(?:user|assistant|note|event [^:]{1,40}|[\w .'-]{1,40}): ")


def _normal(text: str) -> str:
    return " ".join(html.unescape(text).split()).casefold()


def block_of(messages: list[dict[str, Any]]) -> tuple[str | None, list[str]]:
    """(the memory block, the request's texts without it)."""
    block = None
    texts = []
    for m in messages:
        content = _text(m.get("content"))
        found = _BLOCK.search(content)
        if found is not None:
            block = found.group(0)
            content = content[: found.start()] + content[found.end() :]
        texts.append(_normal(content))
    return block, texts


def item_texts(block: str) -> list[tuple[str, str]]:
    """(text, day) of the block's item lines (items and quotes): the stored text un-escaped,
    a cut line without its ``…``; the day the line is dated."""
    out = []
    for line in block.splitlines():
        item = _ITEM.match(line)
        quote = _QUOTE.match(line)
        if item is not None:
            day, text = item.groups()
            who = _WHO.match(text)
            text = text[who.end() :] if who is not None else text
        elif quote is not None:
            text, day = quote.groups()
        else:
            continue
        out.append((_normal(text.removesuffix("…")), day))
    return out


def measure(bodies: list[dict[str, Any]], today: set[str]) -> list[dict[str, Any]]:
    """Per request: tokens, the block's tokens and lines, repeats, lines dated ``today``
    (the conversation's own turns and what was derived from them), and (n >= 2) the prefix
    shared with the previous request."""
    rows: list[dict[str, Any]] = []
    previous: list[str] | None = None
    previous_block = 0
    for n, body in enumerate(bodies, 1):
        messages = body["messages"]
        toks = tokens(render(messages, body.get("tools")))
        block, texts = block_of(messages)
        items = item_texts(block) if block else []
        repeats = sum(1 for t, _ in items if len(t) >= 12 and any(t in x for x in texts))
        row: dict[str, Any] = {
            "turn": n,
            "tokens": len(toks),
            "block_tokens": len(tokens(block)) if block else 0,
            "block_lines": len(items),
            "repeated_lines": repeats,
            "session_lines": sum(1 for _, day in items if day in today),
        }
        if previous is not None:
            shared = common_prefix(previous, toks)
            row["reused"] = shared
            row["reused_share"] = shared / len(previous)
            outside = len(previous) - previous_block
            row["reused_outside_block_share"] = min(shared, outside) / outside
            # What the provider bills at its cache rate: the share of this request.
            row["cached_share"] = shared / len(toks)
        rows.append(row)
        previous, previous_block = toks, row["block_tokens"]
    return rows


# -- the four runs --------------------------------------------------------------------------


def _reply(body: dict[str, Any]) -> str:
    """The scripted answer: the assistant's turn for the n-th user message."""
    n = sum(1 for m in body["messages"] if m.get("role") == "user")
    return TURNS[min(n, len(TURNS)) - 1][1]


def _earlier_memory(path: str, embedder: str) -> None:
    """The user's earlier session, a week before, processed offline."""
    start = datetime.now(timezone.utc) - timedelta(days=7)
    with Memory(f"sqlite:///{path}", embedder=embedder) as mem:
        session = mem.sessions.create(USER, session_id="first-chat")
        session.add_messages(
            [
                {"role": role, "content": text, "timestamp": start + timedelta(minutes=i)}
                for i, (role, text) in enumerate(EARLIER)
            ]
        )
        mem.wait()


@contextlib.contextmanager
def _proxy(mem: Memory, upstream: str) -> Iterator[str]:
    """The standalone proxy over ``mem`` in a uvicorn thread; yields its /v1 URL."""
    import socket

    import uvicorn

    from stratamem.proxy import create_proxy_app
    from stratamem.server import load_server_settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    settings = load_server_settings(port=port, proxy_upstream=upstream)
    config = uvicorn.Config(
        create_proxy_app(mem, settings),
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="proxy", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        if time.monotonic() > deadline:
            raise SystemExit("the proxy did not start")
        time.sleep(0.05)
    try:
        yield f"{url}/v1"
    finally:
        server.should_exit = True
        thread.join(30)


def converse(
    server: FakeOpenAIServer, base: str, tmp: str, via: str, injection: str, args: Any
) -> list[dict[str, Any]]:
    """The conversation through ``via`` ("capture" or "proxy"); the bodies the fake got."""
    path = f"{tmp}/{via}-{injection}.db"
    shutil.copy(base, path)
    mem = Memory(
        f"sqlite:///{path}",
        embedder=args.embedder,
        capture_injection=injection,
        capture_recall_timeout_ms=2000,
    )
    server.requests.clear()
    try:
        with contextlib.ExitStack() as stack:
            if via == "capture":
                client = mem.llm.register(openai.OpenAI(base_url=server.base_url, api_key="k"))
                stack.enter_context(mem.scope(user_id=USER, session_id=SESSION))
            else:
                url = stack.enter_context(_proxy(mem, server.origin))
                headers = {"X-Stratamem-User-Id": USER, "X-Stratamem-Session-Id": SESSION}
                client = openai.OpenAI(base_url=url, api_key="k", default_headers=headers)
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
            for user_text, _ in TURNS[: args.turns]:
                messages.append({"role": "user", "content": user_text})
                extra = {"tools": TOOLS[: args.tools]} if args.tools else {}
                answer = client.chat.completions.create(model=MODEL, messages=messages, **extra)
                messages.append({"role": "assistant", "content": answer.choices[0].message.content})
                # The user reads and types: the exchange is stored and processed meanwhile.
                mem.llm.flush(30)
                mem.wait()
    finally:
        mem.close()
    return [body for body in server.chat_requests() if isinstance(body, dict)]


def _comparable(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A request's messages with each block's lines in sorted order: two runs store the
    same items at different instants and with other ids, so items of one day may swap
    places between runs (recall orders them by time, then id)."""
    out = []
    for m in messages:
        content = _BLOCK.sub(
            lambda b: "\n".join(sorted(b.group(0).splitlines())), _text(m.get("content"))
        )
        out.append((str(m.get("role")), content))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    later = [r for r in rows if "reused_share" in r]
    with_block = [r for r in rows if r["block_tokens"]]
    lines = sum(r["block_lines"] for r in rows)
    repeats = sum(r["repeated_lines"] for r in rows)
    session = sum(r["session_lines"] for r in rows)
    return {
        "reused_mean": _mean([r["reused_share"] for r in later]),
        "reused_mean_first_7": _mean([r["reused_share"] for r in later[:7]]),
        "reused_min": min((r["reused_share"] for r in later), default=float("nan")),
        "reused_last": later[-1]["reused_share"] if later else float("nan"),
        "reused_outside_block_mean": _mean([r["reused_outside_block_share"] for r in later]),
        "cached_mean": _mean([r["cached_share"] for r in later]),
        "requests": len(rows),
        "requests_with_block": len(with_block),
        "block_tokens_mean": _mean([r["block_tokens"] for r in with_block]),
        "block_lines_mean": _mean([r["block_lines"] for r in with_block]),
        "repeated_lines_mean": _mean([r["repeated_lines"] for r in with_block]),
        "repeated_share": repeats / lines if lines else float("nan"),
        "session_lines_mean": _mean([r["session_lines"] for r in with_block]),
        "session_share": session / lines if lines else float("nan"),
        "last_request_tokens": rows[-1]["tokens"] if rows else 0,
    }


def _print_run(label: str, rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    print(f"\n{label}")
    print("  turn  tokens  block  lines  repeated  today  reused from n-1  (outside its block)")
    for r in rows:
        reused = (
            f"{r['reused']:6d} {r['reused_share']:6.1%}  ({r['reused_outside_block_share']:6.1%})"
            if "reused" in r
            else "     -"
        )
        print(
            f"  {r['turn']:4d}  {r['tokens']:6d}  {r['block_tokens']:5d}  {r['block_lines']:5d}"
            f"  {r['repeated_lines']:8d}  {r['session_lines']:5d}  {reused}"
        )
    print(
        f"  mean reused {s['reused_mean']:.1%} (turns 2-8: {s['reused_mean_first_7']:.1%}, "
        f"min {s['reused_min']:.1%}, last {s['reused_last']:.1%}; outside the previous "
        f"block {s['reused_outside_block_mean']:.1%}); block {s['block_tokens_mean']:.0f} "
        f"tokens, {s['block_lines_mean']:.1f} lines, {s['repeated_lines_mean']:.1f} repeating "
        f"the request ({s['repeated_share']:.0%}), {s['session_lines_mean']:.1f} dated today "
        f"({s['session_share']:.0%}); {s['requests_with_block']} of {s['requests']} requests "
        "with a block"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--turns", type=int, default=len(TURNS), help=f"at most {len(TURNS)}")
    p.add_argument("--embedder", default="local")
    p.add_argument(
        "--tools", type=int, default=0, help=f"send the first N of {len(TOOLS)} tool schemas"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.turns = max(2, min(args.turns, len(TURNS)))
    info = machine_info()
    print(
        f"stratamem prefix stability: engine {engine_version()}, {args.turns} turns, system "
        f"prompt {len(tokens(SYSTEM_PROMPT))} tokens, tools "
        f"{len(tokens(json.dumps(TOOLS[: args.tools]))) if args.tools else 0} tokens, "
        f"earlier session {len(EARLIER)} "
        f"messages, embedder {args.embedder}; tokens: the cl100k pre-tokenizer split"
    )
    results: dict[str, Any] = {"machine": info}
    sent: dict[str, list[Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIServer() as server:
        server.chat_script = _reply
        base = f"{tmp}/base.db"
        _earlier_memory(base, args.embedder)
        with sqlite3.connect(base) as db:  # one file: the copies must not need the WAL
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for via in ("capture", "proxy"):
            for injection in ("user", "system"):
                start = datetime.now(timezone.utc).date().isoformat()
                bodies = converse(server, base, tmp, via, injection, args)
                sent[f"{via}/{injection}"] = [b["messages"] for b in bodies]
                rows = measure(bodies, {start, datetime.now(timezone.utc).date().isoformat()})
                s = summarise(rows)
                results[f"{via}/{injection}"] = {"summary": s, "turns": rows}
                _print_run(f"{via}, injection={injection!r}", rows, s)
    for injection in ("user", "system"):
        capture, proxy = sent[f"capture/{injection}"], sent[f"proxy/{injection}"]
        same = [_comparable(m) for m in capture] == [_comparable(m) for m in proxy]
        results[f"proxy_equals_capture/{injection}"] = same
        print(
            f"\ninjection={injection!r}: the proxy's messages equal capture's (a block's "
            f"items of one instant in any order): {same}"
        )
    print("\nsummary: share of the previous request's tokens a prefix cache could reuse")
    for key, r in results.items():
        if not isinstance(r, dict) or "summary" not in r:
            continue
        s = r["summary"]
        judged = ""
        if key.endswith("/user"):
            judged = "  target mean >= 90%: " + ("PASS" if s["reused_mean"] >= 0.9 else "MISS")
        print(
            f"  {key:16s} mean {s['reused_mean']:6.1%}  turns 2-8 {s['reused_mean_first_7']:6.1%}"
            f"  last {s['reused_last']:6.1%}  cached share of each request "
            f"{s['cached_mean']:6.1%}  block {s['block_tokens_mean']:4.0f} tokens, "
            f"{s['repeated_lines_mean']:.1f} of {s['block_lines_mean']:.1f} lines repeat "
            f"the request, {s['session_lines_mean']:.1f} dated today{judged}"
        )
    if args.json:
        emit_json("prefix", results)


if __name__ == "__main__":
    main()

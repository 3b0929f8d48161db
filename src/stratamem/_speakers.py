"""Who said a turn, when the caller wrote it into the content instead of ``name``.

Group chats and transcripts are often sent with every turn ``role: "user"``, no ``name``,
and the speaker at the start of the content: ``"Caroline: I went to the support group"``.
Recall and the write path use a turn's speaker (the speaker signal, names kept out of full
text, labels in ``formatted_context``), so such a turn gets its speaker from that prefix:
``speaker_prefix`` finds it, ``without_speaker`` drops it from the text where the speaker
is already said apart (the full-text index, a rendered line).

Being wrong costs more than missing one: a false speaker ("Note", "Monday") would take that
word out of the full-text side of every query that uses it. So a prefix counts only when it
looks like a person's name written as one: at the very start of the content, one or two
words each starting with a capital letter besides a title (any cased script: "José", "Zoë",
"Łukasz", "Анна", "Mary Ann", "Dr. Jane Smith"; lower-case particles such as "van" or "da"
between them; three capitalised words are mostly a title-cased heading), at most 40
characters, then a colon and a space, then text. Not counted: a word written all in
capitals ("TODO", "NOTE"), the labels of notes, e-mail headers, lists and forms ("Note",
"Correction", "Re", "Subject", "Step", "Monday", "Breakfast" ... ``_NOT_SPEAKERS``), a URL
or a time (no space after the colon), and labels in scripts without letter case (Chinese,
Japanese: a label there cannot be told from a heading such as 注意：).

Role labels ("User:", "Assistant:", "AI:", "Human:") name a role, not a person: they are
found (``Prefix.role``) but give no name; the write path already reads them as roles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ROLE_LABELS", "Prefix", "speaker_of", "speaker_prefix", "without_speaker"]

MAX_CHARS = 40

# Labels that name a role of the conversation rather than a person.
ROLE_LABELS = frozenset(
    "user assistant human ai bot system me model developer tool function chatbot".split()  # noqa: SIM905
)

# Capitalised words that start labelled lines but are not speakers: notes and markers,
# e-mail and form fields, list headings, days and months, meals.
_NOT_SPEAKERS = frozenset(
    """
    note notes nb ps p.s. fyi todo to-do done re fwd fw cc bcc subject from to sent date
    time when where who what why how which location place address phone tel email e-mail
    mail url link links website web source sources ref reference references tag tags status
    priority update updates edit edited correction corrections reminder reminders warning
    caution error errors info important tip tips hint question questions answer answers
    step steps example examples summary tl;dr tldr result results output input ingredients
    recipe goal goals plan plans task tasks agenda topic topics context background
    description details detail reason reasons name age title category type total price cost
    option options item items point points part section chapter day week month year today
    tonight tomorrow yesterday morning afternoon evening night breakfast lunch dinner snack
    monday tuesday wednesday thursday friday saturday sunday january february march april
    may june july august september october november december spring summer autumn fall
    winter pros cons yes no ok okay also and but so then first second third next last
    finally fix bug feature issue problem solution idea ideas conclusion
    disclaimer hello hi hey dear thanks p.p.s. q a list lists meeting action key i we you my
    our your his her their the this that these those it remember directions direction
    translation translate role instructions instruction prompt text message quote scenario
    character setting format rules rule persona query request response reply story poem
    lyrics song chorus verse bridge intro outro hook title headline caption noted sure great
    understood confirmed absolutely certainly perfect awesome cool nice wow oops sorry welcome
    congrats congratulations spoiler bonus caveat fun fact facts pro verdict rating score
    mood weather content overview outline appendix approach aim study brief project offer
    """.split()  # noqa: SIM905
)

# Titles before a name: not counted among its words ("Dr. Jane Smith").
_TITLES = frozenset("mr mr. mrs mrs. ms ms. dr dr. prof prof. sir dame".split())  # noqa: SIM905

# Lower-case words that may join the capitalised words of one name.
_PARTICLES = frozenset("da de del della der di du dos van von la le bin al ibn ter".split())  # noqa: SIM905

# One word of a name: a capital, then letters, with inner apostrophes or hyphens ("O'Brien",
# "Jean-Luc") and an optional final period ("Dr.").
_WORD = r"[^\W\d_][^\W\d_]*(?:['’\-][^\W\d_]+)*\.?"
_PREFIX = re.compile(rf"\s{{0,3}}(?P<who>{_WORD}(?:[ \t]{_WORD}){{0,4}})[ \t]?:[ \t]+(?=\S)")


@dataclass(frozen=True)
class Prefix:
    """A speaker label at the start of a content: the label, whether it names a role, and
    where the text after it begins."""

    label: str
    role: bool
    end: int


def speaker_prefix(content: str) -> Prefix | None:
    """The speaker label that starts ``content`` ("Caroline: ..."), or None."""
    m = _PREFIX.match(content)
    if m is None:
        return None
    label = m.group("who")
    words = label.split()
    if words[0].casefold() in ROLE_LABELS and len(words) == 1:
        return Prefix(label, True, m.end())
    if len(label) > MAX_CHARS:
        return None
    # Any word: "Next Steps:", "Meeting Notes:", "Shopping List:" are headings too.
    if any(
        w.casefold() in _NOT_SPEAKERS or w.casefold().rstrip(".") in _NOT_SPEAKERS for w in words
    ):
        return None
    capitalised = 0
    for word in words:
        if word in _PARTICLES and capitalised > 0:
            continue
        letters = [c for c in word if c.isalpha()]
        if not letters[0].isupper():
            return None  # a lower-case word or an uncased script (CJK)
        if len(letters) > 1 and all(c.isupper() for c in letters):
            return None  # "TODO", "NOTE", "FAQ": a marker or an acronym, not a name
        if re.search(r"[a-z](?:Error|Exception|Warning)$", word):
            return None  # "ValueError: ...": a traceback
        if word.casefold() not in _TITLES:
            capitalised += 1
    # Two words make a full name; three capitalised words are mostly a title-cased heading
    # ("Professional Lyric Video: ...").
    if not 1 <= capitalised <= 2 or words[-1] in _PARTICLES:
        return None
    return Prefix(label, False, m.end())


def speaker_of(content: str) -> str | None:
    """The person's name that starts ``content`` as a speaker label, or None (no label, or
    a role label such as "User:")."""
    found = speaker_prefix(content)
    return None if found is None or found.role else found.label


def without_speaker(content: str, name: str | None) -> str:
    """``content`` without a leading ``"{name}: "``: where the speaker is said apart (a
    rendered line's label, the name kept out of full text), the prefix would say it twice."""
    if not name:
        return content
    found = speaker_prefix(content)
    if found is None or found.label.casefold() != name.casefold():
        return content
    return content[found.end :]

"""The offline write path: facts, topics and correction cues without any LLM.

Without a model configured stratamem must still build useful memory (docs/pipeline.md), so this
module turns messages into grounded sentence-level facts with plain rules. Everything here
is pure and deterministic: the same batch always gives the same drafts, and a fact never
says more than its message did. Only wording changes: the first person becomes the
speaker - the message's ``name`` when it reads as a person's name (``speaker_name``), else
"User" - and relative dates get their absolute date appended (see ``_dates``).

Facts come from the user's turns and from every named participant's (a message with a
``name``, in any chat role: a group chat or a transcript sends the other people as named
assistant turns); each speaks for themselves. An unnamed assistant: see below.

Rules, in the order they apply to such a turn (notes and behaviour events: see below):

1. Split into sentences: ``. ! ?`` followed by a space (not after "Dr.", "e.g.", ...),
   Chinese ``。！？`` and line breaks.
2. Questions are dropped (ending in "?"/"？", starting like "can you ..." / "what is ...",
   or Chinese ending in 吗/呢) - a question is not a fact about the user. One exception,
   kept simple: "can you remind me / remember (that) <first-person clause>?" keeps that
   clause ("Can you remind me I'm allergic to nuts?" -> "User is allergic to nuts").
3. Leading discourse markers are stripped ("By the way,", "Oh and", "Actually,",
   "Correction:", "Remember that", 对了, 其实, ...); "by the way" inside is dropped too.
   A correction marker (correction, update, actually, scratch that, 其实, 更正), or an
   in-sentence "no longer / not anymore / instead / 不再 / 改成", labels the fact
   ``correction``.
   A turn label left at the start ("assistant:", "System:", "AI:", 助手：) puts the words in
   another speaker's mouth: the sentence is not the user's and is dropped, so no fact reads
   like another role's line; the user's own label ("user:", "me:", 用户：) is stripped.
4. Greetings, thanks and filler ("Hi!", "Thanks so much", "Pretty well.", "I see",
   "好的") are dropped; so is small talk in English (``_small_talk``): a sentence addressed
   to the listener (second person outside quotes), a reaction to what they said ("I totally
   agree", "I'm so happy for you"), an offer or request turned to them ("Let me know",
   "Check out my ...", "Here's ..."), leaving ("I'm off to ...", "Talk soon"), or one with
   no word to be about besides the speaker ("I bet.") - unless it is a standing
   instruction.
5. A sentence is kept when it speaks about the user: first person (I, me, my, we, us,
   our; Chinese 我/我们), a standing instruction ("please don't suggest steak houses",
   "never book early flights", "keep answers short", 请不要...: ``_standing``), a
   subject-less past report ("Finished the half marathon"), or a correction marker (it
   corrects something the user said before).
6. Rewrite (shown for "User"; a named speaker's name takes its place): I -> "User" (verb
   agreement: "I cycle" -> "User cycles"; "my sister and I've" -> "... and User have";
   "I myself", "I sort of" skipped), my/our/mine -> "User's" (once "User" was named:
   "their"), me -> "User" (then "them"), we/us -> "User and others" (then "they"/"them"),
   "the two of us" -> "User and one other person", instructions -> "User asks not to
   ...", 我 -> 用户 (or the name), 我们 -> 用户等人. An "'s" before my/our/your is "is"
   ("Blue's my fave" -> "Blue is User's fave", never a chain of possessives), and quoted
   speech keeps its own pronouns. "I'm Jon" said by Jon gives nothing.
7. Kind: a standing instruction or preference of the user's own (``_standing``: not a
   named participant's) is ``instruction``, ``preference`` or ``constraint``, marked
   standing with its scope ("Always give me a code example when I ask about async error
   handling": scope "async error handling"; "I'm vegetarian": every request); an
   instruction reads "User asks to ..." and its "you" is "the assistant". Otherwise the
   first cue that matches: constraint (allergic, can't, never, vegetarian, budget,
   ...), plan (will, going to, planning, want to, or a date in the future), preference
   (like, love, prefer, hate, ..., or a standing instruction), identity (I'm a <role>,
   my name is, I live in, I work at/as, I'm from, "I'm Alex", I moved to <place> - but
   "moved" with a date is an event), event (went, visited, finished, moved, ... or a date
   in the past), else fact.
8. Confidence 0.9, or 0.6 when hedged (maybe, probably, I think, might, 可能, 也许, ...).

An unnamed assistant's statements are kept only when the user confirms them: a sentence
addressed to the user ("Your flight is on May 3", also as a tag question "..., right?")
followed, as the next message of the same session, by a user message that starts with
yes / right / correct / exactly / that's right / 对 / 是的 / 没错 and carries no "but / not /
actually" -> a fact citing both messages (confidence 0.8, label ``confirmed``).

Memory notes (``event_type`` ``"memory"``, ``types.NOTE_EVENT``: something to remember said
outright, e.g. by an agent's ``add_memory``) are taken as they stand: every sentence of a
user's note is a fact. Rules 1-4 and 6 apply (questions and filler dropped, markers
stripped, first person rewritten), rule 5 does not: a note need not speak in the first
person ("User prefers tea over coffee.", "Prefers window seats." are kept as written). The
kind is read with rule 7's first-person cues as if the note said "I" ("User lives in
Berlin" is ``identity``), confidence as in rule 8. Labels: ``note``, and ``correction`` when
a marker says so or the note names the summary it corrects (``metadata[types.CORRECTS]``).
A note in another role's name gives no fact, and a note is never a behaviour event.

Behaviour events (other ``event_type``s) become one ``behaviour`` fact per group: same type
and same normalised content, counted ("searched for "x" 3 times"). Groups of the same type
and page whose contents share most of their words (related searches) are merged into one
fact listing each content, so a user refining a search gives one memory, not five.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ..store import MessageRow
from ..store._text import _CJK, _CJK_RUN, _STOPWORDS, _TOKEN, fts_query_terms
from ..types import CORRECTS, event_key, is_note_event
from ._dates import DateSpan, resolve_dates
from ._drafts import MAX_FACT_CHARS, FactDraft
from ._standing import Standing, standing

__all__ = [
    "USER",
    "correction_target",
    "extract_facts",
    "is_correction",
    "is_note",
    "replaces",
    "speaker_name",
    "split_sentences",
    "topic_for",
]

DIRECT_CONFIDENCE = 0.9
HEDGED_CONFIDENCE = 0.6
CONFIRMED_CONFIDENCE = 0.8  # the assistant's wording, only endorsed by the user
BEHAVIOUR_CONFIDENCE = 0.9
USER = "User"  # who a fact is about when its message names no speaker

_I = re.IGNORECASE

# --------------------------------------------------------------------------- sentences

_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|[。！？]+[”’」』）)]*|\n+")
_ABBREVIATION = re.compile(
    r"(?:\b(?:mr|mrs|ms|dr|prof|st|jr|sr|vs|etc|e\.g|i\.e|approx|ca|sept?|jan|feb|mar|apr"
    r"|jun|jul|aug|oct|nov|dec)|\b[A-HJ-Z])$",
    _I,
)


def split_sentences(text: str) -> list[str]:
    """Sentences of a message: English ``. ! ?`` (not after an abbreviation), ``。！？``."""
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if m.group() == "." and _ABBREVIATION.search(text[start : m.start()]):
            continue  # "Dr. Smith", "e.g. sushi": not the end of a sentence
        piece = text[start : m.end()].strip()
        if piece:
            out.append(piece)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def _is_chinese(text: str) -> bool:
    cjk = sum(len(r) for r in _CJK_RUN.findall(text))
    latin = len(re.findall(r"[A-Za-z]", text))
    return cjk > 0 and cjk >= latin


# --------------------------------------------------------------------------- cues

_QUESTION_START = re.compile(
    r"^(?:(?:what|where|when|why|how|who|which|whose)\s+(?:is|are|was|were|do|does|did|can"
    r"|could|should|would|will|shall|am|about|much|many|long|often|far)\b"
    r"|(?:can|could|would|will|do|does|did|is|are|should|shall|may|might|am|have|has)\s+"
    r"(?:you|i|we|it|there|they|he|she|this|that|my|your)\b)",
    _I,
)
_ZH_QUESTION_END = re.compile(r"[吗呢么][。？?！!]*$")
# "Can you remind me I'm allergic to nuts?" contains a statement about the user.
_EMBEDDED = re.compile(
    r"\b(?:remind\s+(?:me|you|everyone)|remember|note|keep\s+in\s+mind|don'?t\s+forget)\s+"
    r"(?:that\s+)?(?P<rest>(?:i|i'm|i’m|i've|i'd|i'll|my|we|we're|our)\b.*)$",
    _I,
)
_ZH_EMBEDDED = re.compile(r"(?:记住|提醒(?:一下)?|别忘了)(?P<rest>我.*)$")

_CORRECTION_LEAD = (
    r"correction\s*[:,\-–—]?\s*",
    r"update\s*[:\-–—]\s*",
    r"actually\s*[,:]?\s*",
    r"scratch\s+that\s*[,.:;!]?\s*",
    r"(?:sorry|oops)\s*,\s*i\s+meant\s*:?\s*",
)
_OTHER_LEAD = (
    r"by\s+the\s+way\s*[,:]?\s*",
    r"btw\s*[,:]?\s*",
    r"oh\s+and\s*,?\s*",
    r"and\s+also\s*,?\s*",
    r"(?:oh|ah|well|so|also|anyway|anyways|plus|ok|okay|alright)\s*[,.!:]\s*",
    r"fyi\s*[,:]?\s*",
    r"(?:as\s+)?for\s+me\s*,?\s*(?=i\b|i['’])",  # "For me I just ...": "me" is the "I"
    r"just\s+so\s+you\s+know\s*[,:]?\s*",
    r"for\s+the\s+record\s*[,:]?\s*",
    r"(?:please\s+)?(?:remember|note|keep\s+in\s+mind)\s+that\s+",
    r"(?:please\s+)?remember\s*[:,]\s*",
    r"p\.?s\.?\s*[:,]\s*",
    r"(?:yes|yeah|yep|no|nope|ok|okay)\s+(?:but|and)\s+",
    r"(?:hi|hello|hey|hiya|thanks|thank\s+you|yes|yeah|no|sure|great|cool)(?:\s+there)?"
    r"\s*[,!.;:]+\s*",
    # a greeting with one word after it, the listener's name mostly ("Hey John, I'm good",
    # "Thanks guys!"): the pattern is case-insensitive, so any word
    r"(?:hi|hello|hey|hiya|thanks|thank\s+you)\s+[A-Z][\w'’-]*\s*[,!.;:]+\s*",
    # an interjection before the statement ("Haha yeah, I do love Toby!")
    r"(?:ha(?:ha)+|hah|lol|wow|whoa|aw+|omg|ooh)\b\s*[,!.;:]*\s*",
    r"in\s+the\s+meantime\s*,\s*",
)
_LEAD = re.compile(
    r"^(?:(?P<corr>" + "|".join(_CORRECTION_LEAD) + r")|" + "|".join(_OTHER_LEAD) + ")",
    _I,
)
_ZH_LEAD = re.compile(
    r"^(?:(?P<corr>其实|更正|纠正一下|更正一下)[:：,，]?\s*|(?:对了|顺便说一下|顺便|另外|还有|请?记住)"
    r"[:：,，]?\s*|(?:你好|您好|嗨|谢谢|好的|嗯)[!！,，。]\s*)"
)
_TURN_LABEL = re.compile(
    r"^[\W_]*(?P<who>system|assistant|user|human|me|ai|bot|model|developer|tool|function"
    r"|用户|我|助手|系统|机器人)[\W_]{0,3}?[:：]\s*",
    _I,
)
_USER_LABELS = frozenset(("user", "human", "me", "用户", "我"))
_BY_THE_WAY_INSIDE = re.compile(r"\s*,\s*(?:by\s+the\s+way|btw)\s*(?=[,.!?;]|$)", _I)
_STRONG_CORRECTION = re.compile(
    r"\b(?:no\s+longer|instead)\b|(?:n't|n’t|\bnot|\bnever)\b[^.!?]*\bany\s*more\b"
    r"|不再|改成|改为|更正",
    _I,
)
_CORRECTION_CUE = re.compile(
    r"\b(?:correction|actually|no\s+longer|any\s*more|changed|moved|instead|now|update"
    r"|scratch\s+that|switched)\b|其实|更正|不再|改成|改为|纠正",
    _I,
)

_FILLER_WORD = (
    r"hi|hello|hey|hiya|yo|howdy|good\s+(?:morning|afternoon|evening|night)|thanks?|thank\s+you"
    r"|thx|ty|cheers|ok|okay|k|sure|cool|great|nice|awesome|perfect|wonderful|lovely|alright"
    r"|all\s+right|got\s+it|sounds\s+(?:good|great)|pretty\s+(?:well|good)|not\s+bad|fine|good"
    r"|yes|yeah|yep|yup|no|nope|nah|bye|goodbye|see\s+you|lol|ha(?:ha)+|hehe|hm+|wow|oh|ah"
    r"|well|so|right|exactly|correct|indeed|please|you\s+too|same\s+here|i\s+see|i\s+agree"
    r"|(?:i'?m|i’m|i\s+am)\s+(?:fine|good|ok|okay|great|well|doing\s+(?:well|good|fine|great))"
    r"|i\s+understand|i\s+(?:don'?t|do\s+not)\s+know|(?:i'?m|i’m)\s+not\s+sure"
    r"|i\s+(?:think|guess|suppose)\s+so|i\s+appreciate\s+(?:it|that|this)|appreciate\s+it"
    r"|nice\s+to\s+meet\s+you|much\s+appreciated|no\s+problem|no\s+worries|there|everyone"
    r"|a\s+lot|so\s+much|very\s+much|again|man|buddy|mate|guys|all"
)
# Words must be separated, so a string has one parse and a near miss fails fast.
_FILLER = re.compile(rf"^(?:{_FILLER_WORD})(?:[\s,!.~…]+(?:{_FILLER_WORD}))*[\s,!.~…]*$", _I)
_ZH_FILLER = re.compile(
    r"^(?:(?:你好|您好|嗨|哈喽|谢谢|多谢|感谢|好的|好|嗯|哦|哈|没问题|再见|拜拜|早上好|晚上好"
    r"|晚安|对|是的|行|可以|收到|明白了?)[呀啊啦吧呢~！!。，,\s]*)+$"
)

# What a speaker says to or about the listener, or about the exchange itself, is no lasting
# fact about the speaker: such sentences are dropped from conversation turns (not from
# notes). Four categories, each checked on the sentence as said (first person):
# - addressed to the listener ("I'm here for you", "I saw your photo", "Your support means
#   a lot to me"); a standing instruction ("please don't ...") is kept, it is about the
#   speaker's wishes;
_ADDRESSED_TO_LISTENER = re.compile(
    r"\b(?:you|your|you're|you’re|you've|you’ve|you'll|you’ll|you'd|you’d|yours|yourself"
    r"|yourselves|ya)\b",
    _I,
)
# - a reaction to what the listener said ("I totally agree", "I bet", "I'm so happy for
#   you", "I can imagine", "Can't wait!", "Congrats on ...");
_REACTION = re.compile(
    r"^(?:(?:i|we)\s+(?:\w+ly\s+|so\s+|just\s+|really\s+|also\s+)*"
    r"(?:agree|bet|(?:know|understand)(?=\s*(?:[,.!?…]|$|\s+(?:right|what\s+you|how\s+you|the\s+feeling)))"
    r"|hear\s+(?:you|ya)|feel\s+(?:you|the\s+same)|get\s+(?:it|that)"
    r"|can\s+(?:imagine|relate|tell|see\s+(?:that|why|how))|appreciate|wish|mean\s+it"
    r"|(?:could\s*n['’]?t|can['’]?t|cannot)\s+agree\s+more"
    r"|can'?t\s+wait|cannot\s+wait|love\s+(?:that|this|it|how)|admire)\b"
    r"|(?:i'?m|i’m|i\s+am|we'?re|we’re|we\s+are)\s+(?:\w+ly\s+|so\s+|just\s+|really\s+|also\s+)*"
    r"(?:glad|happy\s+for|proud\s+of|thankful|grateful|sorry|touched|flattered|honou?red|with\s+you"
    r"|here\s+for|in\s+awe|impressed)\b"
    r"|(?:can'?t|cannot)\s+wait\b|congrat(?:s|ulations)\b)",
    _I,
)
# - turned to the listener: offers, requests and invitations ("Let me know", "Let me look
#   into it", "Check out my painting", "Here's my latest one", "Let's do it");
_TO_LISTENER = re.compile(
    r"^(?:let\s+me|let['’]s|let\s+us|check\s+(?:it\s+|this\s+|these\s+)?out|look\s+at"
    r"|take\s+a\s+look|here['’]s|here\s+(?:is|are)|tell\s+me\s+(?:more|all|everything)"
    r"|keep\s+me\s+(?:posted|updated|in\s+the\s+loop))\b",
    _I,
)
# - leaving the conversation ("I'm off to do some research", "Gotta go", "Talk soon").
_LEAVING = re.compile(
    r"\b(?:i['’]m|i\s+am|we['’]re|we\s+are)\s+off\b|\b(?:gotta|got\s+to|have\s+to|need\s+to)"
    r"\s+(?:go|run|head\s+out|get\s+going)\b|\btalk\s+(?:to\s+you\s+)?(?:soon|later)\b"
    r"|\btake\s+care\b|\bcatch\s+(?:you|ya)\s+later\b",
    _I,
)
# A fact needs something to be about besides its speaker: at least this many words that
# are neither stopwords nor pronouns nor the vaguest verbs ("I bet", "We can do this").
_MIN_CONTENT_WORDS = 1
_VAGUE = frozenset(
    """i i'm i've i'll i'd me my mine myself we we're we've we'll we'd us our ours ourselves
    it it's they they're them their this that these those thing things stuff lot lots
    really so very just totally definitely absolutely also still even too get got gets
    getting do does did done make makes made go goes going gonna wanna know think feel
    felt feels say said sure yeah yes oh wow haha lol""".split()  # noqa: SIM905
)


# A request to the listener, or a clause about them, closing a statement ("I'm planning a
# day with my niece and I was wondering if you could suggest ...", "I took a road trip
# while you were away"): the statement before it is the fact.
_REQUEST_TAIL = re.compile(
    r"\s*[,;:-]?\s*(?:(?:and|but|so)\s+)?(?:(?:i(?:['’]m|\s+am|\s+was)|was|am)(?:\s+also|\s+just)?\s+wondering"
    r"\s+(?:if|whether|what|how|where|when|which|why|who)"
    r"|i(?:\s+would|['’]d)\s+(?:like|love|appreciate)\s+(?:it\s+if\s+)?(?:you|your|some\s+help)"
    r"|(?:can|could|would|will)\s+you|do\s+you\s+(?:have|know)|if\s+you\s+(?:could|can|have)"
    # or a clause about the listener: "I took a road trip while you were away"
    r"|(?:while|whilst|when|since|after|before|because|as|like|just\s+like)\s+you)\b",
    _I,
)


_WANTS_OBJECT = re.compile(
    r"\b(?:love|loved|like|liked|hate|hated|enjoy|enjoyed|appreciate|appreciated|prefer"
    r"|preferred|mind|miss|missed|remember|adore)\s*$",
    _I,
)


def _without_request(body: str) -> str:
    """``body`` without a request to (or clause about) the listener closing it, when what
    precedes is a statement of the speaker's own (three words or more, first person, no
    "you")."""
    m = _REQUEST_TAIL.search(body)
    if m is None or m.start() == 0:
        return body
    head = body[: m.start()].rstrip(" ,;:-")
    if (
        len(head.split()) < 3
        # "I love when you ...": the clause is the verb's object, not a tail to cut
        or _WANTS_OBJECT.search(head)
        or not _FIRST_PERSON.search(head)
        or _ADDRESSED_TO_LISTENER.search(head)
    ):
        return body
    return head + "."


_SMALL_TALK_MAX_CHARS = 400


def is_small_talk(text: str) -> bool:
    """Whether a conversation turn is small talk as a whole: every sentence of it a
    greeting, thanks or filler, small talk by ``_small_talk``'s categories, or a social
    question ("Take care!", "Cool! What did it look like?"). One sentence with something
    to say makes it a turn with content, and so does a question about a subject ("how do I
    set up Redis for caching user sessions?": ``_asks_about_a_subject``). Read from the
    text alone, so a turn is judged when it is stored, whichever model processes it later.
    A long turn is never small talk as a whole, and is not read: this runs on every stored
    message."""
    if len(text) > _SMALL_TALK_MAX_CHARS:
        return False
    sentences = [s for s in split_sentences(text) if s.strip()]
    if not sentences:
        return False
    for sentence in sentences:
        chinese = _is_chinese(sentence)
        if _is_question(sentence, chinese):
            if chinese or not _asks_about_a_subject(_strip_lead(sentence, chinese)[0]):
                continue
            return False
        body, _ = _strip_lead(sentence, chinese)
        if not body or _is_filler(body, chinese):
            continue
        if not chinese and _small_talk(body):
            continue
        return False
    return True


# A question with at least this many content words is about a subject of its own; the
# words that make a question (contracted wh-words) and indefinite pronouns do not count.
_SUBJECT_QUESTION_WORDS = 4
_QUESTION_SCAFFOLD = frozenset(
    """what's how's where's who's when's why's which's whats hows anything something
    everything nothing anyone someone everyone anybody somebody""".split()  # noqa: SIM905
)


def _asks_about_a_subject(question: str) -> bool:
    """Whether an English question asks about a subject rather than keeping the talk going:
    not turned to the listener ("What was it like for you?", "Any plans?") and with
    ``_SUBJECT_QUESTION_WORDS`` content words or more ("what if MongoDB is running but
    still can't connect?"). In a user's chat with an assistant most follow-ups are such
    questions, and they are what later questions about the thread ask for; counting them
    as small talk took a quarter of recall away from long technical chats."""
    question = _QUOTED.sub('""', question)
    if _small_talk_turn(question):
        return False
    words = [w.lower().replace("’", "'") for w in _WORD.findall(question)]
    content = [
        w for w in words if w not in _STOPWORDS and w not in _VAGUE and w not in _QUESTION_SCAFFOLD
    ]
    return len(content) >= _SUBJECT_QUESTION_WORDS


def _small_talk_turn(body: str) -> bool:
    """Whether a sentence is turned to the listener or to the exchange itself (the four
    categories above), whatever it holds besides."""
    return bool(
        _ADDRESSED_TO_LISTENER.search(body)
        or _REACTION.match(body)
        or _TO_LISTENER.match(body)
        or _LEAVING.search(body)
    )


def _small_talk(body: str) -> bool:
    """Whether an English conversation sentence is small talk (see the categories above)."""
    body = _QUOTED.sub('""', body)  # a quote's "you" is not the listener
    if _IMPERATIVE.match(body) or _instructs(body):
        return False  # a standing instruction: "Don't suggest steak houses to me"
    if _small_talk_turn(body):
        return True
    words = [w.lower().replace("’", "'") for w in _WORD.findall(body)]
    content = [w for w in words if w not in _STOPWORDS and w not in _VAGUE]
    return len(content) < _MIN_CONTENT_WORDS


def _instructs(body: str) -> bool:
    """Whether an English sentence is a standing instruction ("Keep answers short")."""
    item = standing(body)
    return item is not None and item.kind == "instruction"


_FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|i’m|i've|i’ve|i'd|i’d|i'll|i’ll|me|my|mine|myself|we|we're|we’re|we've"
    r"|we’ve|we'll|we’ll|we'd|we’d|us|our|ours|ourselves)\b",
    _I,
)
_IMPERATIVE = re.compile(
    r"^(?:please\s+)?(?P<verb>don'?t|don’t|do\s+not|never|always|avoid|stop|no\s+more)\s+"
    # "Always here to help", "Never a dull moment": no verb follows, so no instruction.
    r"(?!(?:here|there|a|an|the|so|such|been|good|great|fun|easy)\b)(?P<rest>.+)$",
    _I,
)
_ZH_IMPERATIVE = re.compile(r"^(?:请)?(?:不要|别|千万别|不用)")
_SUBJECTLESS_PAST = re.compile(
    r"^(?P<adv>(?:just|finally|already|also)\s+)?(?P<verb>finished|went|visited|moved|started"
    r"|bought|booked|ordered|ran|completed|got|met|saw|watched|tried|made|ate|cooked|signed"
    r"|joined|quit|left|arrived|returned|passed|won|learned|learnt|flew|travelled|traveled"
    r"|attended|graduated|switched)\b(?P<rest>.*)$",
    _I,
)
_SUBJECTLESS_ING = re.compile(
    r"^(?P<verb>going|planning|hoping|heading|flying|moving|travelling|traveling|training"
    r"|working|thinking|looking)\s+(?:to|for|on|of|at)\b",
    _I,
)
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|probably|possibly|might|i\s+think|i\s+guess|i\s+believe|i\s+suppose"
    r"|not\s+sure|kind\s+of|sort\s+of)\b|可能|也许|大概|或许|好像",
    _I,
)

_CONSTRAINT = re.compile(
    r"\b(?:allergic|allergy|allergies|intolerant|intolerance|can't|can’t|cannot|can\s+not"
    r"|unable\s+to|never|must\s+not|mustn't|vegetarian|vegan|halal|kosher|gluten[- ]free"
    r"|lactose|budget|no\s+more\s+than|at\s+most)\b"
    r"|过敏|不能|不可以|素食|吃素|预算|不超过|最多|忌口|禁止|不吃",
    _I,
)
_PLAN = re.compile(
    r"\b(?:will|shall|going\s+to|gonna|planning|plan\s+to|plans\s+to|intend\s+to|want\s+to"
    r"|wanna|would\s+like\s+to|hope\s+to|hoping\s+to|about\s+to)\b|['’]ll\b|['’]d\s+like\s+to\b"
    r"|打算|计划|准备|想|将要|要去|会去",
    _I,
)
_PREFERENCE = re.compile(
    r"\b(?:like|likes|love|loves|prefer|prefers|preferred|favou?rite|hate|hates|dislike"
    r"|dislikes|enjoy|enjoys|fan\s+of|can't\s+stand|can’t\s+stand)\b"
    r"|喜欢|爱吃|爱喝|讨厌|最爱|偏好|不喜欢",
    _I,
)
_IDENTITY = re.compile(
    r"\b(?:i'?m|i’m|i\s+am)\s+(?:a|an)\s+\w+|\bmy\s+name\s+is\b|\b(?:i'?m|i’m|i\s+am)\s+called\b"
    r"|\bcall\s+me\b|\bi(?:'ve|’ve|\s+have)?\s+(?:live|lived)\s+in\b"
    r"|\b(?:i'?m|i’m|i\s+am)\s+living\s+in\b|\bi\s+(?:work|worked)\s+(?:at|as|for|in)\b"
    r"|\bmy\s+(?:flat|apartment|house|home|place)\s+is\s+in\b|\b(?:i'?m|i’m|i\s+am)\s+from\b"
    r"|\b(?:i'?m|i’m|i\s+am)\s+\d{1,3}(?:\s+years?\s+old)?\b"
    r"|我叫|我是|我住在|我来自|我的名字|我在.{1,12}工作",
    _I,
)
_IDENTITY_MOVED = re.compile(r"\bi\s+(?:just\s+|recently\s+)?moved\s+(?:to|from|here)\b|我搬到", _I)
_IDENTITY_NAME = re.compile(r"^(?:[Ii]'?m|[Ii]’m|[Ii]\s+am)\s+[A-Z][a-z]+[.!]?$")  # "I'm Alex"
_EVENT = re.compile(
    r"\b(?:went|visited|finished|completed|moved|attended|met|ran|flew|travelled|traveled"
    r"|arrived|returned|graduated|won|passed|quit|joined|started|bought|booked)\b"
    r"|去了|去过|完成了|参加了|搬到了|买了|跑了|见了",
    _I,
)

# --------------------------------------------------------------------------- rewriting

_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")
_ADVERBS = frozenset(
    """just really also still always never usually often sometimes currently now actually
    definitely totally absolutely mostly only already even rarely seriously personally
    recently finally probably certainly truly honestly generally normally no longer""".split()  # noqa: SIM905
)
_NO_CONJ = frozenset(
    """can could will would should might must may shall can't couldn't won't wouldn't
    shouldn't mustn't didn't did was used went saw ate ran flew got had made met bought took
    came left found felt knew thought told said gave began became kept lost paid sent spent
    sold slept wrote drove rode swam sang won broke chose forgot fell held heard led taught
    caught brought built understood wore woke quit set put cut hit let hurt read cannot
    and or too but""".split()  # noqa: SIM905
)
_SPECIAL_CONJ = {
    "am": "is",
    "are": "is",
    "have": "has",
    "do": "does",
    "don't": "doesn't",
    "haven't": "hasn't",
    "aren't": "isn't",
    "were": "was",
    "weren't": "wasn't",
    "be": "is",
}
_NOT_A_VERB = frozenset(
    """a an the to and or for with at in on too that this these those it them her him us me
    you my your our their his its of from by as so if when then there here""".split()  # noqa: SIM905
)


def _conjugate(verb: str) -> str:
    """The third-person singular present of ``verb`` ("cycle" -> "cycles"); past forms stay."""
    low = verb.lower().replace("’", "'")
    if low in _SPECIAL_CONJ:
        return _SPECIAL_CONJ[low]
    past = low.endswith("ed") and not low.endswith("eed")  # "moved", but "need" is present
    if low in _NO_CONJ or past or low.endswith("n't") or not low.isalpha():
        return verb
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


_NUMBER_WORDS = ("two", "three", "four", "five")
_GROUP_OF_US = re.compile(r"\b(?:the\s+)?(?P<n>both|two|three|four|five)\s+of\s+us\b", _I)

_FIRST_TABLE = {
    # pronoun -> (replacement while "User" is not yet named, replacement once it is)
    "i'm": ("User is", "User is"),
    "i've": ("User has", "User has"),
    "i'll": ("User will", "User will"),
    "i'd": ("User would", "User would"),
    "my": ("User's", "their"),
    "me": ("User", "them"),
    "mine": ("User's", "theirs"),
    "myself": ("User", "themselves"),
    "we": ("User and others", "they"),
    "we're": ("User and others are", "they are"),
    "we've": ("User and others have", "they have"),
    "we'll": ("User and others will", "they will"),
    "we'd": ("User and others would", "they would"),
    "our": ("User's", "their"),
    "ours": ("User's", "theirs"),
    "us": ("User and others", "them"),
    "ourselves": ("User and others", "themselves"),
}
_SECOND_TABLE = {
    "you're": ("User is", "User is"),
    "you've": ("User has", "User has"),
    "you'll": ("User will", "User will"),
    "you'd": ("User would", "User would"),
    "your": ("User's", "their"),
    "yours": ("User's", "theirs"),
    "yourself": ("User", "themselves"),
}


def _group_of_us(m: re.Match[str], who: str) -> str:
    n = m.group("n").lower()
    others = 1 if n == "both" else _NUMBER_WORDS.index(n) + 1
    return (
        f"{who} and one other person"
        if others == 1
        else f"{who} and {_NUMBER_WORDS[others - 2]} others"
    )


# "Blue's my fave": the "'s" before a possessive pronoun is "is" (or "has"), and once the
# pronoun is a name it would read as a chain of possessives ("Blue's Caroline's fave").
_IS_BEFORE_POSSESSIVE = re.compile(r"\b(?P<word>[A-Za-z]+)['’]s\s+(?=(?:my|our|your)\b)", _I)


def _expand_is(m: re.Match[str]) -> str:
    word = m.group("word")
    if word.lower() == "let":  # "let's" is "let us", not a verb to expand
        return m.group()
    return f"{word} is "


def _to_third_person(text: str, *, second_person: bool = False, who: str = USER) -> str:
    """Rewrite first person (or, for the assistant's words, second person) as ``who``: the
    speaker's name when the message carries one, else "User".

    Only pronouns, the agreement of the verb right after them, and an "'s" that means "is"
    before a possessive change, so the statement stays exactly as grounded as the original.
    """
    text = _IS_BEFORE_POSSESSIVE.sub(_expand_is, text)
    if not second_person:
        text = _GROUP_OF_US.sub(lambda m: _group_of_us(m, who), text)
    # Quoted speech is someone's own words ("My son said "I want to be a pilot""): its
    # pronouns are the quoted speaker's, so they stay as said.
    quoted = [m.span() for m in _QUOTED.finditer(text)]
    words = [w for w in _WORD.finditer(text) if not any(a < w.start() < b for a, b in quoted)]
    subject = "you" if second_person else "i"
    table = _SECOND_TABLE if second_person else _FIRST_TABLE
    named = who in text
    out: list[str] = []
    pos = 0
    i = 0
    while i < len(words):
        w = words[i]
        low = w.group().lower().replace("’", "'")
        replacement: str | None = None
        last = i  # index of the last word the replacement covers
        if low in _COMPOUND_FORMS and _compound_subject(text, words, i):
            # "my sister and I are": the verb agrees with both
            replacement = who + _COMPOUND_FORMS[low]
        elif low == subject:
            replacement, last = _subject_and_verb(text, words, i, who)
        elif low in table:
            replacement = table[low][1 if named else 0].replace(USER, who)
        if replacement is None:
            i += 1
            continue
        out.append(text[pos : w.start()])
        if w.group()[0].isupper() and replacement[0].islower() and _sentence_start(text, w.start()):
            replacement = replacement[0].upper() + replacement[1:]
        out.append(replacement)
        named = True
        pos = words[last].end()
        i = last + 1
    out.append(text[pos:])
    return "".join(out)


_QUOTED = re.compile(r'"[^"]*"|“[^”]*”')
# "I" (or a contraction of it) closing a compound subject, and what follows the name.
_COMPOUND_FORMS = {"i": "", "i've": " have", "i'd": " would", "i'll": " will", "you": ""}
# Words between "I" and its verb that are no verb: "I myself prefer", "I sort of made".
_EMPHATIC = frozenset(("myself", "yourself", "ourselves"))
_HEDGE_PHRASE = frozenset(("sort", "kind"))

_SUBJECT_OR_VERB = re.compile(
    r"\b(?:i|i'm|i’m|we|you|he|she|they|is|am|are|was|were|be|been)\b|['’][ms]\b", _I
)


def _compound_subject(text: str, words: list[re.Match[str]], i: int) -> bool:
    """Whether words[i] ("I") ends a short noun phrase like "My sister and I"."""
    if i == 0 or words[i - 1].group().lower() not in ("and", "or", "nor"):
        return False
    clause = re.split(r"[,.;:!?]", text[: words[i - 1].start()])[-1]
    return 0 < len(clause.split()) <= 3 and not _SUBJECT_OR_VERB.search(clause)


def _sentence_start(text: str, index: int) -> bool:
    return not text[:index].strip() or text[:index].rstrip()[-1] in ".!?:;\"'("


def _is_adverb(word: str) -> bool:
    low = word.lower()
    # "-ly" words are adverbs ("personally"), except verbs such as "fly", "reply", "apply"
    return low in _ADVERBS or (low.endswith("ly") and len(low) > 4 and low not in _LY_VERBS)


_LY_VERBS = frozenset(("apply", "reply", "supply", "imply", "multiply", "comply", "bully"))


def _subject_and_verb(text: str, words: list[re.Match[str]], i: int, who: str) -> tuple[str, int]:
    """The subject "I" (or "you") and the verb after it, made to agree with ``who``."""
    j = i + 1
    adverbs: list[str] = []
    while j < len(words) and not text[words[j - 1].end() : words[j].start()].strip():
        low = words[j].group().lower()
        if low in _EMPHATIC:  # "I myself prefer tea": the name says it already
            j += 1
            continue
        if (
            low in _HEDGE_PHRASE
            and j + 1 < len(words)
            and words[j + 1].group().lower() == "of"
            and not text[words[j].end() : words[j + 1].start()].strip()
        ):
            adverbs.append(f"{words[j].group()} of")  # "I sort of made it up"
            j += 2
            continue
        if not _is_adverb(words[j].group()):
            break
        adverbs.append(words[j].group())
        j += 1
    subject = who  # always the name, never "they": unambiguous next to other people
    if j >= len(words) or text[words[j - 1].end() : words[j].start()].strip():
        if adverbs:
            return " ".join([subject, *adverbs]), j - 1
        return subject, i
    verb = words[j].group()
    low = verb.lower().replace("’", "'")
    if low in _NOT_A_VERB:
        # "you" as an object ("book you a table") or "I and Maya": no verb to agree with
        return " ".join([subject, *adverbs]) if adverbs else subject, max(i, j - 1)
    if low == "am" and j + 1 < len(words) and words[j + 1].group().lower() == "not":
        return " ".join([subject, *adverbs, "is"]), j
    return " ".join([subject, *adverbs, _conjugate(verb)]), j


def _zh_third_person(text: str, *, second_person: bool = False, who: str = "用户") -> str:
    if second_person:
        for a, b in (
            ("你们", "用户等人"),
            ("您们", "用户等人"),
            ("你的", "用户的"),
            ("您的", "用户的"),
        ):
            text = text.replace(a, b)
        return text.replace("你", "用户").replace("您", "用户")
    return text.replace("我们", f"{who}等人").replace("我的", f"{who}的").replace("我", who)


def _imperative_to_request(sentence: str, who: str) -> str | None:
    m = _IMPERATIVE.match(sentence)
    if m is None:
        return None
    verb = " ".join(m.group("verb").lower().replace("’", "'").split())
    lead = {
        "don't": "asks not to",
        "dont": "asks not to",
        "do not": "asks not to",
        "never": "asks never to",
        "always": "asks to always",
        "avoid": "asks to avoid",
        "stop": "asks to stop",
        "no more": "asks for no more",
    }[verb]
    return f"{who} {lead} {m.group('rest')}"


def _finish(text: str, chinese: bool) -> str:
    text = " ".join(text.split()) if not chinese else text.strip()
    text = re.sub(r"[!！]+$", "。" if chinese else ".", text)
    if text and text[0].isalpha() and text[0].islower():
        text = text[0].upper() + text[1:]
    closed = len(text) > 1 and text[-1] in "\"'”’" and text[-2] in ".!?。！？"
    if text and not closed and (text[-1].isalnum() or text[-1] in ")\"'”’"):
        text += "。" if chinese and re.match(f"[{_CJK}]", text[-1]) else "."
    if len(text) > MAX_FACT_CHARS:
        cut = text[: MAX_FACT_CHARS - 1]
        text = (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"
    return text


# --------------------------------------------------------------------------- kinds


def _kind(clause: str, span: DateSpan, reference: datetime | None) -> str:
    """The fact kind from cue words in ``clause`` (first person) and the dates it states."""
    ref = reference.date() if reference else None
    future = ref is not None and any(m.role == "at" and m.first > ref for m in span.mentions)
    past = ref is not None and any(m.role == "at" and m.last < ref for m in span.mentions)
    if _CONSTRAINT.search(clause):
        return "constraint"
    if _PLAN.search(clause) or (future and not past):
        return "plan"
    if _PREFERENCE.search(clause) or _IMPERATIVE.match(clause) or _ZH_IMPERATIVE.match(clause):
        return "preference"
    dated = bool(span.mentions)
    if _IDENTITY.search(clause) or _IDENTITY_NAME.match(clause.strip()):
        return "identity"
    if _IDENTITY_MOVED.search(clause) and not dated:
        return "identity"  # "I moved to Berlin": where the user lives now
    if _EVENT.search(clause) or past:
        return "event"  # "I moved to Berlin last week" is an event with a date
    return "fact"


# --------------------------------------------------------------------------- messages


def _parse_ts(ts: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(ts.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def _is_question(sentence: str, chinese: bool) -> bool:
    s = sentence.strip()
    if s.endswith(("?", "？")):
        return True
    if chinese:
        return bool(_ZH_QUESTION_END.search(s))
    return bool(_QUESTION_START.match(s))


def _strip_lead(sentence: str, chinese: bool) -> tuple[str, bool]:
    """Remove leading discourse markers; report whether one of them marked a correction."""
    correction = False
    pattern = _ZH_LEAD if chinese else _LEAD
    while True:
        m = pattern.match(sentence)
        if m is None or m.end() == 0:
            break
        correction = correction or bool(m.group("corr"))
        sentence = sentence[m.end() :].lstrip()
    if not chinese:
        sentence = _BY_THE_WAY_INSIDE.sub("", sentence)
    return sentence, correction


def _is_filler(sentence: str, chinese: bool) -> bool:
    s = sentence.strip()
    return bool((_ZH_FILLER if chinese else _FILLER).match(s)) or not re.search(r"\w", s)


_USER_SUBJECT = re.compile(
    r"\b(?:the\s+)?user(?P<owner>['’]s)?\b(?:(?P<space>\s+)(?P<verb>[A-Za-z]+(?:['’]t)?)\b)?", _I
)
_FIRST_FORMS = {
    "is": "am",
    "isn't": "am not",
    "has": "have",
    "hasn't": "haven't",
    "does": "do",
    "doesn't": "don't",
    "was": "was",
    "wasn't": "wasn't",
}


def _first_form(verb: str) -> str:
    """The first-person present of a third-person verb ("prefers" -> "prefer")."""
    low = verb.lower().replace("’", "'")
    if low in _FIRST_FORMS:
        return _FIRST_FORMS[low]
    if _is_adverb(verb):
        return verb  # "User always books aisle seats": the verb comes later
    if low.endswith("ies") and len(low) > 4:
        return verb[:-3] + "y"
    if low.endswith(("sses", "shes", "ches", "xes", "zes", "oes")):
        return verb[:-2]
    if low.endswith("s") and not low.endswith(("ss", "us", "is")) and len(low) > 2:
        return verb[:-1]
    return verb


def _first_person_view(text: str, chinese: bool) -> str:
    """A note about "the user" as the user would say it, only to read its kind with the
    first-person cues (``_kind``): "User lives in Berlin" reads as "I live in Berlin"."""
    if chinese:
        return text.replace("用户", "我")

    def first(m: re.Match[str]) -> str:
        if m.group("owner"):
            return "my" + (m.group("space") or "") + (m.group("verb") or "")
        if m.group("verb") is None:
            return "I"
        return f"I{m.group('space')}{_first_form(m.group('verb'))}"

    return _USER_SUBJECT.sub(first, text)


@dataclass(frozen=True)
class _Sentence:
    """What one kept sentence gives: its fact's text, kind, confidence and dates, whether
    it corrects something said before, and the standing instruction or preference it
    states (``_standing``), if any."""

    text: str
    kind: str
    confidence: float
    span: DateSpan
    correction: bool
    standing: Standing | None


def _user_fact(
    sentence: str,
    reference: datetime | None,
    *,
    note: bool = False,
    who: str = USER,
    instructs: bool = True,
) -> _Sentence | None:
    """The fact of one sentence of a speaker (``who``: their name, or "User"), or None to
    drop it. Only the user's own words (``instructs``) can give a standing instruction or
    preference: a named participant speaks to the group, not to the assistant.

    A ``note``'s sentence is meant to be remembered whatever its grammatical person, so it
    need not be about the user in the first person; its kind is read as if it were."""
    chinese = _is_chinese(sentence)
    if _is_question(sentence, chinese):
        embedded = (_ZH_EMBEDDED if chinese else _EMBEDDED).search(sentence)
        if embedded is None:
            return None
        sentence = embedded.group("rest").rstrip("?？ 吗")
    body, marked = _strip_lead(sentence, chinese)
    label = _TURN_LABEL.match(body)
    if label is not None:
        if label.group("who").lower() not in _USER_LABELS:
            return None
        body, again = _strip_lead(body[label.end() :], chinese)
        marked = marked or again
    if not body or _is_filler(body, chinese):
        return None
    item = (
        standing(_first_person_view(body, chinese) if note else body, chinese=chinese)
        if instructs
        else None
    )
    instruction = item is not None and item.kind == "instruction"
    if chinese:
        about_user = "我" in body or bool(_ZH_IMPERATIVE.match(body))
    else:
        about_user = bool(
            _FIRST_PERSON.search(body)
            or _IMPERATIVE.match(body)
            or _SUBJECTLESS_PAST.match(body)
            or _SUBJECTLESS_ING.match(body)
        )
    if not about_user and not marked and not note and not instruction:
        return None
    if not note and not chinese:
        body = _without_request(body)
        if _small_talk(body):
            return None
    span = (
        resolve_dates(body, reference)
        if reference is not None
        else DateSpan(None, None, None, body, ())
    )
    kind = _kind(_first_person_view(body, chinese) if note else body, span, reference)
    text = span.resolved_text
    zh_who = "用户" if who == USER else who
    if chinese:
        if _ZH_IMPERATIVE.match(text) or instruction:
            text = zh_who + "要求" + text.replace("请", "", 1)
        text = _zh_third_person(text, who=zh_who)
    else:
        request = _imperative_to_request(text, who)
        past = _SUBJECTLESS_PAST.match(text)
        ing = _SUBJECTLESS_ING.match(text)
        if request is not None:
            text = request
        elif instruction and _ASKED.match(text) and not _CONNECTIVE.match(text):
            text = f"{who} asks to " + text[0].lower() + text[1:]
        elif past is not None and not _FIRST_PERSON.match(text):
            text = f"{who} " + text[0].lower() + text[1:]
        elif ing is not None:
            text = f"{who} is " + text[0].lower() + text[1:]
        text = _to_third_person(text, who=who)
        if instruction:
            text = _to_assistant(text)
    if who != USER and re.fullmatch(rf"{re.escape(who)} is {re.escape(who)}\W*", text):
        return None  # "I'm Jon" said by Jon: the name says it already
    confidence = HEDGED_CONFIDENCE if _HEDGE.search(body) else DIRECT_CONFIDENCE
    correction = marked or bool(_STRONG_CORRECTION.search(body))
    return _Sentence(
        _finish(text, chinese), item.kind if item else kind, confidence, span, correction, item
    )


# "However, I want to make sure I'm following ...": a wish after a connective, not an
# imperative ("User asks to however, ...").
_CONNECTIVE = re.compile(
    r"^(?:however|also|but|and|so|plus|additionally|anyway|though|still|then|now|ok|okay"
    r"|well|oh|btw)\b",
    _I,
)
# An instruction that starts with its verb ("Use metric units ...", "Keep answers short"),
# written as what the user asks: not one about the user already ("User wants ...").
_ASKED = re.compile(r"^(?:please\s+|kindly\s+)?(?!i\b|i['’]|my\b|we\b|when|for|if)[a-z]", _I)
_LISTENER = {"your": "the assistant's", "yours": "the assistant's", "you": "the assistant"}
_LISTENER_WORD = re.compile(r"\b(?:your|yours|yourself|you)\b", _I)


def _to_assistant(text: str) -> str:
    """An instruction's "you" is the assistant: "User wants you to cite sources" -> "User
    wants the assistant to cite sources" (quoted speech keeps its own words)."""
    quoted = [m.span() for m in _QUOTED.finditer(text)]

    def name(m: re.Match[str]) -> str:
        if any(a < m.start() < b for a, b in quoted):
            return m.group()
        return _LISTENER.get(m.group().lower(), "the assistant")

    return _LISTENER_WORD.sub(name, text)


_TAG_QUESTION = re.compile(
    r"\s*,?\s*(?:right|correct|isn't\s+it|aren't\s+you|don't\s+you|is\s+that\s+(?:right|correct)"
    r"|am\s+i\s+right|yes|no)\s*\?+$",
    _I,
)
_ZH_TAG_QUESTION = re.compile(r"\s*[，,]?\s*(?:对吧|对吗|是吗|没错吧|是不是|对不对)\s*[？?]+$")
_ASSISTANT_LEAD = re.compile(
    r"^(?:(?:so|ok|okay|great|got\s+it|noted|just\s+to\s+confirm|to\s+confirm|if\s+i\s+remember"
    r"\s+correctly|as\s+i\s+understand\s+it|i\s+see)\s*[,:.!-]\s*)+",
    _I,
)
_ADDRESSED = re.compile(r"^(?:you|your|you're|you’re|you've|you’ve|you'll|you’ll|you'd)\b", _I)
_CONFIRM = re.compile(
    r"^\s*(?:yes|yeah|yep|yup|right(?!\s+now)|correct|exactly|indeed|absolutely|true"
    r"|that'?s\s+(?:right|correct|true|it)|that’s\s+(?:right|correct|true|it)"
    r"|that\s+is\s+(?:right|correct)|对的|对(?![了话])|是的|没错|正确|确实)(?!\w)",
    _I,
)
_CONFIRM_DOUBT = re.compile(
    r"\b(?:but|not|no|actually|although|except|however|wrong|isn't|wasn't|nope)\b|不|但|其实|错",
    _I,
)


def _confirms(message: MessageRow) -> bool:
    m = _CONFIRM.match(message.content)
    return m is not None and not _CONFIRM_DOUBT.search(message.content[m.end() :])


def _assistant_facts(message: MessageRow, confirmation: MessageRow) -> list[FactDraft]:
    reference = _parse_ts(message.ts)
    drafts: list[FactDraft] = []
    for sentence in split_sentences(message.content):
        chinese = _is_chinese(sentence)
        s = (_ZH_TAG_QUESTION if chinese else _TAG_QUESTION).sub("", sentence)
        if _is_question(s, chinese):
            continue
        s = _ASSISTANT_LEAD.sub("", s).strip()
        if chinese:
            if not s.startswith(("你", "您")):
                continue
        elif not _ADDRESSED.match(s):
            continue  # only what the assistant says about the user can become the user's fact
        span = resolve_dates(s, reference) if reference else DateSpan(None, None, None, s, ())
        # Classify with the same first-person cues as the user's own words.
        as_user = re.sub(r"\byour\b", "my", s, flags=_I)
        as_user = re.sub(r"\byou(['’](?:re|ve|ll|d))", r"I\1", as_user, flags=_I)
        as_user = re.sub(r"\byou\s+are\b", "I am", as_user, flags=_I)
        as_user = re.sub(r"\byou\b", "I", as_user, flags=_I).replace("你", "我").replace("您", "我")
        if chinese:
            text = _zh_third_person(span.resolved_text, second_person=True)
        else:
            text = _to_third_person(span.resolved_text, second_person=True)
        drafts.append(
            FactDraft(
                text=_finish(text, chinese),
                kind=_kind(as_user, span, reference),
                message_ids=[message.id, confirmation.id],
                confidence=HEDGED_CONFIDENCE if _HEDGE.search(s) else CONFIRMED_CONFIDENCE,
                occurred_at=span.occurred_at,
                valid_from=span.valid_from,
                valid_to=span.valid_to,
                labels=["confirmed"],
            )
        )
    return drafts


# --------------------------------------------------------------------------- behaviour

_EVENT_VERBS = {
    "search": "searched for",
    "query": "searched for",
    "click": "clicked",
    "view": "viewed",
    "page_view": "viewed",
    "purchase": "purchased",
    "buy": "bought",
    "add_to_cart": "added to cart",
    "like": "liked",
    "share": "shared",
    "download": "downloaded",
}
_EVENT_VERBS_ZH = {
    "search": "搜索了",
    "query": "搜索了",
    "click": "点击了",
    "view": "浏览了",
    "page_view": "浏览了",
    "purchase": "购买了",
    "buy": "购买了",
    "add_to_cart": "加入购物车了",
    "like": "点赞了",
    "share": "分享了",
    "download": "下载了",
}
_EVENT_LABEL = re.compile(r"^(?P<label>[A-Za-z][A-Za-z _-]{0,30}?)\s*:\s*(?=\S)")


def _event_content(event_type: str, content: str) -> str:
    """The event's content without a label repeating its type ("Clicked: X" -> "X")."""
    content = " ".join(content.split())
    m = _EVENT_LABEL.match(content)
    if m:
        label = re.sub(r"[^a-z]", "", m.group("label").lower())
        parts = [p for p in event_type.split("_") if len(p) >= 3]
        if any(label.startswith(p[:4]) for p in parts):
            content = content[m.end() :]
    return content.strip().strip("\"'“”")


@dataclass
class _EventGroup:
    event_type: str
    page: str | None
    first_index: int
    contents: list[tuple[str, int]]  # (content as first written, count)
    ids: list[str]
    times: list[datetime]
    terms: set[str]


def _related(a: _EventGroup, b: _EventGroup) -> bool:
    if a.event_type != b.event_type or a.page != b.page or not a.terms or not b.terms:
        return False
    shared = len(a.terms & b.terms)
    return shared >= 2 and shared / min(len(a.terms), len(b.terms)) >= 0.5


def _behaviour_facts(events: list[tuple[int, MessageRow]]) -> list[tuple[int, FactDraft]]:
    groups: dict[tuple[str, str, str | None], _EventGroup] = {}
    for index, message in events:
        etype = event_key(message.event_type or "")
        content = _event_content(etype, message.content)
        if not content:
            continue
        key = (etype, content.lower().strip(" .,!?;:"), message.page)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _EventGroup(
                etype, message.page, index, [(content, 0)], [], [], set(fts_query_terms(content))
            )
        group.contents[0] = (group.contents[0][0], group.contents[0][1] + 1)
        group.ids.append(message.id)
        ts = _parse_ts(message.ts)
        if ts is not None:
            group.times.append(ts)
    merged: list[_EventGroup] = []
    for group in groups.values():  # insertion order = order of first occurrence
        target = next((g for g in merged if _related(g, group)), None)
        if target is None:
            merged.append(group)
            continue
        target.contents.extend(group.contents)
        target.ids.extend(group.ids)
        target.times.extend(group.times)
        target.terms |= group.terms
    return [(g.first_index, _behaviour_draft(g)) for g in merged]


def _behaviour_draft(g: _EventGroup) -> FactDraft:
    chinese = any(_CJK_RUN.search(c) for c, _ in g.contents)
    if chinese:
        verb = _EVENT_VERBS_ZH.get(g.event_type, f"{g.event_type}:")
        items = "和".join(f"“{c}”" + (f"{n}次" if n > 1 else "") for c, n in g.contents)
        text = f"用户{verb}{items}" + (f"(页面 {g.page})" if g.page else "") + "。"
    else:
        verb = _EVENT_VERBS.get(g.event_type, g.event_type.replace("_", " "))
        items = " and ".join(f'"{c}"' + (f" {n} times" if n > 1 else "") for c, n in g.contents)
        text = f"User {verb} {items}" + (f" (page {g.page})" if g.page else "") + "."
    if len(text) > MAX_FACT_CHARS:
        text = text[: MAX_FACT_CHARS - 1] + "…"
    return FactDraft(
        text=text,
        kind="behaviour",
        message_ids=list(dict.fromkeys(g.ids)),
        confidence=BEHAVIOUR_CONFIDENCE,
        occurred_at=max(g.times) if g.times else None,
    )


# --------------------------------------------------------------------------- public


def extract_facts(messages: Sequence[MessageRow]) -> list[FactDraft]:
    """Grounded facts about the user from a batch of messages, in message order.

    Every draft cites only ids of ``messages`` and passes ``FactDraft.problems``. See the
    module docstring for the rules.
    """
    out: list[tuple[int, FactDraft]] = []
    events: list[tuple[int, MessageRow]] = []
    for index, message in enumerate(messages):
        if is_note(message):
            if message.role == "user":
                out.extend((index, d) for d in _sentence_facts(message, note=True))
            continue
        if message.event_type:
            events.append((index, message))
            continue
        if message.role == "assistant" and speaker_name(message) is None:
            reply = _next_turn(messages, index)
            if reply is not None and reply.role == "user" and _confirms(reply):
                out.extend((index, d) for d in _assistant_facts(message, reply))
            continue
        if message.role in ("user", "assistant"):
            # A user's turn, or a named participant's (a group chat or a transcript sends
            # the other people as named assistant turns): each speaks for themselves.
            out.extend((index, d) for d in _sentence_facts(message, note=False))
    out.extend(_behaviour_facts(events))
    out.sort(key=lambda pair: pair[0])  # stable: sentences keep their order
    return [draft for _, draft in out]


def _sentence_facts(message: MessageRow, *, note: bool) -> list[FactDraft]:
    """The facts of a speaker's turn or of a memory note, one per sentence kept."""
    reference = _parse_ts(message.ts)
    corrects = note and correction_target(message) is not None
    who = speaker_name(message) or USER
    drafts = []
    instructs = message.role == "user"
    for sentence in split_sentences(message.content):
        result = _user_fact(sentence, reference, note=note, who=who, instructs=instructs)
        if result is None:
            continue
        labels = ["note"] if note else []
        if result.correction or corrects:
            labels.append("correction")
        span = result.span
        drafts.append(
            FactDraft(
                text=result.text,
                kind=result.kind,
                message_ids=[message.id],
                confidence=result.confidence,
                occurred_at=span.occurred_at,
                valid_from=span.valid_from,
                valid_to=span.valid_to,
                labels=labels,
                standing=result.standing is not None,
                scope=result.standing.scope if result.standing else None,
            )
        )
    return drafts


_DISPLAY_NAME = re.compile(r"[^\W\d_](?:[^\W\d_]|[ .'’-]){0,39}")  # letters, no digits


def speaker_name(message: MessageRow) -> str | None:
    """The name a fact calls the message's speaker by: its ``name`` when that reads as a
    person's name ("Caroline", "Mary-Jane O'Neil"; "caroline_smith" as "caroline smith"),
    else None (the fact then says "User"): an id such as "bot_42" or a role name is no
    name to write into a fact."""
    name = " ".join((message.name or "").replace("_", " ").split())
    if not _DISPLAY_NAME.fullmatch(name) or name.lower() in _GENERIC_SPEAKERS:
        return None
    return name


# Names that are roles, not people: a fact about "the user" says "User".
_GENERIC_SPEAKERS = frozenset(("user", "me", "human", "assistant", "ai", "bot", "system"))


def is_note(message: MessageRow) -> bool:
    """Whether ``message`` is a memory note (``types.NOTE_EVENT``, spelled in any case).

    Only the user's notes give facts; a note in another role's name gives none."""
    return is_note_event(message.event_type)


def correction_target(message: MessageRow) -> str | None:
    """The id of the summary a note says it corrects (``metadata[types.CORRECTS]``), if it
    names one: a non-blank string."""
    target = message.metadata.get(CORRECTS) if is_note(message) else None
    return target.strip() if isinstance(target, str) and target.strip() else None


def _next_turn(messages: Sequence[MessageRow], index: int) -> MessageRow | None:
    """The next chat turn (not a behaviour event) of the same session after ``index``."""
    session = messages[index].session_id
    for message in messages[index + 1 :]:
        if message.session_id != session or message.event_type:
            continue
        return message
    return None


def is_correction(text: str) -> bool:
    """Whether ``text`` reads like a change to something said before.

    Cues: correction, actually, not anymore / no longer, changed, moved, instead, now,
    update, switched, scratch that, 其实, 更正, 不再, 改成/改为, 纠正. Deliberately broad: the
    consolidator only acts on it when an existing summary is similar, to supersede it
    instead of adding a contradicting one.
    """
    return bool(_CORRECTION_CUE.search(text))


# A value a statement gives: a number ("3 times", "150MB", "10,000") or a name written with
# a capital inside the sentence ("Berlin", "Tesla Model 3").
_VALUE = re.compile(r"\d[\d,.:/]*[A-Za-z%]*|(?<=[\s(\"'“‘])[A-Z][\w'’&-]*")
_NEGATED_NOW = re.compile(
    r"\bno\s+longer\b|(?:n't|n’t|\bnot|\bnever)\b[^.!?]*\bany\s*more\b|不再", _I
)
# Capitalised words that are no value: the user, and the first-person pronoun.
_NOT_VALUES = frozenset(("user", "i", "i'm", "i've", "i'd", "i'll"))


def _values(text: str) -> set[str]:
    return {
        v.lower().rstrip(".,:")
        for v in _VALUE.findall(text)
        if v.lower().rstrip(".,:") not in _NOT_VALUES
    }


def replaces(old: str, new: str) -> bool:
    """Whether ``new``, a statement with a correction cue word (``is_correction``) but no
    correction marker, and close to ``old``, replaces it rather than adding to it: it says
    something no longer holds ("I no longer eat meat"), or it gives another value than
    ``old`` (a number or a name each has and the other lacks: "lives in Berlin" / "moved to
    Lisbon", "runs 3 times a week" / "now runs 5 times a week"). Cue words alone are common
    in conversation ("I actually just got a new compressor", "Now I'm working on the paint
    job"): taken as corrections they retired 7% of LongMemEval-S's facts, nearly all of
    which still held. Chinese text, whose names carry no capital, is taken on its cues."""
    if _is_chinese(old) or _is_chinese(new):
        return True
    if _NEGATED_NOW.search(new):
        return True
    before, after = _values(old), _values(new)
    return bool(before - after) and bool(after - before)


# --------------------------------------------------------------------------- topics

_TOPICS: tuple[tuple[str, str, str], ...] = (
    # (name, English cue words, Chinese cue substrings)
    (
        "food & diet",
        "food eat ate meal dinner lunch breakfast restaurant vegetarian vegan cook recipe meat"
        " fish sushi pizza coffee tea drink diet snack cuisine dish peanut nut gluten dairy"
        " lactose spicy dessert",
        "吃 饭 餐厅 素食 菜 饮食 咖啡 茶 早餐 午餐 晚餐 辣 花生",
    ),
    (
        "health",
        "allergic allergy allergies doctor medicine medication sick ill pain sleep hospital"
        " health therapy asthma diabetes injury dentist",
        "过敏 医生 药 生病 健康 医院 睡眠",
    ),
    (
        "travel",
        "trip travel flight fly hotel vacation holiday visit airport passport visa tour journey"
        " abroad luggage",
        "旅行 旅游 出差 机票 航班 酒店 签证",
    ),
    (
        "work & career",
        "work job manager boss colleague team office meeting project startup company career"
        " client deadline demo investor promotion salary interview engineer developer",
        "工作 上班 公司 同事 老板 经理 项目 会议",
    ),
    (
        "home & location",
        "live flat apartment house home move neighbourhood neighborhood city rent landlord address",
        "住 搬家 搬到 公寓 房子 城市",
    ),
    (
        "family & relationships",
        "family sister brother mother mom mum father dad parent wife husband partner girlfriend"
        " boyfriend son daughter kid child children friend married wedding",
        "家人 妈妈 爸爸 姐姐 妹妹 哥哥 弟弟 朋友 老婆 老公 孩子 父母",
    ),
    (
        "shopping",
        "buy bought shop shopping order price cart purchase searched clicked size deal discount"
        " store",
        "买 购物 价格 下单 搜索 点击",
    ),
    (
        "sport & fitness",
        "run running runner marathon gym workout fitness training yoga swim swimming cycle"
        " cycling bike football soccer tennis hike hiking climbing exercise sport",
        "跑步 健身 马拉松 运动 游泳 瑜伽",
    ),
    (
        "learning",
        "learn study course class lesson language school university exam degree teacher tutor",
        "学 课 考试 中文 英语 学校",
    ),
    (
        "finance",
        "money budget euro dollar salary saving bank invest investment tax loan mortgage"
        " expensive cheap cost pay",
        "钱 预算 工资 存款 银行 投资 欧元 美元",
    ),
    (
        "hobbies",
        "hobby music guitar piano movie film reading book game gaming paint painting"
        " photography garden gardening art concert",
        "爱好 音乐 电影 读书 游戏 画画 摄影",
    ),
    (
        "schedule",
        "today tomorrow tonight weekend appointment calendar schedule monday tuesday wednesday"
        " thursday friday saturday sunday morning evening remind reminder",
        "今天 明天 周末 日程 预约 提醒",
    ),
)
GENERAL_TOPIC = "general"


def _variants(cue: str) -> set[str]:
    """Inflections of a cue word, so "restaurants" and "running" count for their cue."""
    out = {cue, cue + "s", cue + "es", cue + "ing", cue + "ed", cue + "er", cue + "ers"}
    if cue.endswith("y"):
        out |= {cue[:-1] + "ies", cue[:-1] + "ied"}
    if cue.endswith("e"):
        out |= {cue[:-1] + "ing", cue + "d", cue + "r", cue + "rs"}
    if len(cue) >= 3 and cue[-1] not in "aeiouwy" and cue[-2] in "aeiou" and cue[-3] not in "aeiou":
        out |= {cue + cue[-1] + "ing", cue + cue[-1] + "ed", cue + cue[-1] + "er"}
    return out


_CUE_INDEX: dict[str, list[tuple[int, str]]] = {}
for _n, (_name, _en, _zh) in enumerate(_TOPICS):
    for _cue in _en.split():
        for _v in _variants(_cue):
            _CUE_INDEX.setdefault(_v, []).append((_n, _cue))


def _norm_name(name: str) -> str:
    return " ".join(name.lower().replace(" and ", " & ").split())


def _words(texts: Sequence[str]) -> list[str]:
    out: list[str] = []
    for text in texts:
        for token in _TOKEN.findall(text.lower()):
            if _CJK_RUN.fullmatch(token):
                continue
            token = token.replace("’", "'").split("'")[0]
            if token and token not in _STOPWORDS:
                out.append(token)
    return out


def topic_for(texts: Sequence[str], existing: Sequence[str]) -> tuple[str, str]:
    """The keyword topic (name, description) for the memory items ``texts``.

    Names come from a small fixed taxonomy (food & diet, health, travel, work & career, home
    & location, family & relationships, shopping, sport & fitness, learning, finance,
    hobbies, schedule), chosen by counting cue words (English words with their inflections,
    Chinese substrings); ties go to the earlier taxonomy entry, and no cue at all gives
    "general". A name in ``existing`` wins whenever it scores as well as the best taxonomy
    name (a taxonomy name spelled differently, or a free name such as "Japan trip" whose
    words occur in the texts), so topics stay stable as memory grows. Deterministic.
    """
    words = _words(texts)
    joined = "\n".join(texts)
    scores = [0] * len(_TOPICS)
    seen: list[list[str]] = [[] for _ in _TOPICS]
    for word in words:
        for n, _cue in _CUE_INDEX.get(word, ()):
            scores[n] += 1
            if word not in seen[n]:
                seen[n].append(word)
    for n, (_, _, zh) in enumerate(_TOPICS):
        for cue in zh.split():
            hits = joined.count(cue)
            if hits:
                scores[n] += hits
                seen[n].append(cue)

    by_name = {name: n for n, (name, _, _) in enumerate(_TOPICS)}
    # (score, existing?, -position) - the max wins; existing names win ties.
    best: tuple[int, int, int] = (0, 0, 0)
    choice: tuple[str, list[str]] = (GENERAL_TOPIC, [])
    for n, (name, _, _) in enumerate(_TOPICS):
        key = (scores[n], 0, -n)
        if scores[n] > 0 and key > best:
            best, choice = key, (name, seen[n])
    for position, name in enumerate(existing):
        norm = _norm_name(name)
        if norm in by_name:
            n = by_name[norm]
            score, cues = scores[n], seen[n]
        else:
            name_words = {w for w in _words([name])}
            cues = [w for w in dict.fromkeys(words) if w in name_words]
            cjk = [run for run in _CJK_RUN.findall(name) if len(run) >= 2 and run in joined]
            cues += cjk
            score = sum(1 for w in words if w in name_words) + sum(joined.count(r) for r in cjk)
        key = (score, 1, -position)
        if score > 0 and key > best:
            best, choice = key, (name, cues)
    name, cues = choice
    if best[0] == 0:
        general = next((e for e in existing if _norm_name(e) == GENERAL_TOPIC), GENERAL_TOPIC)
        return general, "Things the user mentioned that fit no specific topic."
    return name, f"Memories about {name}; cue words: {', '.join(cues[:6])}."

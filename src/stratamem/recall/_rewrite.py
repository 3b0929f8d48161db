"""Offline query rewrites for the ``single_hop_parallel`` router mode.

A question and the sentence that answers it share content words but not shape: "When did
Caroline go to the support group?" is answered by "Caroline went to the support group last
week". Searching a few rewrites next to the raw query and fusing the results recovers hits
that the question form alone ranks too low. Three rewrites are produced:

* ``keywords``: the content words, which is what a full-text retriever can match on;
* ``entities``: names, quoted phrases, numbers and acronyms, the most selective terms;
* ``statement``: the question turned into a declarative clause, closer in embedding space
  to the stored sentence that answers it.

Everything is deterministic string work with small English word lists: no model, no
network, no dependency. The rules are deliberately conservative; a rewrite that cannot be
made with confidence is left out rather than guessed, because a nonsense rewrite adds noise
to the fused ranking. Queries without Latin letters (e.g. Chinese or Japanese) get no
rewrites: the word lists are English only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Rewrite", "RewriteKind", "rewrite_query"]

RewriteKind = Literal["keywords", "entities", "statement"]


@dataclass(frozen=True)
class Rewrite:
    """One alternative phrasing of a query, searched alongside the original."""

    kind: RewriteKind
    text: str


# --------------------------------------------------------------------------- word lists

_WH = frozenset({"what", "when", "where", "who", "whom", "whose", "which", "why", "how"})

_DO_AUX = frozenset({"do", "does", "did", "don't", "doesn't", "didn't"})
_BE_AUX = frozenset({"is", "are", "was", "were", "am", "isn't", "aren't", "wasn't", "weren't"})
_HAVE_AUX = frozenset({"has", "have", "had", "hasn't", "haven't", "hadn't"})
_MODAL_AUX = frozenset(
    {
        "can", "could", "will", "would", "shall", "should", "may", "might", "must",
        "can't", "cannot", "couldn't", "won't", "wouldn't", "shouldn't", "mightn't", "mustn't",
    }
)  # fmt: skip
_AuxKind = Literal["do", "be", "have", "modal"]
_AUX_KIND: dict[str, _AuxKind] = {
    **dict.fromkeys(_DO_AUX, "do"),
    **dict.fromkeys(_BE_AUX, "be"),
    **dict.fromkeys(_HAVE_AUX, "have"),
    **dict.fromkeys(_MODAL_AUX, "modal"),
}

_SUBJECT_PRONOUNS = frozenset(
    {
        "i", "you", "he", "she", "it", "we", "they", "there", "someone", "somebody",
        "anyone", "anybody", "everyone", "everybody",
    }
)  # fmt: skip
# Possessive pronouns behave like determiners: both open a noun phrase that needs a head.
_DETERMINERS = frozenset(
    {
        "the", "a", "an", "my", "your", "his", "her", "its", "our", "their", "this", "that",
        "these", "those", "some", "any", "every", "each", "another", "all", "both",
    }
)  # fmt: skip
_PREPOSITIONS = frozenset(
    {
        "about", "above", "across", "after", "against", "along", "among", "around", "as",
        "at", "before", "behind", "below", "beside", "between", "beyond", "by", "down",
        "during", "for", "from", "in", "inside", "into", "near", "of", "off", "on", "onto",
        "out", "outside", "over", "since", "through", "till", "to", "toward", "towards",
        "under", "until", "up", "upon", "via", "with", "within", "without",
    }
)  # fmt: skip
# Adverbs that sit between the subject and the verb ("did Caroline ever go"). Hedges are
# dropped from statements: the stored answer says "Caroline went", not "Caroline ever went".
_HEDGES = frozenset({"ever", "likely", "probably", "possibly", "perhaps", "maybe"})
_ADVERBS = _HEDGES | frozenset(
    {
        "really", "actually", "still", "just", "also", "first", "last", "recently", "finally",
        "originally", "usually", "always", "never", "often", "sometimes", "eventually",
        "initially", "typically", "normally", "already", "even", "once", "ultimately",
        "previously", "currently", "generally", "not", "again", "ago",
    }
)  # fmt: skip

_STOPWORDS = (
    _WH
    | frozenset(_AUX_KIND)
    | _SUBJECT_PRONOUNS
    | _DETERMINERS
    | _PREPOSITIONS
    | _HEDGES
    | frozenset(
        {
            # auxiliaries and copulas not used as question openers
            "be", "been", "being", "having", "doing", "ain't", "shan't",
            # object, possessive and reflexive pronouns
            "me", "mine", "myself", "yours", "yourself", "yourselves", "him", "himself",
            "hers", "herself", "itself", "us", "ours", "ourselves", "them", "theirs",
            "themselves", "one", "something", "anything", "everything", "nothing", "nobody",
            # conjunctions
            "and", "or", "but", "nor", "so", "yet", "if", "then", "than", "because", "while",
            "whether", "though", "although", "unless",
            # function adverbs, quantifiers, fillers
            "not", "no", "very", "too", "also", "just", "only", "even", "still", "really",
            "actually", "here", "now", "again", "already", "quite", "rather", "much", "many",
            "more", "most", "less", "least", "same", "such", "other", "else", "lot", "lots",
            "please", "hey", "hi", "hello", "ok", "okay", "um", "uh", "oh", "well", "yes",
            "thanks", "etc",
        }
    )
)  # fmt: skip

# "How many kids" keeps "kids"; "how long"/"how often" are question syntax, not content.
_HOW_QUANTIFIERS = frozenset({"many", "much"})
_HOW_ADVERBS = frozenset({"long", "often", "old", "far", "soon", "well", "frequently", "big"})
# "What time did ..." asks the same thing as "when did ...", and "how many times" counts
# events: the noun adds nothing to the statement.
_EMPTY_WH_NOUNS = frozenset({"time", "times", "year", "day", "date", "month", "week", "season"})
_KIND_NOUNS = frozenset({"kind", "kinds", "type", "types", "sort", "sorts"})

# Adjectives that come before a head noun: a noun phrase cannot end on them.
_PRENOMINAL = frozenset(
    {
        "favourite", "favorite", "best", "new", "old", "older", "younger", "little", "big",
        "first", "last", "current", "previous", "former", "other", "own", "close", "dear",
        "next", "recent", "latest", "usual", "main", "oldest", "youngest", "eldest", "elder",
    }
)  # fmt: skip
# Predicate adjectives accepted after "Is <the/my ...> <noun>"; without POS tags an unknown
# word there may just as well be the rest of a compound noun, so the list is closed.
_PRED_ADJECTIVES = frozenset(
    {
        "happy", "sad", "okay", "ok", "fine", "good", "bad", "sick", "ill", "busy", "free",
        "single", "pregnant", "alive", "dead", "ready", "available", "allergic", "vegan",
        "vegetarian", "older", "younger", "taller", "better", "worse", "open", "safe",
        "healthy", "expensive", "cheap", "big", "small", "new", "old", "close", "afraid",
        "proud", "sure", "true", "right", "wrong", "home", "back", "away", "able", "likely",
    }
)  # fmt: skip
# Words ending in -ing / -ed that are not verb forms in practice.
_ING_NOUNS = frozenset(
    {
        "painting", "paintings", "wedding", "weddings", "meeting", "meetings", "building",
        "buildings", "morning", "mornings", "evening", "evenings", "clothing", "ceiling",
        "feeling", "feelings", "drawing", "drawings", "setting", "savings", "belongings",
        "sibling", "siblings", "pudding", "offspring", "earring", "earrings", "spring",
        "string", "swing", "sting", "thing", "things", "lightning", "stuffing", "icing",
        "frosting", "housing", "funding", "during", "nothing", "something", "anything",
        "everything", "ring", "king", "wing",
    }
)  # fmt: skip
_NOT_PARTICIPLES = frozenset(
    {
        "need", "seed", "feed", "weed", "deed", "reed", "speed", "breed", "greed", "sled",
        "shed", "bred", "shred", "hundred", "sacred", "naked", "wicked", "kindred",
    }
)  # fmt: skip

# base -> (past tense, past participle)
_IRREGULAR: dict[str, tuple[str, str]] = {
    "be": ("was", "been"), "become": ("became", "become"), "begin": ("began", "begun"),
    "bend": ("bent", "bent"), "bet": ("bet", "bet"), "bite": ("bit", "bitten"),
    "blow": ("blew", "blown"), "break": ("broke", "broken"), "bring": ("brought", "brought"),
    "build": ("built", "built"), "buy": ("bought", "bought"), "catch": ("caught", "caught"),
    "choose": ("chose", "chosen"), "come": ("came", "come"), "cut": ("cut", "cut"),
    "deal": ("dealt", "dealt"), "dig": ("dug", "dug"), "do": ("did", "done"),
    "draw": ("drew", "drawn"), "drink": ("drank", "drunk"), "drive": ("drove", "driven"),
    "eat": ("ate", "eaten"), "fall": ("fell", "fallen"), "feed": ("fed", "fed"),
    "feel": ("felt", "felt"), "fight": ("fought", "fought"), "find": ("found", "found"),
    "fly": ("flew", "flown"), "forget": ("forgot", "forgotten"),
    "forgive": ("forgave", "forgiven"), "freeze": ("froze", "frozen"),
    "get": ("got", "gotten"), "give": ("gave", "given"), "go": ("went", "gone"),
    "grow": ("grew", "grown"), "hang": ("hung", "hung"), "have": ("had", "had"),
    "hear": ("heard", "heard"), "hide": ("hid", "hidden"), "hold": ("held", "held"),
    "hurt": ("hurt", "hurt"), "keep": ("kept", "kept"), "know": ("knew", "known"),
    "lead": ("led", "led"), "leave": ("left", "left"), "lend": ("lent", "lent"),
    "let": ("let", "let"), "lose": ("lost", "lost"), "make": ("made", "made"),
    "mean": ("meant", "meant"), "meet": ("met", "met"), "pay": ("paid", "paid"),
    "put": ("put", "put"), "quit": ("quit", "quit"), "read": ("read", "read"),
    "ride": ("rode", "ridden"), "ring": ("rang", "rung"), "rise": ("rose", "risen"),
    "run": ("ran", "run"), "say": ("said", "said"), "see": ("saw", "seen"),
    "seek": ("sought", "sought"), "sell": ("sold", "sold"), "send": ("sent", "sent"),
    "set": ("set", "set"), "shake": ("shook", "shaken"), "shoot": ("shot", "shot"),
    "show": ("showed", "shown"), "shut": ("shut", "shut"), "sing": ("sang", "sung"),
    "sink": ("sank", "sunk"), "sit": ("sat", "sat"), "sleep": ("slept", "slept"),
    "speak": ("spoke", "spoken"), "spend": ("spent", "spent"), "spread": ("spread", "spread"),
    "stand": ("stood", "stood"), "steal": ("stole", "stolen"), "swim": ("swam", "swum"),
    "take": ("took", "taken"), "teach": ("taught", "taught"), "tear": ("tore", "torn"),
    "tell": ("told", "told"), "think": ("thought", "thought"), "throw": ("threw", "thrown"),
    "understand": ("understood", "understood"), "wake": ("woke", "woken"),
    "wear": ("wore", "worn"), "win": ("won", "won"), "write": ("wrote", "written"),
}  # fmt: skip
_REGULAR_VERBS = frozenset(
    {
        "accept", "act", "add", "admire", "adopt", "agree", "allow", "answer", "apply",
        "arrange", "arrive", "ask", "attend", "avoid", "bake", "believe", "belong", "book",
        "borrow", "call", "camp", "cancel", "care", "carry", "celebrate", "change", "chat",
        "check", "clean", "climb", "close", "collect", "compete", "complete", "consider",
        "cook", "create", "cry", "dance", "date", "decide", "decorate", "delay", "deliver",
        "design", "die", "discover", "discuss", "donate", "dream", "dress", "drop", "earn",
        "edit", "end", "enjoy", "enter", "exercise", "experience", "explain", "explore",
        "fail", "fill", "finish", "fix", "follow", "garden", "graduate", "guess", "hate",
        "help", "hike", "hire", "hope", "host", "hug", "ignore", "imagine", "improve",
        "include", "inspire", "install", "invite", "join", "jog", "jump", "kiss", "knit",
        "laugh", "learn", "like", "listen", "live", "look", "love", "manage", "marry",
        "mention", "miss", "move", "need", "offer", "open", "order", "organise", "organize",
        "own", "paint", "participate", "pass", "perform", "pick", "plan", "plant", "play",
        "post", "practice", "practise", "prefer", "prepare", "promise", "publish", "pursue",
        "raise", "reach", "realise", "realize", "receive", "recommend", "record", "recover",
        "relax", "rely", "remember", "rent", "repair", "reply", "research", "rest", "retire",
        "return", "review", "save", "score", "share", "shop", "sign", "ski", "skate",
        "smile", "snowboard", "solve", "start", "stay", "stop", "study", "suggest",
        "support", "surf", "surprise", "talk", "taste", "thank", "train", "travel", "treat",
        "try", "turn", "upload", "use", "visit", "volunteer", "vote", "wait", "walk", "want",
        "wash", "watch", "wish", "work", "worry", "happen",
    }
)  # fmt: skip
_KNOWN_VERBS = _REGULAR_VERBS | frozenset(_IRREGULAR)
_PARTICIPLES = frozenset(pp for _, pp in _IRREGULAR.values()) | {"born", "got"}
# Multi-syllable verbs stressed on the last syllable double their final consonant.
_DOUBLING = frozenset(
    {
        "admit", "commit", "compel", "control", "equip", "expel", "occur", "omit", "patrol",
        "permit", "prefer", "refer", "regret", "submit", "transfer", "upset",
    }
)  # fmt: skip
_THIRD_IRREGULAR = {"be": "is", "have": "has", "do": "does", "go": "goes"}

# Name particles that join capitalised words into one name ("Bank of America").
_NAME_CONNECTORS = frozenset({"of", "de", "da", "del", "van", "von", "der", "du"})
_ABBREVIATIONS = frozenset({"dr", "mr", "mrs", "ms", "st", "jr", "sr", "prof", "mt", "ft"})
# A capitalised first word that is an instruction, not a name ("Tell me about ...").
_NON_NAME_OPENERS = frozenset(
    {
        "tell", "list", "name", "describe", "remind", "summarize", "summarise", "give",
        "show", "find", "recall", "remember", "thank", "explain", "compare", "search",
    }
)  # fmt: skip
_QUESTION_JOINERS = frozenset({"and", "or", "but"})
_S_CONTRACTION_TO_HAS = frozenset({"been", "got", "gotten"})
_CONTRACTED_AUX = {"s": "is", "re": "are", "d": "did", "ve": "have", "ll": "will"}

# ----------------------------------------------------------------------------- regexes

_LETTERS = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"  # Latin script incl. accents
_HAS_ASCII_LETTER_RE = re.compile(r"[A-Za-z]")
# Decimals, times and dates first, so "10:30" stays one token; then words, which may carry
# digits ("3rd", "MP3"), hyphens ("19-year-old") and apostrophes ("Caroline's").
_TOKEN_RE = re.compile(
    rf"\d+(?:[.,:/]\d+)+|[{_LETTERS}0-9]+(?:['\-][{_LETTERS}0-9]+)*",
)
_CORE_RE = re.compile(rf"[{_LETTERS}0-9](?:[{_LETTERS}0-9'\-.]*[{_LETTERS}0-9])?")
_CONTRACTION_RE = re.compile(r"^(.+?)(n't|'s|'re|'ve|'ll|'d|'m)$", re.IGNORECASE)
_QUOTE_RE = re.compile(r"\"([^\"]{1,80})\"|“([^”]{1,80})”|(?<!\w)'([^']{1,80})'(?!\w)")
_SENTENCE_BREAK_CHARS = frozenset('.!?,;:"(“')
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[?!])\s+|(?<=\.)\s+(?=[A-Z])")
_NORM_RE = re.compile(r"\w+")
# Politeness and recall prefixes around the actual question; the embedded question that
# follows is already declarative ("do you know where John works?").
_FILLER_RE = re.compile(
    r"^\s*(?:(?:so|hey|hi|ok|okay|oh|um|uh|well|and|also|btw)\b[\s,:;\-]*)*", re.IGNORECASE
)
_RECALL_PREFIX_RE = re.compile(
    r"^(?:(?:(?:can|could|would|will)\s+you\s+)?(?:please\s+)?(?:tell|remind)\s+me"
    r"(?:\s+more)?(?:\s+about)?"
    r"|(?:do|did|can)\s+you\s+(?:know|remember|recall)"
    r"|i\s+(?:wonder|forgot|forget|(?:can't|cannot|don't)\s+remember))\b[\s,:]*",
    re.IGNORECASE,
)


# ------------------------------------------------------------------------------ public


def rewrite_query(query: str) -> list[Rewrite]:
    """Return 0..3 rewrites, each distinct from the query and from each other, never empty.

    Distinctness ignores case, whitespace and punctuation: a rewrite that only differs from
    the query in those would retrieve the same results and just double its weight.
    """
    if not query or not _HAS_ASCII_LETTER_RE.search(query):
        return []
    text = query.replace("’", "'").replace("‘", "'")
    candidates: list[tuple[RewriteKind, str | None]] = [
        ("keywords", _keywords(text)),
        ("entities", _entities(text)),
        ("statement", _statement(text)),
    ]
    seen = {_normalise(text)}
    out: list[Rewrite] = []
    for kind, candidate in candidates:
        if candidate is None:
            continue
        key = _normalise(candidate)
        if key and key not in seen:
            seen.add(key)
            out.append(Rewrite(kind, candidate.strip()))
    return out


def _normalise(text: str) -> str:
    return " ".join(_NORM_RE.findall(text.casefold()))


def _strip_prefixes(text: str) -> tuple[str, bool]:
    """``text`` without leading fillers and recall phrases, and whether a recall phrase
    ("can you tell me", "do you remember") was removed: the clause after one is embedded,
    so already declarative."""
    text = _FILLER_RE.sub("", text, count=1)
    m = _RECALL_PREFIX_RE.match(text)
    return (text[m.end() :], True) if m else (text, False)


def _split_contraction(word: str) -> tuple[str, str]:
    """("what's" -> "what", "'s"); a word without a contraction comes back with "" ."""
    m = _CONTRACTION_RE.match(word)
    return (m.group(1), m.group(2)) if m else (word, "")


def _is_stopword(word: str) -> bool:
    low = word.lower()
    return low in _STOPWORDS or _split_contraction(low)[0] in _STOPWORDS


# ---------------------------------------------------------------------------- keywords


def _keywords(text: str) -> str | None:
    text = _strip_prefixes(text)[0]
    tokens = list(_TOKEN_RE.finditer(text))
    words = [m.group() for m in tokens]
    casing = _casing_is_informative(words)
    kept: list[str] = []
    seen: set[str] = set()
    for i, word in enumerate(words):
        low = word.lower()
        prev = words[i - 1].lower() if i else ""
        nxt = words[i + 1].lower() if i + 1 < len(words) else ""
        if prev == "how" and (low in _HOW_ADVERBS or low == "come"):
            continue
        if low in _KIND_NOUNS and nxt == "of":  # "what kind of music" is about music
            continue
        # A capitalised stopword inside a sentence is a name: "Will Smith", "in May".
        if _is_stopword(low) and not (casing and _starts_name(text, tokens, i)):
            continue
        # Full-text search matches "Caroline", not "Caroline's".
        base = word[: len(_split_contraction(word)[0])]
        if base.casefold() not in seen:
            seen.add(base.casefold())
            kept.append(base)
    return " ".join(kept) or None


# ---------------------------------------------------------------------------- entities


def _entities(text: str) -> str | None:
    found: list[tuple[int, str]] = []
    # Quoted phrases are taken whole and masked so their words are not picked up again.
    masked = text
    for m in _QUOTE_RE.finditer(text):
        phrase = next(g for g in m.groups() if g is not None).strip()
        if phrase:
            found.append((m.start(), phrase))
        masked = masked[: m.start()] + "\0" * (m.end() - m.start()) + masked[m.end() :]

    tokens = list(_TOKEN_RE.finditer(masked))
    words = [m.group() for m in tokens]
    casing = _casing_is_informative(words)
    i = 0
    while i < len(tokens):
        if casing and _starts_name(masked, tokens, i):
            end = _name_run_end(masked, tokens, i)
            last = tokens[end - 1]
            stop = last.start() + len(_split_contraction(last.group())[0])
            found.append((tokens[i].start(), masked[tokens[i].start() : stop]))
            i = end
            continue
        if any(c.isdigit() for c in words[i]):
            found.append((tokens[i].start(), words[i]))
        i += 1

    found.sort(key=lambda item: item[0])
    parts: list[str] = []
    seen: set[str] = set()
    for _, part in found:
        if part.casefold() not in seen:
            seen.add(part.casefold())
            parts.append(part)
    return " ".join(parts) or None


def _casing_is_informative(words: Sequence[str]) -> bool:
    """False for ALL-CAPS or Title Case queries, where capitals do not mark names."""
    alpha = [w for w in words if any(c.isalpha() for c in w)]
    if not any(c.islower() for w in alpha for c in w):
        return False
    return not (len(alpha) >= 3 and all(w[0].isupper() for w in alpha))


def _is_acronym(word: str) -> bool:
    letters = [c for c in word if c.isalpha()]
    return len(letters) >= 2 and all(c.isupper() for c in letters) and word.lower() != "ok"


def _gap(text: str, tokens: Sequence[re.Match[str]], i: int) -> str:
    """The text between token i-1 and token i (or before the first token)."""
    return text[tokens[i - 1].end() if i else 0 : tokens[i].start()]


def _is_sentence_start(text: str, tokens: Sequence[re.Match[str]], i: int) -> bool:
    if i == 0:
        return True
    gap = _gap(text, tokens, i)
    if gap.strip() == "." and tokens[i - 1].group().lower() in _ABBREVIATIONS:
        return False  # "Dr. Smith"
    return any(c in _SENTENCE_BREAK_CHARS for c in gap)


def _starts_name(text: str, tokens: Sequence[re.Match[str]], i: int) -> bool:
    word = tokens[i].group()
    if not word[0].isupper():
        return False
    if _is_acronym(word):
        return True
    base = _split_contraction(word.lower())[0]
    if base == "i":
        return False
    if _is_sentence_start(text, tokens, i):
        # Every sentence starts with a capital; only a word that cannot be anything else
        # counts as a name there.
        return not (base in _STOPWORDS or base in _NON_NAME_OPENERS or base in _KNOWN_VERBS)
    return True


def _name_run_end(text: str, tokens: Sequence[re.Match[str]], i: int) -> int:
    """Index after the last token of the capitalised name starting at token i."""
    end = i + 1
    while end < len(tokens):
        if _split_contraction(tokens[end - 1].group())[1]:
            break  # "Taylor Swift's album": the possessive closes the name
        gap = _gap(text, tokens, end)
        abbreviation = gap == ". " and tokens[end - 1].group().lower() in _ABBREVIATIONS
        if not (gap.isspace() or abbreviation):
            break
        word = tokens[end].group()
        if word[0].isupper() and word != "I":
            end += 1
        elif (
            word in _NAME_CONNECTORS
            and end + 1 < len(tokens)
            and _gap(text, tokens, end + 1).isspace()
            and tokens[end + 1].group()[0].isupper()
        ):
            end += 2
        else:
            break
    return end


# --------------------------------------------------------------------------- statement


@dataclass(frozen=True)
class _Tok:
    raw: str  # as written, with any surrounding punctuation
    core: str  # the word itself
    low: str

    @property
    def possessive(self) -> bool:
        if self.low.endswith("'s"):
            return True
        after = self.raw[self.raw.find(self.core) + len(self.core) :]
        return self.low.endswith("s") and after.startswith("'")

    def replaced(self, core: str) -> _Tok:
        return _Tok(self.raw.replace(self.core, core, 1), core, core.lower())


def _word(text: str) -> _Tok:
    return _Tok(text, text, text.lower())


def _tokenize(sentence: str) -> list[_Tok]:
    toks: list[_Tok] = []
    for chunk in sentence.split():
        m = _CORE_RE.search(chunk)
        if m:
            toks.append(_Tok(chunk, m.group(), m.group().lower()))
    return toks


def _question_sentence(text: str) -> str:
    """The sentence to turn into a statement: the last question, else the last sentence."""
    pieces: list[str] = []
    for piece in _SENTENCE_SPLIT_RE.split(text.strip()):
        words = pieces[-1].split() if pieces else []
        if words and words[-1].rstrip(".").lower() in _ABBREVIATIONS:
            pieces[-1] += " " + piece  # "Dr. Smith" is not a sentence break
        else:
            pieces.append(piece)
    questions = [p for p in pieces if "?" in p]
    return (questions or pieces or [""])[-1]


def _statement(text: str) -> str | None:
    sentence = _question_sentence(text)
    if not any(c.islower() for c in sentence):
        sentence = sentence.lower()  # shouting: capitals carry no information
    stripped, embedded = _strip_prefixes(sentence)
    # The final "?" would otherwise stick to whichever word ends up in the middle.
    toks = _expand_wh_contraction(_cut_second_question(_tokenize(stripped.rstrip().rstrip("?!."))))
    if not toks:
        return None
    first = toks[0].low
    words: list[_Tok] | None = None
    if embedded and (first in {"if", "whether"} or first in _WH):
        words = _embedded(toks)
    elif first in _WH:
        words = _wh_question(toks)
    elif first in _AUX_KIND:
        words = _yes_no_question(toks)
    if not words:
        return None
    return " ".join(t.raw for t in words).strip().rstrip("?!.,;:").strip() or None


def _cut_second_question(toks: list[_Tok]) -> list[_Tok]:
    """Keep only the first of "When did X ... and why?"."""
    for k in range(1, len(toks) - 1):
        if toks[k].low in _QUESTION_JOINERS and (
            toks[k + 1].low in _WH or toks[k + 1].low in _AUX_KIND
        ):
            return toks[:k]
        if toks[k].raw.endswith(",") and toks[k + 1].low in _WH:
            return toks[: k + 1]
    return toks


def _expand_wh_contraction(toks: list[_Tok]) -> list[_Tok]:
    """ "What's" -> "What is" (or "has" before "been"), "Where'd" -> "Where did"."""
    if not toks:
        return toks
    base, suffix = _split_contraction(toks[0].low)
    if base not in _WH or not suffix:
        return toks
    aux = _CONTRACTED_AUX.get(suffix.lstrip("'"))
    if aux is None:
        return toks
    if aux == "is" and any(t.low in _S_CONTRACTION_TO_HAS for t in toks[1:4]):
        aux = "has"
    return [_word(base), _word(aux), *toks[1:]]


# -- word classes


def _is_capitalised(t: _Tok) -> bool:
    return t.core[:1].isupper() and t.low != "i"


def _is_aux(t: _Tok) -> bool:
    # Mid-sentence "Will" or "May" is a name, not an auxiliary.
    return t.low in _AUX_KIND and t.core == t.low


def _is_content(t: _Tok) -> bool:
    return not _is_stopword(t.low) and t.low not in _AUX_KIND


def _is_adverb(t: _Tok) -> bool:
    if t.low in _ADVERBS:
        return True
    return t.low.endswith("ly") and len(t.low) > 4 and t.low not in _KNOWN_VERBS


def _is_ing(t: _Tok) -> bool:
    # Capitalised words ending in -ing/-ed are names ("Ming", "Fred"), not verb forms.
    return t.core == t.low and t.low.endswith("ing") and len(t.low) >= 5 and t.low not in _ING_NOUNS


def _is_participle(t: _Tok) -> bool:
    if t.core != t.low:
        return False
    if t.low in _PARTICIPLES:
        return True
    return t.low.endswith("ed") and len(t.low) >= 4 and t.low not in _NOT_PARTICIPLES


def _is_verb_base(t: _Tok, *, strict: bool) -> bool:
    """A plain verb after do/did/modals; ``strict`` accepts only verbs we know."""
    if t.core != t.low or not t.low.replace("-", "").isalpha():
        return False
    if t.low in _KNOWN_VERBS:
        return True
    return not strict and _is_content(t) and not _is_adverb(t) and not t.possessive


def _skip_adverbs(toks: Sequence[_Tok], k: int) -> int:
    while k < len(toks) and _is_adverb(toks[k]):
        k += 1
    return k


# -- noun phrases

# follows(end, simple): does what comes after toks[:end] fit the clause? ``simple`` is True
# for a pronoun, a capitalised name or one bare word, whose boundary is certain.
_Follows = Callable[[int, bool], bool]


def _np_candidates(toks: Sequence[_Tok], i: int) -> Iterator[tuple[int, bool]]:
    """Possible ends of a subject noun phrase starting at toks[i], with its ``simple`` flag."""
    if i >= len(toks):
        return
    t = toks[i]
    if t.low in _SUBJECT_PRONOUNS:
        yield i + 1, True
    elif t.low in _DETERMINERS:
        yield from _head_candidates(toks, i + 1)
    elif _is_capitalised(t) and _is_content(t):
        run = i + 1
        while run < len(toks) and not toks[run - 1].possessive and _is_capitalised(toks[run]):
            run += 1
        # Longest name first ("New York"), then shorter ones ("Is Sam Melanie's sister?").
        for end in range(run, i, -1):
            if toks[end - 1].possessive:  # "Caroline's sister": the possessive is a determiner
                yield from _head_candidates(toks, end)
            else:
                yield end, True
    elif _is_content(t):
        # A lowercase bare noun ("caroline", "people"): the phrase is only trusted when a
        # known verb follows, so it is never ``simple``.
        yield from _head_candidates(toks, i)


def _head_candidates(toks: Sequence[_Tok], start: int) -> Iterator[tuple[int, bool]]:
    """Ends after each word of the nouns following a determiner, shortest first.

    Without part-of-speech tags, "my work schedule" could end after any of its words; the
    caller's ``follows`` check picks the boundary.
    """
    for k in range(start, min(len(toks), start + 4)):
        w = toks[k]
        if not _is_content(w) or _is_adverb(w):
            return
        if not w.possessive and w.low not in _PRENOMINAL:
            yield k + 1, False


def _np_end(toks: Sequence[_Tok], i: int, follows: _Follows) -> int | None:
    """End of the subject noun phrase at toks[i] (coordination included), or None."""
    for end, simple in _np_candidates(toks, i):
        if end < len(toks) and toks[end].low in {"and", "&"}:
            joined = _np_end(toks, end + 1, follows)
            if joined is not None:
                return joined
        if follows(end, simple):
            return end
    return None


def _follows_verb(toks: Sequence[_Tok]) -> _Follows:
    def check(end: int, simple: bool) -> bool:
        k = _skip_adverbs(toks, end)
        return k < len(toks) and _is_verb_base(toks[k], strict=not simple)

    return check


def _follows_participle(toks: Sequence[_Tok]) -> _Follows:
    def check(end: int, simple: bool) -> bool:
        k = _skip_adverbs(toks, end)
        if k >= len(toks):
            return False
        t = toks[k]
        return _is_participle(t) or (simple and _is_verb_base(t, strict=False))

    return check


def _follows_predicate(toks: Sequence[_Tok]) -> _Follows:
    def check(end: int, simple: bool) -> bool:
        k = _skip_adverbs(toks, end)
        if k >= len(toks):
            return False
        if simple:
            return True
        t = toks[k]
        return (
            t.low in _PREPOSITIONS
            or t.low in _DETERMINERS
            or t.low in _PRED_ADJECTIVES
            or _is_ing(t)
            or _is_participle(t)
            or t.core[:1].isdigit()
        )

    return check


_FOLLOWS: dict[_AuxKind, Callable[[Sequence[_Tok]], _Follows]] = {
    "do": _follows_verb,
    "modal": _follows_verb,
    "have": _follows_participle,
    "be": _follows_predicate,
}


# -- verb forms


def _past(verb: str) -> str:
    if verb in _IRREGULAR:
        return _IRREGULAR[verb][0]
    if verb.endswith("e"):
        return verb + "d"
    if re.search(r"[^aeiou]y$", verb):
        return verb[:-1] + "ied"
    if _doubles_final_consonant(verb):
        return verb + verb[-1] + "ed"
    return verb + "ed"


def _doubles_final_consonant(verb: str) -> bool:
    # stop -> stopped, plan -> planned; visit -> visited (unstressed), fix -> fixed (x)
    if verb in _DOUBLING:
        return True
    one_syllable = len(re.findall(r"[aeiouy]+", verb)) == 1
    return one_syllable and re.search(r"(?:^|[^aeiou])[aeiou][bdfgklmnprstvz]$", verb) is not None


def _third_person(verb: str) -> str:
    if verb in _THIRD_IRREGULAR:
        return _THIRD_IRREGULAR[verb]
    if re.search(r"(?:s|sh|ch|x|z|o)$", verb):
        return verb + "es"
    if re.search(r"[^aeiou]y$", verb):
        return verb[:-1] + "ies"
    return verb + "s"


# -- clauses


def _wh_phrase(toks: Sequence[_Tok]) -> tuple[int, list[_Tok]] | None:
    """Index after the wh-phrase and its noun ("which city" -> [city]); None if unusable."""
    wh = toks[0].low
    i = 1
    if wh == "how" and len(toks) > 1:
        if toks[1].low in _HOW_ADVERBS:
            return 2, []
        if toks[1].low not in _HOW_QUANTIFIERS:
            return 1, []
        i = 2
    elif wh not in {"what", "which", "whose"}:
        return 1, []
    noun: list[_Tok] = []
    while i < len(toks) and not _is_aux(toks[i]):
        noun.append(toks[i])
        i += 1
    if len(noun) >= 2 and noun[0].low in _KIND_NOUNS and noun[1].low == "of":
        noun = noun[2:]
    if len(noun) > 4 or not all(_is_content(t) for t in noun):
        return None  # "Which of my friends ...", or no auxiliary at all: a subject question
    if wh == "whose" and noun:
        return None
    if len(noun) == 1 and noun[0].low in _EMPTY_WH_NOUNS:
        noun = []
    return i, noun


def _wh_question(toks: list[_Tok]) -> list[_Tok] | None:
    parsed = _wh_phrase(toks)
    if parsed is None:
        return None
    i, noun = parsed
    if i >= len(toks):
        return None
    if toks[0].low == "how" and toks[i].low == "come":
        return _declarative(toks[i + 1 :], noun)
    if not _is_aux(toks[i]):
        return None  # "Who painted the sunset?": the subject is the unknown
    aux, rest = toks[i], toks[i + 1 :]
    kind = _AUX_KIND[aux.low]
    if kind == "be":
        return _wh_be(toks[0].low, aux, rest, noun)
    end = _np_end(rest, 0, _FOLLOWS[kind](rest))
    if end is None:
        return None
    words, verb_end = _clause(rest[:end], aux, rest[end:], kind)
    main_verb = words[verb_end - 1].low
    if toks[0].low == "what" and not noun and main_verb in {"do", "does", "did", "done", "happen"}:
        return None  # "What did Caroline do?" -> "Caroline did": no content to match
    return _place_noun(words, verb_end, noun)


def _wh_be(wh: str, aux: _Tok, rest: list[_Tok], noun: list[_Tok]) -> list[_Tok] | None:
    """ "What is X?" -> "X is"; "What is X doing?" -> "X is doing"; "Where is X from?"."""
    if not rest:
        return None
    head = rest[0]
    if _is_ing(head) or _is_participle(head):
        # "Which friend is coming?": the wh-noun is the subject.
        return [*noun, _word(aux.low), *rest] if noun else None
    if not (head.low in _DETERMINERS or head.low in _SUBJECT_PRONOUNS or _is_content(head)):
        return None  # "What is in the box?"

    def verb_follows(end: int, simple: bool) -> bool:
        k = _skip_adverbs(rest, end)
        return k < len(rest) and (_is_ing(rest[k]) or _is_participle(rest[k]))

    end = _np_end(rest, 0, verb_follows)
    if end is not None:
        words, verb_end = _clause(rest[:end], aux, rest[end:], "be")
        return _place_noun(words, verb_end, noun)
    if wh in {"when", "where", "why", "how"}:
        # The wh-word is an adjunct, so the rest is subject + predicate: "Why is X sad?".
        predicate = _follows_predicate(rest)
        end = _np_end(rest, 0, lambda e, simple: e == len(rest) or predicate(e, simple))
        if end is None or (wh == "why" and end == len(rest)):
            return None
        return [*rest[:end], _word(aux.low), *rest[end:]]
    # "What/who is X?": the wh-word is the predicate, X the whole subject.
    if len(rest) >= 2 and rest[-1].low in _PREPOSITIONS:
        return [*rest[:-1], _word(aux.low), rest[-1], *noun]  # "Sam is from" + city
    return [*rest, _word(aux.low), *noun]


def _yes_no_question(toks: list[_Tok]) -> list[_Tok] | None:
    aux, rest = toks[0], toks[1:]
    kind = _AUX_KIND[aux.low]
    end = _np_end(rest, 0, _FOLLOWS[kind](rest))
    if end is None:
        return None
    return _clause(rest[:end], aux, rest[end:], kind)[0]


def _clause(
    subject: Sequence[_Tok], aux: _Tok, rest: Sequence[_Tok], kind: _AuxKind
) -> tuple[list[_Tok], int]:
    """Subject + verb group + rest, and the index after the main verb (where an object goes).

    ``rest`` must start (after adverbs) with the verb when ``kind`` is do/modal/have.
    """
    k = _skip_adverbs(rest, 0)
    zone = [t for t in rest[:k] if t.low not in _HEDGES]
    tail = list(rest[k:])
    if kind == "modal" and [t.low for t in tail[:3]] == ["be", "likely", "to"]:
        tail = tail[3:]  # "would be likely to pursue" is a hedge on "would pursue"
    aux_word = _word(aux.low)
    negated = "n't" in aux.low or aux.low == "cannot" or any(t.low == "not" for t in zone)
    if kind == "be" and not (tail and (_is_ing(tail[0]) or _is_participle(tail[0]))):
        head = [*subject, aux_word, *zone]  # "Sam is | married": no verb after the copula
        return [*head, *tail], len(head)
    if kind == "do" and tail and not negated:
        # The tense moves from the auxiliary onto the verb: "did go" -> "went".
        verb = tail[0]
        form = verb.low
        if aux.low == "did":
            form = _past(verb.low)
        elif aux.low == "does":
            form = _third_person(verb.low)
        head = [*subject, *zone, verb.replaced(form)]
        return [*head, *tail[1:]], len(head)
    verb_len = 1
    if (
        len(tail) > 1
        and tail[0].low in {"been", "be"}
        and (_is_ing(tail[1]) or _is_participle(tail[1]))
    ):
        verb_len = 2  # "has been learning", "would be doing"
    head = [*subject, aux_word, *zone, *tail[:verb_len]]
    return [*head, *tail[verb_len:]], len(head)


def _place_noun(words: list[_Tok], verb_end: int, noun: Sequence[_Tok]) -> list[_Tok]:
    """Put the wh-noun where the answer goes: "Melanie has read [books]"."""
    if not noun:
        return words
    after = words[verb_end:]
    at = verb_end
    if after and after[0].low in _PREPOSITIONS:
        nxt = after[1] if len(after) > 1 else None
        if nxt is None or nxt.low in _PREPOSITIONS or _is_time_word(nxt):
            at = verb_end + 1  # "moved to [city] last year"
        elif after[0].low == "to" and nxt.low in _KNOWN_VERBS:
            at = verb_end + 2  # "learned to play [instrument]"
    return [*words[:at], *noun, *words[at:]]


def _is_time_word(t: _Tok) -> bool:
    return t.low in {"last", "next", "this", "yesterday", "today", "tomorrow", "ago"} or (
        t.low in _EMPTY_WH_NOUNS
    )


def _declarative(body: Sequence[_Tok], noun: Sequence[_Tok]) -> list[_Tok] | None:
    """An embedded clause ("where John works") is already a statement."""
    if not body:
        return None

    def finite_follows(end: int, simple: bool) -> bool:
        k = _skip_adverbs(body, end)
        if k >= len(body):
            return False
        t = body[k]
        return t.low in _AUX_KIND or _is_verb_base(t, strict=False) or _is_participle(t)

    end = _np_end(body, 0, finite_follows)
    if end is None:
        return None
    return _place_noun(list(body), _skip_adverbs(body, end) + 1, noun)


def _embedded(toks: list[_Tok]) -> list[_Tok] | None:
    wh = toks[0].low
    if wh in {"if", "whether"}:
        return _declarative(toks[1:], [])
    parsed = _wh_phrase(toks)
    if parsed is not None and parsed[0] < len(toks) and _is_aux(toks[parsed[0]]):
        return _wh_question(toks)  # "do you know where does John work?"
    second = toks[1].low if len(toks) > 1 else ""
    if wh == "how" and (second in _HOW_ADVERBS or second == "come"):
        return _declarative(toks[2:], [])
    if wh == "how" and second in _HOW_QUANTIFIERS:
        return _declarative(toks[3:], toks[2:3])
    # "what Caroline researched" or "what books Melanie read": try without a noun first.
    words = _declarative(toks[1:], [])
    if words is None and wh in {"what", "which"} and len(toks) > 2 and _is_content(toks[1]):
        words = _declarative(toks[2:], toks[1:2])
    return words

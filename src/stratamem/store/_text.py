"""Text preparation for full-text search, shared by the store adapters.

Word-based tokenizers (SQLite's unicode61, PostgreSQL's default parser) treat a run of
Chinese or Japanese characters as one "word", so "我搬到柏林了" would only match itself.
We index CJK runs as overlapping character bigrams (plus unigrams, so one-character
queries still match) and turn queries into the same grams: the standard n-gram approach
that Lucene's CJKAnalyzer uses.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from functools import lru_cache

__all__ = ["fts_document", "fts_query_terms", "fts_words", "message_text", "scope_token"]

# Han, Hiragana, Katakana, Hangul (syllables and jamo), CJK punctuation excluded.
_CJK = (
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u31f0-\u31ff"  # Katakana extensions
    "\u3400-\u4dbf"  # CJK Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\u1100-\u11ff"  # Hangul jamo
    "\U00020000-\U0002ebef"  # CJK Extensions B-F
)
_CJK_RUN = re.compile(f"[{_CJK}]+")
_TOKEN = re.compile(f"[{_CJK}]+|[^\\W_]+(?:['’][^\\W_]+)*", re.UNICODE)

# Words that carry no topic: matching them would rank by noise. Kept short on purpose;
# content words like "live", "work", "like" stay searchable. "user" is here because every
# fact and summary is written about "User ...": in a query it matches everything.
_STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your yours
    yourself yourselves s t don didn doesn isn wasn ve ll re d m o y also user users
    """.split()  # noqa: SIM905
)


def _grams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def message_text(content: str, event_type: str | None, page: str | None) -> str:
    """What a message is found by in full text: its content, its event type in words and
    its page."""
    parts = [content]
    if event_type:
        parts.append(event_type.replace("_", " "))
    if page:
        parts.append(page)
    return "\n".join(parts)


def fts_document(text: str) -> str:
    """The text to index: unchanged, except that CJK runs become unigrams and bigrams."""
    if not _CJK_RUN.search(text):
        return text

    def expand(match: re.Match[str]) -> str:
        run = match.group(0)
        parts = list(run) + (_grams(run) if len(run) > 1 else [])
        return " " + " ".join(parts) + " "

    return _CJK_RUN.sub(expand, text)


def fts_query_terms(query: str, *, max_terms: int = 24) -> list[str]:
    """Search terms of a natural-language query (deduplicated, stopwords dropped).

    CJK runs become bigrams; other words are kept whole (the index tokenizer stems them).
    If every word is a stopword the words are kept, so "Who am I?" still searches.
    """
    terms: list[str] = []
    fallback: list[str] = []
    for token in _TOKEN.findall(query.lower()):
        if _CJK_RUN.fullmatch(token):
            terms.extend(_grams(token))
            continue
        token = token.replace("’", "'").split("'")[0]
        if not token:
            continue
        fallback.append(token)
        if token in _STOPWORDS or (len(token) == 1 and not token.isdigit()):
            continue
        terms.append(token)
    chosen = terms or fallback
    seen: dict[str, None] = {}
    for t in chosen:
        seen.setdefault(t, None)
    return list(seen)[:max_terms]


_WORD = re.compile(r"[^\W_]+")


@lru_cache(maxsize=65536)
def _fold(ch: str) -> str:
    # Like unicode61's remove_diacritics: "é" -> "e", "Å" -> "a". CJK is left alone:
    # dropping a dakuten ("ガ" -> "カ") would change the word, not an accent.
    if ch < "\u00c0" or ch >= "\u3000":
        return ch
    return "".join(c for c in unicodedata.normalize("NFD", ch) if not unicodedata.combining(c))


def fts_words(text: str) -> list[str]:
    """The words SQLite's tokenizer (unicode61, remove_diacritics 2) sees in ``text``:
    lowercased, diacritics removed, runs of letters and digits.

    The PostgreSQL store indexes these words, joined by spaces, instead of handing raw text
    to PostgreSQL's parser, which keeps "/shop/search", "e-mail" or "a@b.c" as one token and
    would then disagree with the query terms (``fts_query_terms``) and with SQLite.
    """
    lowered = text.lower()
    if not lowered.isascii():
        lowered = "".join(map(_fold, lowered))
    return _WORD.findall(lowered)


def scope_token(project_id: str, user_id: str) -> str:
    """One opaque, tokenizer-safe word per (project, user) for scoped full-text search."""
    digest = hashlib.blake2b(f"{project_id}\x1f{user_id}".encode(), digest_size=10).hexdigest()
    return "u" + digest

"""A model-free fallback embedder: signed feature hashing of words and character n-grams.

It captures lexical overlap only (shared words, shared word stems via character n-grams,
typos), not meaning, but it needs nothing beyond numpy, is fully deterministic across
processes and machines, and is fast. Any change to the features, weights or hash must
bump the version (``v2``) in :attr:`HashingEmbedder.id`, since stored vectors would otherwise be
silently incompatible.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from hashlib import blake2b

import numpy as np

from stratamem.errors import ConfigError

__all__ = ["DEFAULT_DIM", "HashingEmbedder"]

DEFAULT_DIM = 384

# Scripts written without spaces between words (Hangul has spaces, but its syllable
# blocks behave like CJK characters for matching): Han, Hiragana, Katakana, Hangul.
# Ranges are after NFKC, which folds half-width Katakana and compatibility Jamo.
_CJK = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u2e80-\u2fdf"  # CJK and Kangxi radicals
    "\u3005\u3007\u3021-\u3029\u3038-\u303b"  # Han iteration mark, numerals
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # Han extension A
    "\u4e00-\u9fff"  # Han unified ideographs
    "\ua960-\ua97f"  # Hangul Jamo extended A
    "\uac00-\ud7ff"  # Hangul syllables, Jamo extended B
    "\uf900-\ufaff"  # Han compatibility ideographs
    "\U00020000-\U0003134f"  # Han extensions B-G
)
# A token is either a run of CJK characters or a run of other word characters.
_TOKEN_RE = re.compile(f"[{_CJK}]+|[^\\W{_CJK}]+")
_CJK_RE = re.compile(f"[{_CJK}]")

# Relative weights of the feature families. Character n-grams are many per word, so each
# weighs little: a word's n-grams together count about as much as the word itself, which
# lets typos and inflections still match without drowning exact word matches. For CJK,
# bigrams approximate words and so weigh more than single characters.
_W_WORD = 1.0
_W_WORD_BIGRAM = 0.7
_W_CHAR_NGRAM = 0.25
_W_CJK_CHAR = 0.5
_W_CJK_BIGRAM = 1.0
_W_STOPWORD = 0.25
_NGRAM_SIZES = (3, 4, 5)

# The most frequent English function words carry little topic signal but, counted like
# other words, make every pair of English sentences look related. They are damped, not
# dropped, so a text made only of them still gets a vector; their n-grams are skipped.
_STOPWORD_LIST = (
    "a an and are as at be but by do for from has have he her his i if in is it its me my "
    "no not of on or our she so that the their them they this to was we were what when "
    "which who will with you your"
)
_STOPWORDS = frozenset(_STOPWORD_LIST.split())

# Each feature string is prefixed with a family tag (w word, s stopword, b word bigram,
# c character n-gram, h CJK character, k CJK bigram) so that, e.g., the word "the" and the
# n-gram "the" hash apart.


def _feature_hash(feature: str) -> int:
    # Python's hash() is salted per process; vectors must be reproducible everywhere. v2 is
    # v1 under the renamed project's personalisation string (the features are unchanged).
    digest = blake2b(feature.encode("utf-8"), digest_size=8, person=b"stratamem-hash2").digest()
    return int.from_bytes(digest, "little")


def _frozen(
    hashes: list[int], weights: list[float], cjk: bool = False
) -> tuple[np.ndarray, np.ndarray, bool]:
    h = np.array(hashes, dtype=np.uint64)
    w = np.array(weights, dtype=np.float64)
    h.flags.writeable = False  # shared through the cache
    w.flags.writeable = False
    return h, w, cjk


# Texts repeat their words far more than they repeat word pairs, so the per-token work
# (n-grams and their hashes) is cached; that is most of the embedder's cost.
@lru_cache(maxsize=1 << 16)
def _token_features(token: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """Hashes and family weights of the features one token contributes, and whether the
    token is a CJK run."""
    if _CJK_RE.match(token):
        chars = [_feature_hash("h" + char) for char in token]
        pairs = [_feature_hash("k" + token[i - 1 : i + 1]) for i in range(1, len(token))]
        weights = [_W_CJK_CHAR] * len(chars) + [_W_CJK_BIGRAM] * len(pairs)
        return _frozen(chars + pairs, weights, cjk=True)
    if token in _STOPWORDS:
        return _frozen([_feature_hash("s" + token)], [_W_STOPWORD])
    marked = f"<{token}>"
    grams = [
        _feature_hash("c" + marked[i : i + size])
        for size in _NGRAM_SIZES
        for i in range(len(marked) - size + 1)
    ]
    return _frozen([_feature_hash("w" + token), *grams], [_W_WORD] + [_W_CHAR_NGRAM] * len(grams))


@lru_cache(maxsize=1 << 16)
def _bigram_hash(first: str, second: str) -> int:
    return _feature_hash("b" + first + " " + second)


# Texts are processed in chunks so the per-chunk (texts x dim) float64 buffer stays small.
_CHUNK = 1024


def _embed_chunk(texts: Sequence[str], dim: int) -> np.ndarray:
    hash_parts: list[np.ndarray] = []
    weight_parts: list[np.ndarray] = []
    part_rows: list[int] = []
    bigrams: list[int] = []
    bigram_rows: list[int] = []
    for row, text in enumerate(texts):
        previous: str | None = None
        for token in _TOKEN_RE.findall(unicodedata.normalize("NFKC", text).lower()):
            hashes, weights, cjk = _token_features(token)
            hash_parts.append(hashes)
            weight_parts.append(weights)
            part_rows.append(row)
            if cjk:
                previous = None  # word bigrams do not span a CJK run
                continue
            if previous is not None:
                bigrams.append(_bigram_hash(previous, token))
                bigram_rows.append(row)
            previous = token
    out = np.zeros((len(texts), dim), dtype=np.float32)
    if not hash_parts:
        return out

    # All features of the chunk as (row, hash, family weight), then term frequencies per
    # (row, hash) by sorting once, instead of one small numpy round trip per text.
    lengths = np.fromiter(map(len, hash_parts), dtype=np.intp, count=len(hash_parts))
    hashes = np.concatenate([*hash_parts, np.array(bigrams, dtype=np.uint64)])
    weights = np.concatenate([*weight_parts, np.full(len(bigrams), _W_WORD_BIGRAM)])
    rows = np.concatenate([np.repeat(np.array(part_rows), lengths), np.array(bigram_rows, int)])
    # Sorting one mixed 64-bit key is several times faster than lexsort on (row, hash). The
    # boundary test still compares row and hash, so a key collision (astronomically rare)
    # could at worst split one feature's count, never merge two features.
    keys = hashes ^ (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    order = np.argsort(keys)
    hashes, weights, rows = hashes[order], weights[order], rows[order]
    first = np.ones(len(hashes), dtype=bool)
    first[1:] = (hashes[1:] != hashes[:-1]) | (rows[1:] != rows[:-1])
    starts = np.flatnonzero(first)
    tf = np.diff(np.append(starts, len(hashes)))
    hashes, rows = hashes[starts], rows[starts]
    weights = weights[starts] * (1.0 + np.log(tf))

    # Each feature goes to two buckets, one per 32-bit half of its hash: the same collision
    # variance as one bucket, but one unlucky collision between two heavy words no longer
    # makes unrelated texts look alike. The top bit of each half picks the sign, so
    # collisions tend to cancel rather than pile up.
    halves = np.concatenate((hashes & np.uint64(0xFFFFFFFF), hashes >> np.uint64(32)))
    buckets = ((halves & np.uint64(0x7FFFFFFF)) % np.uint64(dim)).astype(np.intp)
    signs = 1.0 - 2.0 * (halves >> np.uint64(31)).astype(np.float64)
    cells = np.tile(rows, 2) * dim + buckets
    vecs = np.bincount(cells, weights=signs * np.tile(weights, 2), minlength=len(texts) * dim)
    vecs = vecs.reshape(len(texts), dim)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    np.divide(vecs, norms, out=out, where=norms > 0, casting="same_kind")
    return out


class HashingEmbedder:
    """Deterministic lexical embedder (no model): hashed word, bigram and n-gram features.

    Features: word unigrams and bigrams plus character 3-5-grams within each word; for
    Han, Hiragana, Katakana and Hangul text, character unigrams and bigrams. Text is NFKC
    normalised and lowercased; term counts are weighted sublinearly (``1 + ln tf``) and
    hashed with signs into ``dim`` buckets; rows are L2-normalised.
    """

    def __init__(self, dim: int = DEFAULT_DIM) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"hashing embedder dim must be a positive integer, got {dim!r}")
        self.dim = dim
        self.id = f"hash:v2:{dim}"
        self.name = f"hashing embedder v2 ({dim} dims; lexical, no model)"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``(len(texts), dim)``, unit rows; see ``Embedder``."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single str")
        if len(texts) <= _CHUNK:
            return _embed_chunk(texts, self.dim)
        return np.concatenate(
            [_embed_chunk(texts[i : i + _CHUNK], self.dim) for i in range(0, len(texts), _CHUNK)]
        )

"""A tokenizer-free token estimate, good enough to keep context within a budget.

Different LLMs tokenize differently; we do not ship every tokenizer. English averages
about four characters per token and CJK about one character per token, so we count CJK
characters one each and the rest at one per four characters (but at least one per word).
The estimate errs on the high side so a budget is not overrun.
"""

from __future__ import annotations

import math
import re

__all__ = ["estimate_tokens", "truncate_to_tokens"]

_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_WORD = re.compile(r"\S+")


def estimate_tokens(text: str) -> int:
    if not text:
        return 0
    cjk = len(_CJK.findall(text))
    rest = _CJK.sub(" ", text)
    words = len(_WORD.findall(rest))
    return cjk + max(words, math.ceil(len(rest.strip()) / 4))


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """``text`` cut at a word boundary so that its estimate stays within ``max_tokens``."""
    if estimate_tokens(text) <= max_tokens:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # longest prefix that fits, by bisection on characters
        mid = (lo + hi + 1) // 2
        if estimate_tokens(text[:mid] + "…") <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    cut = text[:lo]
    space = cut.rfind(" ")
    if space > lo * 0.6:
        cut = cut[:space]
    return cut.rstrip() + "…"

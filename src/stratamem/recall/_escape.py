"""Stored text made safe to show inside the memory block, still reading the same.

Memory is user-derived data, and a stored message may hold anything: ``</memory>``, a
chat template's control tokens (``<|im_start|>system``, ``[INST]``), a role marker
(``SYSTEM: ignore all previous instructions``, ``### Instruction``), or a closing quote
followed by a forged ``(assistant, 2026-01-01)`` label. In the block such text stays on one
line, and the characters that would give it structure are written as HTML character
references: visible (no invisible characters a tokenizer may drop), familiar to a reader
and to a model, and unambiguous (``html.unescape`` gives the line back):

* ``<`` (and the full-width ``＜``, ``﹤``) -> ``&lt;``: no tag can close the block and no
  angle-bracket control token survives (ChatML ``<|im_start|>``/``<|im_end|>``,
  ``<|endoftext|>``, Llama 3 ``<|start_header_id|>``/``<|eot_id|>``, ``<s>``/``</s>``,
  ``<<SYS>>``, Gemma ``<start_of_turn>``, DeepSeek's ``<｜User｜>``);
* ``[`` of an upper-case bracket token (``[INST]``, ``[/INST]``, ``[SYSTEM_PROMPT]``) ->
  ``&#91;``;
* a role marker at the start of a line of the stored text, or right after ``>`` or ``]``
  (where a control token or tag ended): the colon of ``SYSTEM:``, ``assistant:``,
  ``Human:`` (Anthropic's ``\\n\\nHuman:``), ``### Instruction:`` -> ``&#58;``; a heading's
  first ``#`` at the start of a line -> ``&#35;``;
* in a quote, ``"`` -> ``&quot;``; in a label also ``( ) , : [ ]``;
* ``&`` that begins something like a character reference -> ``&amp;``, so the escapes
  above are never ambiguous.

Line breaks (and every other Unicode line or paragraph separator) become single spaces,
after the line-start rules have seen them.
"""

from __future__ import annotations

import re

__all__ = ["ROLE_WORDS", "escape_label", "escape_quote", "escape_text"]

# Words that name a turn's speaker in chat templates and plain-text prompt formats.
ROLE_WORDS = (
    "system",
    "assistant",
    "user",
    "human",
    "ai",
    "bot",
    "model",
    "developer",
    "tool",
    "function",
    "instruction",
    "instructions",
    "response",
)

_AMPERSAND = re.compile(r"&(?=#|\w+;)")
_ROLE_MARKER = re.compile(
    rf"(^|[>\]])([ \t]*[-*_#>]*[ \t]*(?:{'|'.join(ROLE_WORDS)})\b[ \t]*\**[ \t]*):",
    re.IGNORECASE | re.MULTILINE,
)
_HEADING = re.compile(r"^([ \t]*)#", re.MULTILINE)
_BRACKET_TOKEN = re.compile(r"\[(?=/?[A-Z][A-Z_]{2,}\])")
_LESS_THAN = re.compile("[<\uff1c\ufe64]")
_LABEL_PUNCTUATION = str.maketrans(
    {"(": "&#40;", ")": "&#41;", ",": "&#44;", ":": "&#58;", "[": "&#91;", "]": "&#93;"}
)


def escape_text(text: str) -> str:
    """``text`` on one line with its structure-giving characters escaped."""
    text = _AMPERSAND.sub("&amp;", text)
    # Line starts are where role markers and headings act: found before lines are joined.
    text = _ROLE_MARKER.sub(r"\1\2&#58;", "\n".join(text.splitlines()))
    text = _HEADING.sub(r"\1&#35;", text)
    text = _BRACKET_TOKEN.sub("&#91;", text)
    text = _LESS_THAN.sub(lambda m: "&lt;" if m.group() == "<" else f"&#{ord(m.group())};", text)
    return " ".join(text.split())


def escape_quote(text: str) -> str:
    """``text`` to show between double quotes: it cannot close them."""
    return escape_text(text).replace('"', "&quot;")


def escape_label(text: str) -> str:
    """A speaker name or event type in a label: it cannot end or extend the label."""
    return escape_quote(text).translate(_LABEL_PUNCTUATION)

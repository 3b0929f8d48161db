"""The prompts of the write path, in one place, versioned.

Every stored fact and summary records the version of the prompt (and the model) that
produced it, so a change here is traceable in the data. Change a prompt's text, change its
version. Hooks may append instructions to the *user* prompt; the system prompts below are
never altered at run time.
"""

from __future__ import annotations

from typing import Any

from ._drafts import FACT_KINDS

__all__ = [
    "CONSOLIDATE",
    "EXTRACT",
    "HEURISTIC_VERSION",
    "TOPICS",
    "Prompt",
]

HEURISTIC_VERSION = "heuristic-v1"


class Prompt:
    def __init__(self, version: str, system: str, schema: dict[str, Any]) -> None:
        self.version = version
        self.system = system.strip()
        self.schema = schema


_NULLABLE_STRING = {"type": ["string", "null"]}

EXTRACT = Prompt(
    "extract-v2",
    """
You extract long-term memory about the USER from a conversation between the user and an
assistant, including the user's behaviour events (searches, clicks, tool calls).

Rules:
- Grounded: state only what the messages support. Never guess, never add world knowledge.
- Atomic but not over-split: one fact per piece of information; keep a thing and its
  qualifiers together ("allergic to peanuts, carries an EpiPen" may stay one fact).
- Write each fact as a short third-person statement about the user ("User is vegetarian"),
  in the language of the messages it comes from.
- kind is one of: """
    + ", ".join(FACT_KINDS)
    + """.
- Resolve relative time against the timestamp of the message it appears in ("next
  Wednesday" said on 2026-04-28 becomes 2026-05-06): put the absolute date in the text and in
  occurred_at / valid_from / valid_to (ISO 8601 dates) when they apply.
- source_ids: the ids of the messages (from MESSAGES, never from CONTEXT) that support the
  fact.
- Facts stated only by the assistant count only if the user confirmed them; then cite both
  messages.
- Behaviour events become facts too; aggregate repeated events ("User searched for light
  running shoes 3 times").
- Skip greetings, thanks, questions without information about the user, and chit-chat.
- confidence: 0.9 for clear statements, lower for hedged ones ("maybe", "I think").
- Corrections ("Correction: ...", "actually ...") are facts too; keep the corrected value.
- Standing instructions and preferences: when the USER (not the assistant, not someone else)
  states something that should shape later answers without being repeated, set standing to
  true. That is an instruction to the assistant (kind instruction: "Always give me a code
  example when I ask about async error handling" -> "User asks to always get a code example
  when asking about async error handling"), a preference stated as one (kind preference:
  "I prefer asynchronous persistence with acknowledgements"), or a lasting diet or health
  constraint (kind constraint: "I'm vegetarian", "I'm allergic to peanuts"). Not standing:
  a request about the current task only ("explain this error"), habits and reports ("I
  always forget my keys", "I've never used Redis"), rules someone else was given.
- scope (standing facts only): what the instruction or preference applies to, in a few
  words ("async error handling", "message persistence"), or null when it applies to every
  request ("I'm vegetarian", "keep answers short"). Non-standing facts: standing false,
  scope null.
""",
    {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "kind": {"type": "string", "enum": list(FACT_KINDS)},
                        "source_ids": {"type": "array", "items": {"type": "string"}},
                        "confidence": {"type": "number"},
                        "occurred_at": _NULLABLE_STRING,
                        "valid_from": _NULLABLE_STRING,
                        "valid_to": _NULLABLE_STRING,
                        "standing": {"type": "boolean"},
                        "scope": _NULLABLE_STRING,
                    },
                    "required": ["text", "kind", "source_ids", "confidence"],
                },
            }
        },
        "required": ["facts"],
    },
)

CONSOLIDATE = Prompt(
    "consolidate-v1",
    """
You maintain a user's long-term memory: short summaries, each a self-contained statement
that is true now. Given NEW FACTS and the EXISTING SUMMARIES most similar to them, decide
for each new fact (or group of new facts saying the same thing):

- "add": the information is new; give the summary text.
- "strengthen": an existing summary already says this; give its summary_id (and optionally
  an improved text that keeps every detail).
- "supersede": the fact changes or corrects an existing summary (a move, a changed
  preference, "correction: ..."); give that summary_id and the text that is true now.
- "none": the fact adds nothing worth remembering long-term.

Write summaries in the language of the facts, with absolute dates where time matters.
Use only summary ids listed under EXISTING SUMMARIES. Every new fact id should appear in
exactly one decision.
""",
    {
        "type": "object",
        "properties": {
            "decisions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "fact_ids": {"type": "array", "items": {"type": "string"}},
                        "action": {
                            "type": "string",
                            "enum": ["add", "strengthen", "supersede", "none"],
                        },
                        "summary_id": _NULLABLE_STRING,
                        "text": _NULLABLE_STRING,
                    },
                    "required": ["fact_ids", "action"],
                },
            }
        },
        "required": ["decisions"],
    },
)

TOPICS = Prompt(
    "topics-v1",
    """
You file a user's memory summaries under topics: short, stable names (one to three words,
lowercase, e.g. "food & diet", "travel", "work") with a one-sentence description. Reuse an
existing topic whenever one fits, spelled exactly as listed; create a new topic only when
none fits. Every summary gets exactly one topic.
""",
    {
        "type": "object",
        "properties": {
            "assignments": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "summary_id": {"type": "string"},
                        "topic": {"type": "string"},
                        "description": _NULLABLE_STRING,
                    },
                    "required": ["summary_id", "topic"],
                },
            }
        },
        "required": ["assignments"],
    },
)

"""A scripted stand-in for an LLM that answers stratamem's three pipeline prompts.

It reads the prompt the real adapter sent (through the real SDK, over loopback HTTP) and
answers with simple deterministic rules, the way a small but competent model would:

- extraction: one fact per user message that says something ("User: <content>"), kinds by
  keyword, every source id taken from the MESSAGES block;
- consolidation: a fact that repeats an existing summary strengthens it; a fact marked as
  a change ("correction", "anymore", "now", "instead") supersedes the existing summary it
  shares most words with; anything else adds a summary;
- topics: a topic name by keyword.

``calls`` counts requests per stage so tests can assert batching.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

__all__ = ["MemoryModel"]

_LINE = re.compile(r"^\[(?P<id>[^\]]+)\] \((?P<ts>[^)]*)\) (?P<who>[^:]*): (?P<text>.*)$")
_SUMMARY = re.compile(r"^\[(?P<id>s_[^\]]+)\] (?P<text>.*)$")
_FACT = re.compile(r"^\[(?P<id>f_[^\]]+)\] \((?P<meta>[^)]*)\) (?P<text>.*)$")
_CHANGE = re.compile(r"\b(correction|anymore|no longer|instead|now)\b", re.I)
_STOP = {
    "user",
    "i",
    "my",
    "the",
    "a",
    "an",
    "to",
    "and",
    "is",
    "am",
    "of",
    "in",
    "it",
    "m",
    "me",
    "for",
    "with",
    "not",
    "now",
    "anymore",
    "correction",
    "really",
    "very",
    "s",
}


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def _kind(text: str) -> str:
    low = text.lower()
    if any(w in low for w in ("love", "like", "prefer", "favourite", "hate")):
        return "preference"
    if any(w in low for w in ("allergic", "can't", "never", "vegetarian")):
        return "constraint"
    if any(w in low for w in ("will", "planning", "going to", "next")):
        return "plan"
    if any(w in low for w in ("name is", "i am", "i'm a", "live in", "work")):
        return "identity"
    return "fact"


def _topic(text: str) -> str:
    low = text.lower()
    for name, cues in (
        ("drinks", ("coffee", "tea", "latte", "milk", "espresso")),
        ("family", ("sister", "brother", "mother", "father", "family")),
        ("travel", ("trip", "flight", "travel", "visit")),
        ("work", ("work", "job", "manager", "office")),
    ):
        if any(c in low for c in cues):
            return name
    return "general"


def _section(prompt: str, title: str) -> list[str]:
    if title not in prompt:
        return []
    body = prompt.split(title, 1)[1]
    lines = []
    for line in body.splitlines()[1:]:
        if not line.strip():
            break
        lines.append(line.strip())
    return lines


class MemoryModel:
    """Call with a request body (OpenAI chat or Anthropic messages); returns the answer."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.prompts: list[tuple[str, str, str]] = []  # (stage, system, user)

    def __call__(self, body: dict[str, Any]) -> str:
        system, user = self._texts(body)
        if "You extract long-term memory" in system:
            stage, answer = "extract", self.extract(user)
        elif "You maintain a user's long-term memory" in system:
            stage, answer = "consolidate", self.consolidate(user)
        elif "You file a user's memory summaries" in system:
            stage, answer = "topics", self.topics(user)
        else:
            stage, answer = "other", {}
        self.calls[stage] += 1
        self.prompts.append((stage, system, user))
        return json.dumps(answer)

    @staticmethod
    def _texts(body: dict[str, Any]) -> tuple[str, str]:
        if "system" in body:  # Anthropic: system is top-level
            system = body["system"]
            if isinstance(system, list):
                system = "".join(b.get("text", "") for b in system)
            user = body["messages"][-1]["content"]
        else:
            system = body["messages"][0]["content"]
            user = body["messages"][-1]["content"]
        if isinstance(user, list):
            user = "".join(b.get("text", "") for b in user if isinstance(b, dict))
        return str(system), str(user)

    def extract(self, prompt: str) -> dict[str, Any]:
        facts = []
        for line in _section(prompt, "MESSAGES:"):
            m = _LINE.match(line)
            if not m or not m.group("who").startswith("user"):
                continue
            text = m.group("text").strip()
            if len(text.split()) < 3 or text.endswith("?"):
                continue
            facts.append(
                {
                    "text": f"User: {text}",
                    "kind": _kind(text),
                    "source_ids": [m.group("id")],
                    "confidence": 0.9,
                }
            )
        return {"facts": facts}

    def consolidate(self, prompt: str) -> dict[str, Any]:
        summaries = {}
        for line in _section(prompt, "EXISTING SUMMARIES:"):
            m = _SUMMARY.match(line)
            if m:
                summaries[m.group("id")] = m.group("text")
        decisions: list[dict[str, Any]] = []
        added: dict[str, dict[str, Any]] = {}  # text -> the add decision that covers it
        for line in _section(prompt, "NEW FACTS:"):
            m = _FACT.match(line)
            if not m:
                continue
            fid, text = m.group("id"), m.group("text")
            same = [sid for sid, s in summaries.items() if s == text]
            if same:
                decisions.append({"fact_ids": [fid], "action": "strengthen", "summary_id": same[0]})
                continue
            if text in added:  # repeats a fact of this batch: one summary for both
                added[text]["fact_ids"].append(fid)
                continue
            if _CHANGE.search(text) and summaries:
                target = max(summaries, key=lambda sid: len(_words(summaries[sid]) & _words(text)))
                if _words(summaries[target]) & _words(text):
                    decisions.append(
                        {
                            "fact_ids": [fid],
                            "action": "supersede",
                            "summary_id": target,
                            "text": text,
                        }
                    )
                    summaries.pop(target)
                    continue
            decision = {"fact_ids": [fid], "action": "add", "text": text}
            decisions.append(decision)
            added[text] = decision
        return {"decisions": decisions}

    def topics(self, prompt: str) -> dict[str, Any]:
        out = []
        for line in _section(prompt, "SUMMARIES TO FILE:"):
            m = _SUMMARY.match(line)
            if m:
                out.append(
                    {
                        "summary_id": m.group("id"),
                        "topic": _topic(m.group("text")),
                        "description": f"What the user said about {_topic(m.group('text'))}",
                    }
                )
        return {"assignments": out}

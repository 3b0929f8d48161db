"""End-to-end answer accuracy on LoCoMo and LongMemEval-S: stratamem's context vs the whole chat.

What is measured
----------------
The figure memory systems report (mem0, Zep, LongMemEval's paper): a model answers each
question from what the memory hands back, and a second model call (the judge) says whether
the answer matches the benchmark's gold answer.

* Ingest. As ``bench/retrieval.py`` does, into a fresh SQLite file (``--db`` reuses one): one
  stratamem user per LoCoMo conversation / per LongMemEval question, one session per
  benchmark session, one ``add_messages`` call per session, then processing until
  ``mem.wait()``. LoCoMo: every turn, ``role`` user for speaker_a and assistant for
  speaker_b, ``name`` the speaker, photo captions in the content (retrieval.py's loader).
  LongMemEval-S: every turn of the haystack, user AND assistant (retrieval.py indexes user
  turns only, the convention for turn-level retrieval; answering single-session-assistant
  questions needs what the assistant said). The write pipeline runs offline (heuristics)
  unless ``--llm``: then stratamem's own ``llm=`` setting runs it with the answer model
  (``openai:<model>`` with ``--base-url``, or ``anthropic:<model>``).

* Questions. LoCoMo: categories 1-4 (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop);
  category 5 (adversarial, no gold answer) is left out, as mem0 and Zep leave it out of the
  J score. LongMemEval-S: every question, abstention ones (``_abs``) included. The question
  time is the start of LoCoMo's last session + 1 day (as retrieval.py) and LongMemEval's
  ``question_date``.

* Two systems, one answer prompt (``ANSWER_PROMPT``), one call per question each:

  - stratamem: ``mem.get_memory(<the user's latest session>, query=question)`` (default
    recall config and token budget; ``as_of`` the question time when the installed API
    takes it), its ``formatted_context`` as the context;
  - full context: the whole conversation as a transcript (sessions in order, each under its
    date; ``Speaker: text`` per turn), cut to ``--max-context-tokens`` by dropping the
    oldest turns when it is longer (the output says for how many questions).

* Judge. LoCoMo: the J score, mem0's judge prompt (``LOCOMO_JUDGE_PROMPT``, CORRECT/WRONG).
  LongMemEval: its own per-type prompts (``longmemeval_judge_prompt``; yes/no), abstention
  questions judged on whether the answer says the question cannot be answered.

* Figures. Accuracy per category / question type with a 95% Wilson interval, stratamem and
  full context side by side; context tokens per question (stratamem's own estimate, the one
  its token budget uses, and the answer calls' prompt tokens as the API counted them);
  recall latency (``get_memory``, one at a time, after one untimed search per user) and
  answer-call latency, p50/p95; with ``--llm``, the write pipeline's LLM calls and tokens
  per ingested message (``mem.stats()["llm_usage"]``). Every question, both contexts'
  sizes, stratamem's context, both answers and verdicts go to ``--out`` (JSONL; one
  ``"type": "question"`` line each, and one ``"type": "conversation"`` line per user with
  the full-context transcript as sent).

    export OPENAI_API_KEY=...
    python bench/qa.py --dataset locomo --limit-conversations 1 --model gpt-4o-mini
    python bench/qa.py --dataset longmemeval --limit-questions 20 --model gpt-4o-mini --llm
    python bench/qa.py --provider anthropic --model claude-haiku-4-5 --judge-model claude-sonnet-4-5
    python bench/qa.py --base-url http://localhost:11434/v1 --model qwen2.5:14b   # Ollama

Figures depend on the answer and judge models; none are quoted in the docs because none
can be produced without one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from _common import emit_json, format_summary, load_locomo, machine_info, summarize
from retrieval import (
    LOCOMO_CATEGORIES,
    MAX_CONTENT_CHARS,
    BenchSession,
    Dataset,
    Doc,
    User,
    _halves,
    _lme_date,
    _load_longmemeval,
    _safe_id,
    ingest,
    locomo_dataset,
)
from stratamem import Memory
from stratamem.recall import estimate_tokens

SYSTEMS = ("stratamem", "full context")
Z95 = 1.959963984540054  # two-sided 95% normal quantile
MAX_CONTEXT_TOKENS = 100_000
ANSWER_MAX_TOKENS = 300
JUDGE_MAX_TOKENS = 200

# One answer prompt for both systems and both benchmarks, written for this script after
# mem0's LoCoMo ANSWER_PROMPT (mem0ai/mem0, evaluation/prompts.py) and Zep's: answer from
# the memory alone, resolve relative dates against the memory's dates, prefer the latest
# statement, answer short. Two additions, because one prompt serves LongMemEval too: it
# asks for a sentence or two when the question is a request (preference questions are
# judged on a rubric) and to say so when the memory does not hold the answer (abstention).
ANSWER_PROMPT = """\
You are an assistant with a long-term memory of past conversations. Answer the question \
using only the memory below.

# MEMORY
{context}

# INSTRUCTIONS
1. The question is asked on {question_date}. The memory carries dates: resolve relative \
times ("last year", "two weeks ago") against the date of the memory that mentions them, \
and answer with a specific date, month or year.
2. If memories contradict each other, the most recent one holds.
3. Do not confuse people mentioned in the memory with the speakers themselves.
4. If the memory does not hold the answer, say that you do not know.
5. Be brief: a factual question gets a short phrase (a few words) and no explanation; a \
request for a recommendation or advice gets one or two sentences that use what you \
remember about the person.

Question: {question}
Answer:"""

# The LoCoMo J score's judge, as mem0 reports it (and Zep after it): mem0ai/mem0,
# evaluation/metrics/llm_judge.py (ACCURACY_PROMPT, Apache-2.0), unchanged but for the
# typographic quotes around CORRECT/WRONG. mem0 asks for JSON {"label": ...}; the label is
# read from the JSON, else from the last CORRECT/WRONG in the text.
LOCOMO_JUDGE_PROMPT = """\
Your task is to label an answer to a question as 'CORRECT' or 'WRONG'. You will be given \
the following data:
    (1) a question (posed by one user to another user),
    (2) a 'gold' (ground truth) answer,
    (3) a generated answer
which you will score as CORRECT/WRONG.

The point of the question is to ask about something one user should know about the other \
user based on their prior conversations.
The gold answer will usually be a concise and short answer that includes the referenced \
topic, for example:
Question: Do you remember what I got the last time I went to Hawaii?
Gold answer: A shell necklace
The generated answer might be much longer, but you should be generous with your grading - \
as long as it touches on the same topic as the gold answer, it should be counted as CORRECT.

For time related questions, the gold answer will be a specific date, month, year, etc. The \
generated answer might be much longer or use relative time references (like "last Tuesday" \
or "next month"), but you should be generous with your grading - as long as it refers to \
the same date or time period as the gold answer, it should be counted as CORRECT. Even if \
the format differs (e.g., "May 7th" vs "7 May"), consider it CORRECT if it's the same date.

Now it's time for the real question:
Question: {question}
Gold answer: {gold_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with \
CORRECT or WRONG.
Do NOT include both CORRECT and WRONG in your response, or it will break the evaluation \
script.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""

# LongMemEval's judge prompts, per question type: xiaowu0162/LongMemEval,
# src/evaluation/evaluate_qa.py (get_anscheck_prompt, MIT), unchanged. The verdict is
# theirs too: correct when "yes" is in the lowercased reply.
_LME_CONTAINS = (
    "I will give you a question, a correct answer, and a response from a model. Please "
    "answer yes if the response contains the correct answer. Otherwise, answer no. If the "
    "response is equivalent to the correct answer or contains all the intermediate steps to "
    "get the correct answer, you should also answer yes. If the response only contains a "
    "subset of the information required by the answer, answer no. "
)
_LME_TAIL = (
    "\n\nQuestion: {}\n\nCorrect Answer: {}\n\nModel Response: {}\n\n"
    "Is the model response correct? Answer yes or no only."
)
LONGMEMEVAL_JUDGE_PROMPTS = {
    "default": _LME_CONTAINS + _LME_TAIL,
    "temporal-reasoning": _LME_CONTAINS
    + "In addition, do not penalize off-by-one errors for the number of days. If the "
    "question asks for the number of days/weeks/months, etc., and the model makes "
    "off-by-one errors (e.g., predicting 19 days when the answer is 18), the model's "
    "response is still correct. " + _LME_TAIL,
    "knowledge-update": "I will give you a question, a correct answer, and a response from "
    "a model. Please answer yes if the response contains the correct answer. Otherwise, "
    "answer no. If the response contains some previous information along with an updated "
    "answer, the response should be considered as correct as long as the updated answer is "
    "the required answer." + _LME_TAIL,
    "single-session-preference": "I will give you a question, a rubric for desired "
    "personalized response, and a response from a model. Please answer yes if the response "
    "satisfies the desired response. Otherwise, answer no. The model does not need to "
    "reflect all the points in the rubric. The response is correct as long as it recalls "
    "and utilizes the user's personal information correctly.\n\nQuestion: {}\n\nRubric: {}"
    "\n\nModel Response: {}\n\nIs the model response correct? Answer yes or no only.",
    "abstention": "I will give you an unanswerable question, an explanation, and a response "
    "from a model. Please answer yes if the model correctly identifies the question as "
    "unanswerable. The model could say that the information is incomplete, or some other "
    "information is given but the asked information is not.\n\nQuestion: {}\n\n"
    "Explanation: {}\n\nModel Response: {}\n\nDoes the model correctly identify the question "
    "as unanswerable? Answer yes or no only.",
}


def longmemeval_judge_prompt(
    qtype: str, question: str, answer: str, response: str, *, abstention: bool
) -> str:
    """The judge prompt LongMemEval uses for a question of type ``qtype``."""
    key = "abstention" if abstention else qtype
    template = LONGMEMEVAL_JUDGE_PROMPTS.get(key, LONGMEMEVAL_JUDGE_PROMPTS["default"])
    return template.format(question, answer, response)


def locomo_verdict(reply: str) -> bool:
    """mem0 reads ``json.loads(...)["label"] == "CORRECT"``; a reply without JSON falls
    back to its last CORRECT/WRONG word."""
    for m in re.finditer(r"\{[^{}]*\}", reply):
        try:
            label = json.loads(m.group(0)).get("label")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(label, str):
            return label.strip().upper() == "CORRECT"
    words = re.findall(r"\b(CORRECT|WRONG)\b", reply.upper())
    return bool(words) and words[-1] == "CORRECT"


def longmemeval_verdict(reply: str) -> bool:
    return "yes" in reply.lower()  # evaluate_qa.py's rule


# -- statistics ----------------------------------------------------------------------------


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (better than p ± z·se at small n and near
    0 or 1, where accuracy per category often is)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = correct / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# -- questions and contexts ------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One question to answer."""

    qid: str
    user_id: str
    group: str  # LoCoMo category "1".."4" / LongMemEval question_type
    question: str
    gold: str
    as_of: datetime
    question_date: str  # as the answer prompt states it
    abstention: bool = False


@dataclass
class QASet:
    key: str
    title: str
    data: Dataset  # users and sessions, as retrieval.ingest takes them
    items: list[Item]
    groups: dict[str, str]  # group -> label, in print order
    skipped: Counter[str] = field(default_factory=Counter)


def _locomo_date(dt: datetime) -> str:
    return f"{dt.day} {dt:%B %Y}"  # "8 May 2023", as LoCoMo writes dates


def locomo_qa(split: str, limit: int | None) -> QASet:
    ds = locomo_dataset(split, limit)  # the users exactly as retrieval.py ingests them
    samples = _halves(load_locomo(), split)
    if limit is not None:
        samples = samples[:limit]
    items: list[Item] = []
    skipped: Counter[str] = Counter()
    for sample, user in zip(samples, ds.users, strict=True):
        # retrieval.py's question time: the last session's start + 1 day (its questions
        # carry it; a conversation none of whose questions has evidence gets the same).
        last_start = min(d.timestamp for d in user.sessions[-1].docs)
        when = user.questions[0].as_of if user.questions else last_start + timedelta(days=1)
        for i, qa in enumerate(sample.get("qa", [])):
            category = str(qa.get("category"))
            question = str(qa.get("question") or "").strip()
            if category == "5":
                skipped["category 5 (adversarial)"] += 1
                continue
            if not question or qa.get("answer") is None:
                skipped["no question or answer"] += 1
                continue
            items.append(
                Item(
                    qid=f"{user.user_id}#{i}",
                    user_id=user.user_id,
                    group=category,
                    question=question,
                    gold=str(qa["answer"]),
                    as_of=when,
                    question_date=_locomo_date(when),
                )
            )
    groups = {k: f"{k} {v}" for k, v in LOCOMO_CATEGORIES.items() if k != "5"}
    return QASet("locomo", "LoCoMo", ds, items, groups, skipped)


def longmemeval_qa(split: str, limit: int | None) -> QASet:
    raw = _halves(_load_longmemeval(), split)
    if limit is not None:
        raw = raw[:limit]
    ds = Dataset(
        key="longmemeval",
        title="LongMemEval-S",
        unit="questions",
        users=[],
        groups={},
        overall=(),
    )
    items: list[Item] = []
    groups: dict[str, str] = {}
    skipped: Counter[str] = Counter()
    for item in raw:
        qid = str(item["question_id"])
        uid = _safe_id(qid)
        sessions: list[BenchSession] = []
        seen: Counter[str] = Counter()
        for sid, date, turns in zip(
            item["haystack_session_ids"],
            item["haystack_dates"],
            item["haystack_sessions"],
            strict=True,
        ):
            seen[str(sid)] += 1
            local = str(sid) if seen[str(sid)] == 1 else f"{sid}.dup{seen[str(sid)]}"
            start = _lme_date(date)
            docs = []
            for i, t in enumerate(turns):
                content = str(t.get("content") or "")
                role = str(t.get("role") or "")
                if role not in ("user", "assistant") or not content.strip():
                    continue
                docs.append(
                    Doc(
                        mid=_safe_id(f"{uid}/{local}:{i}"),
                        turn=f"{local}:{i}",
                        session=str(sid),
                        role=role,
                        name=None,
                        content=content,
                        timestamp=start + timedelta(minutes=i),
                        bm25_text=content,
                    )
                )
            if docs:
                sessions.append(BenchSession(_safe_id(f"{uid}/{local}"), docs))
        if not sessions:
            skipped["empty haystack"] += 1
            continue
        # Sessions in time order: the transcript reads oldest first, and the latest session
        # is where get_memory is called (where the next turn of the user would be).
        sessions.sort(key=lambda s: s.docs[0].timestamp)
        ds.users.append(User(uid, sessions, [], sessions[-1].engine_id))
        qtype = str(item.get("question_type"))
        groups.setdefault(qtype, qtype)
        items.append(
            Item(
                qid=qid,
                user_id=uid,
                group=qtype,
                question=str(item["question"]).strip(),
                gold=str(item["answer"]),
                as_of=_lme_date(item["question_date"]),
                question_date=str(item["question_date"]),
                abstention=qid.endswith("_abs"),
            )
        )
    return QASet("longmemeval", "LongMemEval-S", ds, items, groups, skipped)


@dataclass(frozen=True)
class Transcript:
    text: str
    tokens: int
    turns: int
    dropped: int  # oldest turns left out to fit the budget


def transcript(user: User, max_tokens: int) -> Transcript:
    """The whole conversation as the full-context baseline sends it, oldest turns dropped
    first when it is over ``max_tokens`` (a chat window keeps the latest)."""
    lines: list[tuple[int, str]] = []  # (session index, line)
    headers: list[str] = []
    for n, s in enumerate(user.sessions):
        start = s.docs[0].timestamp
        headers.append(f"## Session {n + 1} ({_locomo_date(start)}, {start:%H:%M})")
        lines.extend((n, f"{d.name or d.role}: {d.content}") for d in s.docs)

    def render(kept: Sequence[tuple[int, str]], dropped: int) -> str:
        out: list[str] = []
        if dropped:
            out.append(f"[{dropped} earlier turns omitted]")
        last = -1
        for n, line in kept:
            if n != last:
                out.extend(("", headers[n]) if out else (headers[n],))
                last = n
            out.append(line)
        return "\n".join(out)

    costs = [estimate_tokens(line) for _, line in lines]
    start = 0
    total = sum(costs) + 4 * len(headers)
    while start < len(lines) and total > max_tokens:  # rough cut, refined below
        total -= costs[start]
        start += 1
    text = render(lines[start:], start)
    while start < len(lines) and estimate_tokens(text) > max_tokens:
        start += 1
        text = render(lines[start:], start)
    return Transcript(text, estimate_tokens(text), len(lines), start)


# -- the model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    text: str
    seconds: float
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None = None


class Chat:
    """One model behind the official SDK: any OpenAI-compatible endpoint, or Anthropic."""

    def __init__(
        self,
        provider: str,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        temperature: float | None,
        timeout: float,
    ) -> None:
        self.provider = provider
        self.model = model
        self.temperature = temperature
        if provider == "anthropic":
            import anthropic

            self._anthropic = anthropic.Anthropic(
                base_url=base_url, api_key=api_key, timeout=timeout, max_retries=5
            )
            # Recent SDKs dropped the sampling parameters (recent models fix them): the
            # temperature is sent only where the installed SDK still takes it.
            if not _accepts(self._anthropic.messages.create, "temperature"):
                self.temperature = None
        else:
            import openai

            # A local OpenAI-compatible server (Ollama, vLLM) needs no key, the SDK one.
            key = api_key or os.environ.get("OPENAI_API_KEY") or ("none" if base_url else None)
            self._openai = openai.OpenAI(
                base_url=base_url, api_key=key, timeout=timeout, max_retries=5
            )

    def __call__(self, prompt: str, max_tokens: int) -> Reply:
        t0 = time.perf_counter()
        try:
            if self.provider == "anthropic":
                kwargs: dict[str, Any] = {}
                if self.temperature is not None:
                    kwargs["temperature"] = self.temperature
                msg = self._anthropic.messages.create(
                    model=self.model,
                    max_tokens=max_tokens,
                    messages=[{"role": "user", "content": prompt}],
                    **kwargs,
                )
                text = "".join(getattr(b, "text", "") for b in msg.content)
                return Reply(
                    text.strip(),
                    time.perf_counter() - t0,
                    msg.usage.input_tokens,
                    msg.usage.output_tokens,
                )
            kwargs = {"max_tokens": max_tokens}
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            resp = self._openai.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": prompt}], **kwargs
            )
            usage = resp.usage
            return Reply(
                (resp.choices[0].message.content or "").strip(),
                time.perf_counter() - t0,
                usage.prompt_tokens if usage else None,
                usage.completion_tokens if usage else None,
            )
        except Exception as exc:  # after the SDK's retries: recorded, counted as WRONG
            return Reply("", time.perf_counter() - t0, None, None, f"{type(exc).__name__}: {exc}")


# -- the run ---------------------------------------------------------------------------------


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def recall(mem: Memory, qs: QASet) -> tuple[dict[str, dict[str, Any]], bool]:
    """stratamem's context for every question, one ``get_memory`` at a time (timed)."""
    as_of = _accepts(mem.get_memory, "as_of")
    session_of = {u.user_id: u.context_session for u in qs.data.users}
    out: dict[str, dict[str, Any]] = {}
    warmed: set[str] = set()
    for item in tqdm(qs.items, desc=f"{qs.title}: recall", unit="q", file=sys.stderr):
        if item.user_id not in warmed:  # the first search of a user loads its vectors
            mem.search(item.question, user_id=item.user_id, limit=10)
            warmed.add(item.user_id)
        extra = {"as_of": item.as_of} if as_of else {}
        t0 = time.perf_counter()
        ctx = mem.get_memory(session_of[item.user_id], query=item.question, **extra)
        seconds = time.perf_counter() - t0
        out[item.qid] = {
            "context": ctx.formatted_context,
            "context_tokens": ctx.token_estimate,
            "recall_ms": round(seconds * 1000, 3),
        }
    return out, as_of


def judge_prompt(qs: QASet, item: Item, answer: str) -> str:
    if qs.key == "locomo":
        return LOCOMO_JUDGE_PROMPT.format(
            question=item.question, gold_answer=item.gold, generated_answer=answer
        )
    return longmemeval_judge_prompt(
        item.group, item.question, item.gold, answer, abstention=item.abstention
    )


def answer_and_judge(
    qs: QASet,
    item: Item,
    contexts: dict[str, str],
    answerer: Chat,
    judge: Chat,
) -> dict[str, Any]:
    verdict = locomo_verdict if qs.key == "locomo" else longmemeval_verdict
    out: dict[str, Any] = {}
    for system, context in contexts.items():
        prompt = ANSWER_PROMPT.format(
            context=context or "(nothing)",
            question=item.question,
            question_date=item.question_date,
        )
        a = answerer(prompt, ANSWER_MAX_TOKENS)
        row: dict[str, Any] = {
            "answer": a.text,
            "answer_ms": round(a.seconds * 1000, 3),
            "answer_prompt_tokens": a.prompt_tokens,
            "answer_completion_tokens": a.completion_tokens,
        }
        if a.error is not None:
            row.update(error=a.error, judge="", correct=False)
        else:
            j = judge(judge_prompt(qs, item, a.text), JUDGE_MAX_TOKENS)
            row.update(judge=j.text, judge_ms=round(j.seconds * 1000, 3))
            if j.error is not None:
                row.update(error=j.error, correct=False)
            else:
                row["correct"] = verdict(j.text)
        out[system] = row
    return out


def llm_per_message(mem: Memory) -> dict[str, Any]:
    """The write pipeline's LLM calls and tokens, per processed message of this database."""
    stats = mem.stats()
    messages = int(stats["messages"]["processed"]) + int(stats["messages"]["failed"])
    usage: dict[str, dict[str, int]] = stats.get("llm_usage") or {}
    calls = sum(u["calls"] for u in usage.values())
    prompt = sum(u["prompt_tokens"] for u in usage.values())
    completion = sum(u["completion_tokens"] for u in usage.values())
    per = max(messages, 1)
    return {
        "messages": messages,
        "calls": calls,
        "failed_calls": sum(u["failed"] for u in usage.values()),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "calls_per_message": calls / per,
        "prompt_tokens_per_message": prompt / per,
        "completion_tokens_per_message": completion / per,
        "by_stage": usage,
    }


def run(
    qs: QASet,
    mem: Memory,
    answerer: Chat,
    judge: Chat,
    *,
    max_context_tokens: int,
    baseline: bool,
    concurrency: int,
    pipeline_llm: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ing = ingest(mem, qs.data)
    contexts, as_of = recall(mem, qs)
    scripts = {u.user_id: transcript(u, max_context_tokens) for u in qs.data.users}
    systems = SYSTEMS if baseline else SYSTEMS[:1]

    def one(item: Item) -> dict[str, Any]:
        ctx = {"stratamem": contexts[item.qid]["context"]}
        if baseline:
            ctx["full context"] = scripts[item.user_id].text
        return answer_and_judge(qs, item, ctx, answerer, judge)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(
            tqdm(
                pool.map(one, qs.items),
                total=len(qs.items),
                desc=f"{qs.title}: answer and judge",
                unit="q",
                file=sys.stderr,
            )
        )
    records: list[dict[str, Any]] = []
    for u in qs.data.users:
        t = scripts[u.user_id]
        records.append(
            {
                "type": "conversation",
                "dataset": qs.key,
                "user_id": u.user_id,
                "turns": t.turns,
                "dropped_turns": t.dropped,
                "context_tokens": t.tokens,
                "context": t.text if baseline else None,
            }
        )
    for item, res in zip(qs.items, results, strict=True):
        rec: dict[str, Any] = {
            "type": "question",
            "dataset": qs.key,
            "qid": item.qid,
            "user_id": item.user_id,
            "group": item.group,
            "abstention": item.abstention,
            "question": item.question,
            "gold": item.gold,
            "question_date": item.question_date,
            "stratamem": {**contexts[item.qid], **res["stratamem"]},
        }
        if baseline:
            t = scripts[item.user_id]
            rec["full context"] = {
                "context_tokens": t.tokens,
                "dropped_turns": t.dropped,
                **res["full context"],
            }
        records.append(rec)
    extra = {
        "ingest": ing,
        "as_of": as_of,
        "systems": systems,
        "llm": llm_per_message(mem) if pipeline_llm else None,
    }
    return records, extra


# -- report ----------------------------------------------------------------------------------


def _cell(correct: int, n: int) -> str:
    if n == 0:
        return f"{'n/a':>27}"
    lo, hi = wilson(correct, n)
    return f"{100 * correct / n:5.1f} [{100 * lo:5.1f}, {100 * hi:5.1f}] {correct:>4}/{n:<4}"


def _acc(rows: Sequence[dict[str, Any]], system: str) -> dict[str, Any]:
    n = len(rows)
    k = sum(1 for r in rows if r[system]["correct"])
    lo, hi = wilson(k, n)
    return {
        "n": n,
        "correct": k,
        "accuracy": round(100 * k / n, 2) if n else None,
        "ci95": [round(100 * lo, 2), round(100 * hi, 2)] if n else None,
    }


def _dist(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(arr)), "mean": float(arr.mean()), "n": len(arr)}


def report(
    qs: QASet, records: list[dict[str, Any]], extra: dict[str, Any], max_context_tokens: int
) -> dict[str, Any]:
    rows = [r for r in records if r["type"] == "question"]
    convs = [r for r in records if r["type"] == "conversation"]
    systems: Sequence[str] = extra["systems"]
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(qs.skipped.items())) or "none"
    metric = "J (mem0's judge prompt)" if qs.key == "locomo" else "accuracy (LongMemEval's judge)"
    unit = ("conversation" if qs.key == "locomo" else "haystack") + ("s" * (len(convs) != 1))
    print(f"\n{qs.title}: {len(convs)} {unit}, {len(rows)} questions (skipped: {skipped})")
    print(f"  {metric}, % [95% Wilson interval] correct/n")
    print(f"  {'':<34}" + "".join(f"{s:<34}" for s in systems).rstrip())
    out: dict[str, Any] = {"questions": len(rows), "skipped": dict(qs.skipped), "groups": {}}
    table: list[tuple[str, list[dict[str, Any]]]] = [
        (label, [r for r in rows if r["group"] == g]) for g, label in qs.groups.items()
    ]
    if qs.key == "longmemeval":
        abst = [r for r in rows if r["abstention"]]
        if abst:
            table.append(("abstention (_abs, also above)", abst))
    overall_label = "overall (categories 1-4)" if qs.key == "locomo" else "overall"
    table.append((overall_label, rows))
    for label, group_rows in table:
        if not group_rows:
            continue
        out["groups"][label] = {s: _acc(group_rows, s) for s in systems}
        cells = "    ".join(
            _cell(out["groups"][label][s]["correct"], len(group_rows)) for s in systems
        )
        print(f"  {label:<34}{cells}")
    out["overall"] = out["groups"].get(overall_label)
    errors = {s: sum(1 for r in rows if r[s].get("error")) for s in systems}
    if any(errors.values()):
        print(
            "  failed model calls (counted WRONG): "
            + ", ".join(f"{s} {n}" for s, n in errors.items())
        )
    out["errors"] = errors

    print("\n  context per question")
    mem_tokens = _dist([r["stratamem"]["context_tokens"] for r in rows])
    out["context_tokens"] = {"stratamem": mem_tokens}
    out["answer_prompt_tokens"] = {}
    for s in systems:
        api = _dist([r[s]["answer_prompt_tokens"] for r in rows if r[s]["answer_prompt_tokens"]])
        out["answer_prompt_tokens"][s] = api
    line = (
        f"  stratamem formatted_context: median {mem_tokens['median']:.0f}, mean "
        f"{mem_tokens['mean']:.0f} tokens (stratamem's estimate)"
    )
    print(line)
    if "full context" in systems:
        full = _dist([r["full context"]["context_tokens"] for r in rows])
        out["context_tokens"]["full context"] = full
        cut = sum(1 for r in rows if r["full context"]["dropped_turns"])
        out["full_context_truncated"] = cut
        print(
            f"  full context transcript:     median {full['median']:.0f}, mean "
            f"{full['mean']:.0f} tokens (the same estimate); {cut} of {len(rows)} questions "
            f"had it cut to --max-context-tokens {max_context_tokens} (oldest turns dropped)"
        )
    for s in systems:
        api = out["answer_prompt_tokens"][s]
        if api:
            print(
                f"  answer call prompt, {s}: median {api['median']:.0f}, mean "
                f"{api['mean']:.0f} tokens (as the API counted them, prompt included)"
            )

    print("\n  latency")
    rec = summarize([r["stratamem"]["recall_ms"] / 1000 for r in rows])
    print(format_summary("recall: get_memory (one at a time)", rec, width=40))
    out["recall_ms"] = rec.as_dict()
    out["answer_ms"] = {}
    for s in systems:
        ans = summarize([r[s]["answer_ms"] / 1000 for r in rows])
        out["answer_ms"][s] = ans.as_dict()
        print(format_summary(f"answer call, {s}", ans, width=40))
    if not extra["as_of"]:
        print("  (the installed get_memory takes no as_of: recall resolves dates against now;")
        print("   the answer prompt states the question date)")

    ing = extra["ingest"]
    if ing.get("messages"):
        total = ing["add_s"] + ing["process_s"]
        print(
            f"\n  ingest: {ing['messages']} messages in {total:.1f} s; {ing['facts']} facts, "
            f"{ing['summaries']} summaries, {ing['topics']} topics, {ing['failed']} failed"
        )
    out["ingest"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in ing.items()}
    llm = extra["llm"]
    if llm is not None:
        print(
            f"  write pipeline LLM: {llm['calls']} calls ({llm['failed_calls']} failed) for "
            f"{llm['messages']} messages: {llm['calls_per_message']:.3f} calls, "
            f"{llm['prompt_tokens_per_message']:.1f} prompt + "
            f"{llm['completion_tokens_per_message']:.1f} completion tokens per message"
        )
        for what, u in llm["by_stage"].items():
            print(
                f"    {what}: {u['calls']} calls, {u['prompt_tokens']} prompt + "
                f"{u['completion_tokens']} completion tokens"
            )
    else:
        print("  write pipeline: offline heuristics (no LLM calls; --llm to use the model)")
    out["pipeline_llm"] = llm
    return out


# -- main ------------------------------------------------------------------------------------


def _db_path(args: argparse.Namespace, key: str, tmp: str) -> Path:
    if args.db is not None:
        return Path(args.db).with_name(f"{Path(args.db).stem}-{key}.db")
    return Path(tmp) / f"qa-{key}.db"


def _temperature(value: str) -> float | None:
    return None if value.lower() == "none" else float(value)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=("locomo", "longmemeval", "all"), default="all")
    p.add_argument("--limit-conversations", type=int, default=None, help="LoCoMo: first N")
    p.add_argument("--limit-questions", type=int, default=None, help="LongMemEval: first N")
    p.add_argument(
        "--split",
        choices=("all", "first-half", "second-half"),
        default="all",
        help="as bench/retrieval.py: LoCoMo conversations 1-3 / 4-6, LongMemEval 0-49 / 50-99",
    )
    p.add_argument("--provider", choices=("openai", "anthropic"), default="openai")
    p.add_argument("--model", required=True, help="the answer model")
    p.add_argument("--judge-model", default=None, help="default: --model")
    p.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint (or proxy)")
    p.add_argument(
        "--api-key",
        default=None,
        help="default: $OPENAI_API_KEY (openai) / $ANTHROPIC_API_KEY (anthropic)",
    )
    p.add_argument(
        "--temperature",
        type=_temperature,
        default=0.0,
        help="answer and judge calls (default 0; 'none' sends none, for reasoning models)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per model call")
    p.add_argument(
        "--llm", action="store_true", help="run stratamem's write pipeline with the model too"
    )
    p.add_argument("--embedder", default="local")
    p.add_argument(
        "--max-context-tokens",
        type=int,
        default=MAX_CONTEXT_TOKENS,
        help=f"full-context baseline budget (default {MAX_CONTEXT_TOKENS}; oldest turns cut)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the full-context baseline")
    p.add_argument("--concurrency", type=int, default=4, help="questions answered at once")
    p.add_argument("--out", default=None, help="JSONL of every question (default: a temp dir)")
    p.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="keep (and reuse) the SQLite files: PATH-<dataset>.db",
    )
    p.add_argument("--json", action="store_true", help="also print a JSON line of results")
    args = p.parse_args(argv)
    keys = ("locomo", "longmemeval") if args.dataset == "all" else (args.dataset,)
    out_path = (
        Path(args.out)
        if args.out
        else Path(tempfile.mkdtemp(prefix="stratamem-qa-")) / "answers.jsonl"
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    judge_model = args.judge_model or args.model
    answerer, judge = (
        Chat(
            args.provider,
            model,
            base_url=args.base_url,
            api_key=args.api_key,
            temperature=args.temperature,
            timeout=args.timeout,
        )
        for model in (args.model, judge_model)
    )
    llm_settings: dict[str, Any] = {}
    if args.llm:
        llm_settings = {"llm": f"{args.provider}:{args.model}"}
        if args.base_url:
            llm_settings["llm_base_url"] = args.base_url
        if args.api_key:
            llm_settings["llm_api_key"] = args.api_key

    info = machine_info()
    print(
        f"stratamem answer benchmark: engine {info['engine']}, answer model {args.provider}:"
        f"{args.model}, judge {judge_model}, write pipeline "
        f"{llm_settings.get('llm', 'offline')}, embedder {args.embedder}, split {args.split}, "
        f"temperature {answerer.temperature}"
    )
    results: dict[str, Any] = {
        "machine": info,
        "model": f"{args.provider}:{args.model}",
        "judge_model": judge_model,
        "pipeline": llm_settings.get("llm", "none"),
        "out": str(out_path),
        "datasets": {},
    }
    loaders: dict[str, Callable[[], QASet]] = {
        "locomo": lambda: locomo_qa(args.split, args.limit_conversations),
        "longmemeval": lambda: longmemeval_qa(args.split, args.limit_questions),
    }
    with (
        tempfile.TemporaryDirectory(prefix="stratamem-qa-db-") as tmp,
        open(out_path, "w", encoding="utf-8") as out,
    ):
        for key in keys:
            qs = loaders[key]()
            if not qs.items:
                print(f"\n{qs.title}: nothing selected")
                continue
            path = _db_path(args, key, tmp)
            mem = Memory(
                f"sqlite:///{path.resolve()}",
                embedder=args.embedder,
                max_content_chars=MAX_CONTENT_CHARS,
                **llm_settings,
            )
            try:
                records, extra = run(
                    qs,
                    mem,
                    answerer,
                    judge,
                    max_context_tokens=args.max_context_tokens,
                    baseline=not args.no_baseline,
                    concurrency=args.concurrency,
                    pipeline_llm=args.llm,
                )
            finally:
                mem.close()
            for rec in records:
                out.write(json.dumps(rec, default=str, ensure_ascii=False) + "\n")
            out.flush()
            results["datasets"][key] = report(qs, records, extra, args.max_context_tokens)
    print(f"\nevery question, context, answer and verdict: {out_path}")
    if args.json:
        emit_json("qa", results)


if __name__ == "__main__":
    main()

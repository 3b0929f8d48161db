"""Offline extraction quality: the write pipeline's facts and summaries against LoCoMo's own
annotations.

What is measured
----------------
Every LoCoMo session carries an ``observation`` annotation (``session_N_observation``): per
speaker, the reference facts a careful reader takes from it, each with the evidence turn(s)
it rests on (``[["Caroline attended an LGBTQ support group ...", "D1:3"], ...]``; a few
evidence entries list several ids, normalised as ``bench/retrieval.py`` normalises
question evidence). The conversations are ingested exactly as ``bench/retrieval.py`` ingests
them (its ``locomo_dataset`` and ``ingest``: speaker_a role user, speaker_b role assistant,
``name`` the speaker, one ``add_messages`` per session, the offline pipeline, then
``mem.wait()``), and the stored facts and summaries are compared with the references:

* (a) facts extracted and messages stored;
* (b) from reference turns: the share of facts whose source messages include a turn that
  holds any reference fact of the conversation (the rest is filler: "User totally agrees");
* (c) covered: the share of reference facts with at least one extracted fact among whose
  sources is one of their evidence turns (split by the role the speaker was sent as);
* (d) summaries / facts: every stored summary (any status) over the facts;
* (e) speaker naming: of the facts and summaries whose source messages all carry a
  ``name``, the share whose text names a speaker of those messages, and the share that says
  "User" instead;
* (f) the worst cases: facts from turns holding no reference fact, facts that read garbled
  (a rewrite that left "User's User", "User am", a doubled word ...), and reference facts
  nothing covers (with their turn), a deterministic sample of each.

Targets (issue 26, part 4): >= 80 % from reference turns, >= 70 % covered, summaries
<= 0.6 x facts, and no fact or summary of a named message saying "User".

The embedder matters: offline consolidation compares facts with summaries by cosine
similarity calibrated on the bundled model, so the default is ``local`` (``--embedder hash``
runs faster and gives other summary counts).

    python bench/extraction.py                          # the six conversations, ~1-2 minutes
    python bench/extraction.py --limit-conversations 2  # quick
    python bench/extraction.py --db /tmp/x.db           # ingest once, re-read fast
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import emit_json, load_locomo, machine_info, verdict
from retrieval import MAX_CONTENT_CHARS, Dataset, Doc, ingest, locomo_dataset
from stratamem import Memory

TARGET_FROM_REFERENCE = 0.80
TARGET_COVERED = 0.70
TARGET_SUMMARY_RATIO = 0.60
SUMMARY_STATUSES = ("active", "deprioritized", "archived", "superseded")
_SESSION_OBS = re.compile(r"session_(\d+)_observation")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
# What a rewrite must never leave behind: a possessive or a verb form that only the old
# first person fits, or the same word twice.
_GARBLED = re.compile(
    r"\b(?:[A-Z][a-z]+|User)['’]s\s+(?:[A-Z][a-z]+|User)['’]s\b"
    r"|\b(?:\w+['’]s\s+User|User\s+(?:am|are|I|me|my|mine|were)\b|User\s+User)\b"
    r"|\b(\w{3,})\s+\1\b"
    r"|\b(?:I|I'm|I’m|me|my|mine|myself)\b",
)
_QUOTED = re.compile(r'"[^"]*"|“[^”]*”')  # quoted speech keeps its own pronouns


@dataclass(frozen=True)
class Reference:
    sample: str
    speaker: str
    text: str
    turns: tuple[str, ...]


def references(samples: Sequence[str]) -> list[Reference]:
    """Every reference fact of the chosen conversations, evidence normalised to dia_ids."""
    wanted = set(samples)
    out: list[Reference] = []
    for sample in load_locomo():
        sid = str(sample["sample_id"])
        if sid not in wanted:
            continue
        for _key, per_speaker in sorted(
            (sample.get("observation") or {}).items(),
            key=lambda kv: int(m.group(1)) if (m := _SESSION_OBS.fullmatch(kv[0])) else 0,
        ):
            if not isinstance(per_speaker, dict):
                continue
            for speaker, items in per_speaker.items():
                for item in items or []:
                    if not isinstance(item, list) or len(item) < 2:
                        continue
                    raw = item[1] if isinstance(item[1], list) else [item[1]]
                    turns = tuple(
                        dict.fromkeys(
                            f"D{m.group(1)}:{m.group(2)}"
                            for entry in raw
                            for m in _EVIDENCE.finditer(str(entry))
                        )
                    )
                    if turns:
                        out.append(Reference(sid, str(speaker), str(item[0]), turns))
    return out


def _all(mem: Memory, user_id: str) -> tuple[list[Any], list[Any]]:
    facts = mem.facts.list(user_id=user_id, limit=10_000)
    summaries = mem.summaries.list(user_id=user_id, status=SUMMARY_STATUSES, limit=10_000)
    return facts, summaries


def _names(text: str, names: set[str]) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", text) for n in names)


def measure(mem: Memory, ds: Dataset, sample_ids: dict[str, str], show: int) -> dict[str, Any]:
    """The figures (a)-(f) for the ingested dataset ``ds`` (user id -> LoCoMo sample id)."""
    refs = references(list(sample_ids.values()))
    by_sample: dict[str, list[Reference]] = defaultdict(list)
    for r in refs:
        by_sample[r.sample].append(r)
    n_facts = n_messages = n_summaries = n_active = 0
    from_ref = 0
    covered: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    naming: dict[str, Counter[str]] = {"facts": Counter(), "summaries": Counter()}
    filler: list[tuple[str, str, str]] = []  # (fact, speaker, turn text)
    garbled: list[tuple[str, str]] = []
    uncovered: list[tuple[str, str, str]] = []
    for user in ds.users:
        sample = sample_ids[user.user_id]
        docs: dict[str, Doc] = {d.mid: d for d in user.docs}
        turn_doc = {d.turn: d for d in docs.values()}
        facts, summaries = _all(mem, user.user_id)
        n_facts += len(facts)
        n_messages += len(docs)
        n_summaries += len(summaries)
        n_active += sum(1 for s in summaries if s.status == "active")
        ref_turns = {t for r in by_sample[sample] for t in r.turns}
        fact_turns: set[str] = set()
        for f in facts:
            turns = {docs[m].turn for m in f.message_ids if m in docs}
            fact_turns |= turns
            if turns & ref_turns:
                from_ref += 1
            else:
                d = docs.get(f.message_ids[0]) if f.message_ids else None
                filler.append((f.text, d.name or d.role if d else "?", d.content if d else ""))
            if _GARBLED.search(_QUOTED.sub('""', f.text)):
                garbled.append((f.text, docs[f.message_ids[0]].content if f.message_ids else ""))
        for r in by_sample[sample]:
            role = turn_doc[r.turns[0]].role if r.turns[0] in turn_doc else "?"
            totals[role] += 1
            if fact_turns.intersection(r.turns):
                covered[role] += 1
            else:
                said = " / ".join(turn_doc[t].content for t in r.turns if t in turn_doc)
                uncovered.append((r.text, r.speaker, said))
        for layer, items in (("facts", facts), ("summaries", summaries)):
            for item in items:
                sources = [docs[m] for m in item.message_ids if m in docs]
                if not sources or any(d.name is None for d in sources):
                    continue
                naming[layer]["named messages"] += 1
                if _names(item.text, {d.name for d in sources if d.name}):
                    naming[layer]["names the speaker"] += 1
                if re.search(r"\bUser\b", item.text):
                    naming[layer]["says User"] += 1
    rng = random.Random(0)

    def pick(rows: list[Any]) -> list[Any]:
        return rng.sample(rows, min(show, len(rows)))

    n_refs = sum(totals.values())
    return {
        "messages": n_messages,
        "facts": n_facts,
        "summaries": n_summaries,
        "summaries_active": n_active,
        "from_reference": from_ref / n_facts if n_facts else 0.0,
        "references": n_refs,
        "covered": sum(covered.values()) / n_refs if n_refs else 0.0,
        "covered_by_role": {
            role: (covered[role] / totals[role], totals[role]) for role in sorted(totals)
        },
        "summary_ratio": n_summaries / n_facts if n_facts else 0.0,
        "naming": {k: dict(v) for k, v in naming.items()},
        "garbled": len(garbled),
        "samples": {
            "filler": pick(filler),
            "garbled": pick(garbled),
            "uncovered": pick(uncovered),
        },
    }


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:5.1f} %" if d else "  n/a"


def report(m: dict[str, Any]) -> None:
    print(f"\n(a) {m['facts']} facts from {m['messages']} messages")
    rows = [
        (
            "(b) facts from reference turns",
            m["from_reference"],
            f">= {TARGET_FROM_REFERENCE:.0%}",
            verdict(m["from_reference"], TARGET_FROM_REFERENCE, higher_is_better=True),
        ),
        (
            f"(c) reference facts covered (of {m['references']})",
            m["covered"],
            f">= {TARGET_COVERED:.0%}",
            verdict(m["covered"], TARGET_COVERED, higher_is_better=True),
        ),
    ]
    for label, value, target, ok in rows:
        print(f"  {label:<44} {100 * value:5.1f} %   target {target:<6} {ok}")
    for role, (share, n) in m["covered_by_role"].items():
        print(f"      speaker sent as {role:<10} {100 * share:5.1f} % of {n}")
    ratio = m["summary_ratio"]
    ok = verdict(ratio, TARGET_SUMMARY_RATIO, higher_is_better=False)
    print(
        f"  {'(d) summaries / facts':<44} {ratio:7.2f}   target <= {TARGET_SUMMARY_RATIO} {ok}"
        f"  ({m['summaries']} summaries, {m['summaries_active']} active)"
    )
    print("  (e) speaker naming (items whose messages all carry a name):")
    for layer, c in m["naming"].items():
        n = c.get("named messages", 0)
        says = c.get("says User", 0)
        print(
            f"      {layer:<10} {n:5d}: names the speaker {_pct(c.get('names the speaker', 0), n)},"
            f" says 'User' {_pct(says, n)}   target 0 % {'PASS' if says == 0 else 'MISS'}"
        )
    print(f"  (f) facts that read garbled: {m['garbled']}")
    titles = {
        "filler": "facts from turns holding no reference fact (fact | speaker | turn)",
        "garbled": "garbled rewrites (fact | turn)",
        "uncovered": "reference facts no fact covers (reference | speaker | turn)",
    }
    for key, title in titles.items():
        print(f"\n  sample of {title}:")
        for row in m["samples"][key]:
            print("    - " + " | ".join(str(x)[:160] for x in row))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit-conversations", type=int, default=None, help="the first N")
    p.add_argument("--split", choices=("all", "first-half", "second-half"), default="all")
    p.add_argument("--embedder", default="local")
    p.add_argument("--show", type=int, default=12, help="worst cases printed per kind")
    p.add_argument("--db", metavar="PATH", default=None, help="reuse (or create) this SQLite file")
    p.add_argument("--json", action="store_true", help="also print a JSON line of results")
    args = p.parse_args(argv)
    info = machine_info()
    print(
        f"stratamem extraction benchmark: {info['cpu']}, {info['cores']} cores, engine "
        f"{info['engine']}, embedder {args.embedder}, split {args.split}, "
        f"load {info.get('loadavg_1m_at_start')}"
    )
    ds = locomo_dataset(args.split, args.limit_conversations)
    sample_ids = {
        u.user_id: str(s["sample_id"])
        for u, s in zip(ds.users, _chosen(args.split, args.limit_conversations), strict=True)
    }
    with tempfile.TemporaryDirectory(prefix="stratamem-extraction-") as tmp:
        path = Path(args.db) if args.db else Path(tmp) / "extraction.db"
        mem = Memory(
            f"sqlite:///{path.resolve()}",
            embedder=args.embedder,
            max_content_chars=MAX_CONTENT_CHARS,
        )
        try:
            ing = ingest(mem, ds)
            m = measure(mem, ds, sample_ids, args.show)
        finally:
            mem.close()
    if ing.get("messages"):
        print(f"ingest: {ing['add_s'] + ing['process_s']:.1f} s, {ing.get('failed', 0)} failed")
    report(m)
    if args.json:
        emit_json("extraction", {"machine": info, "embedder": args.embedder, **m})


def _chosen(split: str, limit: int | None) -> list[dict[str, Any]]:
    """The samples ``locomo_dataset`` takes for these arguments, in its order."""
    samples = load_locomo()
    half = (len(samples) + 1) // 2
    if split == "first-half":
        samples = samples[:half]
    elif split == "second-half":
        samples = samples[half:]
    return samples if limit is None else samples[:limit]


if __name__ == "__main__":
    main()

"""Shared helpers of the benchmark scripts: timing, percentile summaries, benchmark texts.

Benchmark data is read in place from ``$STRATAMEM_DATA_DIR`` (default ``../shared/data``
next to the repository root); it is never copied into the repository.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

__all__ = [
    "REPO_ROOT",
    "TRACING_MODES",
    "Summary",
    "SyntheticText",
    "Turn",
    "data_dir",
    "emit_json",
    "engine_version",
    "format_ab",
    "format_stages",
    "format_summary",
    "load_locomo",
    "loadavg",
    "locomo_questions",
    "locomo_turns",
    "machine_info",
    "other_load",
    "postgres_admin_url",
    "postgres_database",
    "stage_medians",
    "stopwatch",
    "summarize",
    "synthetic_texts",
    "tracing",
    "tracing_ab",
    "verdict",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
_LOCOMO_FILE = "locomo_dev.json"
_LOCOMO_DATE = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"


# -- timing and summaries ----------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Latency percentiles in milliseconds (linear interpolation, as numpy computes them)."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def summarize(seconds: Sequence[float]) -> Summary:
    """Summarise durations given in seconds; the summary is in milliseconds."""
    if not seconds:
        return Summary(0, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"))
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return Summary(
        n=len(ms),
        mean=float(ms.mean()),
        p50=float(p50),
        p95=float(p95),
        p99=float(p99),
        max=float(ms.max()),
    )


def format_summary(label: str, s: Summary, width: int = 44) -> str:
    """One aligned line: ``label  p50 .. p95 .. p99 .. mean .. max .. n``."""
    return (
        f"  {label:<{width}} p50 {s.p50:8.3f} ms  p95 {s.p95:8.3f} ms  p99 {s.p99:8.3f} ms  "
        f"mean {s.mean:8.3f} ms  max {s.max:8.2f} ms  n={s.n}"
    )


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed wall time in seconds."""
    box: list[float] = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


def _machine_busy_seconds() -> float | None:
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def cores_used(groups: dict[str, Sequence[int]]) -> Iterator[dict[str, float]]:
    """Cores each group of processes used while the block ran (CPU seconds over wall
    seconds, from ``/proc``): where a saturated machine's time went."""
    box: dict[str, float] = {}
    before = {name: sum(_process_cpu_seconds(p) for p in pids) for name, pids in groups.items()}
    wall0 = time.perf_counter()
    try:
        yield box
    finally:
        wall = time.perf_counter() - wall0
        for name, pids in groups.items():
            used = sum(_process_cpu_seconds(p) for p in pids) - before[name]
            box[name] = used / wall if wall > 0 else float("nan")


@contextmanager
def other_load(own_pids: Sequence[int] = ()) -> Iterator[list[float]]:
    """Share of the machine's CPU used by OTHER processes while the block ran (0..1).

    Busy time of the whole machine (``/proc/stat``) minus this process's own CPU time (and
    that of ``own_pids``, the benchmark's own subprocesses), over wall time x cores: a noise
    gauge, since the benchmark machine may be shared. ``nan`` where ``/proc`` is unavailable.
    """
    box: list[float] = [float("nan")]
    busy0, own0, wall0 = _machine_busy_seconds(), os.times(), time.perf_counter()
    kids0 = sum(_process_cpu_seconds(pid) for pid in own_pids)
    try:
        yield box
    finally:
        busy1, own1, wall1 = _machine_busy_seconds(), os.times(), time.perf_counter()
        kids1 = sum(_process_cpu_seconds(pid) for pid in own_pids)
        if busy0 is not None and busy1 is not None and wall1 > wall0:
            own = (own1.user + own1.system) - (own0.user + own0.system) + kids1 - kids0
            cores = os.cpu_count() or 1
            box[0] = min(1.0, max(0.0, (busy1 - busy0 - own) / ((wall1 - wall0) * cores)))


def verdict(value: float, target: float, *, higher_is_better: bool) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "PASS" if ok else "MISS"


def emit_json(bench: str, results: dict[str, Any]) -> None:
    """Print one JSON line (``--json``), easy to grep out of the human-readable output."""
    print(json.dumps({"bench": bench, **results}, default=str, sort_keys=True))


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM and library versions, to print beside the figures."""
    model = platform.processor() or "unknown"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    ram_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": model,
        "cores": os.cpu_count(),
        "ram_gib": ram_gib,
        "simd": " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags)
        or "?",
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    try:
        import usearch

        info["usearch"] = usearch.__version__
    except (ImportError, AttributeError):
        pass
    info["engine"] = engine_version()
    info["loadavg_1m_at_start"] = loadavg()
    return info


def engine_version() -> str:
    """The repository commit the engine was measured at, ``+dirty`` if src/ has edits."""
    import subprocess

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD") or "unknown"
        dirty = bool(git("status", "--porcelain", "--", "src"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def loadavg() -> float | None:
    """The 1-minute load average: above ~0.5 on 2 cores, other work shares the machine."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# -- PostgreSQL databases of a benchmark --------------------------------------------------------


def postgres_admin_url(arg: str | None) -> str:
    """The superuser URL a benchmark makes its databases with: ``--pg``, else the test
    suite's server, else the local default."""
    return (
        arg
        or os.environ.get("STRATAMEM_TEST_POSTGRES_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres"
    )


@contextmanager
def postgres_database(admin: str, name: str, *, keep: bool) -> Iterator[str]:
    """A fresh database ``name`` (dropped first if it exists) with the store's extensions;
    its URL. Dropped at the end unless ``keep``."""
    import psycopg

    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
        c.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    try:
        yield url
    finally:
        if not keep:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def analyze_postgres(url: str) -> str:
    """VACUUM and ANALYZE the database of ``url`` after a load, as autovacuum does in
    production (since PostgreSQL 13 it vacuums a table after inserts alone): a test server
    may run without it (this workplace's does). Tables never analysed get plans for empty
    tables (LoCoMo's recall briefs: a nested loop over every topic per summary; mem.search
    p50 36.5 against 24.8 ms once analysed); tables never vacuumed have no visibility map,
    so an index-only scan (a turn's neighbours, two a candidate) reads the table's rows too
    (LoCoMo limit-10 search mean 10.8 against 10.3 ms once vacuumed, Zen 5). Returns what
    it did."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        conn.execute("VACUUM (ANALYZE)")
    return f"VACUUM (ANALYZE) after the load (autovacuum {row[0] if row else 'unknown'})"


# -- LoCoMo --------------------------------------------------------------------------------


def data_dir() -> Path:
    """``$STRATAMEM_DATA_DIR``, else ``../shared/data`` relative to the repository root."""
    env = os.environ.get("STRATAMEM_DATA_DIR")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data").resolve()


@lru_cache(maxsize=1)
def load_locomo() -> list[dict[str, Any]]:
    path = data_dir() / _LOCOMO_FILE
    if not path.is_file():
        raise SystemExit(
            f"benchmark data not found: {path}; set STRATAMEM_DATA_DIR to the folder "
            f"holding {_LOCOMO_FILE}"
        )
    with open(path, encoding="utf-8") as f:
        samples = json.load(f)
    if not isinstance(samples, list):
        raise SystemExit(f"{path}: expected a JSON list of samples")
    return samples


@dataclass(frozen=True)
class Turn:
    """One LoCoMo dialogue turn, as a message of the conversation's user."""

    sample_id: str
    session: int
    dia_id: str
    speaker: str
    role: str  # speaker_a -> "user", speaker_b -> "assistant"
    text: str
    timestamp: datetime
    caption: str | None = None  # ``blip_caption``: a photo the speaker shared with the turn

    @property
    def message_id(self) -> str:
        return f"{self.sample_id}-{self.dia_id}"

    def as_message(self) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "role": self.role,
            "content": self.text,
            "timestamp": self.timestamp.isoformat(),
            "metadata": {"speaker": self.speaker},
        }


def _session_number(key: str) -> int | None:
    m = re.fullmatch(r"session_(\d+)", key)
    return int(m.group(1)) if m else None


def locomo_turns() -> list[Turn]:
    """Every turn of every conversation, in conversation order (about 3,400 turns).

    A turn's timestamp is its session's date plus one minute per turn, so order is kept.
    """
    turns: list[Turn] = []
    for sample in load_locomo():
        sample_id = str(sample["sample_id"])
        conv = sample["conversation"]
        speaker_a = conv.get("speaker_a")
        sessions = sorted(
            (n, key)
            for key, value in conv.items()
            if isinstance(value, list) and (n := _session_number(key)) is not None
        )
        seen: set[str] = set()
        for n, key in sessions:
            raw_date = conv.get(f"{key}_date_time")
            try:
                start = datetime.strptime(str(raw_date), _LOCOMO_DATE).replace(tzinfo=timezone.utc)
            except ValueError:
                start = datetime(2023, 1, 1, tzinfo=timezone.utc) + timedelta(days=n)
            for i, t in enumerate(conv[key]):
                text = str(t.get("text") or "").strip()
                if not text:
                    continue
                dia_id = str(t.get("dia_id") or f"D{n}:{i + 1}")
                if dia_id in seen:  # ids must be unique within a user
                    dia_id = f"{dia_id}.{i}"
                seen.add(dia_id)
                speaker = str(t.get("speaker") or "")
                turns.append(
                    Turn(
                        sample_id=sample_id,
                        session=n,
                        dia_id=dia_id,
                        speaker=speaker,
                        role="user" if speaker == speaker_a else "assistant",
                        text=text,
                        timestamp=start + timedelta(minutes=i),
                        caption=str(t.get("blip_caption") or "").strip() or None,
                    )
                )
    return turns


def locomo_questions(n: int | None = None, *, seed: int = 0) -> list[str]:
    """LoCoMo questions (all ``qa`` items that have one), shuffled deterministically."""
    questions = [
        str(q["question"]).strip()
        for sample in load_locomo()
        for q in sample.get("qa", [])
        if str(q.get("question") or "").strip()
    ]
    random.Random(seed).shuffle(questions)
    return questions if n is None else questions[:n]


def locomo_speakers() -> list[str]:
    names: set[str] = set()
    for sample in load_locomo():
        conv = sample["conversation"]
        for key in ("speaker_a", "speaker_b"):
            if conv.get(key):
                names.add(str(conv[key]))
    return sorted(names)


# -- synthetic scale-up ------------------------------------------------------------------

_NAMES = """Aiko Amara Anders Aria Bea Bruno Camila Chen Dara Diego Elif Emeka Farah Felix Gia
Hana Hugo Ines Ivan Jada Jonas Kai Kemal Lena Luca Maya Mateo Nadia Nico Omar Oona Pia Priya
Quinn Rafa Rosa Sami Sofia Tariq Tess Uma Vera Wen Xavi Yara Yusuf Zane Zoe Ravi Leila""".split()  # noqa: SIM905
_PLACES = """Lisbon Osaka Denver Nairobi Quito Tallinn Perth Bergen Austin Seville Hanoi Krakow
Montreal Cusco Reykjavik Porto Kyoto Accra Valparaiso Tbilisi Dublin Lyon Busan Hobart
Marrakesh Gdansk Boise Cork Leipzig Oaxaca""".split()  # noqa: SIM905
# Openers and closers use interjections, names, places and numbers only, so that the
# synthetic texts do not inflate the document frequency of words that queries use.
_OPENERS = ["", "", "", "Oh, ", "Hey, ", "Honestly, ", "Anyway, ", "Wow, ", "Haha, ", "Hmm, "]
_CLOSERS = [
    " ({place})",
    " - {name}",
    " ({name}, {place})",
    " #{num}",
    " ({place}, {num})",
    " - {name} and {name2}",
]
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_NUMBER = re.compile(r"\b\d+\b")


@dataclass(frozen=True)
class SyntheticText:
    """A synthesised message text and the pool texts it was derived from.

    ``source`` is the index of the pool text it rewrites; ``blend`` the index of a second
    pool text whose first sentence was appended (or None).
    """

    text: str
    source: int
    blend: int | None


def synthetic_texts(pool: Sequence[str], n: int, *, seed: int = 0) -> list[SyntheticText]:
    """``n`` distinct texts recombined from ``pool`` (deterministic for a given seed).

    Each text rewrites one pool text: LoCoMo speaker names become other names, numbers
    other numbers, an interjection may open it and a tag of names, places or numbers
    closes it,
    and for 30% of them the first sentence of another pool text is appended. The texts
    keep LoCoMo's vocabulary and length, so full-text posting lists grow realistically.
    """
    if not pool:
        raise ValueError("the pool is empty")
    rng = random.Random(seed)
    speakers = locomo_speakers()
    name_re = re.compile(r"\b(" + "|".join(map(re.escape, speakers)) + r")\b") if speakers else None
    seen = set(pool)
    out: list[SyntheticText] = []
    while len(out) < n:
        src = rng.randrange(len(pool))
        text = pool[src]
        if name_re is not None:
            text = name_re.sub(lambda _m: rng.choice(_NAMES), text)
        text = _NUMBER.sub(lambda m: str(int(m.group(0)) + rng.randint(1, 97)), text)
        opener = rng.choice(_OPENERS)
        if opener and text[:1].isupper() and not text[:2].isupper():
            text = text[0].lower() + text[1:]
        text = opener + text
        blend = None
        if rng.random() < 0.3:
            blend = rng.randrange(len(pool))
            first = _SENTENCE.split(pool[blend].strip(), maxsplit=1)[0]
            text = f"{text} {first}"
        closer = rng.choice(_CLOSERS).format(
            name=rng.choice(_NAMES),
            name2=rng.choice(_NAMES),
            place=rng.choice(_PLACES),
            num=rng.randint(2, 400),
        )
        text = text + closer
        if text in seen:  # rare: vary the closing clause once more
            text += f" ({rng.choice(_PLACES)}, {rng.randint(1000, 9999)})"
            if text in seen:
                continue
        seen.add(text)
        out.append(SyntheticText(text=text, source=src, blend=blend))
    return out


# -- tracing on and off (docs/observability.md, "What it costs") ---------------------------

#: ``absent``: as without opentelemetry-api (the shim's first check fails); ``off``: the API
#: installed, no tracer provider set (what an application gets from the otel extra alone);
#: ``on``: the SDK's provider with an in-memory exporter behind the batch processor (how
#: spans are exported in production: off the traced thread), flushed after each round.
TRACING_MODES = ("absent", "off", "on")


@contextmanager
def tracing(mode: str) -> Iterator[None]:
    """Run the block with stratamem's tracing in ``mode`` (one of TRACING_MODES)."""
    from stratamem import _metrics, _tracing

    if mode not in TRACING_MODES:
        raise ValueError(f"tracing mode {mode!r}: expected one of {TRACING_MODES}")
    if mode == "absent":
        api, metrics_absent = _tracing._api, _metrics._otel_absent
        _tracing._api, _tracing._absent, _metrics._otel_absent = None, True, True
        try:
            yield
        finally:
            _tracing._api, _tracing._absent = api, False
            _metrics._otel_absent = metrics_absent
        return
    if mode == "off":
        _tracing.set_tracer_provider(None)
        yield
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _tracing.set_tracer_provider(provider)
    try:
        yield
    finally:
        _tracing.set_tracer_provider(None)
        provider.shutdown()  # exports what is queued: the spans were all made
        if not exporter.get_finished_spans():
            raise RuntimeError("tracing was on but no span was exported")


def tracing_ab(
    measure: Callable[[], Sequence[float]], rounds: int, modes: Sequence[str] = TRACING_MODES
) -> dict[str, list[float]]:
    """The p50 (ms) of ``measure()``'s timings (seconds) in each mode, ``rounds`` times:
    the modes alternate within each round, their order rotating from round to round, so
    that drift on a shared machine falls on all of them alike."""
    p50s: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for i in range(len(modes)):
            mode = modes[(r + i) % len(modes)]
            with tracing(mode):
                p50s[mode].append(float(np.percentile(measure(), 50) * 1000))
    return p50s


def format_ab(label: str, p50s: dict[str, list[float]]) -> str:
    """One line per mode: the median of its rounds' p50s, and on's and off's added share
    over the mode before it."""
    medians = {m: float(np.median(v)) for m, v in p50s.items()}
    lines = [f"  {label}: median of {len(next(iter(p50s.values())))} rounds' p50"]
    previous: float | None = None
    for mode, median in medians.items():
        added = "" if previous is None else f" ({(median / previous - 1) * 100:+.1f} %)"
        lines.append(f"    tracing {mode:<6} {median:8.3f} ms{added}")
        previous = median
    return "\n".join(lines)


def stage_medians(run: Callable[[], object]) -> dict[str, float]:
    """Where ``run``'s recalls spend their time, read from the spans stratamem makes of them
    (docs/observability.md): the median duration in ms of each span name (``search_memory``
    the whole search; its stages ``stratamem.recall.*`` and the query's ``embeddings``). Run
    apart from the timed loops: tracing costs a few percent (``tracing_ab``). Full text runs
    beside the embedding and the vectors, so the stages do not add up to the whole. Empty
    without the OpenTelemetry SDK (a test dependency): a long build still ends with its
    other figures."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
    except ImportError:
        return {}

    from stratamem import _tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _tracing.set_tracer_provider(provider)
    try:
        run()
    finally:
        _tracing.set_tracer_provider(None)
        provider.shutdown()
    durations: dict[str, list[float]] = {}
    for span in exporter.get_finished_spans():
        if span.start_time is not None and span.end_time is not None:
            name = span.name.split(" ")[0]  # "embeddings <model>"
            durations.setdefault(name, []).append((span.end_time - span.start_time) / 1e6)
    if not durations:
        raise RuntimeError("tracing was on but no span was recorded")
    return {name: float(np.median(ms)) for name, ms in sorted(durations.items())}


def format_stages(stages: dict[str, float]) -> str:
    """``stage_medians`` as one line, the whole search first."""
    if not stages:
        return "  stages: not measured (pip install opentelemetry-sdk)"
    names = sorted(stages, key=lambda n: (n != "search_memory", n))
    return "  stages (median ms): " + ", ".join(
        f"{n.removeprefix('stratamem.recall.')} {stages[n]:.1f}" for n in names
    )

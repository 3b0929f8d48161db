"""Settings: one place for every option, from arguments and ``STRATAMEM_*`` variables.

Arguments passed to ``Memory(...)`` win over environment variables, which win over the
defaults below. ``docs/configuration.md`` documents each field; keep the two in step.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigError

__all__ = ["DATABASE_FILE_SUFFIXES", "URL_FORMS", "ModelPrice", "Settings", "load_settings"]

# A host name of the webhook allow-list: labels of letters, digits and hyphens; a leading
# "*." allows every subdomain.
_LABEL = r"[A-Za-z0-9][A-Za-z0-9-]{0,62}"
_HOST_RE = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*\.?$")


# What ``database_url`` accepts; a bare path must end in one of these file names' suffixes.
DATABASE_FILE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db3")
_URL_SCHEMES = ("sqlite:", "postgresql:", "postgres:", "http:", "https:")
URL_FORMS = (
    "use sqlite:///relative/path.db, sqlite:////absolute/path.db, a file path ending in "
    f"{', '.join(DATABASE_FILE_SUFFIXES)}, postgresql://user:password@host:5432/db, or "
    "http(s)://host:port (a stratamem server)"
)


class ModelPrice(BaseModel):
    """What a model costs per 1M tokens (in any one currency, the same for every model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: float = Field(ge=0, allow_inf_nan=False)
    completion: float = Field(ge=0, allow_inf_nan=False)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRATAMEM_", extra="forbid", frozen=True)

    database_url: str = Field(
        default="sqlite:///./stratamem.db",
        description="sqlite:///path.db (embedded), postgresql://user:pass@host/db (PostgreSQL "
        "with pgvector; needs the postgres extra), or http(s):// (a stratamem server).",
    )
    project_id: str = Field(default="default", description="Project (tenant) this Memory acts in.")
    llm: str = Field(
        default="none",
        description="none (offline heuristics) | openai:<model> (any OpenAI-compatible "
        "server) | anthropic:<model>",
    )
    llm_base_url: str | None = Field(default=None, description="Base URL of the LLM API.")
    llm_api_key: str | None = Field(default=None, description="Key of the LLM API.")
    llm_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    llm_max_retries: int = Field(
        default=3, ge=0, le=20, description="SDK retries on 429/5xx/timeouts per call."
    )
    extract_chunk_messages: int = Field(
        default=30, ge=1, le=500, description="Messages per extraction call."
    )
    consolidate_chunk_facts: int = Field(
        default=40, ge=1, le=500, description="New facts per consolidation call."
    )
    embedder: str = Field(
        default="auto", description="auto | local | hash | hash:<dim> | openai:<model>"
    )
    embedder_base_url: str | None = Field(default=None, description="OpenAI-compatible base URL.")
    embedder_api_key: str | None = Field(default=None, description="Key for the embedder API.")
    local_model_path: str | None = Field(
        default=None,
        description="Another copy of the bundled model.onnx (all-MiniLM-L6-v2 int8) to load; "
        "its sha256 is verified.",
    )
    embedder_threads: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Texts of a background batch the local model embeds at once (one core each).",
    )
    workers: int = Field(
        default=1,
        ge=0,
        le=64,
        description="Background worker threads in this process; 0 = process in the caller "
        "(sync=True, wait()) or by a separate `stratamem worker`.",
    )
    worker_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Linux: how much lower the CPU priority (niceness) of this process's "
        "background work is than the application's threads (worker threads and the local "
        "model's batch threads); they then take the cores the application leaves idle. "
        "0 = the same priority.",
    )
    job_lease_seconds: float = Field(
        default=30.0,
        gt=0.5,
        le=3600,
        description="A job not heartbeated for this long is taken to belong to a dead worker.",
    )
    job_max_attempts: int = Field(default=8, ge=1, le=100)
    job_backoff_seconds: float = Field(
        default=2.0, ge=0.0, le=3600, description="First retry delay; doubles per attempt."
    )
    job_backoff_max_seconds: float = Field(default=600.0, ge=0.0)
    outage_backoff_seconds: float = Field(
        default=2.0,
        gt=0.0,
        le=3600,
        description="During an outage of the LLM or the remote embedder, the wait before "
        "the first probe; doubles per failed probe (+-20% jitter).",
    )
    outage_backoff_max_seconds: float = Field(
        default=60.0,
        gt=0.0,
        le=3600,
        description="Longest wait between two probes of an outage: processing resumes at "
        "most this long (+20%) after the service answers again.",
    )
    batch_max_messages: int = Field(
        default=256, ge=1, le=10_000, description="Messages one worker job covers at most."
    )
    max_content_chars: int = Field(default=32_000, ge=1, le=10_000_000)
    max_messages_per_call: int = Field(default=1000, ge=1, le=100_000)
    max_metadata_bytes: int = Field(default=16_384, ge=2, le=10_000_000)
    sync_timeout_seconds: float = Field(
        default=120.0, gt=0, description="How long add_messages(sync=True) waits for processing."
    )
    warm_up: bool = Field(
        default=True,
        description="Load the local embedding model in the background as the Memory opens, "
        "so that the first search does not wait for it (~0.5 s, ~250 MB); false loads it "
        "on first use (commands that never embed, a supervising process).",
    )
    close_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        description="On close()/exit, time allowed to finish queued work of this process; "
        "the rest stays queued in the database and is processed on the next start.",
    )
    vector_index_threshold: int = Field(
        default=20_000,
        ge=0,
        description="Above this many vectors in one user's scope, search uses an HNSW index "
        "(usearch in process on SQLite, pgvector on PostgreSQL) instead of exact search.",
    )
    token_budget: int = Field(
        default=800,
        ge=50,
        le=32_000,
        description="Default token budget of formatted_context (recall_config.token_budget wins).",
    )
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0)
    sqlite_mmap_bytes: int = Field(
        default=0,
        ge=0,
        description="SQLite: read the database file through a memory map of up to this many "
        "bytes (0, the default: every connection copies pages into its own 2 MB cache).",
    )
    postgres_pool_size: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="PostgreSQL: most connections this process opens (worker threads, "
        "recall, webhook senders and server requests share them).",
    )
    postgres_ef_search: int = Field(
        default=100,
        ge=10,
        le=1000,
        description="PostgreSQL: hnsw.ef_search of vector searches through the HNSW index "
        "(raised to twice the results wanted when that is more); higher is more exact.",
    )
    capture_recall: bool = Field(
        default=True,
        description="mem.llm: recall memory for the scoped user before each captured call "
        "and inject it (where: capture_injection).",
    )
    capture_injection: Literal["user", "system"] = Field(
        default="user",
        description="mem.llm: where the recalled block goes: `user`, into the last user turn "
        "(after its text; the caller's system prompt, tools and earlier turns stay "
        "byte-identical, so provider prompt caches keep working), or `system`, into the "
        "provider's system slot.",
    )
    capture_recall_timeout_ms: int = Field(
        default=50,
        ge=1,
        le=60_000,
        description="mem.llm: longest wait for recall before a call goes on without memory.",
    )
    capture_inject_history: bool = Field(
        default=False,
        description="mem.llm: also send the session's earlier turns that the caller did not.",
    )
    capture_default_user: str | None = Field(
        default=None,
        description="mem.llm: user of calls made outside any mem.scope(...) and without "
        "mem.llm.attribution(...) defaults; unset, such calls are not captured.",
    )

    recall_log: bool = Field(
        default=True,
        description="Keep a log of recent recalls made by capture, the proxy and the REST "
        "context routes, with the memory text each injected (mem.recall_log).",
    )
    recall_log_max_entries: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Recall log: most records kept per project (the oldest go first).",
    )
    recall_log_retention_hours: float = Field(
        default=168.0,
        gt=0,
        le=87_600,
        description="Recall log: records older than this are deleted.",
    )

    trace_content: bool = Field(
        default=False,
        description="OpenTelemetry: put query and memory text on spans "
        "(gen_ai.memory.query.text, gen_ai.memory.records). It is what users said: "
        "personal data; off, spans carry ids, counts and timings only.",
    )
    llm_prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description="Prices of the pipeline's model, per 1M tokens, to turn its tokens into "
        'money: {"openai:gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}} (the model as '
        "llm names it, or without its provider; JSON in STRATAMEM_LLM_PRICES).",
    )

    webhook_allow: str = Field(
        default="",
        description="Hosts and CIDRs webhooks may reach although they resolve to loopback, "
        "private, link-local or reserved addresses (comma or space separated), e.g. "
        "`hooks.internal, 10.1.0.0/16, 127.0.0.1`.",
    )
    webhook_timeout_ms: int = Field(
        default=5000,
        ge=100,
        le=30_000,
        description="Timeout of a webhook created without one (each hook may set 100-30000).",
    )
    webhook_max_response_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        le=100_000_000,
        description="A webhook answer longer than this is cut and the delivery fails.",
    )
    webhook_max_attempts: int = Field(
        default=10, ge=1, le=100, description="Attempts of an async delivery before it fails."
    )
    webhook_backoff_seconds: float = Field(
        default=5.0,
        ge=0.0,
        le=3600,
        description="First retry delay of an async delivery; doubles per attempt (+-20% jitter).",
    )
    webhook_backoff_max_seconds: float = Field(
        default=3600.0, ge=0.0, description="Longest delay between async delivery attempts."
    )
    webhook_async_concurrency: int = Field(
        default=4, ge=1, le=64, description="Async deliveries sent at once by this process."
    )
    webhook_log_keep: int = Field(
        default=1000, ge=10, le=1_000_000, description="Delivery attempts kept per webhook."
    )

    @field_validator("webhook_allow", mode="before")
    @classmethod
    def _allow(cls, v: Any) -> Any:
        # Memory(webhook_allow=["127.0.0.1", "10.0.0.0/8"]) reads better than one string.
        if isinstance(v, (list, tuple, set)):
            v = ",".join(map(str, v))
        if not isinstance(v, str):
            raise ValueError("expected hosts and CIDRs separated by commas or spaces")
        for entry in v.replace(",", " ").split():
            try:
                ipaddress.ip_network(entry.strip("[]"), strict=False)
            except ValueError:
                if "/" in entry or not _HOST_RE.match(entry):
                    raise ValueError(f"{entry!r} is neither a host name nor an IP/CIDR") from None
        return v

    @field_validator("database_url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must not be empty")
        lowered = v.lower()
        if lowered.startswith(_URL_SCHEMES):
            return v
        # A bare path names a SQLite file, created on first use: a mistyped URL
        # ("postgres//host", "notaurl") must not become a new, empty store.
        if "://" in v or not lowered.endswith(DATABASE_FILE_SUFFIXES):
            raise ValueError(f"{v!r} is neither a database URL nor a database file; {URL_FORMS}")
        return v


def load_settings(**overrides: Any) -> Settings:
    """Build settings; ``None`` arguments mean "not given" so the environment still applies."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "settings"
            # pydantic words a validator's own message "Value error, ...": ours say enough.
            problems.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError("invalid stratamem configuration:\n  " + "\n  ".join(problems)) from None

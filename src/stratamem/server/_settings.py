"""Settings of the REST server, from arguments and ``STRATAMEM_*`` environment variables.

They live apart from the engine's :class:`stratamem.config.Settings` because only the server
reads them; both use the same prefix, so one environment configures a deployment.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..errors import ConfigError

__all__ = ["ServerSettings", "load_server_settings"]


class ServerSettings(BaseSettings):
    # extra="ignore": the engine's STRATAMEM_* variables share the prefix and are not ours.
    model_config = SettingsConfigDict(env_prefix="STRATAMEM_", extra="ignore", frozen=True)

    host: str = Field(default="127.0.0.1", description="Interface `stratamem serve` binds.")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port of `stratamem serve`.")
    proxy_port: int = Field(
        default=8001,
        ge=1,
        le=65535,
        description="TCP port of `stratamem proxy` (its own, so that it runs beside "
        "`stratamem serve` on one machine).",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the /admin API (projects and keys); unset, the admin "
        "API answers 403.",
    )
    max_body_bytes: int = Field(
        default=1_048_576,
        ge=1024,
        le=1 << 30,
        description="Largest request body accepted; larger ones are refused with 413.",
    )
    proxy_upstream: str | None = Field(
        default=None,
        description="Memory proxy: base URL of the OpenAI-compatible upstream of "
        "/v1/chat/completions, /v1/responses and every other /v1 path, e.g. "
        "`https://api.openai.com` or `http://127.0.0.1:11434` (Ollama); unset, the proxy's "
        "routes answer 501.",
    )
    proxy_anthropic_upstream: str | None = Field(
        default=None,
        description="Memory proxy: base URL of /v1/messages' upstream, e.g. "
        "`https://api.anthropic.com` (default: proxy_upstream).",
    )
    proxy_upstream_api_key: SecretStr | None = Field(
        default=None,
        description="Memory proxy: the provider key sent upstream instead of the caller's "
        "(then `stratamem serve` requires a stratamem key on every proxied request, "
        "`/v1` paths without memory included).",
    )
    proxy_require_user: bool = Field(
        default=True,
        description="Memory proxy: refuse (400) a chat, responses or messages request "
        "without X-Stratamem-User-Id; false relays it without memory.",
    )
    proxy_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=3600,
        description="Memory proxy: longest wait for the upstream's next byte.",
    )
    proxy_max_body_bytes: int = Field(
        default=32 * 1_048_576,
        ge=1024,
        le=1 << 30,
        description="Memory proxy: largest request body accepted on /v1 paths (images "
        "travel inline); larger ones are refused with 413.",
    )
    auth_failures_burst: int = Field(
        default=10,
        ge=1,
        le=1_000_000,
        description="Wrong credentials (API keys, the admin token, dashboard sign-ins; each "
        "kind apart) one client address may send in a row before it is answered 429 with "
        "Retry-After; correct ones never count.",
    )
    auth_failures_per_minute: float = Field(
        default=10.0,
        gt=0,
        le=1_000_000,
        description="How fast that allowance comes back: wrong credentials per minute an "
        "address may keep sending once it has used its burst.",
    )
    auth_limiter_addresses: int = Field(
        default=10_000,
        ge=1,
        le=10_000_000,
        description="Client addresses with recent failures remembered (least recently "
        "failing forgotten first): bounds the limiter's memory.",
    )
    forwarded_allow_ips: str | None = Field(
        default=None,
        description="Comma-separated addresses (or networks, or `*`) of reverse proxies "
        "whose X-Forwarded-For and X-Forwarded-Proto `stratamem serve` trusts for the "
        "client's address and scheme; unset, none: the address is the connection's.",
    )
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        le=3600,
        description="How long `stratamem serve` and `stratamem proxy` keep an idle client "
        "connection open. Longer than clients keep theirs (httpx, so the OpenAI and "
        "Anthropic SDKs: 5 s; load balancers: 60 s), so that the client always closes "
        "first: at uvicorn's 5 s both ends timed out together and a request sent on a "
        "connection the server was closing failed (ReadError).",
    )
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes of `stratamem serve` or `stratamem proxy`, accepting on "
        "the one port; each opens its own Memory, with its own pipeline workers. One "
        "process relays and recalls under one GIL: under many concurrent streams a second "
        "process keeps recall within its bound.",
    )
    switch_interval_ms: float = Field(
        default=0.2,
        gt=0,
        le=100,
        description="How long a thread of `stratamem serve` or `stratamem proxy` keeps the "
        "GIL while another waits for it (Python's default is 5 ms): a recall hands the GIL "
        "back at each SQLite step and model run, about a hundred times, and behind a busy "
        "event loop each handback cost the default's 5 ms.",
    )
    metrics: bool = Field(
        default=False,
        description="Serve Prometheus metrics at /metrics (needs prometheus-client, in the "
        "server extra); with metrics_token set, a scrape must send it as a bearer token.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token /metrics requires (a token of its own: it opens nothing "
        "else); unset, /metrics answers anyone who reaches the server.",
    )
    ui: bool = Field(
        default=True,
        description="Serve the dashboard at /ui (sign-in with a project API key or the "
        "admin token); false leaves /ui unrouted.",
    )
    ui_session_hours: float = Field(
        default=12.0,
        gt=0,
        le=24 * 30,
        description="Dashboard: how long a sign-in lasts before the browser must sign in again.",
    )


def load_server_settings(**overrides: Any) -> ServerSettings:
    """Server settings; ``None`` arguments mean "not given" so the environment still applies."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return ServerSettings(**given)
    except PydanticValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError("invalid server configuration:\n  " + "\n  ".join(problems)) from None

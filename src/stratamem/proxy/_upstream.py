"""Where the proxy forwards to, and which headers cross it.

The caller's provider key (``Authorization``, ``x-api-key``, ...) travels to the upstream
untouched unless the proxy has a key of its own for that upstream; stratamem's headers
(``X-Stratamem-*``: the project key, the user) never leave the proxy. Nothing here logs a
header.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

__all__ = ["Upstream", "base_url", "body_decoder", "request_headers", "response_headers"]

# Hop-by-hop headers (RFC 9110 §7.6.1) and those the proxy sets itself: the body's length
# changes when memory is injected, and the upstream is asked for an uncompressed answer
# (the proxy reads it to capture it).
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
# The places providers read a key from: replaced when the proxy has a key of its own.
_KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
_OWN_PREFIX = "x-stratamem-"
# The server computes these for the body it sends.
_NOT_RETURNED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)


def base_url(url: str, what: str) -> str:
    """``url`` as the base the request's ``/v1/...`` path is appended to: a trailing ``/``
    or ``/v1`` (how SDK base URLs are usually written) is dropped."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{what}: expected an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what}: a base URL has no query or fragment, got {url!r}")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class Upstream:
    """One upstream: its base URL and, optionally, the key the proxy sends it instead of
    the caller's (``key_header``: ``authorization`` for OpenAI-style APIs, ``x-api-key``
    for Anthropic's)."""

    url: str
    key: str | None = None
    key_header: str = "authorization"

    def target(self, path: str, query: str) -> str:
        return f"{self.url}{path}?{query}" if query else f"{self.url}{path}"

    def headers(self, incoming: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        out = request_headers(incoming, drop_keys=self.key is not None)
        if self.key is not None:
            value = f"Bearer {self.key}" if self.key_header == "authorization" else self.key
            out.append((self.key_header, value))
        return out


def request_headers(
    incoming: Iterable[tuple[str, str]], *, drop_keys: bool = False
) -> list[tuple[str, str]]:
    out = [
        (name, value)
        for name, value in incoming
        if name not in _NOT_FORWARDED
        and not name.startswith(_OWN_PREFIX)
        and not (drop_keys and name in _KEY_HEADERS)
    ]
    out.append(("accept-encoding", "identity"))
    return out


def response_headers(incoming: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers the caller gets, raw (names and duplicates kept)."""
    return [(k, v) for k, v in incoming if k.decode("latin-1").lower() not in _NOT_RETURNED]


def body_decoder(encoding: str | None) -> Callable[[bytes], bytes] | None:
    """What undoes the upstream's ``Content-Encoding`` for capture's copy of the answer,
    chunk by chunk: the proxy asks for none, but an upstream may compress anyway. None
    for an encoding stratamem cannot read (the answer is then relayed, not captured)."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return _same
    if encoding in ("gzip", "x-gzip", "deflate"):
        # wbits 47: a gzip or zlib header, whichever comes.
        return zlib.decompressobj(wbits=47).decompress
    return None


def _same(data: bytes) -> bytes:
    return data

"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

A delivery carries ``webhook-id`` (the delivery id, the same on every retry so receivers
can drop duplicates), ``webhook-timestamp`` (Unix seconds of this attempt) and
``webhook-signature``: ``v1,`` + base64 HMAC-SHA256 over ``{id}.{timestamp}.{body}`` keyed
with the secret's bytes (two such signatures, space-separated, while a rotated secret is in
its grace period). Secrets are ``whsec_`` + base64 of 32 random bytes, the format
the ``standardwebhooks`` libraries read directly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence

__all__ = ["SECRET_PREFIX", "new_delivery_id", "new_secret", "sign", "signature_headers"]

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def new_delivery_id() -> str:
    # Time-ordered, so ids sort by when a delivery was triggered; random so they never collide.
    return f"msg_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


def _key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    return base64.b64decode(raw)


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_headers(
    keys: Sequence[str], delivery_id: str, body: bytes, timestamp: int | None = None
) -> dict[str, str]:
    """Headers of one delivery, signed with each secret (space-separated signatures, as
    Standard Webhooks verifiers accept: any one that matches will do)."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(sign(s, delivery_id, ts, body) for s in keys),
    }

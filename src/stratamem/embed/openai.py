"""Embeddings from any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Ollama, vLLM, ...).

The ``openai`` SDK is an optional extra (``pip install 'stratamem[openai]'``) and is
imported only when an :class:`OpenAIEmbedder` is built. Responses are validated rather
than trusted: a proxy or local server returning the wrong number of vectors, ragged
vectors or NaNs would otherwise corrupt the store silently.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from stratamem._unavailable import unavailable_status
from stratamem.errors import ConfigError, EmbeddingError, EmbeddingUnavailableError

__all__ = ["OpenAIEmbedder"]

# Local servers (Ollama, llama.cpp, vLLM) ignore the key, but the SDK insists on one.
_PLACEHOLDER_KEY = "stratamem-no-key"
_PROBE_TEXT = "dimension probe"


def _describe(url: str) -> str:
    # For messages and the startup log: never echo credentials that might sit in the URL.
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}".rstrip("/")


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint, L2-normalised, float32.

    ``api_key`` defaults to ``OPENAI_API_KEY``; with a ``base_url`` (e.g. Ollama's
    ``http://localhost:11434/v1``) and no key, a placeholder key is sent. ``max_retries``
    is handed to the SDK, which retries connection errors, 408/409/429 and 5xx with
    backoff. Inputs are sent ``batch_size`` at a time. ``dim`` is ``dimensions`` if given,
    else learnt from the first response; reading ``dim`` or ``id`` before any
    :meth:`embed` makes one small probe request.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        batch_size: int = 128,
        dimensions: int | None = None,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ConfigError(
                "the 'openai:' embedder needs the openai package: pip install 'stratamem[openai]'"
            ) from exc
        if not model or not model.strip():
            raise ConfigError("OpenAIEmbedder needs a model name, e.g. 'text-embedding-3-small'")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if dimensions is not None and dimensions < 1:
            raise ConfigError(f"dimensions must be a positive integer, got {dimensions}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, got {timeout}")

        # The SDK itself falls back to OPENAI_BASE_URL; mirror that for the key decision.
        effective_url = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if not effective_url:
                raise ConfigError(
                    "the 'openai:' embedder needs an API key: pass api_key or set "
                    "OPENAI_API_KEY (a key is optional only with base_url, for local servers)"
                )
            key = _PLACEHOLDER_KEY

        self._openai = openai
        self._client = openai.OpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )
        self.model = model.strip()
        self._where = _describe(str(self._client.base_url))
        self._timeout = timeout
        self._max_retries = max_retries
        self._batch_size = batch_size
        self._dimensions = dimensions
        self._dim: int | None = dimensions
        self._dim_lock = threading.Lock()
        self.name = f"OpenAI-compatible embeddings {self.model!r} at {self._where}"
        #: What an outage of the endpoint is recorded as (``stratamem stats``).
        self.service = f"embedder openai:{self.model}"

    def close(self) -> None:
        """Close the SDK's HTTP connection pool; the embedder is unusable afterwards."""
        self._client.close()

    @property
    def dim(self) -> int:
        """Vector size; the first access may make one probe request (EmbeddingError if it
        fails)."""
        if self._dim is None:
            with self._dim_lock:
                if self._dim is None:
                    self._request([_PROBE_TEXT])  # sets self._dim
        assert self._dim is not None
        return self._dim

    @property
    def id(self) -> str:
        return f"openai:{self.model}:{self.dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``(len(texts), dim)``, unit rows; see ``Embedder``.

        Empty or whitespace-only texts get zero rows without being sent: the OpenAI API
        rejects empty inputs, and such texts have no tokens anyway.
        """
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single str")
        todo = [i for i, text in enumerate(texts) if text.strip()]
        parts: list[np.ndarray] = []
        for start in range(0, len(todo), self._batch_size):
            parts.append(self._request([texts[i] for i in todo[start : start + self._batch_size]]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if parts:
            out[todo] = np.concatenate(parts)
        return out

    def _request(self, batch: list[str]) -> np.ndarray:
        """One embeddings call for ``batch``: validated, L2-normalised rows in input order."""
        openai = self._openai
        kwargs: dict[str, Any] = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self._dimensions is not None:
            kwargs["dimensions"] = self._dimensions
        what = f"embedding request to {self._where} (model {self.model!r}, batch of {len(batch)})"
        attempts = f"{self._max_retries + 1} attempt{'s' if self._max_retries else ''}"
        # Unreachable, timed out, overloaded, refusing the key or model, or answering what
        # is not an embeddings response: an outage (processing pauses, see jobs), unlike
        # a refused request or an invalid answer (_check).
        down = functools.partial(EmbeddingUnavailableError, service=self.service)
        try:
            response = self._client.embeddings.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise down(f"{what} timed out after {self._timeout:g}s ({attempts})") from exc
        except openai.APIConnectionError as exc:
            raise down(f"{what} failed: cannot connect ({exc}; {attempts})") from exc
        except openai.APIStatusError as exc:
            # The SDK has already retried the transient statuses (408, 409, 429, 5xx).
            status = exc.status_code
            tries = f" ({attempts})" if status in (408, 409, 429) or status >= 500 else ""
            error = down if unavailable_status(status) else EmbeddingError
            raise error(f"{what} failed with HTTP {status}{tries}: {_status_detail(exc)}") from exc
        except openai.OpenAIError as exc:
            raise EmbeddingError(f"{what} failed: {exc}") from exc
        except (ValueError, TypeError) as exc:  # the SDK lets a non-JSON body escape as-is
            raise down(f"{what} returned a malformed response: {exc}") from exc
        return self._check(response, len(batch), what)

    def _check(self, response: Any, expected: int, what: str) -> np.ndarray:
        def bad(problem: str) -> EmbeddingError:
            return EmbeddingError(f"{what} returned an invalid response: {problem}")

        data = getattr(response, "data", None)
        if not isinstance(data, list):
            raise bad(f"no 'data' list (got {type(response).__name__})")
        if len(data) != expected:
            raise bad(f"{len(data)} embeddings for {expected} inputs")
        rows: list[Any] = [None] * expected
        for position, item in enumerate(data):
            index = getattr(item, "index", position)
            if not isinstance(index, int) or not 0 <= index < expected or rows[index] is not None:
                raise bad(f"bad or repeated 'index' {index!r}")
            rows[index] = getattr(item, "embedding", None)
        try:
            matrix = np.array(rows, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            lengths = sorted({len(row) if isinstance(row, list) else -1 for row in rows})
            raise bad(
                f"embeddings are not equal-length lists of numbers (lengths {lengths})"
            ) from exc
        if matrix.ndim != 2 or matrix.shape[1] == 0:
            raise bad(f"embeddings have shape {matrix.shape}, expected ({expected}, dim)")
        if not np.isfinite(matrix).all():
            raise bad("embeddings contain NaN or infinite values")
        dim = matrix.shape[1]
        if self._dim is None:
            # Unlocked on purpose (the dim probe calls this while holding _dim_lock). Two
            # racing first responses of different sizes still get caught: one of them fails
            # the comparison below.
            self._dim = dim
        if dim != self._dim:
            source = "requested" if self._dimensions is not None else "earlier responses"
            raise bad(f"vectors have {dim} dimensions, {source}: {self._dim}")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        np.divide(matrix, norms, out=matrix, where=norms > 0)
        return matrix.astype(np.float32)


def _status_detail(exc: Any) -> str:
    # OpenAI-style error bodies carry a readable message; proxies send HTML or plain text,
    # of which the start is still the most useful thing to show.
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
    try:
        text = exc.response.text.strip()
    except Exception:
        text = ""
    return " ".join(text.split())[:300] or str(exc)

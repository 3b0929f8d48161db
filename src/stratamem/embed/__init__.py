"""Text embedders: the :class:`Embedder` port and :func:`make_embedder`.

Three adapters implement the port:

* ``local`` (default): all-MiniLM-L6-v2, int8 ONNX, run offline with onnxruntime.
* ``hash``: a deterministic lexical hashing embedder that needs no model at all; the
  fallback when the local model's runtime is not installed.
* ``openai:<model>``: any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Ollama,
  vLLM, ...), needs ``pip install 'stratamem[openai]'``.

Importing this module must stay cheap: the heavy runtimes (onnxruntime, tokenizers,
openai) are imported by the adapters only when one is built.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from stratamem.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Embedder", "ObservedEmbedder", "local_embedder_available", "make_embedder"]

log = logging.getLogger(__name__)

# Modules the local adapter needs (its model file ships with stratamem), and what to
# install to get them.
_LOCAL_RUNTIME_MODULES = ("onnxruntime", "tokenizers")
_LOCAL_INSTALL_HINT = (
    "pip install 'onnxruntime>=1.17' 'tokenizers>=0.15' "
    "(they are dependencies of stratamem, so reinstalling stratamem also restores them)"
)
_MAX_HASH_DIM = 65536

_VALID_SPECS = (
    "'auto' (local model if installed, else hashing), 'local', 'hash', 'hash:<dim>' "
    "(e.g. 'hash:512'), 'openai:<model>' (e.g. 'openai:text-embedding-3-small')"
)


# Deliberately not @runtime_checkable: on Python < 3.12 isinstance() would read ``id`` and
# ``dim``, and for the OpenAI adapter that can mean a network call.
class Embedder(Protocol):
    """Turns texts into unit-length vectors of one fixed vector space.

    ``id`` names the vector space and is stored with every vector: two embedders with the
    same ``id`` must produce interchangeable vectors, so that a store can refuse to mix
    vectors from different spaces. ``name`` is for humans (startup log). ``dim`` may be
    discovered lazily (the OpenAI adapter may make one request to learn it).
    """

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; float32 array of shape ``(len(texts), dim)``.

        Every row is L2-normalised, except that a text with no tokens at all (empty or
        only whitespace/control characters) gives an all-zero row. An empty sequence
        gives shape ``(0, dim)``. Raises :class:`stratamem.errors.EmbeddingError` when
        the model or endpoint fails. Safe to call from several threads at once.
        """
        ...


from ._observed import ObservedEmbedder  # noqa: E402  (it types against Embedder above)


def _missing_modules(names: Sequence[str]) -> list[str]:
    # find_spec on a top-level name locates the module without executing it, which keeps
    # this check cheap enough to run at every startup.
    return [name for name in names if importlib.util.find_spec(name) is None]


def local_embedder_available() -> bool:
    """Whether the default local embedder can run here (checked without importing it)."""
    return not _missing_modules(_LOCAL_RUNTIME_MODULES)


def make_embedder(
    spec: str = "auto",
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
    threads: int | None = None,
    model_path: str | None = None,
    batch_nice: int = 0,
) -> Embedder:
    """Build the embedder named by ``spec``.

    ``spec`` is one of ``"auto"``, ``"local"``, ``"hash"``, ``"hash:<dim>"`` or
    ``"openai:<model>"``. ``threads``, ``model_path`` and ``batch_nice`` apply to the local model,
    ``base_url``, ``api_key`` and ``timeout`` to ``openai:``. Raises
    :class:`stratamem.errors.ConfigError` for an unknown spec or a missing dependency.
    """
    if not isinstance(spec, str):
        raise ConfigError(f"embedder spec must be a string, one of {_VALID_SPECS}; got {spec!r}")
    text = spec.strip()
    kind, sep, arg = text.partition(":")
    kind = kind.lower()

    if kind in ("auto", "local") and not sep:
        missing = _missing_modules(_LOCAL_RUNTIME_MODULES)
        if not missing:
            from stratamem.embed.local import LocalEmbedder

            return LocalEmbedder(model_path=model_path, threads=threads, batch_nice=batch_nice)
        if kind == "local":
            raise ConfigError(
                "embedder 'local' needs the Python module(s) "
                f"{', '.join(missing)}, which are not installed; {_LOCAL_INSTALL_HINT}"
            )
        log.warning(
            "Local embedding model unavailable (missing Python module(s): %s); falling back "
            "to the hashing embedder, which matches words but not meaning, so recall will be "
            "noticeably worse. To fix: %s",
            ", ".join(missing),
            _LOCAL_INSTALL_HINT,
        )
        return _make_hash(None)

    if kind == "hash":
        if not sep:
            return _make_hash(None)
        try:
            dim = int(arg.strip())
        except ValueError:
            dim = -1
        if not 1 <= dim <= _MAX_HASH_DIM:
            raise ConfigError(
                f"embedder spec {spec!r}: the dimension after 'hash:' must be an integer "
                f"from 1 to {_MAX_HASH_DIM} (e.g. 'hash:384'); valid specs: {_VALID_SPECS}"
            )
        return _make_hash(dim)

    if kind == "openai" and sep:
        model = arg.strip()
        if not model:
            raise ConfigError(
                f"embedder spec {spec!r} names no model; use e.g. 'openai:text-embedding-3-small'"
            )
        from stratamem.embed.openai import OpenAIEmbedder

        return OpenAIEmbedder(model, base_url=base_url, api_key=api_key, timeout=timeout)

    raise ConfigError(f"unknown embedder spec {spec!r}; valid specs: {_VALID_SPECS}")


def _make_hash(dim: int | None) -> Embedder:
    from stratamem.embed.hashing import DEFAULT_DIM, HashingEmbedder

    return HashingEmbedder(DEFAULT_DIM if dim is None else dim)

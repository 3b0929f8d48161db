"""Shared fixtures: real SQLite files in tmp_path, real embedders, no mocks of our code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# tests/fakes is importable as `fakes` from every test module.
sys.path.insert(0, str(Path(__file__).parent))

from memstrata import Memory
from memstrata.embed import make_embedder

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's MEMSTRATA_* variables must not change what the tests exercise.
    for key in list(os.environ):
        if key.startswith("MEMSTRATA_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def local_embedder() -> Any:
    """The real bundled MiniLM model, loaded once for the whole run."""
    return make_embedder("local")


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'memory.db'}"


@pytest.fixture
def make_memory(db_url: str) -> Iterator[Callable[..., Memory]]:
    opened: list[Memory] = []

    def factory(url: str | None = None, **kwargs: Any) -> Memory:
        kwargs.setdefault("embedder", "hash")
        # Capture tests check what recall injects; on a loaded 2-core CI machine recall can
        # exceed the production bound of 50 ms. Tests of that bound set it themselves.
        kwargs.setdefault("capture_recall_timeout_ms", 10_000)
        mem = Memory(url or db_url, **kwargs)
        opened.append(mem)
        return mem

    yield factory
    for mem in opened:
        mem.close(timeout=1)


@pytest.fixture
def mem(make_memory: Callable[..., Memory]) -> Memory:
    """A Memory on a fresh file with the hashing embedder and one worker thread."""
    return make_memory()

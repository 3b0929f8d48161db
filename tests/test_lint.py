"""The code base stays ruff-clean (lint and format) and src/ type-checks under mypy
(pyproject's ``[tool.mypy]``), checked with every test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

import pytest

from conftest import REPO

PATHS = [p for p in ("src", "tests", "bench", "clients") if (REPO / p).is_dir()]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    # The ruff of the environment running the tests (beside its interpreter), even when that
    # environment is not activated; else the one on PATH.
    beside = Path(sys.executable).with_name("ruff")
    exe = str(beside) if beside.is_file() else shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is a test dependency: pip install -e '.[test]'")
    return subprocess.run([exe, *args, *PATHS], cwd=REPO, capture_output=True, text=True)


def test_ruff_check() -> None:
    proc = _ruff("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = _ruff("format", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy() -> None:
    if find_spec("mypy") is None:
        pytest.fail("mypy is a test dependency: pip install -e '.[test]'")
    # A checkout's first run analyses every installed SDK the code imports (over a minute
    # on two cores); its cache, outside the checkout, makes later runs take seconds. mypy
    # checks each cached module against its source file's contents, so checkouts and
    # virtualenvs can share it.
    uid = os.getuid() if hasattr(os, "getuid") else 0
    cache = os.environ.get("MYPY_CACHE_DIR") or str(
        Path(tempfile.gettempdir()) / f"stratamem-mypy-{uid}"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", cache],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

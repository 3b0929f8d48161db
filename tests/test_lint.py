"""The code base stays ruff-clean (lint and format), checked with every test run."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO

PATHS = [p for p in ("src", "tests", "bench") if (REPO / p).is_dir()]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is a test dependency: pip install -e '.[test]'")
    return subprocess.run([exe, *args, *PATHS], cwd=REPO, capture_output=True, text=True)


def test_ruff_check() -> None:
    proc = _ruff("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = _ruff("format", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr

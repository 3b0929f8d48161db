"""The code base stays ruff-clean (lint and format), checked with every test run."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO


def _ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is a test dependency: pip install -e '.[test]'")
    return [exe]


def test_ruff_check() -> None:
    proc = subprocess.run(
        [*_ruff(), "check", "src", "tests", "bench"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = subprocess.run(
        [*_ruff(), "format", "--check", *PATHS],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

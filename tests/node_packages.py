"""Node.js for the tests that run it: the tools, and an npm project's packages installed
once per lockfile (``npm ci`` into a cache outside the checkout, reused by later runs)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

__all__ = ["installed_packages", "node_tool"]

LOCK_FILES = ("package.json", "package-lock.json")


def node_tool(name: str, needed_by: str) -> str:
    """The path of ``node`` or ``npm``; a test that needs it fails (not skips) without it:
    CI installs them (``.ci/tools.sh``)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed. {needed_by} need node and npm "
            "(Debian: apt-get install nodejs npm; .ci/run installs them in CI)."
        )
    return path


def installed_packages(project: Path, cache_name: str, marker: str) -> Path:
    """``project``'s packages (``node_modules``), installed by ``npm ci`` into a cache keyed
    by the hash of package.json and package-lock.json (a changed lockfile gets a fresh
    install). ``marker`` is a package whose folder shows an install is whole."""
    digest = hashlib.sha256(b"".join((project / f).read_bytes() for f in LOCK_FILES))
    uid = os.getuid() if hasattr(os, "getuid") else 0
    cache = Path(tempfile.gettempdir()) / f"{cache_name}-{uid}"
    installed = cache / digest.hexdigest()[:16]
    if (installed / "node_modules" / marker).is_dir():
        return installed / "node_modules"
    npm = node_tool("npm", f"The tests of {project.name}")
    cache.mkdir(parents=True, exist_ok=True)
    # Installed aside, then renamed into place: a run interrupted halfway leaves no
    # half-installed cache behind, and two runs at once both end with a whole one.
    staging = Path(tempfile.mkdtemp(prefix="installing-", dir=cache))
    try:
        for f in LOCK_FILES:
            shutil.copy(project / f, staging / f)
        # --ignore-scripts: no package's install script (nor a project's `prepare`) runs.
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            pytest.fail(f"npm ci failed in {staging}:\n{done.stdout}\n{done.stderr}")
        with contextlib.suppress(OSError):  # another run installed it first
            staging.rename(installed)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return installed / "node_modules"

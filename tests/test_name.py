"""The project's name: the one it had before (taken on PyPI by another memory engine) is
gone from every file and path of the tree, but for the changelog's note of the rename."""

from __future__ import annotations

import re
import subprocess

from conftest import REPO

# Spelled in two halves so that this file does not hold the name it looks for.
OLD_NAME = re.compile(("mem" + "strata").encode(), re.IGNORECASE)
# The only place allowed to say what the project was called: the release note of the rename.
RENAME_NOTE = "CHANGELOG.md"


def _tracked_and_new_files() -> list[str]:
    # Tracked files and files not yet added (but not ignored ones: .venv, build output).
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p and (REPO / p).is_file()})


def test_the_old_name_appears_nowhere_but_the_rename_note() -> None:
    files = _tracked_and_new_files()
    assert "pyproject.toml" in files and len(files) > 100  # the listing worked
    in_paths = [p for p in files if OLD_NAME.search(p.encode())]
    in_content = [p for p in files if p != RENAME_NOTE and OLD_NAME.search((REPO / p).read_bytes())]
    assert in_paths == [] and in_content == []


def test_the_rename_note_says_what_the_old_name_was() -> None:
    note = (REPO / RENAME_NOTE).read_bytes()
    assert len(OLD_NAME.findall(note)) >= 1 and b"stratamem" in note

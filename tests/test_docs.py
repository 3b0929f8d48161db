"""Docs that drift from the code mislead: check the reference pages name what exists."""

from __future__ import annotations

from conftest import REPO
from memstrata.config import Settings
from memstrata.types import RecallConfig


def test_every_setting_is_documented() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f"| `{name}` | `MEMSTRATA_{name.upper()}` |" in page, name


def test_every_recall_config_key_is_documented() -> None:
    page = (REPO / "docs" / "recall.md").read_text(encoding="utf-8")
    for name in RecallConfig.model_fields:
        assert f"`{name}`" in page, name


def test_readme_starts_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:3]]
    assert blocks[0].endswith('pip install -e ".[server]" && memstrata serve')
    assert blocks[1] in ci  # CI runs exactly the documented test command

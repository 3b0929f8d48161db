"""Docs that drift from the code mislead: check the reference pages name what exists."""

from __future__ import annotations

from conftest import REPO
from stratamem.config import Settings
from stratamem.types import RecallConfig


def test_every_setting_is_documented() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name in Settings.model_fields:
        assert f"| `{name}` | `STRATAMEM_{name.upper()}` |" in page, name


def test_every_recall_config_key_is_documented() -> None:
    page = (REPO / "docs" / "recall.md").read_text(encoding="utf-8")
    for name in RecallConfig.model_fields:
        assert f"`{name}`" in page, name


def test_readme_starts_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:3]]
    assert blocks[0].endswith('pip install -e ".[server]" && stratamem serve')
    assert blocks[1] in ci  # CI runs exactly the documented test command


def test_the_architecture_page_names_the_store_files_that_exist() -> None:
    """The store's layout as the page draws it is the tree's: every file it names exists,
    the two backends hold the same files, and every hook a backend implements is named."""
    import re

    from stratamem.store._core.store import SQLStore

    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    store = REPO / "src" / "stratamem" / "store"
    layout = page.split("```\nsrc/stratamem/store/\n", 1)[1].split("```", 1)[0]
    for name in set(re.findall(r"\b(_?[a-z_]+\.py)\b", layout)):
        assert list(store.rglob(name)), name
    sqlite, postgres = ({p.name for p in (store / b).glob("*.py")} for b in ("sqlite", "postgres"))
    assert postgres - sqlite == {"_user_indexes.py"} and not sqlite - postgres
    hooks = set(SQLStore.__abstractmethods__) - {"_query", "_transaction"}
    missing = {h for h in hooks if f"`{h}`" not in page}
    assert not missing, f"hooks the page does not name: {sorted(missing)}"


def test_the_benchmarks_page_is_a_results_page() -> None:
    """The page holds current figures, not session logs: it stays short, every script in
    bench/ is in its table of scripts with a command on the page, and every benchmark has a
    results section that names its command, a commit and the machine (or says it was not
    recorded). ``ab.py`` compares two commits: its figures belong to the section of the
    change it measured."""
    import re

    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    lines = len(page.splitlines())
    assert lines <= 300, f"{lines} lines: move what is not a current figure to git history"
    table = page.split("\n## Machines\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("|")]
    machines = rows[2:]
    assert machines
    sections = {
        name: " ".join(body.split())
        for name, body in re.findall(
            r"^### [^\n]*\(`bench/(\w+\.py)`\)\n(.*?)(?=^##)", page, re.M | re.S
        )
    }
    flat = " ".join(page.split())
    for script in sorted((REPO / "bench").glob("*.py")):
        name = script.name
        assert f"| `bench/{name}` |" in page, f"bench/{name} is not in the table of scripts"
        if name.startswith("_"):
            continue
        assert f"python bench/{name}" in flat, f"no command for bench/{name}"
        if name == "ab.py":
            continue
        body = sections.get(name)
        assert body is not None, f"no results section for bench/{name}"
        assert f"python bench/{name}" in body, f"the section of bench/{name} has no command"
        assert re.search(r"`[0-9a-f]{7,40}`", body), f"the section of bench/{name} names no commit"
        assert any(m in body for m in machines) or "machine not recorded" in body, name

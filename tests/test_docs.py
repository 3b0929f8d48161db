"""Docs that drift from the code mislead: check the reference pages name what exists."""

from __future__ import annotations

import re
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.token import Token

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
    the two backends hold the same files but the one each has alone (named), and every
    hook a backend implements is named."""
    import re

    from stratamem.store._core.store import SQLStore

    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    store = REPO / "src" / "stratamem" / "store"
    layout = page.split("```\nsrc/stratamem/store/\n", 1)[1].split("```", 1)[0]
    for name in set(re.findall(r"\b(_?[a-z_]+\.py)\b", layout)):
        assert list(store.rglob(name)), name
    sqlite, postgres = ({p.name for p in (store / b).glob("*.py")} for b in ("sqlite", "postgres"))
    # What one backend alone has is named on the page (the layout's note under the files).
    assert postgres - sqlite == {"_user_indexes.py"} and sqlite - postgres == {"_index_files.py"}
    assert all(
        f"{b}/{name}" in layout
        for b, name in [("postgres", "_user_indexes.py"), ("sqlite", "_index_files.py")]
    )
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


# -- links between the docs ------------------------------------------------------------------

LINKED_PAGES = ["README.md", "clients/typescript/README.md", "docs/**/*.md"]


def _markdown() -> MarkdownIt:
    # CommonMark plus tables and strikethrough, as GitHub renders (bare URLs are no concern)
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _inline_text(token: Token) -> str:
    """A heading's text as GitHub renders it: code spans' and links' text kept, markup and
    inline HTML dropped."""
    parts = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(_inline_text(child))
    return "".join(parts)


def github_anchors(page: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the text lowercased, every character but
    letters, digits, ``_``, ``-`` and spaces removed, spaces as ``-``; a repeated slug gets
    ``-1``, ``-2``, ... (github-slugger's rules)."""
    tokens = _markdown().parse(page)
    seen: dict[str, int] = {}
    anchors = set()
    for i, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        slug = re.sub(r"[^\w\- ]", "", _inline_text(tokens[i + 1]).strip().lower())
        slug = slug.replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: str) -> list[str]:
    found = []
    for token in _markdown().parse(page):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrs["href"]))
            elif child.type == "image":
                found.append(str(child.attrs["src"]))
    return found


def test_github_anchors_follow_githubs_rules() -> None:
    page = (
        "# Capture: `mem.llm.register(client)`\n## What is injected, and where\n"
        "## Settings\n## Settings\n### `heuristic` & co. — v2\n```\n# not a heading\n```\n"
    )
    assert github_anchors(page) == {
        "capture-memllmregisterclient",
        "what-is-injected-and-where",
        "settings",
        "settings-1",
        "heuristic--co--v2",
    }


def test_every_relative_link_and_anchor_exists() -> None:
    """Every link of the README and docs/ to a file of the repository names one that exists,
    and every #anchor one of the target page's headings."""
    pages = sorted({p for pattern in LINKED_PAGES for p in REPO.glob(pattern)})
    assert len(pages) > 10
    anchors = {p: github_anchors(p.read_text(encoding="utf-8")) for p in pages}
    broken = []
    for page in pages:
        for href in _links(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:", href, re.I):  # https:, mailto: ...
                continue
            path, _, anchor = unquote(href).partition("#")
            target = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {href}"
            if not target.is_relative_to(REPO) or not target.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and target.suffix == ".md":
                known = anchors.get(target) or github_anchors(target.read_text(encoding="utf-8"))
                if anchor not in known:
                    broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)

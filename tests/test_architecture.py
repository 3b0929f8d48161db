"""Which way imports go: the layers of docs/architecture.md, checked on the source with ast.

The page's table puts every room (package or top-level module) of ``src/stratamem`` in a
layer; a module may import rooms of its own layer or below, and the page lists each import
that goes up. Every import counts, lazy and ``TYPE_CHECKING`` ones included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

SRC = REPO / "src" / "stratamem"
PAGE = REPO / "docs" / "architecture.md"


def _section() -> str:
    page = PAGE.read_text(encoding="utf-8")
    return page.split("\n## Rooms and which way imports go\n", 1)[1].split("\n## ", 1)[0]


def _layers() -> dict[str, int]:
    """Room -> layer, the base 0: the table lists the layers top down."""
    rows = [line for line in _section().splitlines() if line.startswith("| ")][1:]
    layer_of: dict[str, int] = {}
    for height, row in enumerate(reversed(rows)):
        for room in re.findall(r"`([^`]+)`", row.split("|")[2]):
            assert room not in layer_of, f"{room} is in two layers"
            layer_of[room] = height
    return layer_of


def _room(parts: tuple[str, ...]) -> str:
    """The room of a module under stratamem, given as path parts (``("store", "_rows.py")``)
    or module parts (``("store", "_rows")``; ``()`` is the package itself)."""
    if not parts:
        return "__init__.py"
    name = parts[0].removesuffix(".py")
    return f"{name}/" if (SRC / name).is_dir() else f"{name}.py"


def _is_module(parts: tuple[str, ...]) -> bool:
    return SRC.joinpath(*parts).is_dir() or SRC.joinpath(*parts[:-1], f"{parts[-1]}.py").is_file()


def _imported(path: Path) -> set[tuple[str, ...]]:
    """The stratamem modules ``path`` imports, as module parts under the package."""
    package = path.relative_to(SRC).parts[:-1]
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "stratamem" or alias.name.startswith("stratamem."):
                    found.add(tuple(alias.name.split(".")[1:]))
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        dotted = tuple(node.module.split(".")) if node.module else ()
        if node.level:
            module = package[: len(package) - node.level + 1] + dotted
        elif dotted[:1] == ("stratamem",):
            module = dotted[1:]
        else:
            continue
        for alias in node.names:  # ``from . import x``: x may be a module of the package
            sub = (*module, alias.name)
            found.add(sub if _is_module(sub) else module)
    return found


def _upward_imports() -> set[tuple[str, str]]:
    layer_of = _layers()
    up: set[tuple[str, str]] = set()
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).parts
        source = _room(parts)
        assert source in layer_of, f"the room {source} is in no layer of {PAGE.name}'s table"
        for target_parts in _imported(path):
            target = _room(target_parts)
            assert target in layer_of, f"{source} imports {target}, a room in no layer"
            if layer_of[target] > layer_of[source]:
                up.add((source, target))
    return up


def test_every_room_is_in_one_layer_of_the_page() -> None:
    rooms = {_room(p.relative_to(SRC).parts) for p in SRC.rglob("*.py")}
    assert set(_layers()) == rooms


def test_imports_go_down_the_layers_except_those_the_page_lists() -> None:
    listed = set(re.findall(r"^- `([^`]+)` → `([^`]+)`", _section(), re.M))
    found = _upward_imports()
    assert not found - listed, f"imports that go up, not listed on the page: {found - listed}"
    assert not listed - found, f"listed on the page, no longer in the code: {listed - found}"


def test_integrations_use_only_the_public_api() -> None:
    # docs/architecture.md: a framework's seam is a thin adapter over what any user of
    # stratamem has (the MemoryAPI, the public nouns, the errors), never the engine.
    public = {(), ("api",), ("types",), ("errors",)}
    for path in sorted((SRC / "integrations").rglob("*.py")):
        for target in _imported(path):
            assert target in public or target[:1] == ("integrations",), (path.name, target)

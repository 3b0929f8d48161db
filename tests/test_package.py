"""Packaging promises: fast import, no provider SDK or model loaded until used."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import stratamem
from conftest import REPO


def test_import_is_fast_and_loads_no_sdk_or_model() -> None:
    code = (
        "import json, sys, time\n"
        "t = time.perf_counter()\n"
        "import stratamem\n"
        "from stratamem import Memory, AsyncMemory, RecallConfig\n"
        "elapsed = time.perf_counter() - t\n"
        "heavy = [m for m in ('openai', 'anthropic', 'google.genai', 'litellm', 'onnxruntime',"
        " 'tokenizers', 'usearch', 'httpx', 'tqdm', 'psycopg', 'psycopg_pool', 'pgvector',"
        " 'wrapt', 'opentelemetry', 'prometheus_client')"
        " if m in sys.modules]\n"
        "print(json.dumps({'elapsed': elapsed, 'heavy': heavy}))\n"
    )
    best = min(
        json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )["elapsed"]
        for _ in range(3)
    )
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    assert out["heavy"] == []
    assert best < 1.0, f"import took {best:.2f}s"


def test_public_names() -> None:
    for name in stratamem.__all__:
        assert getattr(stratamem, name) is not None
    assert stratamem.ValidationError.__mro__[1] is stratamem.StratamemError


def test_ships_type_information() -> None:
    # The PEP 561 marker: type checkers read stratamem's own annotations. The wheel takes
    # every file under src/stratamem (pyproject's hatch packages), this one with them.
    assert (resources.files("stratamem") / "py.typed").is_file()


def test_vector_index_and_local_model_load_in_either_order() -> None:
    # usearch imported before onnxruntime crashed the interpreter (SIGSEGV); the vector
    # index loads the model runtime first so the order of use does not matter.
    code = (
        "from stratamem.store.sqlite._vectors import _usearch_index\n"
        "_usearch_index()\n"
        "from stratamem.embed import make_embedder\n"
        "print(make_embedder('local').embed(['hello there']).shape)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(1, 384)"


def test_the_wheel_holds_every_file_the_package_reads(tmp_path: Path) -> None:
    # Templates, the stylesheet, migrations and the bundled model are read from the installed
    # package at run time: a wheel without one would install and fail on first use.
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("stratamem-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    src = REPO / "src"
    needed = [
        p
        for pattern in (
            "ui/templates/*.html",
            "ui/static/*",
            "store/*/migrations/*.sql",
            "**/*.onnx",
        )
        for p in (src / "stratamem").glob(pattern)
    ]
    assert len(needed) > 20
    missing = [str(p.relative_to(src)) for p in needed if str(p.relative_to(src)) not in shipped]
    assert missing == []

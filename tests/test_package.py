"""Packaging promises: fast import, no provider SDK or model loaded until used; the sdist and
the wheel hold what the package reads, its licence and notices, and a long description that
renders on a registry page; installed from the wheel into a fresh virtual environment, with
``[server]`` or without extras, every command works from an empty folder or says which extra
it needs; the test dependencies are pinned within pyproject's ranges."""

from __future__ import annotations

import email.parser
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import stratamem
from conftest import REPO
from server_proc import KEY_RE, free_port

CONSTRAINTS = REPO / "constraints" / "test.txt"


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
    # A bound against loading something heavy by accident, not a speed target: the best of
    # three stayed under 1 s on earlier machines and took 1.1 s on a 2-core AVX2 EPYC.
    assert best < 2.5, f"import took {best:.2f}s"


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
        "from stratamem.store._vector_cache import _usearch_index\n"
        "_usearch_index()\n"
        "from stratamem.embed import make_embedder\n"
        "print(make_embedder('local').embed(['hello there']).shape)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(1, 384)"


def test_the_version_is_the_packages() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stratamem", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"stratamem {stratamem.__version__}"
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{stratamem.__version__}]" in changelog  # every release has its entry


def test_the_proxy_without_the_web_stack_says_which_extra_to_install() -> None:
    # As in a plain install (no [server]): Starlette cannot be imported.
    code = (
        "import sys\n"
        "sys.modules['starlette'] = None\n"
        "from stratamem.cli import main\n"
        "sys.exit(main(['proxy', '--upstream', 'http://127.0.0.1:9']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "needs starlette: pip install 'stratamem[server]'" in done.stderr


# -- the test dependencies' lock ---------------------------------------------------------------


def _pins() -> dict[str, Version]:
    lines = CONSTRAINTS.read_text(encoding="utf-8").splitlines()
    pairs = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    assert all(len(pair) == 2 for pair in pairs), "every line is name==version"
    return {canonicalize_name(name): Version(version) for name, version in pairs}


def test_the_test_lock_pins_every_test_dependency_within_its_range() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as CI
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = _pins()
    assert "stratamem" not in pins  # the lock is of what the project needs, not of itself
    for spec in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        req = Requirement(spec)
        pinned = pins.get(canonicalize_name(req.name))
        assert pinned is not None, f"{req.name} is not pinned: run scripts/lock_test_deps.sh"
        assert req.specifier.contains(pinned, prereleases=True), f"{req.name}=={pinned}: {spec}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert 'pip install -c constraints/test.txt -e ".[test]"' in readme


# -- the sdist and the wheel -------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path

    def wheel_files(self) -> set[str]:
        return set(zipfile.ZipFile(self.wheel).namelist())

    def metadata(self) -> email.message.Message:
        name = f"stratamem-{stratamem.__version__}.dist-info/METADATA"
        text = zipfile.ZipFile(self.wheel).read(name).decode("utf-8")
        return email.parser.Parser().parsestr(text)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (sdist,) = out.glob("stratamem-*.tar.gz")
    (wheel,) = out.glob("stratamem-*.whl")
    return Dist(sdist, wheel)


def test_the_wheel_holds_every_file_the_package_reads(dist: Dist) -> None:
    # Templates, the stylesheet, migrations and the bundled model are read from the installed
    # package at run time: a wheel without one would install and fail on first use.
    shipped = dist.wheel_files()
    src = REPO / "src"
    needed = [
        p
        for pattern in (
            "ui/templates/*.html",
            "ui/static/*",
            "store/*/migrations/*.sql",
            "embed/_minilm/*",
            "_demo/*",
            "py.typed",
        )
        for p in (src / "stratamem").glob(pattern)
    ]
    assert len(needed) > 20
    missing = [str(p.relative_to(src)) for p in needed if str(p.relative_to(src)) not in shipped]
    assert missing == []
    licences = f"stratamem-{stratamem.__version__}.dist-info/licenses"
    assert {f"{licences}/LICENSE", f"{licences}/NOTICE"} <= shipped


def test_the_wheel_declares_its_licence_version_and_addresses(dist: Dist) -> None:
    meta = dist.metadata()
    assert meta["Version"] == stratamem.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert sorted(meta.get_all("License-File") or []) == ["LICENSE", "NOTICE"]
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls["Repository"].startswith("https://")


def test_the_long_description_has_no_relative_link(dist: Dist) -> None:
    # A registry page has no repository beside it: docs/server.md or #quick-start lead
    # nowhere there. The build rewrites them against the repository's address.
    meta = dist.metadata()
    assert meta["Description-Content-Type"].startswith("text/markdown")
    body = str(meta.get_payload())
    assert body.startswith("# stratamem")
    targets = [
        *re.findall(r"\]\(\s*<?([^)\s>]+)", body),  # [text](target), ![alt](target)
        *re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?\s*$", body, re.M),  # [label]: target
        *re.findall(r"""\b(?:href|src)\s*=\s*["']([^"']+)""", body),  # HTML
    ]
    assert len(targets) > 10  # the README links its documentation pages
    relative = [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t)]
    assert relative == []


def test_the_sdist_builds_the_same_wheel(dist: Dist, tmp_path: Path) -> None:
    # pip installs an sdist by building a wheel from it: the sdist must hold every file
    # the wheel is made of, and the licence and notices.
    with tarfile.open(dist.sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    for name in ("LICENSE", "NOTICE", "README.md", "CHANGELOG.md", "pyproject.toml"):
        assert (root / name).is_file(), name
    out = tmp_path / "out"
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=root,
        check=True,
        capture_output=True,
    )
    (rebuilt,) = out.glob("*.whl")
    assert set(zipfile.ZipFile(rebuilt).namelist()) == dist.wheel_files()


# -- installed from the wheel, in a fresh virtual environment ---------------------------------


def _clean_env() -> dict[str, str]:
    # Nothing of the developer's set-up may reach the installed package: no STRATAMEM_*
    # setting, no path to the checkout's sources, no active virtual environment.
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_") and k not in drop}


def _fresh_venv(where: Path, *requirements: str) -> Path:
    """A new virtual environment (no system site-packages) with ``requirements`` installed
    by pip as a user would, within the versions CI tests (the lock): its ``bin``."""
    env = _clean_env()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, env=env)
    bin_dir = where / "bin"
    done = subprocess.run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "-c",
            str(CONSTRAINTS),
            *requirements,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, f"pip install {' '.join(requirements)} failed:\n{done.stderr}"
    return bin_dir


def _run(
    bin_dir: Path, cwd: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "stratamem"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _installed_files(bin_dir: Path, cwd: Path) -> dict[str, int]:
    """How many files of each kind the installed package holds (read through the installed
    interpreter, from outside the checkout)."""
    code = (
        "import json, sys\n"
        "from importlib import metadata, resources\n"
        "root = resources.files('stratamem')\n"
        "files = [str(f) for f in metadata.files('stratamem')]\n"
        "print(json.dumps({\n"
        "  'model': int(root.joinpath('embed/_minilm/model.onnx').is_file()),\n"
        "  'vocabulary': int(root.joinpath('embed/_minilm/vocab.txt').is_file()),\n"
        "  'py.typed': int(root.joinpath('py.typed').is_file()),\n"
        "  'migrations': sum(f.endswith('.sql') and '/migrations/' in f for f in files),\n"
        "  'templates': sum(f.startswith('stratamem/ui/templates/') for f in files),\n"
        "  'licences': sum('.dist-info/licenses/' in f for f in files),\n"
        "  'from': int(str(root).startswith(sys.argv[1])),\n"
        "}))\n"
    )
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", code, str(bin_dir.parent)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_clean_env(),
        check=True,
    )
    return dict(json.loads(done.stdout))


def _assert_complete(files: dict[str, int]) -> None:
    assert files["from"] == 1, "stratamem was not imported from the fresh environment"
    assert files["model"] == files["vocabulary"] == files["py.typed"] == 1, files
    assert files["migrations"] >= 2 and files["templates"] >= 5, files
    assert files["licences"] == 2, files


def _demo_works(bin_dir: Path, cwd: Path) -> None:
    done = _run(bin_dir, cwd, "demo")
    assert done.returncode == 0, done.stderr
    assert "embedder: local all-MiniLM-L6-v2" in done.stdout
    assert "formatted_context for" in done.stdout and "Berlin" in done.stdout
    assert list(cwd.iterdir()) == []  # the demo's store is temporary


def _serves(bin_dir: Path, empty: Path, tmp_path: Path) -> None:
    """``stratamem serve`` from ``empty`` answers ``/healthz``, serves the dashboard from the
    installed templates, takes a write with the key its banner printed, and stops cleanly."""
    port = free_port()
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        server = subprocess.Popen(
            [str(bin_dir / "stratamem"), "serve", "--port", str(port)],
            cwd=empty,
            stdout=stdout,
            stderr=stderr,
            env=_clean_env(),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        health = None
        while health is None and time.monotonic() < deadline:
            assert server.poll() is None, f"stratamem serve exited:\n{err.read_text()}"
            try:
                health = httpx.get(f"{url}/healthz", timeout=2)
            except httpx.TransportError:
                time.sleep(0.2)
        assert health is not None, f"no answer on /healthz:\n{err.read_text()}"
        assert health.status_code == 200 and health.json()["success"] is True
        # The dashboard's page and stylesheet come from the wheel's templates and static files.
        login = httpx.get(f"{url}/ui/login", timeout=10)
        assert login.status_code == 200 and "<form" in login.text
        assert httpx.get(f"{url}/ui/static/dashboard.css", timeout=10).status_code == 200
        (key,) = KEY_RE.findall(out.read_text())[:1]
        made = httpx.post(
            f"{url}/api/sessions",
            json={"user_id": "u1"},
            headers={"Authorization": f"Api-Key {key}"},
            timeout=30,
        )
        assert made.status_code in (200, 201), made.text
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    assert code == 0, err.read_text()
    assert (empty / "stratamem.db").is_file()  # the default store, in the folder it ran in


@pytest.mark.slow
def test_the_wheel_with_the_server_extra_serves_from_an_empty_folder(
    dist: Dist, tmp_path: Path
) -> None:
    bin_dir = _fresh_venv(tmp_path / "venv", f"{dist.wheel}[server]")
    empty = tmp_path / "empty"
    empty.mkdir()
    version = _run(bin_dir, empty, "--version")
    assert version.stdout.strip() == f"stratamem {stratamem.__version__}"
    _assert_complete(_installed_files(bin_dir, empty))
    _demo_works(bin_dir, empty)

    _serves(bin_dir, empty, tmp_path)


# Each command of a plain install (no extras), from an empty folder: (arguments, what it must
# say). None: it works (exit 0); a string: it exits 2 naming the extra to install, no traceback.
PLAIN_INSTALL = [
    (["demo"], None),
    # A reader refuses a store that does not exist yet: the import makes it first.
    (["import", "talk.jsonl", "--user-id", "u1", "-q"], None),
    (["stats"], None),
    (["search", "Berlin", "--user-id", "u1"], None),
    (["worker", "--exit-when-idle"], None),
    (["reindex"], None),
    (["retry-failed"], None),
    (["projects", "create", "Shop", "--id", "shop"], None),
    (["projects", "list"], None),
    (["keys", "create", "shop"], None),
    (["keys", "list"], None),
    (["serve"], "pip install 'stratamem[server]'"),
    (["proxy", "--upstream", "http://127.0.0.1:9"], "pip install 'stratamem[server]'"),
    (["mcp", "--user-id", "u1"], "pip install 'stratamem[mcp]'"),
    (["--db", "postgresql://u@127.0.0.1:9/db", "stats"], "pip install 'stratamem[postgres]'"),
    (["--embedder", "openai:text-embedding-3-small", "stats"], "pip install 'stratamem[openai]'"),
]


@pytest.mark.slow
def test_the_wheel_without_extras_works_or_names_the_extra(dist: Dist, tmp_path: Path) -> None:
    from stratamem.cli import _parser

    (subcommands,) = [a for a in _parser()._actions if isinstance(a.choices, dict)]
    commands = set(subcommands.choices or ())
    # Every command is tried: one added later must be added here too.
    assert {next(a for a in args if a in commands) for args, _ in PLAIN_INSTALL} == commands

    bin_dir = _fresh_venv(tmp_path / "venv", str(dist.wheel))
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_complete(_installed_files(bin_dir, empty))
    _demo_works(bin_dir, empty)
    work = tmp_path / "work"
    work.mkdir()
    (work / "talk.jsonl").write_text(
        json.dumps({"role": "user", "content": "I moved to Berlin last May"}) + "\n",
        encoding="utf-8",
    )
    for args, says in PLAIN_INSTALL[1:]:
        done = _run(bin_dir, work, *args, timeout=120)
        shown = f"stratamem {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, shown
        if says is None:
            assert done.returncode == 0, shown
        else:
            assert done.returncode == 2 and says in done.stderr, shown
    found = _run(bin_dir, work, "search", "where does the user live", "--user-id", "u1")
    assert "Berlin" in found.stdout


# -- the declared lower bounds ----------------------------------------------------------------


def _lowest_venv(where: Path, requirement: str, declared: list[str]) -> Path:
    """A fresh virtual environment with ``requirement`` installed and its ``declared``
    dependencies at the LOWEST versions they allow (named on the command line so that uv's
    ``--resolution lowest-direct`` applies to them): its ``bin``."""
    env = _clean_env()
    # uv reads neither pip's configuration nor its CA bundle: the system's trust store, and
    # pip's bundle where one is set, as pip would use behind a proxy that re-signs TLS.
    env.setdefault("UV_NATIVE_TLS", "1")
    if env.get("PIP_CERT") and not env.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = env["PIP_CERT"]
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "-q", "-p", sys.executable, str(where)], check=True, env=env)
    python = where / "bin" / "python"
    lowest = ["--resolution", "lowest-direct"]
    done = subprocess.run(
        [*uv, "pip", "install", "-q", "--python", str(python), *lowest, requirement, *declared],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert done.returncode == 0, f"uv pip install {requirement} failed:\n{done.stderr}"
    return where / "bin"


def _installed_versions(bin_dir: Path) -> dict[str, Version]:
    code = (
        "import json\nfrom importlib import metadata\n"
        "print(json.dumps({d.metadata['Name']: d.version for d in metadata.distributions()}))"
    )
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", code], capture_output=True, text=True, check=True
    )
    return {canonicalize_name(k): Version(v) for k, v in json.loads(done.stdout).items()}


def _declared_minimums(specs: list[str]) -> dict[str, Version]:
    minimums = {}
    for spec in specs:
        req = Requirement(spec)
        (low,) = [s.version for s in req.specifier if s.operator == ">="]
        minimums[canonicalize_name(req.name)] = Version(low)
    return minimums


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_declared_lower_bounds_are_installable_and_work(dist: Dist, tmp_path: Path) -> None:
    """The ranges in pyproject are honest: installed at their lowest (every direct
    dependency at exactly the minimum it declares), the package runs its demo, and with
    ``[server]`` it serves. A bound that no longer resolves, or that an installed dependency
    forces higher, fails here: raise the bound (docs/development.md)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    empty = tmp_path / "empty"
    empty.mkdir()
    for extra in ("", "server"):
        # The core's bounds are checked without extras; an extra may need a newer core
        # dependency (mcp needs a newer pydantic), so with it only the extra's own bounds.
        declared = project["optional-dependencies"][extra] if extra else project["dependencies"]
        wheel = f"{dist.wheel}[{extra}]" if extra else str(dist.wheel)
        bin_dir = _lowest_venv(tmp_path / f"venv-{extra or 'plain'}", wheel, declared)
        installed = _installed_versions(bin_dir)
        for name, minimum in _declared_minimums(declared).items():
            assert installed[name] == minimum, f"[{extra}] {name}: {installed[name]} != {minimum}"
        _demo_works(bin_dir, empty)
        if extra == "server":
            _serves(bin_dir, empty, tmp_path)

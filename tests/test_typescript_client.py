"""The TypeScript client (``clients/typescript``, the npm package ``stratamem``), built and
tested from here so that ``.ci/run`` covers it.

Its devDependencies (TypeScript, openapi-typescript) are installed with ``npm ci`` once per
lockfile into a cache outside the checkout; the package is copied beside them, built (ESM +
CJS with declarations), its generated types are checked against the app's OpenAPI
document, and its ``node --test`` suites run against real ``stratamem serve`` processes
started by the suites themselves (with this interpreter). A last test follows the README's
two commands in a fresh Node project. Without ``node`` and ``npm`` the tests fail: CI
installs them (``.ci/tools.sh``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from fakes.openai_server import FakeOpenAIServer
from node_packages import LOCK_FILES, installed_packages, node_tool
from server_proc import ServerProcess

pytestmark = pytest.mark.slow

PACKAGE = REPO / "clients" / "typescript"
# What a checkout of the package holds (node_modules and dist are made here).
SOURCES = (
    "src",
    "scripts",
    "test",
    "tsconfig.json",
    "tsconfig.cjs.json",
    "README.md",
    *LOCK_FILES,
)
SUITES = ("api.test.mjs", "retry.test.mjs", "transport.test.mjs", "ai-sdk.test.mjs")


def _tool(name: str) -> str:
    return node_tool(name, "The TypeScript client's tests")


def _run(
    cmd: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env or _env()
    )


def _env(**extra: str) -> dict[str, str]:
    # This checkout's stratamem first, whatever the developer's environment says; no
    # STRATAMEM_* settings of theirs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


def _node_modules() -> Path:
    """The package's devDependencies (TypeScript, openapi-typescript)."""
    return installed_packages(PACKAGE, "stratamem-ts-client", "typescript")


def _copy_sources(to: Path) -> Path:
    to.mkdir(parents=True)
    for name in SOURCES:
        source = PACKAGE / name
        if source.is_dir():
            shutil.copytree(source, to / name)
        else:
            shutil.copy(source, to / name)
    return to


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built copy of the package, its node_modules from the cache."""
    node = _tool("node")
    modules = _node_modules()
    work = _copy_sources(tmp_path_factory.mktemp("ts-client") / "typescript")
    (work / "node_modules").symlink_to(modules, target_is_directory=True)
    built = _run([node, "scripts/build.mjs"], work)
    assert built.returncode == 0, f"the build failed:\n{built.stdout}\n{built.stderr}"
    for entry in ("esm/index.js", "esm/index.d.ts", "cjs/index.js", "cjs/index.d.ts"):
        assert (work / "dist" / entry).is_file(), entry
    return work


def test_the_generated_types_are_the_apps_openapi_document(package: Path) -> None:
    """src/openapi.ts is what openapi-typescript makes of the app's current document: a
    route or model changed on the server without `npm run generate` fails here."""
    done = _run(
        [_tool("node"), "scripts/generate.mjs", "--check"],
        package,
        env=_env(PYTHON=sys.executable),
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_declarations_type_a_consumer(package: Path) -> None:
    """test/consumer.mts and .cts (an `import` and a `require` user of the package) compile
    against dist's declarations under strict TypeScript, and its `@ts-expect-error` lines
    (a role outside the server's enum, a search without userId) are errors."""
    tsc = str(package / "node_modules" / "typescript" / "bin" / "tsc")
    done = _run([_tool("node"), tsc, "-p", "test/tsconfig.json"], package)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_ai_sdk_middleware_is_one_wrap_language_model_takes(package: Path) -> None:
    """test/ai-sdk.consumer.mts hands `stratamem/ai-sdk`'s middleware to the `ai` package's
    own wrapLanguageModel (its declarations, with the DOM types they need): it compiles."""
    tsc = str(package / "node_modules" / "typescript" / "bin" / "tsc")
    done = _run([_tool("node"), tsc, "-p", "test/tsconfig.ai-sdk.json"], package)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_node_suites_against_a_real_server(package: Path) -> None:
    done = _run(
        [_tool("node"), "--test", *(f"test/{s}" for s in SUITES)],
        package,
        env=_env(STRATAMEM_TEST_PYTHON=sys.executable),
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    passed = re.search(r"^# pass (\d+)$", output, re.M)
    failed = re.search(r"^# fail (\d+)$", output, re.M)
    assert passed and failed, output
    assert int(failed.group(1)) == 0 and int(passed.group(1)) >= 27, output


def test_the_ai_sdk_docs_example_runs(package: Path, tmp_path: Path) -> None:
    """docs/integrations/ai-sdk.md's example, as written, with `@ai-sdk/openai` pointed at
    the suite's fake OpenAI server and a real `stratamem serve`: the second call's last user
    message carries what the first one stored."""
    page = REPO / "docs" / "integrations" / "ai-sdk.md"
    code = page.read_text(encoding="utf-8").split("```ts\n", 1)[1].split("```", 1)[0]
    server = ServerProcess(tmp_path, env={"STRATAMEM_UI": "false"}).start()
    try:
        with FakeOpenAIServer() as fake:
            fake.chat_replies.extend(["Noted.", "Try an apple."])
            env = _env(
                STRATAMEM_API_KEY=server.bootstrap_key(),
                OPENAI_API_KEY="k",
                OPENAI_BASE_URL=fake.base_url,
            )
            # The example is plain JavaScript (no annotations); the server is this one.
            example = code.replace("http://127.0.0.1:8000", server.url)
            (package / "example.mjs").write_text(example, encoding="utf-8")
            done = _run([_tool("node"), "example.mjs"], package, env=env, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.strip() == "Try an apple."
            first, second = fake.responses_requests()
            asked = [i for i in second["input"] if i.get("role") == "user"][-1]["content"]
            texts = [part["text"] for part in asked]
            assert texts[0] == "Can you suggest a snack?" and "<memory>" in texts[-1]
            assert "allergic to peanuts" in texts[-1]
            assert [i for i in first["input"] if i.get("role") == "user"][-1]["content"] == [
                {"type": "input_text", "text": "I'm allergic to peanuts."}
            ]
    finally:
        server.stop()


def _readme_install_commands() -> list[str]:
    """The two commands README.md gives for a Node project (a ```sh block naming
    clients/typescript)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    found = [b for b in blocks if "clients/typescript" in b]
    assert len(found) == 1, "README.md: one ```sh block with the TypeScript client's install"
    lines = [ln.split("#", 1)[0].strip() for ln in found[0].splitlines()]
    commands = [ln for ln in lines if ln]
    assert len(commands) == 2, commands
    return commands


DEFAULT_URL = "http://127.0.0.1:8000"


def _readme_example() -> str:
    """README.md's TypeScript example (its ```ts block)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```ts\n(.*?)```", readme, re.S)
    assert len(blocks) == 1 and DEFAULT_URL in blocks[0], blocks
    return str(blocks[0])


CONSUMER_ESM = """\
import { MemoryClient, NotFoundError, verifyWebhook } from "stratamem";
const [url, key] = process.argv.slice(2);
const client = new MemoryClient({ apiKey: key, baseUrl: url });
const session = await client.sessions.create({ userId: "node-app", sessionId: "fresh-1" });
await session.addMessages([{ role: "user", content: "I moved to Berlin in March." }],
                          { sync: true });
const ctx = await session.getMemory("Where does the user live?");
const missing = await client.sessions.get("nope").catch((e) => e instanceof NotFoundError);
console.log(JSON.stringify({ context: ctx.formatted_context, missing,
                             verify: typeof verifyWebhook }));
"""

CONSUMER_CJS = """\
const { MemoryClient, ConflictError } = require("stratamem");
const [url, key] = process.argv.slice(2);
const client = new MemoryClient({ apiKey: key, baseUrl: url });
(async () => {
  const messages = await client.messages.list({ sessionId: "fresh-1" });
  const conflict = await client.sessions.create({ userId: "other", sessionId: "fresh-1" })
    .catch((e) => e instanceof ConflictError);
  console.log(JSON.stringify({ contents: messages.map((m) => m.content), conflict }));
})();
"""


def test_a_fresh_node_project_in_the_readmes_two_commands(tmp_path: Path) -> None:
    """The README's two commands, run as written (the repository's path put in), make
    `stratamem` importable with both `import` and `require` in a new Node project."""
    node, npm = _tool("node"), _tool("npm")
    _node_modules()  # fills npm's own cache, so the install below needs no download
    repo = tmp_path / "stratamem"
    _copy_sources(repo / "clients" / "typescript")
    app = tmp_path / "app"
    app.mkdir()
    env = _env()
    init = _run([npm, "init", "-y"], app, env=env)
    assert init.returncode == 0, init.stderr
    for command in _readme_install_commands():
        line = command.replace("/path/to/stratamem", str(repo))
        done = subprocess.run(
            line, shell=True, cwd=app, capture_output=True, text=True, timeout=600, env=env
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    manifest = json.loads((app / "package.json").read_text(encoding="utf-8"))
    assert "stratamem" in manifest["dependencies"]

    (app / "esm.mjs").write_text(CONSUMER_ESM, encoding="utf-8")
    (app / "readme.mjs").write_text(_readme_example(), encoding="utf-8")
    (app / "cjs.cjs").write_text(CONSUMER_CJS, encoding="utf-8")
    server = ServerProcess(tmp_path, env={"STRATAMEM_UI": "false"}).start()
    try:
        args = [server.url, server.bootstrap_key()]
        esm = _run([node, "esm.mjs", *args], app, env=env, timeout=120)
        assert esm.returncode == 0, esm.stdout + esm.stderr
        said = json.loads(esm.stdout)
        assert "Berlin" in said["context"] and said["missing"] is True
        assert said["verify"] == "function"
        # The README's example as written (it is JavaScript too), on this server.
        example = (app / "readme.mjs").read_text(encoding="utf-8")
        (app / "readme.mjs").write_text(example.replace(DEFAULT_URL, server.url), "utf-8")
        readme = _run(
            [node, "readme.mjs"], app, env={**env, "STRATAMEM_API_KEY": args[1]}, timeout=120
        )
        assert readme.returncode == 0, readme.stdout + readme.stderr
        assert "Berlin" in readme.stdout
        cjs = _run([node, "cjs.cjs", *args], app, env=env, timeout=120)
        assert cjs.returncode == 0, cjs.stdout + cjs.stderr
        assert json.loads(cjs.stdout) == {
            "contents": ["I moved to Berlin in March."],
            "conflict": True,
        }
    finally:
        server.stop()

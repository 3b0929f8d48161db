"""Browser tests: a real Chromium, driven by Playwright's sync API, against a real server.

tests/conftest.py loads this module as a plugin, so every test can take its fixtures as
arguments, and import its helpers::

    from browser import page_log, screenshot
    from playwright.sync_api import expect

    def test_dashboard(stratamem_server, page):
        page.goto(f"{stratamem_server.url}/ui")
        expect(page.get_by_role("heading", name="Memory")).to_be_visible()
        screenshot(page, "ui-home")
        assert not page_log(page).errors

Fixtures:

- ``browser`` (module): one headless Chromium per test module, launched from Debian's
  ``/usr/bin/chromium`` (or ``STRATAMEM_CHROMIUM``); Playwright's own browser download is
  never used. ``.ci/tools.sh`` installs the package.
- ``page``: a page in a fresh context, 1280x800; ``phone_page``: 390x844, mobile and touch.
  ``new_page(viewport, **context_options)`` makes more (each in its own context). Pages
  fail an action after 10 s, not Playwright's 30. When a test fails, each of its pages is
  screenshot as ``FAILED-<test>-<n>.png``.
- ``stratamem_server`` (module): ``stratamem serve`` on 127.0.0.1 (tests/server_proc.py's
  ``ServerProcess``) on a SQLite file, admin API enabled with ``ADMIN_TOKEN``; its
  ``url`` and ``bootstrap_key()`` (an API key). A module that wants its own server (another
  store, such as conftest's ``module_db_url``, or other settings) starts a ``ServerProcess``.

Helpers: ``screenshot(page, name)`` writes ``<name>.png`` (the whole page) to
``STRATAMEM_SCREENSHOT_DIR``, by default ``build/screenshots/`` (git-ignored): pictures for a
person to look at, never committed, never compared. ``page_log(page)`` is what the page did
wrong: requests to hosts other than the server's loopback address, which are refused (the
suite has no internet, and a page must not depend on it), and uncaught errors and
``console.error`` messages.

Without Chromium or the ``playwright`` package the browser tests are skipped, with that
reason, except in CI (``CI`` or ``STRATAMEM_REQUIRE_BROWSER`` set; ``.ci/run`` sets it),
where they fail.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

import pytest

from conftest import REPO
from server_proc import ServerProcess

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page, Route

# Read at import (collection), before conftest's autouse fixture hides STRATAMEM_* variables.
CHROMIUM = os.environ.get("STRATAMEM_CHROMIUM", "").strip() or "/usr/bin/chromium"
REQUIRE_BROWSER = any(
    os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")
    for name in ("STRATAMEM_REQUIRE_BROWSER", "CI")
)
SCREENSHOT_DIR = Path(
    os.environ.get("STRATAMEM_SCREENSHOT_DIR", "").strip() or REPO / "build" / "screenshots"
)

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
ADMIN_TOKEN = "admin-" + secrets.token_hex(8)
TIMEOUT_MS = 10_000
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class PageLog:
    """What a page did wrong; see ``page_log``."""

    blocked: list[str] = field(default_factory=list)  # URLs of refused non-loopback requests
    errors: list[str] = field(default_factory=list)  # uncaught errors, console.error messages


_LOGS: WeakKeyDictionary[Any, PageLog] = WeakKeyDictionary()


def page_log(page: Page) -> PageLog:
    """The requests refused and the errors of ``page`` (one of this module's fixtures')."""
    return _LOGS[page]


def screenshot(page: Page, name: str) -> Path:
    """Save the whole of ``page`` as ``<name>.png`` in the screenshot directory; its path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "page"
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{safe}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _unavailable(reason: str) -> NoReturn:
    if REQUIRE_BROWSER:
        pytest.fail(f"CI requires the browser tests, but {reason}")
    pytest.skip(f"browser test: {reason}")


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """Chromium's path (``STRATAMEM_CHROMIUM`` or /usr/bin/chromium); skips or fails without."""
    path = CHROMIUM if os.sep in CHROMIUM else shutil.which(CHROMIUM)
    if not path or not os.access(path, os.X_OK):
        _unavailable(
            f"no chromium at {CHROMIUM} (STRATAMEM_CHROMIUM); on Debian, .ci/tools.sh "
            "installs it (apt-get install chromium)"
        )
    return path


@pytest.fixture(scope="module")
def browser(chromium_executable: str) -> Iterator[Browser]:
    """One headless Chromium per test module.

    Not per run: Playwright's sync API keeps its event loop running in the main thread
    while it is started, so any later test calling ``asyncio.run`` (the async capture
    tests) would fail with "cannot be called from a running event loop"."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as pw:
        # A launch failure with the binary present is an error, never a skip.
        browser = pw.chromium.launch(
            executable_path=chromium_executable,
            headless=True,
            # As root in a container: no sandbox (it needs user namespaces), and a small
            # /dev/shm must not crash renderers.
            chromium_sandbox=False,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        try:
            yield browser
        finally:
            browser.close()


def _refuse_external(log: PageLog) -> Callable[[Route], None]:
    def handle(route: Route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOOPBACK:
            log.blocked.append(url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    return handle


def _console(log: PageLog, msg: ConsoleMessage) -> None:
    if msg.type == "error":
        log.errors.append(f"console.error: {msg.text}")


@pytest.fixture
def new_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Callable[..., Page]]:
    """``new_page(viewport=DESKTOP, **context_options)``: a page in a context of its own."""
    opened: list[Page] = []

    def make(viewport: dict[str, int] = DESKTOP, **context_options: Any) -> Page:
        context = browser.new_context(viewport=viewport, **context_options)
        context.set_default_timeout(TIMEOUT_MS)
        log = PageLog()
        context.route("**/*", _refuse_external(log))
        page = context.new_page()
        page.on("pageerror", lambda exc: log.errors.append(f"uncaught: {exc}"))
        page.on("console", lambda msg: _console(log, msg))
        _LOGS[page] = log
        opened.append(page)
        return page

    yield make
    report = getattr(request.node, "_browser_call_report", None)
    for n, page in enumerate(opened, 1):
        try:
            if report is not None and report.failed and not page.is_closed():
                screenshot(page, f"FAILED-{request.node.name}-{n}")
        finally:
            page.context.close()


@pytest.fixture
def page(new_page: Callable[..., Page]) -> Page:
    """A page in a fresh desktop context (1280x800)."""
    return new_page(DESKTOP)


@pytest.fixture
def phone_page(new_page: Callable[..., Page]) -> Page:
    """A page in a fresh phone-width context (390x844, mobile viewport, touch)."""
    return new_page(PHONE, is_mobile=True, has_touch=True)


@pytest.fixture(scope="module")
def stratamem_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``stratamem serve`` on 127.0.0.1 and a SQLite file; admin API with ``ADMIN_TOKEN``."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("browser-serve"), env={"STRATAMEM_ADMIN_TOKEN": ADMIN_TOKEN}
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # The test's own outcome, for new_page's teardown (screenshots of a failed test's pages).
    report = yield
    if report.when == "call":
        item._browser_call_report = report  # type: ignore[attr-defined]
    return report

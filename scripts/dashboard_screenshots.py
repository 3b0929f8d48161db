"""Take the screenshots of docs/dashboard.md: the dashboard over the demo conversation.

Starts `stratamem serve` on a new SQLite file, stores the package's demo conversation
(``stratamem demo``'s) through the REST API, asks for context once (so the recall log has an
entry) and corrects a summary's status, then signs in with Debian's Chromium (driven by
Playwright, as the browser tests do) and saves desktop-sized PNGs to docs/images/.

    python scripts/dashboard_screenshots.py            # needs /usr/bin/chromium (.ci/tools.sh)
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, sync_playwright

from stratamem import connect

OUT = Path(__file__).resolve().parent.parent / "docs" / "images"
USER = "alex"


def _serve(db: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = db.with_suffix(".log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMEM_")}
    cmd = [sys.executable, "-m", "stratamem", "serve", "--port", str(port)]
    cmd += ["--database-url", f"sqlite:///{db}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                key = re.search(r"\bsm_[A-Za-z0-9_-]{20,}", log.read_text())
                assert key, log.read_text()
                return proc, url, key.group(0)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"stratamem serve did not start:\n{log.read_text()}")


def _load(url: str, key: str) -> None:
    demo = resources.files("stratamem._demo").joinpath("conversation.jsonl").read_text()
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in demo.splitlines():
        message = json.loads(line)
        by_session[message.pop("session_id")].append(message)
    with connect(url, api_key=key) as mem:
        for session_id, messages in by_session.items():
            mem.sessions.create(USER, session_id=session_id).add_messages(messages, sync=True)
        mem.get_memory("demo-trip", "Where should we eat in Kyoto?")
        summary = next(s for s in mem.summaries.list(user_id=USER) if "Kreuzberg" in s.text)
        mem.set_status(summary.id, "deprioritized", reason="Moved out of Kreuzberg in May")


def _shot(page: Page, name: str, *, whole: bool = False) -> None:
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=whole)
    print(f"  docs/images/{name}.png")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = _serve(Path(tmp) / "demo.db")
        try:
            _load(url, key)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=os.environ.get("STRATAMEM_CHROMIUM", "/usr/bin/chromium"),
                    args=["--no-sandbox", "--disable-dev-shm-usage"],
                )
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(f"{url}/ui/login")
                page.get_by_label("API key or admin token").fill(key)
                page.keyboard.press("Enter")
                page.get_by_role("button", name="Sign out").wait_for()
                _shot(page, "dashboard-overview")
                page.goto(f"{url}/ui/users/{USER}")
                _shot(page, "dashboard-user")
                page.locator("ul.summaries a", has_text="Kreuzberg").first.click()
                _shot(page, "dashboard-summary-history", whole=True)
                page.goto(f"{url}/ui/recall?user_id={USER}&query=Where+should+we+eat+in+Kyoto%3F")
                _shot(page, "dashboard-recall")
                page.goto(f"{url}/ui/recall/log")
                _shot(page, "dashboard-recall-log")
                phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
                phone.context.add_cookies(page.context.cookies())
                phone.goto(f"{url}/ui/users/{USER}")
                _shot(phone, "dashboard-phone")
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()

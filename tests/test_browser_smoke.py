"""The browser-test stack works: Debian's Chromium, driven by Playwright, renders pages of a
real ``stratamem serve`` (tests/browser.py), refuses requests off the loopback address, and
screenshots land in the screenshot directory."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from playwright.sync_api import Page, expect

from browser import DESKTOP, PHONE, page_log, screenshot
from server_proc import ServerProcess


def test_healthz_renders(stratamem_server: ServerProcess, page: Page) -> None:
    response = page.goto(f"{stratamem_server.url}/healthz")
    assert response is not None and response.status == 200
    # Chromium shows a JSON answer as text in the page.
    body = json.loads(page.locator("body").inner_text())
    assert body["data"]["version"]
    # The page's own scripts run, and reach the server.
    status = page.evaluate("fetch('/healthz').then(r => r.status)")
    assert status == 200
    assert page.viewport_size == DESKTOP
    path = screenshot(page, "smoke-healthz")
    assert path.read_bytes().startswith(b"\x89PNG")
    assert page_log(page).blocked == [] and page_log(page).errors == []


def test_docs_page_served_and_external_assets_refused(
    stratamem_server: ServerProcess, phone_page: Page
) -> None:
    # /docs is FastAPI's Swagger UI, whose script and stylesheet come from a CDN: the page
    # arrives, its title is rendered, and those requests are refused (and recorded), not sent
    # (FastAPI's favicon, on fastapi.tiangolo.com, too).
    phone_page.goto(f"{stratamem_server.url}/docs")
    expect(phone_page).to_have_title("stratamem - Swagger UI")
    expect(phone_page.locator("#swagger-ui")).to_be_attached()
    hosts = {urlsplit(url).hostname for url in page_log(phone_page).blocked}
    assert "cdn.jsdelivr.net" in hosts
    # Without its script the page's inline call fails: uncaught errors are recorded.
    assert any("SwaggerUIBundle" in error for error in page_log(phone_page).errors)
    assert phone_page.viewport_size == PHONE
    assert phone_page.evaluate("window.innerWidth") == PHONE["width"]
    screenshot(phone_page, "smoke-docs-phone")

"""The dashboard in a real headless Chromium against a real `stratamem serve` (tests/browser.py).

What a person does: sign in, browse a user's memory, follow provenance from a summary to its
messages and back, run a recall, change a summary's status with a reason and find it in the
history, manage a webhook, erase a user; and what must not happen: a wrong key let in, a form
without its CSRF token obeyed, memory text run as markup. Each page is screenshot to
build/screenshots/ (STRATAMEM_SCREENSHOT_DIR) for a person to look at.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Page, expect

from browser import ADMIN_TOKEN, page_log, screenshot
from server_proc import ServerProcess
from stratamem import connect

pytestmark = pytest.mark.slow

HOSTILE = [
    "<script>document.title='pwned'</script> My favourite tea is genmaicha.",
    "<img src=x onerror=\"document.title='pwned'\"> I keep a bonsai on the balcony.",
]
CONVERSATION = [
    "I moved to Berlin last spring for a job at a robotics startup.",
    "My sister Ana is a nurse in Lisbon.",
    "I am allergic to peanuts, so please never suggest satay.",
    "On weekends I go climbing at the Magic Mountain gym.",
    *HOSTILE,
]


@pytest.fixture(scope="module")
def server(stratamem_server: ServerProcess) -> Iterator[ServerProcess]:
    """The server with one user's conversation processed into memory."""
    with connect(stratamem_server.url, api_key=stratamem_server.bootstrap_key()) as mem:
        session = mem.sessions.create("alice", session_id="trip", title="Moving")
        session.add_messages([{"role": "user", "content": t} for t in CONVERSATION], sync=True)
        mem.sessions.create("bob", session_id="b1").add_messages(
            [{"role": "user", "content": "I play the cello."}], sync=True
        )
    yield stratamem_server


def _dialogs(page: Page) -> list[str]:
    seen: list[str] = []
    page.on("dialog", lambda d: (seen.append(d.message), d.dismiss()))
    return seen


def _sign_in(
    page: Page, server: ServerProcess, secret: str | None = None, *, accepted: bool = True
) -> None:
    page.goto(f"{server.url}/ui/")
    expect(page).to_have_url(re.compile(r"/ui/login"))
    # Keyboard only: the key field has focus, Enter submits.
    expect(page.get_by_label("API key or admin token")).to_be_focused()
    page.keyboard.type(secret or server.bootstrap_key())
    page.keyboard.press("Enter")
    if accepted:
        expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def _clean(page: Page, *refused: int) -> None:
    """Nothing blocked and no error, except Chromium's note on answers refused as asked."""
    log = page_log(page)
    expected = tuple(f"the server responded with a status of {code}" for code in refused)
    assert [e for e in log.errors if not any(x in e for x in expected)] == []
    assert log.blocked == []


def test_a_wrong_key_is_refused(server: ServerProcess, page: Page) -> None:
    _sign_in(page, server, "sm_this_is_not_a_key_at_all_000000", accepted=False)
    expect(page.get_by_role("alert")).to_have_text("That key was not accepted.")
    screenshot(page, "dashboard-login-refused")
    page.goto(f"{server.url}/ui/users")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Fusers"))
    _clean(page, 401)


def test_browse_explain_and_govern_a_users_memory(server: ServerProcess, page: Page) -> None:
    dialogs = _dialogs(page)
    _sign_in(page, server)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    screenshot(page, "dashboard-overview")

    # Users, then alice's memory: topics, their summaries.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Users").click()
    page.get_by_label("Search user ids").fill("ali")
    page.get_by_label("Search user ids").press("Enter")
    expect(page.get_by_role("link", name="bob")).to_have_count(0)
    screenshot(page, "dashboard-users")
    page.get_by_role("link", name="alice", exact=True).click()
    expect(page.get_by_role("heading", name="User alice")).to_be_visible()
    screenshot(page, "dashboard-user-memory")

    # Memory text is text: the hostile messages are shown, as written, and never run.
    page.get_by_role("link", name="Messages", exact=True).click()
    expect(page.get_by_text("<script>document.title='pwned'</script>", exact=False)).to_be_visible()
    expect(page.get_by_text('<img src=x onerror="document.title=', exact=False)).to_be_visible()
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    screenshot(page, "dashboard-user-messages")

    # A summary, down its provenance to a message, and back up to the summary.
    page.get_by_role("link", name="Memory", exact=True).click()
    page.locator("ul.summaries a", has_text="Berlin").first.click()
    expect(page.get_by_role("heading", name=re.compile(r"^Summary "))).to_be_visible()
    summary_url = page.url
    screenshot(page, "dashboard-summary")
    down = page.locator("section", has=page.get_by_role("heading", name="Came from ↓"))
    # Past the summary's facts, to the words said.
    down.get_by_role("link", name=CONVERSATION[0], exact=True).click()
    expect(page.get_by_role("heading", name=re.compile(r"^Message "))).to_be_visible()
    expect(page.locator("p.big")).to_have_text(CONVERSATION[0])
    screenshot(page, "dashboard-message")
    up = page.locator("section", has=page.get_by_role("heading", name="Made into ↑"))
    up.locator("ul.summaries a").filter(has_text="Berlin").first.click()
    expect(page).to_have_url(summary_url)

    # Change its status with a reason: confirm, then find it in the history.
    page.get_by_label("New status").select_option("deprioritized")
    page.get_by_label("Reason (audited)").fill("Moved again in 2026")
    page.get_by_role("button", name="Change status…").click()
    expect(page.get_by_role("heading", name="Set this summary to 'deprioritized'")).to_be_visible()
    screenshot(page, "dashboard-confirm")
    page.get_by_role("button", name="Confirm").click()
    expect(page.get_by_role("status")).to_have_text(re.compile("Status changed"))
    history = page.locator("section", has=page.get_by_role("heading", name="History"))
    expect(history.get_by_role("cell", name="Moved again in 2026")).to_be_visible()
    expect(history.get_by_text(re.compile(r"ui:api_key:key_"))).to_be_visible()
    screenshot(page, "dashboard-summary-history")

    # Recall: every layer's hits and the exact context block.
    nav = page.get_by_role("navigation", name="Main")
    nav.get_by_role("link", name="Recall", exact=True).click()
    page.get_by_label("User").fill("alice")
    page.get_by_label("Query").fill("Where does she live and what can't she eat?")
    page.get_by_role("button", name="Recall").click()
    context = page.locator("pre.context")
    expect(context).to_contain_text("Berlin")
    for layer in ("Summary hits", "Fact hits", "Message hits"):
        expect(page.get_by_role("heading", name=layer)).to_be_visible()
    screenshot(page, "dashboard-recall")

    page.get_by_role("link", name="Recall log").click()
    expect(page.get_by_role("heading", name="Recall log")).to_be_visible()
    screenshot(page, "dashboard-recall-log")

    # Webhooks: create one (its secret shown once), then its page.
    page.get_by_role("link", name="Webhooks").click()
    page.get_by_label("Name").fill("audit trail")
    page.get_by_label("Event").select_option("after_llm")
    page.get_by_label("Mode").select_option("async")
    page.get_by_label("Target URL").fill("https://hooks.example.com/stratamem")
    page.get_by_role("button", name="Create webhook").click()
    expect(page.get_by_label("Signing secret")).to_have_value(re.compile(r"^whsec_"))
    screenshot(page, "dashboard-webhook-secret")
    page.get_by_role("link", name="Go to the webhook").click()
    page.get_by_role("button", name="Disable").click()
    expect(page.get_by_role("status")).to_have_text("Webhook disabled.")
    screenshot(page, "dashboard-webhook")

    page.get_by_role("link", name="Audit").click()
    expect(page.get_by_role("cell", name="Moved again in 2026")).to_be_visible()
    screenshot(page, "dashboard-audit")

    # Erase the user, behind its confirmation.
    page.get_by_role("link", name="Users").click()
    page.get_by_role("link", name="alice", exact=True).click()
    page.get_by_role("link", name="Sessions & actions").click()
    page.get_by_label("Reason for erasing (audited)").fill("Asked to be forgotten")
    page.get_by_role("button", name="Erase this user…").click()
    expect(page.get_by_text("This cannot be undone.", exact=False)).to_be_visible()
    page.get_by_role("button", name="Confirm").click()
    expect(page.get_by_role("status")).to_have_text("The user was erased.")
    expect(page.get_by_role("link", name="alice", exact=True)).to_have_count(0)

    assert dialogs == [] and page.title() != "pwned"
    _clean(page)


def test_a_form_without_its_csrf_token_is_refused(server: ServerProcess, page: Page) -> None:
    _sign_in(page, server)
    page.goto(f"{server.url}/ui/users/bob?tab=sessions")
    # The test strips the token from the form, as a forged cross-site form would lack it.
    page.locator("form[action$='/erase'] input[name=csrf]").evaluate("e => e.remove()")
    page.get_by_role("button", name="Erase this user…").click()
    expect(page.get_by_role("alert")).to_contain_text("missing its security token")
    screenshot(page, "dashboard-csrf-refused")
    page.goto(f"{server.url}/ui/users")
    expect(page.get_by_role("link", name="bob", exact=True)).to_be_visible()
    _clean(page, 403)


def test_readable_at_phone_width(server: ServerProcess, phone_page: Page) -> None:
    _sign_in(phone_page, server)
    for path, name in (
        ("/ui/", "overview"),
        ("/ui/users/bob", "user"),
        ("/ui/webhooks", "webhooks"),
    ):
        phone_page.goto(server.url + path)
        # Nothing wider than the screen: no sideways scrolling of the page itself.
        assert phone_page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (
            path
        )
        screenshot(phone_page, f"dashboard-phone-{name}")
    _clean(phone_page)


def test_the_admin_token_chooses_a_project_and_signs_out(
    server: ServerProcess, new_page: Callable[..., Page]
) -> None:
    page = new_page()
    _sign_in(page, server, ADMIN_TOKEN)
    expect(page.get_by_role("heading", name="Projects")).to_be_visible()
    screenshot(page, "dashboard-projects")
    page.get_by_role("button", name=re.compile("^Open")).first.click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/ui/login"))
    page.goto(f"{server.url}/ui/")
    expect(page).to_have_url(re.compile(r"/ui/login"))
    _clean(page)

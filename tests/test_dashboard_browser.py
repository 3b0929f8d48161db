"""The dashboard in a real headless Chromium against a real `stratamem serve` (tests/browser.py).

What a person does: sign in, browse a user's memory, follow provenance from a summary to its
messages and back, run a recall, change a summary's status with a reason and find it in the
history, manage a webhook, erase a user; and what must not happen: a wrong key let in, a form
without its CSRF token obeyed, memory text run as markup. Each page is screenshot to
build/screenshots/ (STRATAMEM_SCREENSHOT_DIR) for a person to look at.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, expect

from browser import ADMIN_TOKEN, DESKTOP, PHONE, page_log, screenshot
from fakes.webhook_receiver import WebhookReceiver
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


# -- every page at phone and desktop width -----------------------------------------------------

USER = "alice-wonderland"


@dataclass
class Seeded:
    """A server whose every dashboard page has something to show, and the ids to visit."""

    server: ServerProcess
    pages: dict[str, str]  # name -> path under the server


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A summary with a correction and a status change in its history, facts, a behaviour
    event, a topic left without current summaries, audit records, logged recalls, a webhook
    with deliveries and one failing (on the overview)."""
    with WebhookReceiver() as receiver:
        proc = ServerProcess(
            tmp_path_factory.mktemp("browser-seeded"),
            env={"STRATAMEM_ADMIN_TOKEN": ADMIN_TOKEN, "STRATAMEM_WEBHOOK_ALLOW": "127.0.0.1"},
        ).start()
        try:
            yield Seeded(proc, _seed(proc, receiver))
        finally:
            proc.stop()


def _seed(proc: ServerProcess, receiver: WebhookReceiver) -> dict[str, str]:
    with connect(proc.url, api_key=proc.bootstrap_key()) as mem:
        hook, _ = mem.webhooks.create(
            name="summary trail",
            resource="summary",
            event="before_add",
            mode="async",
            target_url=receiver.url("/hook"),
        )
        mem.webhooks.create(
            name="broken receiver",
            resource="fact",
            event="before_add",
            target_url=receiver.url("/status/500"),
        )
        session = mem.sessions.create(USER, session_id="trip-planning-2026", title="Moving")
        session.add_messages([{"role": "user", "content": t} for t in CONVERSATION], sync=True)
        event = mem.user_actions.record(
            USER,
            event_type="search",
            content="light running shoes",
            page="/shop/search",
            session_id=session.id,
            sync=True,
        ).message_ids[0]
        summaries = {s.text: s for s in mem.summaries.list(user_id=USER)}
        berlin = next(s for t, s in summaries.items() if "Berlin" in t)
        correction = {"content": "I moved to Hamburg in May.", "metadata": {"corrects": berlin.id}}
        session.add_messages([{"role": "user", "event_type": "memory", **correction}], sync=True)
        climbing = next(s for t, s in summaries.items() if "climbing" in t)
        mem.set_status(climbing.id, "deprioritized", reason="Not about travel planning")
        peanuts = next(s for t, s in summaries.items() if "peanuts" in t)
        mem.set_status(peanuts.id, "deleted", reason="Asked to delete it")  # its topic empties
        mem.forget(user_id=USER, message_ids=[event], reason="Shopping is not memory")
        event = mem.user_actions.record(
            USER, event_type="search", content="trail shoes", page="/shop/search", sync=True
        ).message_ids[0]
        session.get_memory("Where does the user live now?")  # logged: a REST recall
        deadline = time.monotonic() + 30
        while not mem.webhooks.deliveries(hook.id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mem.webhooks.deliveries(hook.id), "no webhook delivery to show"
        fact = mem.facts.list(user_id=USER)[0]
        topic = mem.topics.list(user_id=USER)[0]
    return {
        "overview": "/ui/",
        "users": "/ui/users",
        "user-memory": f"/ui/users/{USER}",
        "user-facts": f"/ui/users/{USER}?tab=facts",
        "user-messages": f"/ui/users/{USER}?tab=messages",
        "user-sessions": f"/ui/users/{USER}?tab=sessions",
        "summary-history": f"/ui/items/{berlin.id}",
        "summary-deprioritized": f"/ui/items/{climbing.id}",
        "fact": f"/ui/items/{fact.id}",
        "message": f"/ui/items/{fact.message_ids[0]}",
        "event": f"/ui/items/{event}",
        "topic": f"/ui/items/{topic.id}",
        "recall": f"/ui/recall?user_id={USER}&query=Where+does+the+user+live",
        "recall-log": "/ui/recall/log",
        "webhooks": "/ui/webhooks",
        "webhook": f"/ui/webhooks/{hook.id}",
        "audit": "/ui/audit",
        "error": "/ui/items/s_nothing_here",
    }


# Table cells and definitions holding one word (an identifier, a status, an id) that the
# browser broke between two letters or digits: a line that starts inside the word. A break
# after a hyphen is one a reader expects, and a URL breaks where it must. Text only for
# screen readers (clipped to 1 px: .sr, the header of stacked rows) is not laid out to be read.
_BROKEN_WORDS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll("main td, main th, main dd")) {
    const word = cell.textContent.trim();
    if (!word || /\\s/.test(word) || word.length > 40 || word.includes("://")) continue;
    const clipped = [cell.closest("thead"), cell.querySelector(".sr")];
    if (clipped.some(e => e && e.getBoundingClientRect().width < 2)) continue;
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      const text = node.textContent, range = document.createRange();
      let top = null;
      for (let i = 0; i < text.length; i++) {
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const box = range.getClientRects()[0];
        if (!box) continue;
        if (top !== null && box.top > top + 1 && /\\w/.test(text[i - 1]) && /\\w/.test(text[i])) {
          broken.push(word);
        }
        top = box.top;
      }
    }
  }
  return broken;
}"""

# At phone width, table rows are stacked, each cell a line with its label before it: a cell
# narrower than this share of the screen is a column squeezed to a few characters a line,
# and a label wider than the room kept for it would cover the value.
_STACKED_CELLS = """share => [...document.querySelectorAll("main table:not(.compact) td")]
  .filter(td => td.textContent.trim())
  .filter(td => {
    const label = getComputedStyle(td, "::before");
    const room = parseFloat(getComputedStyle(td).paddingLeft);
    const needs = label.content === "none" ? 0 : parseFloat(label.left) + parseFloat(label.width);
    return td.getBoundingClientRect().width < share * innerWidth || needs > room;
  })
  .map(td => td.textContent.trim().slice(0, 40))"""


def _fits(page: Page, name: str, *, phone: bool) -> None:
    """The page does not scroll sideways (with everything folded in <details> open), breaks
    no single word over lines and, at phone width, squeezes no table column."""
    # A page reached by a form (the sign-in) shows its heading before its stylesheet is in:
    # measured then, on a loaded machine, the phone layout's stacked rows were still a table.
    page.wait_for_load_state("load")
    page.locator("details").evaluate_all("all => all.forEach(d => { d.open = true; })")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], (name, width)  # type: ignore[index]
    assert page.evaluate(_BROKEN_WORDS) == [], name
    if phone:
        assert page.evaluate(_STACKED_CELLS, 0.6) == [], name
    screenshot(page, f"dashboard-{'phone' if phone else 'desktop'}-{name}")


@pytest.mark.parametrize("phone", [True, False], ids=["phone", "desktop"])
def test_every_page_fits_the_screen(
    seeded: Seeded, new_page: Callable[..., Page], phone: bool
) -> None:
    """Every dashboard page, with content, at 390 px and at 1280 px."""
    options = {"is_mobile": True, "has_touch": True} if phone else {}
    page = new_page(PHONE if phone else DESKTOP, **options)
    page.goto(f"{seeded.server.url}/ui/login")
    _fits(page, "login", phone=phone)
    _sign_in(page, seeded.server)
    for name, path in seeded.pages.items():
        page.goto(seeded.server.url + path)
        expect(page.locator("main h1")).to_be_visible()
        _fits(page, name, phone=phone)
    # The pages an action answers with: a confirmation, a secret shown once.
    page.goto(seeded.server.url + seeded.pages["summary-deprioritized"])
    page.get_by_label("Reason (audited)").fill("Checking the layout")
    page.get_by_role("button", name="Change status…").click()
    expect(page.get_by_role("button", name="Confirm")).to_be_visible()
    _fits(page, "confirm", phone=phone)
    page.goto(seeded.server.url + seeded.pages["webhook"])
    page.get_by_role("button", name="Rotate secret…").click()
    page.get_by_role("button", name="Confirm").click()
    expect(page.get_by_label("Signing secret")).to_have_value(re.compile(r"^whsec_"))
    _fits(page, "secret", phone=phone)
    _clean(page, 404)
    admin = new_page(PHONE if phone else DESKTOP, **options)
    _sign_in(admin, seeded.server, ADMIN_TOKEN)
    expect(admin.get_by_role("heading", name="Projects")).to_be_visible()
    _fits(admin, "projects", phone=phone)
    _clean(admin)


def test_identifiers_are_not_broken_mid_word_at_desktop_width(seeded: Seeded, page: Page) -> None:
    """The audit's set_status and the history's heuristic, which used to break mid-word,
    are each on one line (test_every_page_fits_the_screen checks every page's words)."""
    _sign_in(page, seeded.server)
    for path, label, word in (
        ("audit", "Action", "set_status"),
        ("summary-history", "By", "heuristic"),
    ):
        page.goto(seeded.server.url + seeded.pages[path])
        cell = page.locator(f"td[data-label={label}]", has_text=word).first
        expect(cell).to_have_text(word)
        height = cell.evaluate(
            "c => { const r = document.createRange(); r.selectNodeContents(c); return "
            "r.getBoundingClientRect().height / parseFloat(getComputedStyle(c).lineHeight); }"
        )
        assert height < 1.5, (word, height)  # one line
    _clean(page)


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

"""The dashboard in a real browser, used as a person would.

Playwright drives Debian's chromium (``scripts/browser.sh`` installs it when
missing; Playwright never downloads a browser of its own). The app runs in
pytest-django's live server, a transactional test; PostgreSQL only, since
on SQLite the events' append-only trigger refuses the DELETE of the test
flush. Every page is watched for console errors, uncaught exceptions and
Content-Security-Policy violations; screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerdash.ledger import recording
from ledgerdash.ledger.errors import IdempotencyConflict
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import AGENT, IN_CI, TOOLS_V1, record
from tests.factories import attempt_in
from tests.live import DOC_SHOTS, DOC_SHOTS_DIR, ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
S = State

#: Reports every CSP violation to the console, where the watcher sees it
#: (chromium also logs its own "Refused to …" line; this names the directive).
WATCH_CSP = """
document.addEventListener("securitypolicyviolation", (event) => {
  const where = event.sourceFile + ":" + event.lineNumber + ":" + event.columnNumber;
  console.error("CSP violation: " + event.violatedDirective + " blocked " + event.blockedURI + " at " + where);
});
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: run scripts/browser.sh (as root it installs Debian's chromium)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    # The sync API runs an event loop in this thread; the ORM calls the
    # tests make between browser steps are plain synchronous ones.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            yield chromium
            chromium.close()


class Person:
    """One person at one browser window, with everything the page complained about."""

    def __init__(self, browser: Any, base_url: str) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.add_init_script(WATCH_CSP)
        self.page = self.context.new_page()
        # Waits end as soon as the page is ready; the bound is for a machine under load.
        self.page.set_default_timeout(60_000)
        self.problems: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        self.page.on("dialog", self._dialog)

    def _console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            self.problems.append(f"console {message.type} at {self.page.url}: {message.text}")

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def log_in(self, username: str) -> None:
        self.page.goto(self.base_url + "/login/")
        self.page.get_by_label("Username").fill(username)
        self.page.get_by_label("Password").fill("pw-" + username)
        self.page.get_by_role("button", name="Log in").click()
        self.page.wait_for_url(self.base_url + "/")

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        if os.environ.get("LEDGERDASH_DOC_SHOTS") and name in DOC_SHOTS:
            shutil.copyfile(ARTIFACTS / f"{name}.png", DOC_SHOTS_DIR / f"{name}.png")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def people(browser: Any, live_server: Any) -> Iterator[Any]:
    opened: list[Person] = []

    def open_for(username: str) -> Person:
        person = Person(browser, live_server.url)
        person.log_in(username)
        opened.append(person)
        return person

    yield open_for
    problems = [problem for person in opened for problem in person.problems]
    dialogs = [dialog for person in opened for dialog in person.dialogs]
    for person in opened:
        person.close()
    assert problems == [], "the pages complained:\n" + "\n".join(problems)
    assert dialogs == []


def linked_with_other_args(tenant: Tenant, key: str) -> Attempt:
    """The provider refused the first call for good; the agent re-used ``key``
    with other arguments: a linked attempt for review."""
    original = record(tenant, key, args={"to": "ap@example.com", "invoice": 7})
    recording.fail(recording.mark_dispatched(original, actor=AGENT), reason="550 mailbox unavailable", actor=AGENT)
    with pytest.raises(IdempotencyConflict) as conflict:
        record(tenant, key, args={"to": "ap@example.com", "invoice": 7, "cc": "cfo@example.com"})
    return conflict.value.attempt


def test_an_operator_claims_stuck_work_and_an_approver_settles_a_linked_retry(
    people: Any, tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    from playwright.sync_api import expect

    stuck = attempt_in(S.UNKNOWN, tenant_a, key="invoice:7:send")
    retry = linked_with_other_args(tenant_a, "invoice:8:send")
    later = linked_with_other_args(tenant_a, "invoice:9:send")

    # The operator opens the UNKNOWN queue from the navigation and claims
    # the first item with the keyboard: j to select it, c to claim it.
    operator = people("operator-a")
    page = operator.page
    operator.shot("overview-operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="UNKNOWN").click()
    expect(page.get_by_role("heading", name="UNKNOWN queue")).to_be_visible()
    row = page.locator(f"#row-{stuck.pk}")
    expect(row).to_contain_text("oncall-a")
    page.keyboard.press("j")
    expect(row).to_have_class("selected")
    page.keyboard.press("c")
    expect(page.locator("#flash")).to_contain_text(f"You own #{stuck.pk} now.")
    expect(row).to_contain_text("yours")
    expect(row).to_have_class("selected")  # the refreshed row keeps the selection
    operator.shot("unknown-queue-after-claim")
    assert Attempt.objects.get(pk=stuck.pk).owner_id == operator_a.pk

    # The approver finds the linked attempt in MANUAL_REVIEW, opens it with o,
    # sees what changed against its parent, and approves it.
    approver = people("approver-a")
    page = approver.page
    page.get_by_role("navigation", name="Main").get_by_role("link", name="MANUAL_REVIEW").click()
    expect(page.locator(f"#row-{retry.pk}")).to_be_visible()
    page.locator(f"#row-{retry.pk}").click()
    page.keyboard.press("o")
    page.wait_for_url(f"**/attempts/{retry.pk}/")
    expect(page.get_by_role("heading", name="This linked attempt waits for an approver")).to_be_visible()
    diff = page.locator("table.diff")
    expect(diff).to_contain_text("argument cc")
    expect(diff).to_contain_text('"cfo@example.com"')
    expect(diff).to_contain_text("args hash")
    expect(page.locator(".approval")).to_contain_text(
        f"A retry cannot duplicate the original: the provider refused the original #{retry.parent_id}: it did not act"
    )
    approver.shot("linked-retry-before-approval")
    page.get_by_label("Comment").first.fill("the cc was asked for by finance")
    page.get_by_role("button", name="Approve retry").click()
    expect(page.locator("#flash")).to_contain_text(f"Retry #{retry.pk} approved")
    expect(page.locator("h1 .state")).to_have_text("INTENT_RECORDED")
    approver.shot("linked-retry-approved")
    assert AttemptEvent.objects.filter(attempt=retry, to_state=S.INTENT_RECORDED, actor_user=approver_a).count() == 1

    # Another linked attempt: the policy changes while the approver reads it.
    page.goto(f"{approver.base_url}/attempts/{later.pk}/")
    expect(page.get_by_role("button", name="Approve retry")).to_be_visible()
    policy_publish(
        tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("security"), note="rotate scopes"
    )
    page.get_by_label("Comment").first.fill("looks right")
    page.get_by_role("button", name="Approve retry").click()
    expect(page.locator("#flash")).to_contain_text(
        "Approval refused: scope email:send is not allowed for send_email by policy v2"
    )
    expect(page.locator(".event-approval_refused")).to_contain_text("not allowed for send_email by policy v2")
    expect(page.locator("h1 .state")).to_have_text("MANUAL_REVIEW")
    approver.shot("linked-retry-refused-after-policy-change")
    assert Attempt.objects.get(pk=later.pk).state == S.MANUAL_REVIEW


def test_bulk_assignment_previews_then_assigns(people: Any, tenant_a: Tenant, operator_a: Any) -> None:
    from playwright.sync_api import expect

    first = attempt_in(S.UNKNOWN, tenant_a, key="bulk-1")
    second = attempt_in(S.UNKNOWN, tenant_a, key="bulk-2")
    operator = people("operator-a")
    page = operator.page
    page.goto(operator.base_url + "/queues/unknown/")
    page.get_by_label(f"Select #{first.pk}", exact=True).check()
    page.get_by_label(f"Select #{second.pk}", exact=True).check()
    # The list refreshes itself (every 10 s; here, now, as its poller does):
    # new work appears, morphed in, and the ticked boxes and the selected
    # row stay as they were.
    arrived = attempt_in(S.UNKNOWN, tenant_a, key="bulk-3")
    page.evaluate(
        "htmx.ajax('GET', document.getElementById('results-poller').getAttribute('hx-get'),"
        " {source: '#results-poller'})"
    )
    expect(page.locator(f"#row-{arrived.pk}")).to_be_visible()
    expect(page.get_by_label(f"Select #{first.pk}", exact=True)).to_be_checked()
    expect(page.get_by_label(f"Select #{second.pk}", exact=True)).to_be_checked()
    expect(page.locator(f"#row-{second.pk}")).to_have_class("selected")  # the row last clicked
    expect(page.locator("#count-unknown")).to_have_text("3")
    page.get_by_label("Assign selected to").select_option(label="operator-a")
    page.get_by_role("button", name="Preview assignment").click()
    preview = page.locator("#preview")
    expect(preview).to_contain_text("Preview: what this assignment will touch")
    expect(preview).to_contain_text("bulk-1")
    expect(preview).to_contain_text("bulk-2")
    operator.shot("bulk-assign-preview")
    assert Attempt.objects.filter(owner=operator_a).count() == 0  # a preview writes nothing
    preview.get_by_role("button", name="Assign 2 selected to operator-a").click()
    expect(page.locator("#flash")).to_contain_text("Assigned 2 attempt(s) to operator-a.")
    expect(page.locator(f"#row-{first.pk}")).to_contain_text("yours")
    expect(page.locator(f"#row-{second.pk}")).to_contain_text("yours")
    assert Attempt.objects.filter(owner=operator_a).count() == 2


def test_the_keys_can_be_turned_off_and_the_refresh_paused(people: Any, tenant_a: Tenant, operator_a: Any) -> None:
    from playwright.sync_api import expect

    stuck = attempt_in(S.UNKNOWN, tenant_a, key="keys-1")
    operator = people("operator-a")
    page = operator.page
    page.goto(operator.base_url + "/queues/unknown/")
    row = page.locator(f"#row-{stuck.pk}")
    page.get_by_role("button", name="Turn keyboard shortcuts off").click()
    expect(page.locator("#shortcuts-toggle")).to_have_attribute("aria-pressed", "false")
    page.keyboard.press("j")
    expect(row).not_to_have_class("selected")
    page.reload()  # the choice is remembered in this browser
    page.keyboard.press("j")
    expect(row).not_to_have_class("selected")
    page.get_by_role("button", name="Turn keyboard shortcuts on").click()
    page.keyboard.press("j")
    expect(row).to_have_class("selected")
    page.get_by_role("link", name="Pause auto-refresh").click()
    expect(page.get_by_role("link", name="Resume auto-refresh")).to_be_visible()
    assert "refresh=off" in page.url
    expect(page.locator("#results-poller")).to_have_attribute("hx-trigger", "ledgerdash:refresh from:body")
    operator.shot("unknown-queue-paused")


def test_hostile_tool_arguments_render_as_text_and_run_nothing(people: Any, tenant_a: Tenant, operator_a: Any) -> None:
    from playwright.sync_api import expect

    image = '<img src=x onerror="window.__pwned = 1; alert(1)">'
    script = "<script>window.__pwned = 2; alert(2)</script>"
    attempt = record(
        tenant_a,
        "xss-<b>key</b>",
        task_id="task-<i>x</i>",
        args={"subject": image, "body": script, image: "as a key too"},
    )
    operator = people("operator-a")
    page = operator.page
    page.goto(operator.base_url + "/attempts/?q=" + "xss-%3Cb%3Ekey%3C%2Fb%3E")
    expect(page.locator(f"#row-{attempt.pk}")).to_contain_text("xss-<b>key</b>")
    expect(page.locator(f"#row-{attempt.pk}")).to_contain_text("task-<i>x</i>")
    page.locator(f"#row-{attempt.pk} a.open").click()
    page.wait_for_url(f"**/attempts/{attempt.pk}/")
    arguments = page.locator("pre.args")
    expect(arguments).to_contain_text(image.replace('"', '\\"'))  # JSON text, quotes escaped
    expect(arguments).to_contain_text(script)
    assert page.locator("pre.args img").count() == 0
    assert page.locator("pre.args script").count() == 0
    assert page.evaluate("window.__pwned") is None
    operator.shot("hostile-arguments")


def test_the_main_pages_load_cleanly_for_a_viewer(people: Any, tenant_a: Tenant, viewer_a: Any) -> None:
    from playwright.sync_api import expect

    from tests.test_drill_views import stored_run

    attempt = attempt_in(S.MANUAL_REVIEW, tenant_a, key="viewer-sees")
    run = stored_run(tenant_a, ok=False)
    viewer = people("viewer-a")
    page = viewer.page
    for path, name in [
        ("/", "viewer-overview"),
        ("/queues/unknown/", "viewer-unknown"),
        ("/queues/review/?owner=anyone&sort=newest", "viewer-review"),
        ("/attempts/", "viewer-search"),
        ("/drills/", "viewer-drills"),
        (f"/drills/{run.pk}/", "viewer-drill-report"),
        (f"/attempts/{attempt.pk}/", "viewer-detail"),
    ]:
        response = page.goto(viewer.base_url + path)
        assert response is not None
        assert response.status == 200
        csp = response.headers["content-security-policy"]
        assert "script-src 'self' 'nonce-" in csp
        assert "unsafe-inline" not in csp
        viewer.shot(name)
    expect(page.get_by_text("acting on it needs the operator role")).to_be_visible()
    # The pictures render: the attempt's states over time, and the overview's last 24 hours (fetched after it).
    strip = page.locator("svg.strip")
    expect(strip).to_be_visible()
    assert strip.bounding_box()["height"] > 10
    page.goto(viewer.base_url + "/")
    expect(page.locator("#trends svg.bars").first).to_be_visible()
    assert page.locator("#trends svg.bars .bar").count() >= 3 * 24
    viewer.shot("viewer-overview-trends")
    # Filters work through htmx and land in the address bar.
    page.goto(viewer.base_url + "/queues/review/")
    page.get_by_label("Sort").select_option("newest")
    page.wait_for_url("**/queues/review/?*sort=newest*")
    expect(page.locator(f"#row-{attempt.pk}")).to_be_visible()
    assert os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE") == "true"


def test_a_tool_name_never_breaks_mid_word_in_the_queue(people: Any, tenant_a: Tenant, operator_a: Any) -> None:
    """On a narrow window the queue's columns share the width, but a tool's name stays one line."""
    stuck = attempt_in(S.UNKNOWN, tenant_a, key="narrow-1")
    # A longer name, as the demo's tools have (shown as it is; the test needs no policy for it).
    Attempt.objects.filter(pk=stuck.pk).update(tool_name="drill.send_email_claimed")
    for n in range(3):  # long keys, the column that may wrap
        attempt_in(S.UNKNOWN, tenant_a, key=f"customer:{n}:invoice:2026-12-0{n}:reminder:second-notice")
    operator = people("operator-a")
    page = operator.page
    page.set_viewport_size({"width": 640, "height": 800})
    page.goto(operator.base_url + "/queues/unknown/")
    cell = page.locator(f"#row-{stuck.pk} td.tool")
    lines = cell.evaluate(
        "td => { const range = document.createRange(); range.selectNodeContents(td);"
        " return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; }"
    )
    assert lines == 1
    operator.shot("unknown-queue-narrow")


def test_the_interactive_api_docs_run_a_call_with_a_token_under_the_csp(
    people: Any, tenant_a: Tenant, viewer_a: Any
) -> None:
    """/api/v1/docs: Swagger UI from the app's own static files, under the site's policy (a
    violation fails the test through the page's watcher), its token box sending the bearer token."""
    from playwright.sync_api import expect

    from ledgerdash.ledger.tokens import token_create

    attempt = attempt_in(S.UNKNOWN, tenant_a, key="docs-1")
    _, raw = token_create(tenant=tenant_a, name="docs", scopes=["attempts:read"], actor=Actor.system("test"))
    reader = people("viewer-a")
    page = reader.page
    response = page.goto(reader.base_url + "/api/v1/docs")
    assert response is not None
    assert response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.get_by_role("heading", name="ledgerdash ingest API")).to_be_visible()
    page.get_by_role("button", name="Authorize").first.click()
    page.locator(".modal-ux input").first.fill(raw)
    page.locator(".modal-ux button.authorize").click()
    expect(page.locator(".modal-ux")).to_contain_text("Authorized")
    page.locator(".modal-ux button.btn-done").click()
    operation = page.locator(".opblock-get", has_text="/api/v1/attempts/{attempt_id}").first
    operation.locator(".opblock-summary").click()
    operation.get_by_role("button", name="Try it out").click()
    operation.locator("input[placeholder='attempt_id']").fill(str(attempt.pk))
    operation.get_by_role("button", name="Execute").click()
    expect(operation.locator(".live-responses-table tbody .response-col_status").first).to_have_text("200")
    expect(operation.locator(".live-responses-table")).to_contain_text('"state": "UNKNOWN"')
    reader.shot("api-docs")

"""Hostile and huge strings in a real browser, at 1440 px.

What agents send through the ingest API lands on every page: a
right-to-left override in a key, zero-width characters that make two keys
look the same, a 255-character task id without spaces, a 3,900-character
reason, a 60,000-character argument. On the queues, the search, an
attempt's page, the parent/child diff, the bulk-assign preview, the drill
pages and the audit reports (HTML and PDF) this checks that:

- no page is wider than the window (``document.scrollWidth``);
- the override does not move what follows it (the owner and the report
  links stay to the right of the key);
- no invisible character reaches the page's text: each is a marker
  inside an isolated ``<bdi>``;
- the PDFs of the 60,000-character argument and the hostile keys answer,
  each a few pages long (pages, not seconds: a verdict on time would
  depend on the machine's load).

PostgreSQL pass (see tests/test_browser.py for how the browser is driven);
screenshots go to ``test-artifacts/hostile-*.png``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.errors import IdempotencyConflict
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, DrillRun, Membership, Tenant
from ledgerdash.ledger.policies import policy_publish
from reviews import audit_views
from tests.conftest import RECONCILER, TOOLS_V1, record
from tests.test_browser import browser, people  # noqa: F401 (fixtures)
from tests.test_pdf_bounds import pdf_pages

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WIDTH = 1440
RLO = "\u202e"
ZWSP = "\u200b"
RLO_KEY = f"refund:{RLO}7002:dnes"  # shown as is, the override reverses the rest of the line
LOOKALIKE = "invoice:8:send"
LOOKALIKE_ZW = f"invoice:{ZWSP}8:send"
LONG_TASK = "task-" + "0123456789abcdef" * 15 + "t" * 10  # 255 characters, no spaces
LONG_REASON = "E" * 3900  # no spaces
SIXTY_K = "0123456789abcdef" * 3750
HEBREW_OPERATOR = "\u05d0\u05d5\u05e8\u05d9"  # a username in a right-to-left script
HOSTILE_TOOL = f"notify{RLO}{ZWSP}_" + "t" * 200  # a tool name a policy allows
#: The widest values that still keep to one line in a table cell, in every column of one row.
WIDE = "wide wide wide w"
AGENT = Actor.agent(f"agent{RLO}evil")

#: Everything a page's text may not contain: bidi controls and isolates,
#: zero-width characters, the BOM.
INVISIBLE = r"[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]"

MEASURE = (
    """() => {
  const text = document.body.textContent;
  const invisible = [...text.matchAll(/"""
    + INVISIBLE
    + """/g)].map(m => "U+" + m[0].codePointAt(0).toString(16).toUpperCase());
  const markers = [...document.querySelectorAll(".cp")];
  return {
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    invisible: invisible,
    markers: markers.map(m => m.textContent),
    markersOutsideBdi: markers.filter(m => !m.closest("bdi")).length,
  };
}"""
)


@dataclass
class Hostile:
    rlo: Attempt
    lookalike: Attempt
    lookalike_zw: Attempt
    long_task: Attempt
    huge: Attempt
    reused: Attempt  # a linked attempt with other arguments (an agent reused the key)
    narrowed: Attempt  # a linked attempt the reconciler made after the policy narrowed the scope
    drill: DrillRun


def keyed_before_the_rule(stand_in: str, key: str) -> None:
    """Give the attempts of ``stand_in`` the key ``key``, as the ledger held
    keys recorded before it refused invisible and bidi characters in them:
    such rows stay, and the pages must still show them safely."""
    Attempt.objects.filter(idempotency_key=stand_in).update(idempotency_key=key, provider_key=key)


def unknown(attempt: Attempt, reason: str = "timeout") -> Attempt:
    attempt = recording.mark_dispatched(attempt, actor=AGENT)
    return recording.mark_unknown(attempt, reason=reason, actor=AGENT)


@pytest.fixture
def hostile(tenant_a: Tenant, operator_a: Any, make_user: Any) -> Hostile:
    hebrew = make_user(HEBREW_OPERATOR)
    Membership.objects.create(user=hebrew, tenant=tenant_a, role="operator")
    policy_publish(
        tenant=tenant_a,
        tools={**TOOLS_V1, HOSTILE_TOOL: ["email:send"], WIDE: ["email:send"]},
        actor=Actor.system("tests"),
        note="v2",
    )
    unknown(record(tenant_a, "hostile-tool", tool_name=HOSTILE_TOOL))
    wide = recording.mark_dispatched(record(tenant_a, "key key key key!", tool_name=WIDE, task_id=WIDE), actor=AGENT)
    wide = recording.record_request_id(wide, "req req req req!", actor=AGENT)
    unknown_wide = recording.mark_unknown(wide, reason=WIDE, actor=AGENT)
    assert unknown_wide.provider_request_id == "req req req req!"
    rlo = unknown(record(tenant_a, "rlo", args={"memo": f"pay{RLO}{ZWSP}now", "to": "ap@example.com"}), LONG_REASON)
    keyed_before_the_rule("rlo", RLO_KEY)
    rlo.refresh_from_db()
    moves.attempt_assign(attempt=rlo, owner=hebrew, actor=Actor.user(operator_a), reason=f"yours{RLO}")
    moves.attempt_comment(attempt=rlo, actor=Actor.user(operator_a), text=f"looked{RLO} at it " + "c" * 600)
    lookalike = unknown(record(tenant_a, LOOKALIKE))
    lookalike_zw = unknown(record(tenant_a, "lookalike-zw"))
    keyed_before_the_rule("lookalike-zw", LOOKALIKE_ZW)
    lookalike_zw.refresh_from_db()
    long_task = unknown(record(tenant_a, "long-task", task_id=LONG_TASK))
    huge = unknown(record(tenant_a, "huge-argument", args={"body": SIXTY_K}))

    record(tenant_a, "reuse-key", args={"to": "a@example.com"})
    with pytest.raises(IdempotencyConflict) as conflict:
        record(tenant_a, "reuse-key", args={"to": f"b{ZWSP}@example.com", "blob": "z" * 5000})
    keyed_before_the_rule("reuse-key", f"reuse{RLO}key")
    reused = conflict.value.attempt

    # The reconciler finds nothing at the provider after the scope was narrowed.
    charge = unknown(
        record(
            tenant_a,
            "charge-9",
            tool_name="charge_card",
            credential_scope=["payments:charge", "payments:refund"],
            args={"amount": 7, "note": "n" * 3000},
        )
    )
    policy_publish(
        tenant=tenant_a,
        tools={**TOOLS_V1, "charge_card": ["payments:charge"]},
        actor=Actor.system("security"),
        note="no refunds",
    )
    _, narrowed = moves.attempt_escalate_for_retry(
        attempt=charge,
        actor=RECONCILER,
        fence=charge.fence,
        changes=["scope payments:refund is no longer allowed"],
        lookup={"status": "not_found"},
    )
    assert narrowed is not None
    keyed_before_the_rule("charge-9", f"charge{ZWSP}:9")

    drill = DrillRun.objects.create(tenant=tenant_a, database="postgresql", ok=False, cases_total=1, cases_failed=1)
    drill.report = {
        "cases": [
            {
                "id": "001-B",
                "title": "killed after the request left",
                "tool": "send_email",
                "idempotent": True,
                "crash_point": "after_send",
                "key": RLO_KEY,
                "ok": False,
                "at_provider": f"{RLO_KEY} performed 2 times",
                "in_ledger": LONG_REASON,
                "steps": [{"step": f"worker{RLO} runs the task", "crashed_at": "after_send", "killed_pid": 7}],
                "assertions": [{"name": "nothing performed twice", "held": False, "evidence": LONG_REASON}],
                "attempts": [
                    {
                        "id": rlo.pk,
                        "parent_id": None,
                        "state": rlo.state,
                        "args_hash": rlo.args_hash,
                        "provider_request_id": f"req{RLO}" + "q" * 250,
                        "credential_scope": "",
                        "policy_version": 1,
                        "dispatch_count": 1,
                    }
                ],
                "events": [
                    {
                        "seq": 1,
                        "attempt_id": rlo.pk,
                        "kind": "transition",
                        "from": "",
                        "to": "UNKNOWN",
                        "actor": f"agent{RLO}evil",
                        "reason": LONG_REASON,
                        "lookup": None,
                        "at": "2026-01-01T00:00:00+00:00",
                    }
                ],
            }
        ]
    }
    drill.save(update_fields=["report"])
    return Hostile(rlo, lookalike, lookalike_zw, long_task, huge, reused, narrowed, drill)


def look(person: Any, path: str, name: str, *, markers: bool = True) -> dict[str, Any]:
    """Open ``path``, check it fits the window and shows no invisible
    character as such, save a screenshot; return the measurements."""
    response = person.page.goto(person.base_url + path)
    assert response is not None
    assert response.status == 200, path
    measured = person.page.evaluate(MEASURE)
    person.shot(f"hostile-{name}")
    assert measured["scrollWidth"] <= measured["innerWidth"], f"{path} is {measured['scrollWidth']} px wide"
    assert measured["invisible"] == [], f"{path} shows invisible characters as they are"
    assert measured["markersOutsideBdi"] == 0, path
    if markers:
        assert measured["markers"], f"{path} marks no hidden character"
    return measured


def test_hostile_strings_keep_every_page_in_shape(people: Any, hostile: Hostile) -> None:  # noqa: F811
    from playwright.sync_api import expect

    operator = people("operator-a")
    page = operator.page
    page.set_viewport_size({"width": WIDTH, "height": 900})

    queue = look(operator, "/queues/unknown/?sort=newest", "queue")
    assert {"U+202E", "U+200B"} <= set(queue["markers"])
    # The two keys that looked identical no longer do.
    plain = page.locator(f"#row-{hostile.lookalike.pk} td.key").inner_text()
    sneaky = page.locator(f"#row-{hostile.lookalike_zw.pk} td.key").inner_text()
    assert plain != sneaky
    assert "U+200B" in sneaky
    # The 255-character task id is cut in its cell; the whole of it is on hover.
    task_cell = page.locator(f"#row-{hostile.long_task.pk} td.task")
    expect(task_cell).to_contain_text("more characters")
    assert task_cell.locator("bdi").get_attribute("title") == LONG_TASK

    look(operator, "/queues/review/", "review-queue")
    search = look(operator, "/attempts/?q=" + "refund%3A%E2%80%AE7002%3Adnes", "search")
    assert "U+202E" in search["markers"]
    expect(page.locator(f"#row-{hostile.rlo.pk}")).to_be_visible()

    # The attempt's page: the key's override stays inside the key.
    look(operator, f"/attempts/{hostile.rlo.pk}/", "detail")
    sub = page.locator("p.sub")
    key = sub.locator("code.key").bounding_box()
    owner = sub.locator(".owner").bounding_box()
    report = sub.get_by_role("link", name="this attempt").bounding_box()
    whole = sub.get_by_role("link", name="every attempt at this side effect").bounding_box()
    assert key is not None
    assert owner is not None
    assert report is not None
    assert whole is not None
    assert abs(key["y"] - report["y"]) < 12, "the header line should fit on one line at 1440 px"
    assert key["x"] + key["width"] <= owner["x"] <= report["x"] < whole["x"]
    # ... and the key reads in its own order: "refund:", the marker, then "7002:dnes".
    order = page.evaluate(
        """() => {
      const bdi = document.querySelector("p.sub code.key bdi");
      const left = node => {
        const range = document.createRange();
        range.selectNodeContents(node);
        return range.getBoundingClientRect().left;
      };
      return [...bdi.childNodes].map(left);
    }"""
    )
    assert order == sorted(order)
    expect(page.locator(".timeline")).to_contain_text(f"owner: oncall-a → {HEBREW_OPERATOR}")
    reason = page.locator(".timeline .reason", has_text="EEEE").first
    assert reason.bounding_box()["width"] <= WIDTH  # type: ignore[index]

    # A linked attempt an agent made by reusing its key, and the diff from its parent.
    look(operator, f"/attempts/{hostile.reused.pk}/", "diff")
    expect(page.locator("table.diff")).to_contain_text("argument blob")
    expect(page.locator(".approval")).to_contain_text("reused the idempotency key with other arguments")
    parent_page = look(operator, f"/attempts/{hostile.reused.parent_id}/", "diff-from-parent")
    assert "U+200B" in parent_page["markers"]

    # The reconciler's linked attempt: both scopes shown as they are, and who made it.
    look(operator, f"/attempts/{hostile.narrowed.pk}/", "narrowed-retry")
    scope_row = page.locator("table.diff tr", has_text="credential scope")
    expect(scope_row).to_contain_text("payments:charge payments:refund")
    expect(scope_row.locator("td.after")).to_have_text("payments:charge")
    expect(page.locator(".approval")).to_contain_text("the reconciler (reconciler-test): the authority changed")

    # Bulk assignment's preview of the hostile rows.
    page.goto(operator.base_url + "/queues/unknown/")
    for attempt in (hostile.rlo, hostile.lookalike_zw, hostile.long_task):
        page.get_by_label(f"Select #{attempt.pk}", exact=True).check()
    page.get_by_role("button", name="Preview assignment").click()
    expect(page.locator("#preview")).to_contain_text("Preview: what this assignment will touch")
    measured = page.evaluate(MEASURE)
    operator.shot("hostile-bulk-preview")
    assert measured["scrollWidth"] <= measured["innerWidth"]
    assert measured["invisible"] == []

    # The approvals queue (the hostile linked attempts wait there), the
    # overview, and a bulk decision's preview of the hostile rows.
    look(operator, "/approvals/", "approvals-queue")
    look(operator, "/", "overview", markers=False)
    page.goto(operator.base_url + "/queues/unknown/")
    for attempt in (hostile.rlo, hostile.lookalike_zw, hostile.long_task):
        page.get_by_label(f"Select #{attempt.pk}", exact=True).check()
    page.get_by_role("button", name="Preview re-check").click()
    expect(page.locator("#preview")).to_contain_text("will touch")
    measured = page.evaluate(MEASURE)
    operator.shot("hostile-bulk-recheck-preview")
    assert measured["scrollWidth"] <= measured["innerWidth"]
    assert measured["invisible"] == []

    look(operator, f"/drills/{hostile.drill.pk}/", "drill")
    look(operator, "/drills/", "drills", markers=False)

    # The audit reports, as HTML.
    look(operator, f"/attempts/{hostile.rlo.pk}/report/", "report")
    look(operator, f"/attempts/{hostile.reused.pk}/incident/", "incident-report")
    look(operator, f"/drills/{hostile.drill.pk}/report/", "drill-report")
    huge = look(operator, f"/attempts/{hostile.huge.pk}/report/", "huge-report", markers=False)
    assert huge["scrollWidth"] <= WIDTH


def test_the_pdf_of_a_60000_character_argument_answers_in_a_few_pages(
    people: Any,  # noqa: F811
    hostile: Hostile,
) -> None:
    audit_views.preload_pdf_renderer()  # as a worker does when it starts (ledgerdash/wsgi.py)
    operator = people("operator-a")
    for attempt, name in ((hostile.huge, "report.pdf"), (hostile.rlo, "report.pdf"), (hostile.reused, "incident.pdf")):
        started = time.monotonic()
        response = operator.page.request.get(f"{operator.base_url}/attempts/{attempt.pk}/{name}", timeout=60_000)
        print(f"#{attempt.pk} {name} took {time.monotonic() - started:.2f} s")
        assert response.status == 200
        assert response.headers["content-type"] == "application/pdf"
        assert response.body().startswith(b"%PDF-")
        assert pdf_pages(response.body()) <= 3, f"#{attempt.pk} {name}"
    drill = operator.page.request.get(f"{operator.base_url}/drills/{hostile.drill.pk}/report.pdf", timeout=60_000)
    assert drill.status == 200


def test_the_login_and_error_pages_look_like_the_app(
    browser: Any,  # noqa: F811
    live_server: Any,
    operator_a: Any,
    viewer_a: Any,
) -> None:
    from django.test import RequestFactory
    from playwright.sync_api import expect

    from ledgerdash.ops import errorpages as errors
    from tests.test_browser import Person

    # Logged out: the log-in page, then a refused log-in.
    visitor = Person(browser, live_server.url)
    page = visitor.page
    page.set_viewport_size({"width": WIDTH, "height": 900})
    page.goto(live_server.url + "/queues/unknown/")
    page.wait_for_url("**/login/?next=/queues/unknown/")
    expect(page.get_by_role("heading", name="Log in to ledgerdash")).to_be_visible()
    expect(page.locator(".login-note")).to_have_text("Log in to open that page.")
    visitor.shot("login")
    page.get_by_label("Username").fill("operator-a")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Please enter a correct username and password")
    visitor.shot("login-refused")
    # The 500 page as a worker serves it, its stylesheet from the live server.
    body = errors.server_error(RequestFactory().get("/")).content.decode()
    page.route("**/server-error-preview/", lambda route: route.fulfill(status=500, body=body, content_type="text/html"))
    page.goto(live_server.url + "/server-error-preview/")
    expect(page.get_by_role("heading", name="Something went wrong")).to_be_visible()
    assert page.evaluate("getComputedStyle(document.querySelector('.error-page')).borderTopStyle") == "solid"
    visitor.shot("error-500")
    visitor.close()

    viewer = Person(browser, live_server.url)
    viewer.log_in("viewer-a")
    viewer.page.set_viewport_size({"width": WIDTH, "height": 900})
    assert viewer.page.goto(live_server.url + "/attempts/999999/").status == 404  # type: ignore[union-attr]
    expect(viewer.page.get_by_role("heading", name="Not found")).to_be_visible()
    viewer.shot("error-404")
    assert viewer.page.goto(live_server.url + "/attempts/assign/?ids=1&owner=1").status == 403  # type: ignore[union-attr]
    expect(viewer.page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(viewer.page.locator(".error-page")).to_contain_text("assigning work needs the operator role")
    viewer.shot("error-403")
    problems = [p for p in visitor.problems + viewer.problems if "status of 40" not in p and "status of 500" not in p]
    viewer.close()
    assert problems == []

"""Audit reports people read and print: one attempt, an incident (its
linked chain), a crash-drill run; as HTML with a print layout and as PDF.
And the overview's chain badge."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.errors import ApprovalRefused
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, DrillRun, State, Tenant
from tests import tamper
from tests.conftest import as_user, ledger_snapshot, record
from tests.factories import attempt_in, linked_retry

HOME = reverse("reviews:home")


@pytest.fixture
def incident(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> tuple[Attempt, Attempt]:
    """A linked retry refused once (the approver said nothing about the
    original's risk), then approved with the reason."""
    retry = linked_retry(tenant_a, operator_a, lookup="unavailable")
    with pytest.raises(ApprovalRefused):
        moves.retry_approve(
            attempt=retry,
            actor=Actor.user(approver_a),
            comment="looks fine",
        )
    moves.retry_approve(
        attempt=retry,
        actor=Actor.user(approver_a),
        comment="<b>customer confirmed</b>",
        safe_because="the provider's support says it never arrived",
    )
    retry.refresh_from_db()
    assert retry.parent is not None
    return retry.parent, retry


def urls(pk: int) -> list[str]:
    return [
        reverse(name, args=[pk])
        for name in (
            "reviews:attempt_report",
            "reviews:attempt_report_pdf",
            "reviews:side_effect_report",
            "reviews:side_effect_report_pdf",
        )
    ]


def test_the_attempt_report_has_facts_decisions_and_timeline(incident: tuple[Attempt, Attempt], viewer_a: Any) -> None:
    original, retry = incident
    page = as_user(viewer_a).get(reverse("reviews:attempt_report", args=[retry.pk])).content.decode()
    assert f'Attempt #{retry.pk}: <bdi class="u">send_email</bdi>' in page
    assert retry.args_hash in page
    assert "Approvals, refusals and other decisions by people" in page
    assert "Refused because:" in page
    assert "record why it is safe to approve anyway" in page
    assert "retry approved by approver-a" in page
    assert "&lt;b&gt;customer confirmed&lt;/b&gt;" in page  # people's text is escaped
    assert "<b>customer" not in page
    for event in AttemptEvent.objects.filter(attempt=retry):
        assert event.hash in page
    assert f"#{original.pk}" in page  # the linked chain
    assert 'href="/static/ledgerdash/report.css"' in page
    assert "<script" not in page


def test_the_side_effect_report_has_every_attempt_of_the_chain_on_one_timeline(
    incident: tuple[Attempt, Attempt], viewer_a: Any
) -> None:
    original, retry = incident
    page = as_user(viewer_a).get(reverse("reviews:side_effect_report", args=[original.pk])).content.decode()
    assert "Side effect: 2 attempts at" in page
    assert f'id="facts-{original.pk}"' in page
    assert f'id="facts-{retry.pk}"' in page
    events = AttemptEvent.objects.filter(attempt__in=[original, retry]).order_by("seq")
    timeline = page.split('id="timeline-h"')[1]
    positions = [timeline.index(e.hash) for e in events]
    assert positions == sorted(positions)  # chain order across both attempts
    assert "superseded by approved linked retry" in page


def test_an_attempt_page_names_the_side_effects_report_for_what_it_is(
    incident: tuple[Attempt, Attempt], viewer_a: Any
) -> None:
    """No "incident" where there is none: the report over the linked chain is named for what it holds, and
    its earlier address (bookmarks, links in mail) leads there."""
    original, _retry = incident
    client = as_user(viewer_a)
    page = client.get(reverse("reviews:attempt", args=[original.pk])).content.decode()
    report = reverse("reviews:side_effect_report", args=[original.pk])
    header = page.split('<p class="sub">')[1].split("</p>")[0]
    assert f'<a href="{report}">every attempt at this side effect</a>' in header
    assert "incident" not in header
    assert "incident-banner" not in page  # and the ledger opened none on it
    for old, new in ((f"/attempts/{original.pk}/incident/", report), (f"/attempts/{original.pk}/incident.pdf", None)):
        moved = client.get(old)
        assert moved.status_code == 301
        assert moved["Location"] == (new or reverse("reviews:side_effect_report_pdf", args=[original.pk]))


def test_reports_escape_attacker_controlled_arguments(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = record(tenant_a, "xss", args={"body": "<script>alert(1)</script>"})
    page = as_user(viewer_a).get(reverse("reviews:attempt_report", args=[attempt.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page


def test_the_print_stylesheet_hides_the_screen_only_parts() -> None:
    from django.contrib.staticfiles import finders

    css = open(str(finders.find("ledgerdash/report.css")), encoding="utf-8").read()  # noqa: SIM115
    assert "@media print" in css
    assert ".no-print { display: none" in css
    assert "@page" in css


@pytest.mark.slow  # renders PDFs
@pytest.mark.parametrize("which", [1, 3])
def test_the_pdf_is_a_pdf(incident: tuple[Attempt, Attempt], viewer_a: Any, which: int) -> None:
    response = as_user(viewer_a).get(urls(incident[1].pk)[which])
    assert response.status_code == 200
    assert response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"].startswith('attachment; filename="ledgerdash-')
    assert response.content.startswith(b"%PDF-")
    assert len(response.content) > 5000


def test_reports_refuse_posts(incident: tuple[Attempt, Attempt], viewer_a: Any) -> None:
    for url in urls(incident[1].pk):
        assert as_user(viewer_a).post(url).status_code == 405


def test_reports_of_another_tenants_attempt_are_404(incident: tuple[Attempt, Attempt], outsider_b: Any) -> None:
    for url in urls(incident[1].pk):
        assert as_user(outsider_b).get(url).status_code == 404


def test_reports_need_a_log_in(incident: tuple[Attempt, Attempt], client: Client) -> None:
    for url in urls(incident[1].pk):
        assert client.get(url).status_code == 302


@pytest.mark.slow  # renders PDFs
def test_reading_a_report_is_recorded_in_the_tenants_chain(
    incident: tuple[Attempt, Attempt], viewer_a: Any, tenant_a: Tenant
) -> None:
    """Reading audit data is on the record: each report delivered is an event
    naming the reader; nothing else changes."""
    retry = incident[1]
    attempts_before = ledger_snapshot()[2]
    client = as_user(viewer_a)
    for url in urls(retry.pk):
        before = AttemptEvent.objects.filter(tenant=tenant_a).count()
        assert client.get(url).status_code == 200
        (event,) = AttemptEvent.objects.filter(tenant=tenant_a, kind="report").order_by("-seq")[:1]
        assert AttemptEvent.objects.filter(tenant=tenant_a).count() == before + 1
        assert (event.attempt_id, event.actor_user_id, event.details["attempt"]) == (None, viewer_a.pk, retry.pk)
        pdf = url.endswith(".pdf")
        assert event.details["format"] == ("pdf" if pdf else "html")
        assert event.details["report"] == ("side effect" if "side-effect" in url else "attempt")
        assert event.reason.endswith("downloaded as PDF" if pdf else "viewed")
    assert ledger_snapshot()[2] == attempts_before


@pytest.mark.slow  # renders PDFs
def test_a_head_request_or_a_refused_report_records_nothing(
    incident: tuple[Attempt, Attempt], viewer_a: Any, outsider_b: Any
) -> None:
    before = ledger_snapshot()
    for url in urls(incident[1].pk):
        assert as_user(viewer_a).head(url).status_code == 200
        assert as_user(outsider_b).get(url).status_code == 404
    assert ledger_snapshot() == before


def test_the_attempt_page_links_to_its_reports(incident: tuple[Attempt, Attempt], viewer_a: Any) -> None:
    retry = incident[1]
    page = as_user(viewer_a).get(reverse("reviews:attempt", args=[retry.pk])).content.decode()
    assert reverse("reviews:attempt_report", args=[retry.pk]) in page
    assert reverse("reviews:side_effect_report", args=[retry.pk]) in page


# --- crash-drill runs -------------------------------------------------------------------------


@pytest.fixture
def drill_run(tenant_a: Tenant) -> tuple[DrillRun, Attempt]:
    run = DrillRun.objects.create(tenant=tenant_a, database="sqlite", ok=True, cases_total=1)
    key = f"drill:{run.pk}:001-B-idem"
    attempt = attempt_in(State.OUTCOME_CONFIRMED, tenant_a, key=key)
    run.report = {
        "cases": [
            {
                "id": "001-B-idem",
                "case": "B",
                "title": "killed after the request left",
                "tool": "send_email",
                "idempotent": True,
                "crash_point": "after_send",
                "key": key,
                "ok": True,
                "at_provider": f"{key} performed 1 time",
                "in_ledger": f"#{attempt.pk} INTENT_RECORDED -> DISPATCHED -> OUTCOME_CONFIRMED",
                "steps": [{"step": "worker runs the task, killed at after_send", "exit": -9}],
                "assertions": [
                    {"name": "nothing performed twice", "held": True, "evidence": f"{key}: 1 effect at the provider"}
                ],
                "provider_effects": {key: 1},
                "attempts": [
                    {
                        "id": attempt.pk,
                        "parent_id": None,
                        "state": "OUTCOME_CONFIRMED",
                        "args_hash": attempt.args_hash,
                        "provider_request_id": "req-1",
                        "policy_version": 1,
                        "credential_scope": "",
                        "dispatch_count": 1,
                    }
                ],
                "events": [
                    {
                        "seq": 1,
                        "attempt_id": attempt.pk,
                        "kind": "transition",
                        "from": "",
                        "to": "INTENT_RECORDED",
                        "actor": "agent drill",
                        "reason": "intent recorded",
                        "lookup": None,
                        "at": "2026-01-01T00:00:00+00:00",
                    }
                ],
            }
        ]
    }
    run.save(update_fields=["report"])
    return run, attempt


@pytest.mark.slow  # renders PDFs
def test_the_drill_report_shows_each_case_with_its_evidence(drill_run: tuple[DrillRun, Attempt], viewer_a: Any) -> None:
    run, attempt = drill_run
    page = as_user(viewer_a).get(reverse("reviews:drill_report", args=[run.pk])).content.decode()
    assert f"Crash drill #{run.pk}: passed" in page
    assert "killed after the request left" in page
    assert "nothing performed twice" in page
    assert f"{attempt.idempotency_key}: 1 effect at the provider" in page
    assert reverse("reviews:side_effect_report", args=[attempt.pk]) in page
    pdf = as_user(viewer_a).get(reverse("reviews:drill_report_pdf", args=[run.pk]))
    assert pdf.content.startswith(b"%PDF-")
    read = AttemptEvent.objects.filter(tenant=run.tenant, kind="report").order_by("seq")
    assert [(e.details["report"], e.details["drill_run"], e.details["format"], e.actor_user_id) for e in read] == [
        ("drill", run.pk, "html", viewer_a.pk),
        ("drill", run.pk, "pdf", viewer_a.pk),
    ]


def test_an_attempt_from_a_drill_carries_the_drill_evidence(drill_run: tuple[DrillRun, Attempt], viewer_a: Any) -> None:
    run, attempt = drill_run
    page = as_user(viewer_a).get(reverse("reviews:attempt_report", args=[attempt.pk])).content.decode()
    assert f'Crash-drill evidence: run #{run.pk}, case <bdi class="u">001-B-idem</bdi>' in page
    assert "nothing performed twice" in page


def test_another_tenants_drill_is_404_and_posts_are_refused(
    drill_run: tuple[DrillRun, Attempt], outsider_b: Any
) -> None:
    run, _ = drill_run
    for name in ("reviews:drill_report", "reviews:drill_report_pdf"):
        assert as_user(outsider_b).get(reverse(name, args=[run.pk])).status_code == 404
        assert as_user(outsider_b).post(reverse(name, args=[run.pk])).status_code == 405


# --- the overview's chain badge -------------------------------------------------------------------


@tamper.commits
def test_the_overview_shows_each_chain_as_verify_audit_left_it(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(State.OUTCOME_CONFIRMED, tenant_a, key="k")
    client = as_user(operator_a)
    assert "not verified" in client.get(HOME).content.decode()
    call_command("verify_audit")
    page = client.get(HOME).content.decode()
    assert 'class="chain-badge chain-verified" id="chain-acme"' in page
    record(tenant_a, "later")
    assert "1 event appended since" in client.get(HOME).content.decode()
    victim = AttemptEvent.objects.filter(attempt=attempt).first()
    assert victim is not None
    tamper.edit(victim.pk, reason="forged")
    with pytest.raises(CommandError, match="do not verify"):
        call_command("verify_audit")
    page = client.get(HOME).content.decode()
    assert 'class="chain-badge chain-broken" id="chain-acme"' in page
    assert f"tenant acme seq {victim.seq} (event id {victim.pk}) was edited" in page


def test_without_weasyprint_the_pdf_says_so(incident: tuple[Attempt, Attempt], viewer_a: Any, monkeypatch: Any) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "weasyprint", None)  # as if it could not be imported
    response = as_user(viewer_a).get(reverse("reviews:attempt_report_pdf", args=[incident[1].pk]))
    assert response.status_code == 503
    assert b"print the HTML report instead" in response.content

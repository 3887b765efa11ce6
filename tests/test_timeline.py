"""The attempt page's timeline: repeated checks fold into one row, long
histories come in pages, and the audit report still lists every event."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from reviews import timeline
from tests.conftest import as_user
from tests.factories import attempt_in

HTMX = {"HX-Request": "true"}
RECONCILER = Actor.reconciler("reconciler-test")


def checked(attempt: Attempt, times: int, reason: str = "provider unavailable: timeout") -> Attempt:
    for _ in range(times):
        attempt = moves.attempt_check_later(
            attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason=reason, lookup={"status": "unavailable"}
        )
    return attempt


def page_of(client: Any, attempt: Attempt) -> str:
    return client.get(reverse("reviews:attempt", args=[attempt.pk])).content.decode()


def test_a_run_of_checks_folds_into_one_row_with_its_count(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = checked(attempt_in(State.UNKNOWN, tenant_a), 30)
    attempt = moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="checks exhausted")
    total = AttemptEvent.objects.filter(attempt=attempt).count()
    shown = timeline.timeline(attempt)
    folded = [row for row in shown.rows if row.folded]
    assert len(folded) == 1
    assert folded[0].count == 30
    assert folded[0].reasons == [("provider unavailable: timeout", 30)]
    assert sum(row.count for row in shown.rows) == total  # nothing is dropped, only folded
    page = as_user(viewer_a).get(reverse("reviews:attempt", args=[attempt.pk])).content.decode()
    assert page.count('class="event event-') == len(shown.rows) < total
    assert "\N{MULTIPLICATION SIGN} 30" in page
    assert "UNKNOWN → MANUAL_REVIEW" in page.replace("&nbsp;", " ")  # what ended the run is its own row


def test_a_state_change_is_never_folded_and_reasons_are_counted(tenant_a: Tenant) -> None:
    attempt = attempt_in(State.UNKNOWN, tenant_a)
    attempt = checked(attempt, 3, "timeout")
    attempt = checked(attempt, 2, "connection refused")
    rows = timeline.timeline(attempt).rows
    moves_made = [(row.event.from_state, row.event.to_state) for row in rows if not row.folded]
    assert ("DISPATCHED", "UNKNOWN") in moves_made
    (run,) = [row for row in rows if row.folded]
    assert run.count == 5
    assert run.reasons == [("timeout", 3), ("connection refused", 2)]
    assert run.first is not None
    assert run.first.seq < run.event.seq


def test_a_long_history_comes_in_pages_and_the_report_keeps_every_event(
    tenant_a: Tenant, operator_a: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timeline, "PAGE_SIZE", 5)
    attempt = attempt_in(State.UNKNOWN, tenant_a)
    for n in range(7):  # comments between checks: nothing to fold, every one a row
        moves.attempt_comment(attempt=attempt, actor=Actor.user(operator_a), text=f"note {n}")
        attempt = checked(Attempt.objects.get(pk=attempt.pk), 1)
    rows = timeline.timeline(attempt)
    assert rows.page.paginator.num_pages > 1
    assert len(rows.rows) == 5
    client = as_user(operator_a)
    first = page_of(client, attempt)
    assert "note 0" in first
    assert "Later</a>" in first
    # The pager swaps only the timeline under htmx.
    later = client.get(
        reverse("reviews:attempt", args=[attempt.pk]), {"events": "2"}, headers={**HTMX, "HX-Target": "timeline"}
    ).content.decode()
    assert later.lstrip().startswith('<div id="timeline"')
    assert "<html" not in later
    # A page past the end or not a number reads as the nearest page, never an error.
    for bad in ["999", "x", "-1"]:
        assert client.get(reverse("reviews:attempt", args=[attempt.pk]), {"events": bad}).status_code == 200
    report = client.get(reverse("reviews:attempt_report", args=[attempt.pk])).content.decode()
    for n in range(7):
        assert f"note {n}" in report


def test_the_page_reads_a_fixed_number_of_queries_however_long_the_history(tenant_a: Tenant, viewer_a: Any) -> None:
    short = checked(attempt_in(State.UNKNOWN, tenant_a, key="short"), 2)
    long = checked(attempt_in(State.UNKNOWN, tenant_a, key="long"), 120)
    client = as_user(viewer_a)
    client.get(reverse("reviews:attempt", args=[short.pk]))  # the login and caches, once
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("reviews:attempt", args=[short.pk]))
    with CaptureQueriesContext(connection) as many:
        response = client.get(reverse("reviews:attempt", args=[long.pk]))
    assert response.status_code == 200
    assert len(many.captured_queries) == len(few.captured_queries)
    assert len(response.content) < 60_000

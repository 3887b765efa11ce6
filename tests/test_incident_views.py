"""Incidents in the dashboard, and giving up an intent nobody sent."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.errors import RequestIdTaken
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, FailedBecause, Incident, State, Tenant
from tests.conftest import AGENT, RECONCILER, as_user, record
from tests.factories import an_hour_ago

S = State


@pytest.fixture
def duplicate(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> Incident:
    """The original's request landed after its approved retry went out too."""
    with an_hour_ago():
        dispatched = recording.mark_dispatched(record(tenant_a, "k-dup", tool_name="charge_card"), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    moves.attempt_escalate(
        attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="x", lookup={"status": "not_found"}
    )
    retry = moves.retry_request(attempt=dispatched, actor=Actor.user(operator_a), reason="resend")
    approved = moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok")
    sent = moves.attempt_dispatch(attempt=approved, actor=RECONCILER, fence=approved.fence)
    moves.attempt_confirm(attempt=sent, fence=sent.fence, actor=RECONCILER, provider_request_id="req-2")
    recording.confirm(dispatched, provider_request_id="req-1", actor=AGENT)
    return Incident.objects.get(attempt_id=dispatched.pk)


def test_the_overview_and_the_navigation_count_open_incidents(duplicate: Incident, viewer_a: Any) -> None:
    page = as_user(viewer_a).get(reverse("reviews:home")).content.decode()
    assert 'id="count-incidents">1<' in page
    assert "Open incidents" in page


def test_the_incident_list_and_page_show_what_happened(duplicate: Incident, viewer_a: Any) -> None:
    listing = as_user(viewer_a).get(reverse("reviews:incidents")).content.decode()
    assert f"#{duplicate.pk}" in listing
    assert "duplicate effect" in listing
    page = as_user(viewer_a).get(reverse("reviews:incident", args=[duplicate.pk])).content.decode()
    assert "may have happened twice" in page
    assert "req-1" in page  # the late report's receipt, as evidence
    assert "Acting on an incident needs the operator role." in page
    attempt_page = as_user(viewer_a).get(reverse("reviews:attempt", args=[duplicate.attempt_id])).content.decode()
    assert f"Incident #{duplicate.pk}" in attempt_page


def test_another_tenants_incident_is_a_404(duplicate: Incident, outsider_b: Any) -> None:
    client = as_user(outsider_b)
    assert client.get(reverse("reviews:incident", args=[duplicate.pk])).status_code == 404
    response = client.post(reverse("reviews:incident_resolve", args=[duplicate.pk]), {"resolution": "x", "fence": 0})
    assert response.status_code == 404
    assert f"#{duplicate.pk}" not in client.get(reverse("reviews:incidents")).content.decode()


def test_a_viewer_cannot_resolve_or_claim(duplicate: Incident, viewer_a: Any) -> None:
    client = as_user(viewer_a)
    url = reverse("reviews:incident_resolve", args=[duplicate.pk])
    assert client.post(url, {"resolution": "x", "fence": duplicate.fence}).status_code == 403
    assert client.post(reverse("reviews:incident_claim", args=[duplicate.pk]), {"owner_seen": ""}).status_code == 403
    assert client.get(url).status_code == 405


def test_an_operator_claims_then_resolves_an_incident_saying_what_was_done(
    duplicate: Incident, operator_a: Any
) -> None:
    client = as_user(operator_a)
    claimed = client.post(
        reverse("reviews:incident_claim", args=[duplicate.pk]), {"owner_seen": duplicate.owner_id or ""}
    )
    assert claimed.status_code == 303
    duplicate.refresh_from_db()
    assert duplicate.owner_id == operator_a.pk
    resolved = client.post(
        reverse("reviews:incident_resolve", args=[duplicate.pk]),
        {"resolution": "refunded the second charge", "fence": duplicate.fence},
        follow=True,
    )
    assert "is resolved" in resolved.content.decode()
    duplicate.refresh_from_db()
    assert (duplicate.status, duplicate.resolved_by_id, duplicate.resolution) == (
        "resolved",
        operator_a.pk,
        "refunded the second charge",
    )
    actions = list(
        AttemptEvent.objects.filter(attempt_id=duplicate.attempt_id, kind="incident").values_list(
            "details__action", flat=True
        )
    )
    assert actions == ["opened", "assigned", "resolved"]


def test_resolving_from_a_stale_page_is_refused(duplicate: Incident, operator_a: Any) -> None:
    seen = duplicate.fence
    moves.incident_assign(incident=duplicate, owner=operator_a, actor=Actor.user(operator_a))
    response = as_user(operator_a).post(
        reverse("reviews:incident_resolve", args=[duplicate.pk]), {"resolution": "done", "fence": seen}, follow=True
    )
    assert "changed since you loaded it" in response.content.decode()
    assert Incident.objects.get(pk=duplicate.pk).status == "open"


def test_an_operator_abandons_an_intent_nobody_sent(tenant_a: Tenant, operator_a: Any, viewer_a: Any) -> None:
    attempt = record(tenant_a, "k-stale")
    url = reverse("reviews:abandon", args=[attempt.pk])
    page = as_user(operator_a).get(reverse("reviews:attempt", args=[attempt.pk])).content.decode()
    assert "Abandon intent" in page
    assert as_user(viewer_a).post(url, {"reason": "x", "fence": attempt.fence}).status_code == 403
    response = as_user(operator_a).post(url, {"reason": "the agent was retired", "fence": attempt.fence}, follow=True)
    assert "was given up before it was sent" in response.content.decode()
    attempt = Attempt.objects.get(pk=attempt.pk)
    assert (attempt.state, attempt.failed_because) == (S.FAILED, FailedBecause.ABANDONED)
    assert "Abandon intent" not in response.content.decode()


def test_an_incident_over_another_side_effects_id_shows_the_report_it_kept(tenant_a: Tenant, viewer_a: Any) -> None:
    holder = recording.mark_dispatched(record(tenant_a, "k-holder"), actor=AGENT)
    recording.confirm(holder, provider_request_id="SM-9", actor=AGENT)
    attempt = recording.mark_dispatched(record(tenant_a, "k-other", args={"n": 2}), actor=AGENT)
    with pytest.raises(RequestIdTaken):
        recording.confirm(attempt, provider_request_id="SM-9", actor=AGENT)
    incident = Incident.objects.get(attempt=attempt)

    page = as_user(viewer_a).get(reverse("reviews:incident", args=[incident.pk])).content.decode()

    assert "event-request_id_taken" in page
    assert "kept as evidence, not applied" in page
    assert f"#{holder.pk}" in page

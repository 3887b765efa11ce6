"""When a provider's "not found" proves a request did not land.

A tool may prepare before it sends, and a provider may act up to the
maximum request time after it receives a request: so "not found" counts
only once the latest moment the request could have left (the dispatcher's
last sign of life, or the end of its lease while it is silent) plus the
maximum request time has passed, and only for a lookup *asked* after that.
The reconciler, the original's standing (the approvals page and the
approval check) all follow ``ledgerdash.ledger.landing``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledgerdash.ledger import clock, moves, recording, rules
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, Incident, State, Tenant, Tool
from ledgerdash.ledger.reconciler import Reconciler
from tests import scripted_provider
from tests.conftest import AGENT, record

S = State
CHARGE = {"card": "tok_1", "amount_cents": 4200}


@pytest.fixture
def slow_charge(tenant_a: Tenant) -> Iterator[Tool]:
    """charge_card: not idempotent, acts up to 6 s after it receives a request, a 9 s lease."""
    scripted_provider.reset()
    yield Tool.objects.create(
        name="charge_card",
        adapter=Tool.Adapter.PYTHON,
        config={"class": "tests.scripted_provider.Scripted"},
        idempotent=False,
        max_request_seconds=6,
        dispatch_lease_seconds=9,
    )
    scripted_provider.reset()


def at(moment: datetime) -> Any:
    return clock.frozen_at(moment)


def charge(tenant: Tenant, t0: datetime) -> Attempt:
    with at(t0):
        attempt = record(tenant, "charge:1", tool_name="charge_card", args=CHARGE)
        return recording.mark_dispatched(attempt, actor=AGENT)


def landed(attempt: Attempt) -> None:
    """The provider acted on the attempt's request."""
    scripted_provider.EFFECTS[attempt.provider_key] = ("ch_1", normalize_args(CHARGE)[1])


def test_a_not_found_counts_only_after_the_unknown_report_plus_the_request_time(
    tenant_a: Tenant, slow_charge: Tool
) -> None:
    # Claimed at 0, prepares 1.5 s, sends; the connection drops and the wrapper reports UNKNOWN at 2 s.
    t0 = timezone.now()
    dispatched = charge(tenant_a, t0)
    with at(t0 + timedelta(seconds=2)):
        unknown = recording.mark_unknown(dispatched, reason="connection reset", actor=AGENT)
    assert unknown.lands_by == t0 + timedelta(seconds=8)

    # 6.1 s: past the claim plus the request time, but the request (received by 2 s) may land until 8 s.
    with at(t0 + timedelta(seconds=6.1)):
        Reconciler(label="r").run_pass()
    waiting = Attempt.objects.get(pk=unknown.pk)
    assert waiting.state == S.UNKNOWN
    assert "may still land" in waiting.last_note
    assert rules.original_standing(waiting, now=t0 + timedelta(seconds=6.1)).proof is None

    # The provider acts 5.4 s after receiving it at 1.5 s; the next lookup, after 8 s, finds it.
    landed(unknown)
    with at(t0 + timedelta(seconds=8.1)):
        Reconciler(label="r").run_pass()
    assert Attempt.objects.get(pk=unknown.pk).state == S.OUTCOME_CONFIRMED


def test_a_silent_dispatcher_may_send_until_its_lease_ends(tenant_a: Tenant, slow_charge: Tool) -> None:
    t0 = timezone.now()
    dispatched = charge(tenant_a, t0)
    assert dispatched.lands_by == t0 + timedelta(seconds=9 + 6)
    # The lease ends at 9 s; a lookup then finds nothing, which proves nothing until 15 s.
    with at(t0 + timedelta(seconds=9.5)):
        Reconciler(label="r").run_pass()
    waiting = Attempt.objects.get(pk=dispatched.pk)
    assert (waiting.state, waiting.last_lookup) == (S.UNKNOWN, "not_found")
    assert waiting.next_check_at > t0 + timedelta(seconds=15)
    with at(t0 + timedelta(seconds=15.5)):
        Reconciler(label="r").run_pass()
    settled = Attempt.objects.get(pk=dispatched.pk)
    assert settled.state == S.MANUAL_REVIEW  # not idempotent: a person decides, now on the provider's word
    assert rules.original_standing(settled, now=t0 + timedelta(seconds=15.5)).proof is not None


def test_a_heartbeat_moves_the_landing_time_to_the_end_of_the_new_lease(tenant_a: Tenant, slow_charge: Tool) -> None:
    t0 = timezone.now()
    dispatched = charge(tenant_a, t0)
    with at(t0 + timedelta(seconds=8)):
        beaten = recording.heartbeat(dispatched, actor=AGENT)
    assert beaten.next_check_at == t0 + timedelta(seconds=17)
    assert beaten.lands_by == t0 + timedelta(seconds=17 + 6)


def test_a_lookup_counts_from_when_it_was_asked_not_when_it_answered(tenant_a: Tenant, slow_charge: Tool) -> None:
    t0 = timezone.now()
    dispatched = charge(tenant_a, t0)
    with at(t0 + timedelta(seconds=1)):
        unknown = recording.mark_unknown(dispatched, reason="connection reset", actor=AGENT)
    assert unknown.lands_by == t0 + timedelta(seconds=7)
    now = [t0 + timedelta(seconds=6)]

    def slow_answer() -> None:
        now[0] += timedelta(seconds=3)  # asked at 6 s, answered at 9 s

    scripted_provider.DURING_LOOKUP.append(slow_answer)
    with clock.driven_by(lambda: now[0], random.Random(1)):
        Reconciler(label="r").run_pass()
    looked = Attempt.objects.get(pk=unknown.pk)
    assert looked.state == S.UNKNOWN
    assert looked.last_lookup_at == t0 + timedelta(seconds=6)
    assert not rules.original_standing(looked, now=now[0]).proof


def test_a_late_unknown_report_is_a_sign_of_life_that_pushes_the_landing_time_on(
    tenant_a: Tenant, slow_charge: Tool
) -> None:
    t0 = timezone.now()
    dispatched = charge(tenant_a, t0)
    with at(t0 + timedelta(seconds=9)):
        (claimed,) = moves.attempts_claim_due(limit=1)
        moves.attempt_expire_lease(attempt=claimed, actor=Actor.reconciler("r"), fence=claimed.fence)
    # The dispatcher was paused past its lease; it wakes at 20 s and says it cannot tell.
    with at(t0 + timedelta(seconds=20)):
        report = recording.report_outcome(dispatched, outcome="unknown", reason="timed out", actor=AGENT)
    assert report.late
    assert report.attempt.lands_by == t0 + timedelta(seconds=26)
    kinds = list(report.attempt.events.order_by("seq").values_list("kind", flat=True))
    assert kinds[-1] == "late_report"


def test_a_late_unknown_report_after_a_retry_went_out_opens_an_incident(
    tenant_a: Tenant, slow_charge: Tool, operator_a: Any, approver_a: Any
) -> None:
    t0 = timezone.now()
    dispatched = charge(tenant_a, t0)
    with at(t0 + timedelta(seconds=9.5)):
        Reconciler(label="r").run_pass()
    with at(t0 + timedelta(seconds=16)):
        Reconciler(label="r").run_pass()
    reviewed = Attempt.objects.get(pk=dispatched.pk)
    assert reviewed.state == S.MANUAL_REVIEW
    with at(t0 + timedelta(seconds=17)):
        retry = moves.retry_request(attempt=reviewed, actor=Actor.user(operator_a), reason="customer asks")
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="not found after it could land")
        sent = recording.mark_dispatched(Attempt.objects.get(pk=retry.pk), actor=Actor.reconciler("r"))
    # The original's dispatcher, paused all along, wakes and cannot tell whether its request landed.
    with at(t0 + timedelta(seconds=30)):
        report = recording.report_outcome(dispatched, outcome="unknown", reason="timed out", actor=AGENT)
    assert report.late
    incident = Incident.objects.get(attempt_id=dispatched.pk)
    assert incident.kind == Incident.Kind.DUPLICATE
    assert incident.retry_id == sent.pk


@pytest.fixture
def slow_email(tenant_a: Tenant) -> Iterator[Tool]:
    """send_email: idempotent, the scripted provider's, a 6 s maximum request time and a 9 s lease."""
    scripted_provider.reset()
    yield Tool.objects.create(
        name="send_email",
        adapter=Tool.Adapter.PYTHON,
        config={"class": "tests.scripted_provider.Scripted"},
        idempotent=True,
        max_request_seconds=6,
        dispatch_lease_seconds=9,
    )
    scripted_provider.reset()


def _sent_again_and_declined(tenant: Tenant, t0: datetime) -> tuple[Attempt, Attempt]:
    """An email whose dispatcher went silent; recovery found nothing once it could
    no longer land, sent it again with the same key, and the provider declined it."""
    with at(t0):
        first = recording.mark_dispatched(record(tenant, "mail:1"), actor=AGENT)
    scripted_provider.DECLINED.add(first.provider_key)
    with at(t0 + timedelta(seconds=9.5)):
        Reconciler(label="r").run_pass()
    with at(t0 + timedelta(seconds=16)):
        Reconciler(label="r").run_pass()
    declined = Attempt.objects.get(pk=first.pk)
    assert (declined.state, declined.dispatch_count) == (S.FAILED, 2)
    return first, declined


def test_a_receipt_from_an_earlier_dispatch_is_recorded_as_evidence_and_opens_an_incident(
    tenant_a: Tenant, slow_email: Tool
) -> None:
    t0 = timezone.now()
    first, _declined = _sent_again_and_declined(tenant_a, t0)
    # The first dispatcher, paused all along, sent late and hears back with a receipt.
    with at(t0 + timedelta(seconds=600)):
        recorded = recording.record_request_id(first, "msg-late", actor=AGENT)
    assert recorded.state == S.FAILED
    assert recorded.events.order_by("-seq").values_list("kind", flat=True)[:2][::-1] == ["late_report", "incident"]
    assert Incident.objects.get(attempt_id=first.pk).kind == Incident.Kind.CONTRADICTION


def test_an_unknown_from_an_earlier_dispatch_contradicts_the_refusal_of_a_later_one(
    tenant_a: Tenant, slow_email: Tool
) -> None:
    t0 = timezone.now()
    first, _declined = _sent_again_and_declined(tenant_a, t0)
    with at(t0 + timedelta(seconds=600)):
        report = recording.report_outcome(first, outcome="unknown", reason="timed out", actor=AGENT)
    assert report.late
    incident = Incident.objects.get(attempt_id=first.pk)
    assert "may have acted at the provider after all" in incident.summary


def test_a_refusal_of_an_earlier_dispatch_does_not_settle_an_attempt_sent_again(
    tenant_a: Tenant, slow_email: Tool
) -> None:
    Tool.objects.filter(pk=slow_email.pk).update(max_dispatches=2)
    t0 = timezone.now()
    with at(t0):
        first = recording.mark_dispatched(record(tenant_a, "mail:2"), actor=AGENT)
    # Recovery sends it again (its answer never comes), then, out of sends, hands it to people.
    for seconds in (9.5, 16, 30, 45):
        with at(t0 + timedelta(seconds=seconds)):
            Reconciler(label="r").run_pass()
    reviewed = Attempt.objects.get(pk=first.pk)
    assert (reviewed.state, reviewed.dispatch_count) == (S.MANUAL_REVIEW, 2)
    # The first dispatcher comes back: the provider declined *its* request.
    with at(t0 + timedelta(seconds=600)):
        report = recording.report_outcome(first, outcome="failed", reason="declined", actor=AGENT)
    assert report.late
    assert report.attempt.state == S.MANUAL_REVIEW  # the second request's fate is still unknown
    assert report.attempt.events.order_by("-seq").first().kind == "late_report"


def test_a_not_found_answered_after_the_provider_may_have_forgotten_the_key_is_no_proof(
    tenant_a: Tenant, slow_email: Tool
) -> None:
    Tool.objects.filter(pk=slow_email.pk).update(key_retention_seconds=60)
    t0 = timezone.now()
    with at(t0):
        dispatched = recording.mark_dispatched(record(tenant_a, "mail:3"), actor=AGENT)
    with at(t0 + timedelta(seconds=1)):
        recording.report_outcome(dispatched, outcome="unknown", reason="timed out", actor=AGENT)
    # The lookup comes back only after the provider's key retention ran out.
    with at(t0 + timedelta(seconds=120)):
        Reconciler(label="r").run_pass()
    reviewed = Attempt.objects.get(pk=dispatched.pk)
    assert (reviewed.state, reviewed.last_lookup) == (S.MANUAL_REVIEW, "past_retention")
    standing = rules.original_standing(reviewed, now=t0 + timedelta(seconds=121))
    assert standing.proof is None
    assert standing.risk is not None
    assert "past retention" in standing.risk


def test_an_unknown_after_the_dispatchers_own_refusal_settled_it_puts_the_attempt_back_before_a_person(
    tenant_a: Tenant, slow_email: Tool, operator_a: Any
) -> None:
    """The dispatcher's word settled the attempt as not happened; its later
    "cannot tell" (its SDK sent the request again) withdraws that word."""
    Tool.objects.filter(pk=slow_email.pk).update(max_dispatches=1)
    t0 = timezone.now()
    with at(t0):
        first = recording.mark_dispatched(record(tenant_a, "mail:5"), actor=AGENT)
    # Paused past its lease: nothing found once it could no longer land, no sends left: a person decides.
    for seconds in (9.5, 16):
        with at(t0 + timedelta(seconds=seconds)):
            Reconciler(label="r").run_pass()
    assert Attempt.objects.get(pk=first.pk).state == S.MANUAL_REVIEW
    # It wakes: the provider had refused its request before acting. That settles it...
    with at(t0 + timedelta(seconds=20)):
        refused = recording.report_outcome(first, outcome="failed_retryable", reason="429", actor=AGENT)
    assert (refused.attempt.state, refused.attempt.failed_because) == (S.FAILED, "provider")
    # ...until its SDK sends the request again and it reports that it cannot tell.
    with at(t0 + timedelta(seconds=25)):
        report = recording.report_outcome(first, outcome="unknown", reason="timed out", actor=AGENT)
    assert report.late
    reopened = Attempt.objects.get(pk=first.pk)
    assert reopened.state == S.MANUAL_REVIEW
    assert reopened.owner_id is not None
    assert reopened.lands_by == t0 + timedelta(seconds=25 + 6)
    incident = Incident.objects.get(attempt_id=first.pk)
    assert incident.kind == Incident.Kind.CONTRADICTION
    assert "may have acted at the provider after all" in incident.summary
    assert incident.details["people"]["owner_id"] == reopened.owner_id
    kinds = list(reopened.events.order_by("seq").values_list("kind", "to_state"))
    assert kinds[-3:] == [("transition", S.MANUAL_REVIEW), ("late_report", ""), ("incident", "")]
    # No longer settled, it is a person's again: looked up, verified, or retried with a reason.
    assert rules.moves_for(operator_a, reopened).recheck


def test_a_receipt_after_the_dispatchers_own_refusal_settled_it_puts_the_attempt_back_with_the_receipt(
    tenant_a: Tenant, slow_email: Tool
) -> None:
    t0 = timezone.now()
    with at(t0):
        first = recording.mark_dispatched(record(tenant_a, "mail:6"), actor=AGENT)
    fence = first.fence
    with at(t0 + timedelta(seconds=1)):
        recording.report_outcome(first, outcome="failed", reason="declined", fence=fence, actor=AGENT)
    with at(t0 + timedelta(seconds=30)):
        report = recording.report_outcome(
            first, outcome="confirmed", provider_request_id="msg-after-all", fence=fence, actor=AGENT
        )
    assert report.late
    reopened = Attempt.objects.get(pk=first.pk)
    assert (reopened.state, reopened.provider_request_id) == (S.MANUAL_REVIEW, "msg-after-all")
    assert Incident.objects.get(attempt_id=first.pk).kind == Incident.Kind.CONTRADICTION

"""What the ledger knows gates every send.

A request of a side effect leaves only if nothing the ledger recorded says
the side effect happened (another attempt at it confirmed, a receipt, a
dispatcher's late report of one) or could still happen (a request that may
still land, another attempt that may yet be sent): asked under the row
locks of the side effect's attempts by every path that sends. An
approval weighs the facts when it is given; facts that arrive after it win.
The scenarios here run through the real moves and reconciler against the
sandbox provider, a real process that counts what it performed.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from ledgerdash.ledger import clock, moves, recording, rules
from ledgerdash.ledger.errors import AlreadyHappened, AwaitingApproval, SideEffectInFlight
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, FailedBecause, Incident, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.notify import outbox, services
from ledgerdash.notify.models import Delivery, RuleEvent
from tests.conftest import AGENT, RECONCILER, TOOLS_V1, as_user, record
from tests.sandboxes import Sandbox

S = State
CHARGE = {"card": "tok_visa", "amount_cents": 4200}


def at(seconds: float, t0: Any) -> Any:
    return clock.frozen_at(t0 + timedelta(seconds=seconds))


def _original_acted_then_went_to_review(tenant: Tenant, sandbox: Sandbox, key: str) -> tuple[Attempt, int, str, Any]:
    """A charge (not idempotent) sent within its lease: the provider acts,
    its dispatcher is paused before it reports, lookups answer 503 until the
    checks run out, and a person takes it over. Returns the original, its
    dispatch fence, the provider's id for the effect and the start time."""
    Tool.objects.filter(name="charge_card").update(max_checks=2, max_request_seconds=2, dispatch_lease_seconds=5)
    t0 = timezone.now()
    with at(0, t0):
        original = recording.mark_dispatched(
            record(tenant, key, tool_name="charge_card", args=CHARGE, credential_scope="payments:charge"), actor=AGENT
        )
    status, body = sandbox.perform("charge_card", original.provider_key, original.args)
    assert status == 201
    sandbox.faults("charge_card", non_idempotent=True, lookup_5xx=True)
    for seconds in (6, 60, 600):
        with at(seconds, t0):
            Reconciler(label="r").run_pass()
    reviewed = Attempt.objects.get(pk=original.pk)
    assert reviewed.state == S.MANUAL_REVIEW
    assert "checks exhausted" in reviewed.last_note
    return original, original.fence, str(body["id"]), t0


def _retry_approved_over_a_risk(original: Attempt, operator: Any, approver: Any) -> Attempt:
    """An operator asks for a retry of ``original`` (under review); an approver lets it out with a reason."""
    retry = moves.retry_request(
        attempt=Attempt.objects.get(pk=original.pk), actor=Actor.user(operator), reason="customer asks"
    )
    return moves.retry_approve(
        attempt=retry, actor=Actor.user(approver), comment="resend", safe_because="the bank shows no charge"
    )


def test_a_retry_approved_before_a_late_receipt_is_not_sent_once_the_receipt_arrives(
    tenant_a: Tenant, sandbox_tools: Sandbox, operator_a: Any, approver_a: Any
) -> None:
    original, fence, receipt, t0 = _original_acted_then_went_to_review(tenant_a, sandbox_tools, "pay:1")
    with at(700, t0):
        retry = _retry_approved_over_a_risk(original, operator_a, approver_a)
    # The original's dispatcher wakes and reports the receipt it holds.
    with at(701, t0):
        report = recording.report_outcome(
            original, outcome="confirmed", provider_request_id=receipt, fence=fence, actor=AGENT
        )
    assert report.late
    # Recovery would send the approved retry next: what the ledger now knows stops it.
    with at(702, t0):
        summary = Reconciler(label="r").run_pass()
    assert summary.decisions["not_sent"] == 1
    assert sandbox_tools.count(original.provider_key) == 1
    held_back = Attempt.objects.get(pk=retry.pk)
    assert (held_back.state, held_back.failed_because) == (S.FAILED, FailedBecause.ALREADY_HAPPENED)
    assert held_back.dispatch_count == 0
    assert f"#{original.pk}'s dispatcher reported late that the provider acted ({receipt})" in held_back.last_note
    incident = Incident.objects.get(kind=Incident.Kind.NOT_SENT)
    assert (incident.attempt_id, incident.retry_id) == (original.pk, retry.pk)
    assert incident.details["retry_people"] == {
        "owner_id": held_back.owner_id,
        "requested_by_id": operator_a.pk,
        "approved_by_id": approver_a.pk,
    }
    # Its timeline says so, and the incident is on the original's.
    last = AttemptEvent.objects.filter(attempt_id=retry.pk).order_by("-seq").first()
    assert last is not None
    assert (last.to_state, last.details["acted"]) == (S.FAILED, original.pk)
    assert AttemptEvent.objects.filter(attempt_id=original.pk, kind="incident").exists()
    # Recovery run again changes nothing, and an agent calling with the key is told it happened.
    with at(703, t0):
        assert Reconciler(label="r").run_pass().changed == 0
    with pytest.raises(AlreadyHappened):
        recording.refuse_unless_dispatchable(held_back)
    # The approvals page says which approved call was not sent, why, and who decided it.
    page = as_user(approver_a).get(reverse("reviews:approvals")).content.decode()
    assert "Approved, then not sent" in page
    assert f'id="not-sent-{retry.pk}"' in page
    assert f'approved by <bdi class="u">{approver_a.get_username()}</bdi>' in page


def test_the_people_who_asked_for_and_approved_a_retry_not_sent_hear_of_it(
    tenant_a: Tenant, sandbox_tools: Sandbox, operator_a: Any, approver_a: Any
) -> None:
    for person, email in ((operator_a, "ops@example.com"), (approver_a, "approver@example.com")):
        person.email = email
        person.save(update_fields=["email"])
    admin = Actor.system("tests")
    channel = services.channel_create(
        tenant=tenant_a, name="mail", kind="email", target="oncall@example.com", actor=admin
    )
    services.rule_create(
        tenant=tenant_a, actor=admin, event=RuleEvent.RETRY_NOT_SENT, channel_id=channel.pk, audience="deciders"
    )
    original, fence, receipt, t0 = _original_acted_then_went_to_review(tenant_a, sandbox_tools, "pay:5")
    with at(700, t0):
        retry = _retry_approved_over_a_risk(original, operator_a, approver_a)
    with at(701, t0):
        recording.report_outcome(original, outcome="confirmed", provider_request_id=receipt, fence=fence, actor=AGENT)
    with at(702, t0):
        Reconciler(label="r").run_pass()
    assert outbox.collect_events() >= 1
    delivery = Delivery.objects.get(event=RuleEvent.RETRY_NOT_SENT)
    assert delivery.recipients == ["approver@example.com", "ops@example.com"]
    assert delivery.attempt_id == retry.pk
    assert f"#{retry.pk} was not sent" in delivery.payload["title"]


def test_an_agent_sending_an_approved_retry_meets_the_same_gate(
    tenant_a: Tenant, sandbox_tools: Sandbox, operator_a: Any, approver_a: Any
) -> None:
    original, fence, receipt, t0 = _original_acted_then_went_to_review(tenant_a, sandbox_tools, "pay:2")
    with at(700, t0):
        approved = _retry_approved_over_a_risk(original, operator_a, approver_a)
    with at(701, t0):
        recording.record_request_id(original, receipt, fence=fence, actor=AGENT)
    with at(702, t0), pytest.raises(AlreadyHappened) as refused:
        recording.mark_dispatched(approved, actor=AGENT)
    assert refused.value.attempt.state == S.FAILED
    assert sandbox_tools.count(original.provider_key) == 1


def test_a_retry_waits_while_a_request_of_its_side_effect_may_still_land(
    tenant_a: Tenant, sandbox_tools: Sandbox, operator_a: Any, approver_a: Any
) -> None:
    """Approved over a risk, then the original's dispatcher says it is still
    at work ("cannot tell"): its request may land for a while yet."""
    original, fence, _receipt, t0 = _original_acted_then_went_to_review(tenant_a, sandbox_tools, "pay:3")
    with at(700, t0):
        approved = _retry_approved_over_a_risk(original, operator_a, approver_a)
    with at(701, t0):
        recording.report_outcome(original, outcome="unknown", reason="still waiting", fence=fence, actor=AGENT)
    with at(702, t0), pytest.raises(SideEffectInFlight) as waits:
        recording.mark_dispatched(approved, actor=AGENT)
    assert waits.value.due == t0 + timedelta(seconds=701 + 2)
    assert Attempt.objects.get(pk=approved.pk).state == S.INTENT_RECORDED
    assert sandbox_tools.count(original.provider_key) == 1


# --- an approval is bound to what it approved -------------------------------------------------------


PAY = {"charge_card": "amount_cents > `100`"}


@pytest.fixture
def pay(sandbox_tools: Sandbox) -> Any:
    """An agent's charge_card through the sandbox (not idempotent there): each call it lets out is one charge."""

    @recording.tool("charge_card", key="order:{order}:charge")
    def charge_card(call: recording.ToolCall, *, order: int, amount_cents: int) -> dict[str, Any]:
        status, body = sandbox_tools.perform("charge_card", call.key, call.args)
        assert status == 201, body
        call.record_request_id(str(body["id"]))
        return {"charged": amount_cents}

    def run(order: int, amount: int) -> Any:
        with recording.task(tenant="acme", task_id="checkout", agent="shop-agent"):
            return charge_card(order=order, amount_cents=amount)

    return run


def _publish(tenant: Tenant, approvals: dict[str, str], note: str) -> None:
    policy_publish(tenant=tenant, tools=TOOLS_V1, approvals=approvals, actor=Actor.system("policy"), note=note)


def _held_and_approved(tenant: Tenant, pay: Any, approver: Any, order: int) -> Attempt:
    _publish(tenant, PAY, "charges over 1.00 wait for an approver")  # v2
    with pytest.raises(AwaitingApproval) as held:
        pay(order, 500)
    return moves.retry_approve(attempt=held.value.attempt, actor=Actor.user(approver), comment="customer confirmed")


def test_an_approval_does_not_outlive_a_freeze_published_after_it(
    tenant_a: Tenant, pay: Any, sandbox_tools: Sandbox, approver_a: Any
) -> None:
    approved = _held_and_approved(tenant_a, pay, approver_a, 7)
    assert (approved.approved_policy_version, approved.approved_hold) == (2, "amount_cents > `100`")
    _publish(tenant_a, {name: "" for name in TOOLS_V1}, "incident: every call waits")  # v3, a freeze
    with pytest.raises(AwaitingApproval, match=r"policy v3 requires approval") as again:
        pay(7, 500)
    assert sandbox_tools.count("order:7:charge") == 0
    held = Attempt.objects.get(pk=approved.pk)
    assert held.state == S.MANUAL_REVIEW
    assert rules.awaiting_approval(held)
    assert "policy v3 requires approval for charge_card" in held.approval_required
    assert "given under v2, which held it when amount_cents > `100`" in held.approval_required
    assert again.value.attempt.pk == held.pk
    # A fresh approval under v3 lets it out, once.
    moves.retry_approve(attempt=held, actor=Actor.user(approver_a), comment="checked during the freeze")
    assert pay(7, 500) == {"charged": 500}
    assert pay(7, 500) == {"charged": 500}
    assert sandbox_tools.count("order:7:charge") == 1


def test_an_approval_stands_under_a_policy_no_stricter_for_the_call(
    tenant_a: Tenant, pay: Any, sandbox_tools: Sandbox, approver_a: Any
) -> None:
    _held_and_approved(tenant_a, pay, approver_a, 8)
    # v3 adds a hold on another tool and keeps this one's rule as it was: nothing about this call changed.
    _publish(tenant_a, {**PAY, "send_email": ""}, "emails wait too")
    assert pay(8, 500) == {"charged": 500}
    assert sandbox_tools.count("order:8:charge") == 1


def test_a_lower_threshold_published_after_the_approval_holds_the_call_again(
    tenant_a: Tenant, pay: Any, sandbox_tools: Sandbox, approver_a: Any
) -> None:
    _held_and_approved(tenant_a, pay, approver_a, 9)
    _publish(tenant_a, {"charge_card": "amount_cents > `50`"}, "charges over 0.50 wait")
    with pytest.raises(AwaitingApproval, match="when amount_cents > `50`"):
        pay(9, 500)
    assert sandbox_tools.count("order:9:charge") == 0


def test_an_approved_retry_is_held_again_by_a_freeze_and_can_be_approved_again(
    tenant_a: Tenant, sandbox_tools: Sandbox, operator_a: Any, approver_a: Any
) -> None:
    original, _fence, _receipt, t0 = _original_acted_then_went_to_review(tenant_a, sandbox_tools, "pay:4")
    # The provider's records say the original never charged (a person's word, with a reason).
    sandbox_tools.clear()
    sandbox_tools.faults("charge_card", non_idempotent=True)
    with at(700, t0):
        retry = _retry_approved_over_a_risk(original, operator_a, approver_a)
        _publish(tenant_a, {name: "" for name in TOOLS_V1}, "incident: every call waits")
    with at(701, t0):
        summary = Reconciler(label="r").run_pass()
    assert summary.decisions["held_again"] == 1
    held = Attempt.objects.get(pk=retry.pk)
    assert (held.state, held.dispatch_count) == (S.MANUAL_REVIEW, 0)
    assert rules.awaiting_approval(held)
    assert sandbox_tools.count(original.provider_key) == 1
    with at(702, t0):
        moves.retry_approve(
            attempt=held,
            actor=Actor.user(approver_a),
            comment="still needed during the freeze",
            safe_because="the bank shows no charge",
        )
        assert Attempt.objects.get(pk=retry.pk).state == S.INTENT_RECORDED


def test_late_receipts_heard_before_the_upgrade_are_kept_on_their_attempts(tenant_a: Tenant, operator_a: Any) -> None:
    """The upgrade copies every late report that said the provider acted onto its attempt."""
    from django.apps import apps

    keep = importlib.import_module("ledgerdash.ledger.migrations.0029_late_receipt_kept_on_the_attempt")
    heard, unheard = (recording.mark_dispatched(record(tenant_a, key), actor=AGENT) for key in ("a:1", "a:2"))
    for attempt, outcome in ((heard, "confirmed"), (unheard, "failed")):
        fence = attempt.fence
        unknown = recording.mark_unknown(attempt, reason="dropped", fence=fence)
        reviewed = moves.attempt_escalate(attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="no answer")
        moves.attempt_mark_failed(attempt=reviewed, actor=Actor.user(operator_a), reason="nothing arrived")
        assert recording.report_outcome(attempt, outcome=outcome, result_ref="receipt-9", fence=fence).late
    assert Attempt.objects.get(pk=heard.pk).late_receipt == "receipt-9"
    Attempt.objects.update(late_receipt="")  # as the rows were before the upgrade

    keep.keep_late_receipts(apps, None)
    assert dict(Attempt.objects.values_list("pk", "late_receipt")) == {heard.pk: "receipt-9", unheard.pk: ""}


def test_dispatches_that_said_unknown_before_the_upgrade_are_kept_on_their_attempts(tenant_a: Tenant) -> None:
    """The upgrade copies, from the events, which dispatch of each attempt said it could not tell
    whether its request landed: on time, or late."""
    from django.apps import apps

    keep = importlib.import_module("ledgerdash.ledger.migrations.0030_reports_heard_kept_on_the_attempt")
    late, silent = (recording.mark_dispatched(record(tenant_a, key), actor=AGENT) for key in "ab")
    for claimed in moves.attempts_claim_due(limit=2, now=late.next_check_at + timedelta(seconds=1)):
        moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    on_time = recording.mark_dispatched(record(tenant_a, "c"), actor=AGENT)
    sent_with = {attempt.pk: attempt.fence for attempt in (on_time, late, silent)}
    recording.mark_unknown(on_time, reason="timed out", fence=on_time.fence)
    assert recording.report_outcome(late, outcome="unknown", reason="timed out", fence=late.fence).late
    said = dict(Attempt.objects.values_list("pk", "said_unknown_fence"))
    assert said == {on_time.pk: sent_with[on_time.pk], late.pk: sent_with[late.pk], silent.pk: None}
    Attempt.objects.update(said_unknown_fence=None)  # as the rows were before the upgrade

    keep.keep_said_unknown(apps, None)
    assert dict(Attempt.objects.values_list("pk", "said_unknown_fence")) == said

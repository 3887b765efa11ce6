"""Approval before the first call: a policy holds a risky call for an
approver; the agent waits, is told why, and its call goes out once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from ledgerdash.ledger import authority, clock, moves, recording, rules
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    ApprovalRejected,
    AuthorizationChanged,
    AwaitingApproval,
    IllegalTransition,
    SelfApproval,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, FailedBecause, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.ledger.tokens import token_create
from reviews import queries
from tests.api_support import BOTH, Api, intent
from tests.conftest import THRESHOLD, TOOLS_V1, as_user

S = State


@pytest.fixture
def charges() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def charge_card(charges: list[dict[str, Any]]) -> Any:
    @recording.tool("charge_card", key="order:{order}:charge")
    def charge_card(call: recording.ToolCall, *, order: int, amount_cents: Any) -> dict[str, Any]:
        charges.append({"key": call.key, "amount_cents": amount_cents})
        call.record_request_id(f"ch-{order}")
        return {"charged": amount_cents}

    return charge_card


def _charge(charge_card: Any, order: int, amount: Any) -> Any:
    with recording.task(tenant="acme", task_id="checkout-1", agent="shop-agent"):
        return charge_card(order=order, amount_cents=amount)


def test_the_condition_decides_and_an_undecided_condition_waits(guarded: Tenant) -> None:
    from ledgerdash.ledger.authority import current_policy

    policy = current_policy(guarded.pk)
    assert authority.approval_needed(policy, "charge_card", {"amount_cents": 50000}) == ""
    assert "when amount_cents > `50000`" in authority.approval_needed(policy, "charge_card", {"amount_cents": 50001})
    # A string where a number was expected, or a missing field: it cannot tell, so it waits.
    assert "could not be evaluated" in authority.approval_needed(policy, "charge_card", {"amount_cents": "90000"})
    assert "did not yield true or false" in authority.approval_needed(policy, "charge_card", {"amount_cents": None})
    assert authority.approval_needed(policy, "charge_card", {}) != ""
    assert authority.approval_needed(policy, "send_email", {"amount_cents": 10**9}) == ""
    always = policy_publish(tenant=guarded, tools=TOOLS_V1, approvals={"send_email": ""}, actor=Actor.system("t"))
    assert authority.approval_needed(always, "send_email", {}) == "policy v3 requires approval for send_email"


def test_a_policy_refuses_a_condition_that_is_not_jmespath_or_a_tool_it_does_not_allow(tenant_a: Tenant) -> None:
    with pytest.raises(ValidationError, match="not valid JMESPath"):
        policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals={"charge_card": "amount >"}, actor=Actor.system("t"))
    with pytest.raises(ValidationError, match="does not allow"):
        policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals={"wire_money": ""}, actor=Actor.system("t"))


def test_a_small_call_goes_out_at_once(guarded: Tenant, charge_card: Any, charges: list[dict[str, Any]]) -> None:
    assert _charge(charge_card, 1, 1200) == {"charged": 1200}
    assert len(charges) == 1


def test_a_large_call_waits_then_goes_out_once_after_approval(
    guarded: Tenant, charge_card: Any, charges: list[dict[str, Any]], approver_a: Any
) -> None:
    with pytest.raises(AwaitingApproval, match="waits for an approver") as waiting:
        _charge(charge_card, 2, 90000)
    assert charges == []
    held = waiting.value.attempt
    assert held.state == S.MANUAL_REVIEW
    assert held.owner_id == guarded.default_owner_id
    assert held.next_check_at is None
    assert rules.awaiting_approval(held)
    # Calling again before anyone decided: still waiting, nothing new recorded.
    before = AttemptEvent.objects.count()
    with pytest.raises(AwaitingApproval):
        _charge(charge_card, 2, 90000)
    assert AttemptEvent.objects.count() == before
    assert queries.queue_counts(approver_a)["APPROVALS"] == 1

    approved = moves.retry_approve(attempt=held, actor=Actor.user(approver_a), comment="customer confirmed by phone")
    assert approved.state == S.INTENT_RECORDED
    assert approved.approved_by_id == approver_a.pk
    assert _charge(charge_card, 2, 90000) == {"charged": 90000}
    assert _charge(charge_card, 2, 90000) == {"charged": 90000}  # replayed
    assert len(charges) == 1
    final = Attempt.objects.get(pk=held.pk)
    assert final.state == S.OUTCOME_CONFIRMED
    kinds = [(e.from_state, e.to_state) for e in AttemptEvent.objects.filter(attempt=final).order_by("seq")]
    assert kinds[:3] == [("", S.MANUAL_REVIEW), (S.MANUAL_REVIEW, S.INTENT_RECORDED), (S.INTENT_RECORDED, S.DISPATCHED)]


def test_rejection_is_final_and_tells_the_agent_why(
    guarded: Tenant, charge_card: Any, charges: list[dict[str, Any]], approver_a: Any
) -> None:
    with pytest.raises(AwaitingApproval) as waiting:
        _charge(charge_card, 3, 70000)
    rejected = moves.retry_reject(
        attempt=waiting.value.attempt, actor=Actor.user(approver_a), comment="over the customer's limit"
    )
    assert rejected.state == S.FAILED
    assert rejected.failed_because == FailedBecause.REJECTED
    for _ in range(2):
        with pytest.raises(ApprovalRejected, match="over the customer's limit"):
            _charge(charge_card, 3, 70000)
    assert charges == []
    with pytest.raises(IllegalTransition, match="does not await approval"):
        moves.retry_approve(attempt=rejected, actor=Actor.user(approver_a), comment="changed my mind")


def test_whoever_triggered_it_cannot_approve_it(guarded: Tenant, approver_a: Any, make_user: Any) -> None:
    from tests.conftest import member

    _, raw = token_create(tenant=guarded, name="approver's agent", scopes=BOTH, actor=Actor.user(approver_a))
    body = intent("order:9:charge", tool_name="charge_card", args={"amount_cents": 60000})
    response = Api(raw).post("/attempts", body)
    assert response.status_code == 409
    held = Attempt.objects.get(pk=response.json()["attempt_id"])
    assert held.requested_by_id == approver_a.pk
    verdict = rules.approval_verdict(held, None, approver_a)
    assert verdict.word == "refused"
    assert "you triggered this call" in verdict.summary
    with pytest.raises(SelfApproval, match="triggered this call"):
        moves.retry_approve(attempt=held, actor=Actor.user(approver_a), comment="mine")
    other = member(make_user, "approver-2", guarded, "approver")
    assert moves.retry_approve(attempt=held, actor=Actor.user(other), comment="ok").state == S.INTENT_RECORDED


def test_approval_re_checks_authority_like_a_linked_retrys(guarded: Tenant, charge_card: Any, approver_a: Any) -> None:
    with pytest.raises(AwaitingApproval) as waiting:
        _charge(charge_card, 4, 80000)
    narrower = {**TOOLS_V1, "charge_card": ["payments:refund"]}
    policy_publish(tenant=guarded, tools=narrower, approvals=THRESHOLD, actor=Actor.system("t"), note="no charges")
    assert rules.approval_verdict(waiting.value.attempt, None, approver_a).word == "refused"
    with pytest.raises(ApprovalRefused, match="payments:charge is not allowed"):
        moves.retry_approve(attempt=waiting.value.attempt, actor=Actor.user(approver_a), comment="ok")
    assert Attempt.objects.get(pk=waiting.value.attempt.pk).state == S.MANUAL_REVIEW
    guarded.is_active = False
    guarded.save()
    with pytest.raises(ApprovalRefused, match="is not active"):
        moves.retry_approve(attempt=waiting.value.attempt, actor=Actor.user(approver_a), comment="ok")


def test_the_api_answers_awaiting_approval_with_retry_after_then_dispatches_once(
    guarded: Tenant, approver_a: Any
) -> None:
    api = Api(token_create(tenant=guarded, name="agent", scopes=BOTH, actor=Actor.system("t"))[1])
    body = intent("order:5:charge", tool_name="charge_card", args={"amount_cents": 75000})
    first = api.post("/attempts", body)
    assert first.status_code == 409
    assert first.json()["code"] == "awaiting_approval"
    assert first["Retry-After"] == "30"
    assert first.json()["retry_after"] == 30
    attempt_id = first.json()["attempt_id"]
    assert api.dispatch(attempt_id).json()["code"] == "awaiting_approval"
    again = api.post("/attempts", body)
    assert again.status_code == 409
    assert again.json()["attempt_id"] == attempt_id
    moves.retry_approve(attempt=Attempt.objects.get(pk=attempt_id), actor=Actor.user(approver_a), comment="ok")
    after = api.post("/attempts", body)
    assert after.status_code == 200
    assert after.json()["state"] == S.INTENT_RECORDED
    claim = api.dispatch(attempt_id)
    assert claim.status_code == 200
    assert api.dispatch(attempt_id).status_code == 409  # only once
    assert Attempt.objects.get(pk=attempt_id).dispatch_count == 1


def test_the_api_tells_the_agent_of_a_rejection(guarded: Tenant, approver_a: Any) -> None:
    api = Api(token_create(tenant=guarded, name="agent", scopes=BOTH, actor=Actor.system("t"))[1])
    body = intent("order:6:charge", tool_name="charge_card", args={"amount_cents": 75000})
    attempt_id = api.post("/attempts", body).json()["attempt_id"]
    moves.retry_reject(attempt=Attempt.objects.get(pk=attempt_id), actor=Actor.user(approver_a), comment="fraud check")
    answer = api.post("/attempts", body)
    assert answer.status_code == 409
    assert answer.json()["code"] == "approval_rejected"
    assert "fraud check" in answer.json()["message"]


def test_the_reconciler_leaves_an_approved_first_call_to_its_agent_then_abandons_it(
    guarded: Tenant, charge_card: Any, approver_a: Any
) -> None:
    with pytest.raises(AwaitingApproval) as waiting:
        _charge(charge_card, 7, 99000)
    assert Reconciler().run_pass().claimed == 0  # waiting on a person: not the reconciler's
    moves.retry_approve(attempt=waiting.value.attempt, actor=Actor.user(approver_a), comment="ok")
    assert Reconciler().run_pass().claimed == 0  # not due until the intent lease ends
    with clock.frozen_at(timezone.now() + timedelta(hours=2)):
        summary = Reconciler().run_pass()
    assert summary.decisions["abandoned"] == 1
    attempt = Attempt.objects.get(pk=waiting.value.attempt.pk)
    assert attempt.state == S.FAILED
    assert attempt.dispatch_count == 0
    assert "its agent did not call again" in attempt.last_note


def test_the_dashboard_shows_why_it_waits_and_lets_another_approver_decide(
    guarded: Tenant, charge_card: Any, approver_a: Any
) -> None:
    with pytest.raises(AwaitingApproval) as waiting:
        _charge(charge_card, 8, 65000)
    held = waiting.value.attempt
    queue = as_user(approver_a).get(reverse("reviews:approvals")).content.decode()
    assert f'id="approval-{held.pk}"' in queue
    assert "no original: the first call of this key" in queue
    detail = as_user(approver_a).get(reverse("reviews:attempt", args=[held.pk])).content.decode()
    assert "This call waits for an approver before it is sent" in detail
    assert "amount_cents &gt; `50000`" in detail
    response = as_user(approver_a).post(
        reverse("reviews:approve", args=[held.pk]), {"fence": held.fence, "comment": "fine"}, follow=True
    )
    assert "its agent&#x27;s next call sends it" in response.content.decode()
    assert Attempt.objects.get(pk=held.pk).state == S.INTENT_RECORDED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_parallel_approvals_and_rejections_decide_once_and_parallel_re_calls_send_once(
    tenant_a: Tenant, make_user: Any
) -> None:
    from tests.conftest import member, together

    policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals=THRESHOLD, actor=Actor.system("t"))

    def hold(order: int) -> Attempt:
        held = recording.record_intent(
            tenant=tenant_a,
            task_id="t",
            tool_name="charge_card",
            idempotency_key=f"order:{order}:charge",
            args={"order": order, "amount_cents": 80000},
        ).attempt
        assert rules.awaiting_approval(held)
        return held

    # Ten approvers decide the same held call at once, half approving, half rejecting.
    held = hold(77)
    approvers = [member(make_user, f"approver-{n}", tenant_a, "approver") for n in range(10)]
    outcomes: list[str] = []

    def decide(pair: tuple[int, Any]) -> None:
        n, user = pair
        try:
            if n % 2:
                moves.retry_reject(attempt=held, actor=Actor.user(user), comment="no", fence=held.fence)
                outcomes.append("rejected")
            else:
                moves.retry_approve(attempt=held, actor=Actor.user(user), comment="yes", fence=held.fence)
                outcomes.append("approved")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    together(decide, list(enumerate(approvers)))
    assert len([o for o in outcomes if o in ("approved", "rejected")]) == 1, outcomes
    assert set(outcomes) - {"approved", "rejected"} <= {"StaleFence", "IllegalTransition"}
    decisions = AttemptEvent.objects.filter(attempt=held, from_state=S.MANUAL_REVIEW)
    assert decisions.count() == 1

    # Approved, then eight copies of its agent call again at once: it goes out once.
    approved = hold(78)
    moves.retry_approve(attempt=approved, actor=Actor.user(approvers[0]), comment="yes")
    sent: list[int] = []

    @recording.tool("charge_card", key="order:{order}:charge")
    def charge_card(call: recording.ToolCall, *, order: int, amount_cents: int) -> dict[str, Any]:
        sent.append(order)
        call.record_request_id(f"ch-{order}")
        return {"charged": amount_cents}

    answers: list[str] = []

    def agent(n: int) -> None:
        try:
            with recording.task(tenant="acme", task_id="t", agent=f"copy-{n}"):
                charge_card(order=78, amount_cents=80000)
            answers.append("ok")
        except Exception as exc:
            answers.append(type(exc).__name__)

    together(agent, list(range(8)))
    assert sent == [78]
    assert set(answers) <= {"ok", "AttemptInFlight", "ClaimLost"}, answers
    assert Attempt.objects.get(pk=approved.pk).dispatch_count == 1


# --- a policy that starts holding a call after its intent ---------------------------------------


def _intent_then(tenant: Tenant, approvals: dict[str, str], amount: int) -> Any:
    """An intent recorded while charge_card ran freely, then a policy version
    with ``approvals`` (the same tools and scopes): the dispatch that follows."""
    attempt = recording.record_intent(
        tenant=tenant,
        task_id="checkout-1",
        tool_name="charge_card",
        idempotency_key=f"order:{amount}:charge",
        args={"order": amount, "amount_cents": amount},
        actor=Actor.agent("shop-agent"),
    ).attempt
    assert attempt.state == S.INTENT_RECORDED
    policy_publish(tenant=tenant, tools=TOOLS_V1, approvals=approvals, actor=Actor.system("t"), note="hold charges")
    return attempt


def test_a_policy_that_now_holds_the_call_for_approval_stops_its_dispatch(tenant_a: Tenant) -> None:
    attempt = _intent_then(tenant_a, {"charge_card": ""}, 4200)
    with pytest.raises(AuthorizationChanged) as refused:
        recording.mark_dispatched(attempt, actor=Actor.agent("shop-agent"))
    assert "requires approval for charge_card" in str(refused.value)
    original = Attempt.objects.get(pk=attempt.pk)
    assert (original.state, original.dispatch_count) == (S.MANUAL_REVIEW, 0)
    linked = Attempt.objects.get(parent=original)
    assert rules.awaiting_approval(linked)
    assert linked.policy_version == 2


def test_a_condition_that_now_holds_this_call_stops_it_and_one_that_does_not_lets_it_go(tenant_a: Tenant) -> None:
    held = _intent_then(tenant_a, {"charge_card": "amount_cents > `5000`"}, 9000)
    with pytest.raises(AuthorizationChanged):
        recording.mark_dispatched(held, actor=Actor.agent("shop-agent"))
    small = _intent_then(tenant_a, {"charge_card": "amount_cents > `5000`"}, 100)
    assert recording.mark_dispatched(small, actor=Actor.agent("shop-agent")).state == S.DISPATCHED


def test_a_retryable_failure_is_not_sent_again_once_the_policy_holds_it(tenant_a: Tenant) -> None:
    # (The scripted provider fails the test if anything is sent to it.)
    Tool.objects.create(
        name="charge_card", adapter=Tool.Adapter.PYTHON, config={"class": "tests.scripted_provider.Scripted"}
    )
    attempt = recording.record_intent(
        tenant=tenant_a,
        task_id="checkout-1",
        tool_name="charge_card",
        idempotency_key="order:77:charge",
        args={"order": 77, "amount_cents": 7700},
        actor=Actor.agent("shop-agent"),
    ).attempt
    sent = recording.mark_dispatched(attempt, actor=Actor.agent("shop-agent"))
    refused = recording.fail_retryable(sent, reason="rate limited", actor=Actor.agent("shop-agent"))
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals={"charge_card": ""}, actor=Actor.system("t"))
    with clock.frozen_at(refused.next_check_at + timedelta(seconds=1)):
        Reconciler(label="r").run_pass()
    assert Attempt.objects.get(pk=attempt.pk).state == S.MANUAL_REVIEW
    assert rules.awaiting_approval(Attempt.objects.get(parent_id=attempt.pk))

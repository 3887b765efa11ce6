from __future__ import annotations

from typing import Any

import pytest

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.errors import ApprovalRefused, IdempotencyConflict, IllegalTransition, SelfApproval, StaleFence
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, Membership, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import AGENT, RECONCILER, TOOLS_V1, ledger_snapshot, record, together
from tests.factories import attempt_in

S = State


def under_review(tenant: Tenant, *, lookup: str = "") -> Attempt:
    attempt = attempt_in(S.UNKNOWN, tenant)
    status = {"status": lookup} if lookup else None
    return moves.attempt_escalate(
        attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="not idempotent", lookup=status
    )


@pytest.fixture
def retry(tenant_a: Tenant, operator_a: Any) -> Attempt:
    original = under_review(tenant_a, lookup="not_found")
    return moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend it")


def approve(retry: Attempt, approver: Any, **extra: Any) -> Attempt:
    return moves.retry_approve(attempt=retry, actor=Actor.user(approver), comment="checked", **extra)


def test_approving_a_retry_authorizes_it_and_supersedes_the_original(retry: Attempt, approver_a: Any) -> None:
    approved = approve(retry, approver_a)
    original = Attempt.objects.get(pk=retry.parent_id)
    assert approved.state == S.INTENT_RECORDED
    assert approved.approved_by_id == approver_a.pk
    assert original.state == S.RECONCILED
    assert f"#{retry.pk}" in original.last_note
    event = AttemptEvent.objects.filter(attempt=retry).order_by("seq").last()
    assert event is not None
    assert (event.from_state, event.to_state, event.actor_user_id) == (
        S.MANUAL_REVIEW,
        S.INTENT_RECORDED,
        approver_a.pk,
    )
    assert event.details["comment"] == "checked"
    assert event.details["original_last_lookup"] == "not_found"


def _refused(retry: Attempt, approver: Any, **extra: Any) -> ApprovalRefused:
    snapshot = ledger_snapshot()
    events_before = AttemptEvent.objects.count()
    with pytest.raises(ApprovalRefused) as caught:
        approve(retry, approver, **extra)
    after = ledger_snapshot()
    assert after[2] == snapshot[2]  # no state, fence or owner changed
    refusal = AttemptEvent.objects.order_by("seq").last()
    assert AttemptEvent.objects.count() == events_before + 1
    assert refusal is not None
    assert refusal.kind == "approval_refused"
    assert refusal.details["changes"] == caught.value.changes
    return caught.value


def test_it_refuses_approval_when_the_policy_changed_what_the_retry_may_do(
    retry: Attempt, approver_a: Any, tenant_a: Tenant
) -> None:
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"), note="v2")
    refusal = _refused(retry, approver_a)
    assert (
        "scope email:send is not allowed for send_email by policy v2 (it allows: none) (attempt recorded under v1)"
        in str(refusal)
    )


def test_a_new_policy_version_that_leaves_the_tool_alone_does_not_refuse_approval(
    retry: Attempt, approver_a: Any, tenant_a: Tenant
) -> None:
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "new_tool": []}, actor=Actor.system("t"), note="v2")
    approve(retry, approver_a)
    event = AttemptEvent.objects.filter(attempt=retry).order_by("seq").last()
    assert event is not None
    assert (event.details["policy_version"], event.details["policy_version_now"]) == (1, 2)


def test_it_refuses_approval_when_the_tool_is_no_longer_allowed(
    retry: Attempt, approver_a: Any, tenant_a: Tenant
) -> None:
    tools = {k: v for k, v in TOOLS_V1.items() if k != "send_email"}
    policy_publish(tenant=tenant_a, tools=tools, actor=Actor.system("t"))
    refusal = _refused(retry, approver_a)
    assert any("tool send_email is not allowed by policy v2" in c for c in refusal.changes)


def test_it_refuses_approval_when_the_tenant_was_deactivated(retry: Attempt, approver_a: Any, tenant_a: Tenant) -> None:
    Tenant.objects.filter(pk=tenant_a.pk).update(is_active=False)
    refusal = _refused(retry, approver_a)
    assert "tenant acme is not active" in refusal.changes


def test_a_linked_attempt_is_never_wider_than_the_original(tenant_a: Tenant, approver_a: Any) -> None:
    original = record(
        tenant_a, "charge-1", tool_name="charge_card", args={"amount": 5}, credential_scope="payments:charge"
    )
    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "charge-1", tool_name="charge_card", args={"amount": 6})  # policy default: charge + refund
    linked = caught.value.attempt
    assert linked.parent_id == original.pk
    assert linked.credential_scope == "payments:charge"
    created = AttemptEvent.objects.get(attempt=linked, to_state=S.MANUAL_REVIEW)
    assert created.details["scope_narrowed_from"] == "payments:charge payments:refund"


def test_it_refuses_when_the_approver_may_not_act_for_the_tenant(
    retry: Attempt, approver_a: Any, outsider_b: Any
) -> None:
    snapshot = ledger_snapshot()
    Membership.objects.filter(user=approver_a).update(role="operator")  # demoted since they opened the page
    with pytest.raises(ApprovalRefused, match="approver-a is an operator of the tenant and needs to be an approver"):
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok")
    with pytest.raises(ApprovalRefused, match="outsider-b is not a member of the tenant"):
        moves.retry_approve(attempt=retry, actor=Actor.user(outsider_b), comment="ok")
    assert ledger_snapshot()[2] == snapshot[2]


def test_an_approver_cannot_approve_a_retry_they_requested(tenant_a: Tenant, approver_a: Any) -> None:
    original = under_review(tenant_a, lookup="not_found")
    retry = moves.retry_request(attempt=original, actor=Actor.user(approver_a), reason="resend")
    with pytest.raises(SelfApproval):
        approve(retry, approver_a)
    assert Attempt.objects.get(pk=retry.pk).state == S.MANUAL_REVIEW
    assert AttemptEvent.objects.filter(attempt=retry, kind="approval_refused").count() == 1


def test_it_refuses_while_the_original_may_still_have_happened(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    original = under_review(tenant_a, lookup="unavailable")
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend")
    refusal = _refused(retry, approver_a)
    assert any("has not said the original" in c and "unavailable" in c for c in refusal.changes)
    approved = approve(retry, approver_a, safe_because="provider support: message id absent from their logs")
    assert approved.state == S.INTENT_RECORDED
    last = AttemptEvent.objects.filter(attempt=retry).order_by("seq").last()
    assert last is not None
    assert last.details["safe_because"].startswith("provider support")


def test_a_decision_is_single_use(retry: Attempt, approver_a: Any) -> None:
    approve(retry, approver_a)
    with pytest.raises(IllegalTransition):
        approve(retry, approver_a)
    with pytest.raises(IllegalTransition):
        moves.retry_reject(attempt=retry, actor=Actor.user(approver_a), comment="too late")


def test_a_decision_on_a_changed_attempt_is_refused(
    retry: Attempt, approver_a: Any, make_user: Any, tenant_a: Tenant
) -> None:
    from tests.conftest import member

    seen = retry.fence
    other = member(make_user, "approver-2", tenant_a, "approver")
    moves.retry_reject(attempt=retry, actor=Actor.user(other), comment="duplicate")
    with pytest.raises(StaleFence, match="changed since you loaded it"):
        approve(retry, approver_a, fence=seen)


def test_rejecting_a_retry_fails_it_and_leaves_the_original(retry: Attempt, approver_a: Any) -> None:
    rejected = moves.retry_reject(attempt=retry, actor=Actor.user(approver_a), comment="duplicate")
    assert rejected.state == S.FAILED
    assert "duplicate" in rejected.last_note
    assert Attempt.objects.get(pk=retry.parent_id).state == S.MANUAL_REVIEW


def test_a_comment_is_required(retry: Attempt, approver_a: Any) -> None:
    from ledgerdash.ledger.errors import InvalidField

    with pytest.raises(InvalidField):
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="  ")


def test_only_linked_retries_are_approved(tenant_a: Tenant, approver_a: Any) -> None:
    original = under_review(tenant_a)
    with pytest.raises(IllegalTransition, match="does not await approval"):
        approve(original, approver_a)


def test_an_approved_retry_is_dispatched_under_the_same_provider_key(retry: Attempt, approver_a: Any) -> None:
    approved = approve(retry, approver_a)
    dispatched = recording.mark_dispatched(approved, actor=AGENT)
    assert dispatched.state == S.DISPATCHED
    assert dispatched.provider_key == Attempt.objects.get(pk=retry.parent_id).provider_key


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_approvals_yield_one(tenant_a: Tenant, operator_a: Any, make_user: Any) -> None:
    from tests.conftest import member

    original = under_review(tenant_a, lookup="not_found")
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend")
    approvers = [member(make_user, f"approver-{n}", tenant_a, "approver") for n in range(20)]
    outcomes: list[str] = []

    def worker(user: Any) -> None:
        try:
            approve(retry, user)
            outcomes.append("approved")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    together(worker, approvers)
    assert outcomes.count("approved") == 1
    assert outcomes.count("IllegalTransition") == 19
    assert AttemptEvent.objects.filter(attempt=retry, to_state=S.INTENT_RECORDED).count() == 1
    assert AttemptEvent.objects.filter(attempt=original, to_state=S.RECONCILED).count() == 1


def test_it_refuses_while_the_original_may_yet_be_sent(tenant_a: Tenant, approver_a: Any) -> None:
    original = record(tenant_a, "k-live", args={"amount": 5})  # INTENT_RECORDED: its agent may still send it
    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "k-live", args={"amount": 6})
    linked = caught.value.attempt
    refusal = _refused(linked, approver_a, safe_because="the agent will not come back")
    assert any(f"the original #{original.pk} is INTENT_RECORDED and may yet be sent" in c for c in refusal.changes)
    assert Attempt.objects.get(pk=original.pk).state == S.INTENT_RECORDED


@pytest.mark.parametrize("state", [S.DISPATCHED, S.UNKNOWN, S.FAILED_RETRYABLE])
def test_a_live_original_blocks_approval_whatever_the_reason(state: str, tenant_a: Tenant, approver_a: Any) -> None:
    original = attempt_in(state, tenant_a, key="k-live")
    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "k-live", args={"other": True})
    refusal = _refused(caught.value.attempt, approver_a, safe_because="sure")
    assert any("may yet be sent" in c for c in refusal.changes)
    assert Attempt.objects.get(pk=original.pk).state == state


def test_a_failed_original_does_not_block_its_retry(tenant_a: Tenant, approver_a: Any) -> None:
    attempt_in(S.FAILED, tenant_a, key="k-failed")
    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "k-failed", args={"fixed": True})
    approved = approve(caught.value.attempt, approver_a)
    assert approved.state == S.INTENT_RECORDED


def test_a_never_sent_retry_cannot_be_rechecked_or_verified_around_its_approval(
    retry: Attempt, operator_a: Any
) -> None:
    snapshot = ledger_snapshot()
    with pytest.raises(IllegalTransition, match="never sent"):
        moves.attempt_recheck(attempt=retry, actor=Actor.user(operator_a))
    with pytest.raises(IllegalTransition, match="never sent"):
        moves.attempt_verify(attempt=retry, actor=Actor.user(operator_a), evidence="looks sent")
    assert ledger_snapshot() == snapshot


def test_a_retry_of_a_reworded_call_weighs_every_attempt_at_the_side_effect(tenant_a: Tenant, approver_a: Any) -> None:
    # The first call went out and happened; the agent re-ran twice with other arguments.
    first = recording.confirm(
        recording.mark_dispatched(record(tenant_a, "k-chain"), actor=AGENT), provider_request_id="r-1", actor=AGENT
    )
    reworded = []
    for amount in (8, 9):
        with pytest.raises(IdempotencyConflict) as conflict:
            record(tenant_a, "k-chain", args={"to": "ap@example.com", "invoice": amount})
        reworded.append(conflict.value.attempt)
    second, third = reworded
    assert (second.parent_id, third.parent_id) == (first.pk, second.pk)
    # Its own parent was never sent, but the side effect happened through the first call: a retry under its
    # key would never be sent (the send rule), so no reason makes approving it mean anything.
    refused = _refused(Attempt.objects.get(pk=third.pk), approver_a)
    assert f"#{first.pk} is confirmed (provider request r-1): the side effect happened" in str(refused)
    with pytest.raises(ApprovalRefused, match="never sent"):
        approve(
            Attempt.objects.get(pk=third.pk),
            approver_a,
            safe_because="the customer wants the corrected invoice as well",
        )
    assert Attempt.objects.get(pk=third.pk).state == S.MANUAL_REVIEW

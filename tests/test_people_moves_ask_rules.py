"""A person's decision asks the rules itself, under the row lock, whatever
path it comes by (dashboard, bulk, API, a script): the moves give the same
answer as :func:`ledgerdash.ledger.rules.moves_for`.

Two paths answered differently: "mark failed" on a first call awaiting
approval (the rules send it to an approver's reject, the move recorded it as
rejected with no four-eyes check), and a reject by the person who requested
the retry (the rules and the bulk path refuse it, the single move did not).
"""

from __future__ import annotations

from typing import Any

import pytest

from ledgerdash.ledger import moves, rules
from ledgerdash.ledger.errors import ApprovalRefused, IllegalTransition, RoleRequired, SelfApproval
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, Membership, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.tokens import token_create
from tests.api_support import BOTH, Api, intent
from tests.conftest import RECONCILER, TOOLS_V1
from tests.factories import attempt_in
from tests.test_approvals import under_review

pytestmark = pytest.mark.django_db
S = State


def held_first_call(tenant: Tenant, issuer: Actor) -> Attempt:
    policy_publish(
        tenant=tenant, tools=TOOLS_V1, approvals={"charge_card": "amount_cents > `50000`"}, actor=Actor.system("t")
    )
    raw = token_create(tenant=tenant, name="agent", scopes=BOTH, actor=issuer)[1]
    body = intent("order:1:charge", tool_name="charge_card", args={"amount_cents": 90000})
    return Attempt.objects.get(pk=Api(raw).post("/attempts", body).json()["attempt_id"])


def test_a_first_call_awaiting_approval_cannot_be_marked_failed(tenant_a: Tenant, approver_a: Any) -> None:
    held = held_first_call(tenant_a, Actor.system("t"))
    assert not rules.moves_for(approver_a, held).mark_failed
    with pytest.raises(IllegalTransition, match="rejected by an approver"):
        moves.attempt_mark_failed(attempt=held, actor=Actor.user(approver_a), reason="no", fence=held.fence)
    held.refresh_from_db()
    assert held.state == S.MANUAL_REVIEW


def test_whoever_triggered_a_call_cannot_reject_it_either(tenant_a: Tenant, approver_a: Any, admin_a: Any) -> None:
    held = held_first_call(tenant_a, Actor.user(approver_a))
    assert not rules.moves_for(approver_a, held).decide_retry
    with pytest.raises(SelfApproval):
        moves.retry_reject(attempt=held, actor=Actor.user(approver_a), comment="no", fence=held.fence)
    moves.retry_reject(attempt=held, actor=Actor.user(admin_a), comment="no", fence=held.fence)
    held.refresh_from_db()
    assert held.state == S.FAILED


def test_the_requester_of_a_retry_cannot_reject_it(tenant_a: Tenant, admin_a: Any, approver_a: Any) -> None:
    retry = moves.retry_request(
        attempt=under_review(tenant_a, lookup="not_found"), actor=Actor.user(admin_a), reason="r"
    )
    assert not rules.moves_for(admin_a, retry).decide_retry
    with pytest.raises(SelfApproval):
        moves.retry_reject(attempt=retry, actor=Actor.user(admin_a), comment="no", fence=retry.fence)
    # Over the API, with the requester's own approver token: the same answer.
    raw = token_create(tenant=tenant_a, name="a", scopes=["approvals:decide"], actor=Actor.system("t"), person=admin_a)[
        1
    ]
    answer = Api(raw).post(f"/approvals/{retry.pk}/reject", {"fence": retry.fence, "comment": "no"})
    assert answer.json()["code"] == "self_approval"
    retry.refresh_from_db()
    assert retry.state == S.MANUAL_REVIEW


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_reject_needs_the_approver_role_and_marking_failed_the_operator_role(
    tenant_a: Tenant, operator_a: Any, make_user: Any, role: str
) -> None:
    person = make_user(f"{role}-x")
    Membership.objects.create(user=person, tenant=tenant_a, role=role)
    retry = moves.retry_request(
        attempt=under_review(tenant_a, lookup="not_found"), actor=Actor.user(operator_a), reason="r"
    )
    with pytest.raises(RoleRequired, match="needs to be an approver"):
        moves.retry_reject(attempt=retry, actor=Actor.user(person), comment="no", fence=retry.fence)
    attempt = attempt_in(S.UNKNOWN, tenant_a, key="k-2")
    review = moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="not idempotent")
    if role == "viewer":
        with pytest.raises(RoleRequired, match="needs to be an operator"):
            moves.attempt_mark_failed(attempt=review, actor=Actor.user(person), reason="x", fence=review.fence)
    else:
        moves.attempt_mark_failed(attempt=review, actor=Actor.user(person), reason="x", fence=review.fence)


def test_an_incident_is_claimed_and_resolved_by_operators_only(
    tenant_a: Tenant, viewer_a: Any, operator_a: Any
) -> None:
    from ledgerdash.ledger import clock
    from ledgerdash.ledger.models import Incident

    incident = Incident.objects.create(
        tenant=tenant_a,
        attempt=under_review(tenant_a),
        kind=Incident.Kind.DUPLICATE,
        summary="two effects for one key",
        opened_at=clock.now(),
    )
    with pytest.raises(RoleRequired):
        moves.incident_assign(incident=incident, owner=viewer_a, actor=Actor.user(viewer_a), reason="mine")
    with pytest.raises(RoleRequired):
        moves.incident_resolve(incident=incident, actor=Actor.user(viewer_a), resolution="refunded")
    moves.incident_assign(incident=incident, owner=operator_a, actor=Actor.user(operator_a), reason="mine")
    resolved = moves.incident_resolve(incident=incident, actor=Actor.user(operator_a), resolution="refunded")
    assert resolved.status == Incident.Status.RESOLVED


def test_no_retry_is_requested_for_a_deactivated_tenant(tenant_a: Tenant, operator_a: Any) -> None:
    from ledgerdash.ledger.errors import TenantInactive

    original = under_review(tenant_a, lookup="not_found")
    Tenant.objects.filter(pk=tenant_a.pk).update(is_active=False)
    with pytest.raises(TenantInactive):
        moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend")
    assert not Attempt.objects.filter(parent=original).exists()


@pytest.mark.parametrize("away", ["membership removed", "account deactivated"])
def test_a_person_taken_away_mid_decision_is_refused(
    away: str, tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    """The page was loaded while they were a member; the decision comes after they were not."""
    retry = moves.retry_request(
        attempt=attempt_in(S.MANUAL_REVIEW, tenant_a, key="away"), actor=Actor.user(operator_a), reason="resend"
    )
    seen = rules.moves_for(approver_a, retry)
    assert seen.decide_retry
    if away == "membership removed":
        Membership.objects.filter(user=approver_a, tenant=tenant_a).delete()
    else:
        type(approver_a).objects.filter(pk=approver_a.pk).update(is_active=False)
    with pytest.raises((RoleRequired, ApprovalRefused)):
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok", fence=retry.fence)
    with pytest.raises(RoleRequired):
        moves.retry_reject(attempt=retry, actor=Actor.user(approver_a), comment="no", fence=retry.fence)
    assert Attempt.objects.get(pk=retry.pk).state == S.MANUAL_REVIEW

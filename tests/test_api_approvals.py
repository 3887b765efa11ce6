"""Approving without a browser: an approver's own token lists what awaits
approval and decides it, with the same re-checks as the dashboard's buttons.

The token acts for one person and can never also write (the token that
records a call cannot approve it); the person's role is checked at every
request; four eyes holds against the person who asked for the retry and the
person who issued the agent's token.
"""

from __future__ import annotations

from typing import Any

import pytest

from ledgerdash.ledger import moves
from ledgerdash.ledger.errors import InvalidField
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, Membership, State, Tenant, TokenScope
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.tokens import token_create
from tests.api_support import BOTH, READ, Api, intent
from tests.conftest import TOOLS_V1
from tests.test_approvals import under_review

pytestmark = pytest.mark.django_db
S = State
DECIDE = TokenScope.DECIDE.value
BIG_CHARGE = intent("order:9:charge", tool_name="charge_card", args={"amount_cents": 60000})


def agent(tenant: Tenant, issuer: Actor | None = None) -> Api:
    return Api(token_create(tenant=tenant, name="shop agent", scopes=BOTH, actor=issuer or Actor.system("t"))[1])


def approver_api(tenant: Tenant, person: Any, *scopes: str) -> Api:
    raw = token_create(
        tenant=tenant, name=f"{person.username}'s approvals", scopes=scopes or [DECIDE], actor=Actor.system("t"),
        person=person,
    )[1]  # fmt: skip
    return Api(raw)


def test_an_approver_lists_and_approves_a_held_call_and_the_agent_then_sends_it(
    guarded: Tenant, approver_a: Any
) -> None:
    shop = agent(guarded)
    held = shop.post("/attempts", BIG_CHARGE)
    assert held.json()["code"] == "awaiting_approval"
    approver = approver_api(guarded, approver_a)

    listed = approver.get("/approvals")
    assert listed.status_code == 200, listed.content
    [item] = listed.json()["items"]
    assert item["attempt"]["id"] == held.json()["attempt_id"]
    assert (item["verdict"], item["original"]) == ("approvable", None)

    approved = approver.post(
        f"/approvals/{item['attempt']['id']}/approve", {"fence": item["attempt"]["fence"], "comment": "known customer"}
    )
    assert approved.status_code == 200, approved.content
    assert approved.json()["state"] == S.INTENT_RECORDED
    event = AttemptEvent.objects.filter(attempt_id=item["attempt"]["id"], to_state=S.INTENT_RECORDED).last()
    assert event is not None
    assert event.actor_user_id == approver_a.pk
    assert event.actor_label.startswith("approver-a via token ")
    # The agent's same call now goes through, once.
    again = shop.post("/attempts", BIG_CHARGE)
    assert again.status_code == 200, again.content
    assert shop.dispatch(again.json()["id"]).status_code == 200
    assert approver.get("/approvals").json()["items"] == []


def test_a_rejection_is_told_to_the_agent(guarded: Tenant, approver_a: Any) -> None:
    shop = agent(guarded)
    attempt_id = shop.post("/attempts", BIG_CHARGE).json()["attempt_id"]
    fence = Attempt.objects.get(pk=attempt_id).fence
    rejected = approver_api(guarded, approver_a).post(
        f"/approvals/{attempt_id}/reject", {"fence": fence, "comment": "fraud check failed"}
    )
    assert rejected.status_code == 200, rejected.content
    assert rejected.json()["state"] == S.FAILED
    told = shop.post("/attempts", BIG_CHARGE)
    assert told.json()["code"] == "approval_rejected"
    assert "fraud check failed" in told.json()["message"]


def test_a_linked_retry_is_approved_with_the_ledgers_rechecks(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    original = under_review(tenant_a, lookup="not_found")
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend it")
    approver = approver_api(tenant_a, approver_a)
    [item] = approver.get("/approvals").json()["items"]
    assert (item["attempt"]["id"], item["original"]["id"]) == (retry.pk, original.pk)
    # The policy took the tool's scope away since: approving is refused, and the refusal recorded.
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"))
    refused = approver.post(f"/approvals/{retry.pk}/approve", {"fence": retry.fence, "comment": "ok"})
    assert refused.status_code == 409
    assert refused.json()["code"] == "approval_refused"
    assert refused.json()["changes"]
    assert AttemptEvent.objects.filter(attempt=retry, kind="approval_refused").exists()
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, actor=Actor.system("t"))
    approved = approver.post(f"/approvals/{retry.pk}/approve", {"fence": retry.fence, "comment": "ok"})
    assert approved.status_code == 200, approved.content
    original.refresh_from_db()
    assert original.state == S.RECONCILED


def test_four_eyes_hold_against_the_requester_and_the_agents_token_issuer(
    guarded: Tenant, approver_a: Any, admin_a: Any
) -> None:
    # The approver issued the agent's token: the agent's calls are theirs too.
    attempt_id = agent(guarded, issuer=Actor.user(approver_a)).post("/attempts", BIG_CHARGE).json()["attempt_id"]
    fence = Attempt.objects.get(pk=attempt_id).fence
    mine = approver_api(guarded, approver_a).post(f"/approvals/{attempt_id}/approve", {"fence": fence, "comment": "x"})
    assert mine.json()["code"] == "self_approval"
    # A retry the approver asked for.
    original = under_review(guarded, lookup="not_found")
    retry = moves.retry_request(attempt=original, actor=Actor.user(admin_a), reason="resend")
    own = approver_api(guarded, admin_a).post(f"/approvals/{retry.pk}/approve", {"fence": retry.fence, "comment": "x"})
    assert own.status_code == 409
    assert own.json()["code"] == "self_approval"
    other = approver_api(guarded, approver_a).post(
        f"/approvals/{retry.pk}/approve", {"fence": retry.fence, "comment": "x"}
    )
    assert other.status_code == 200, other.content


def test_the_persons_role_is_checked_at_every_request(guarded: Tenant, approver_a: Any) -> None:
    attempt_id = agent(guarded).post("/attempts", BIG_CHARGE).json()["attempt_id"]
    approver = approver_api(guarded, approver_a)
    Membership.objects.filter(user=approver_a, tenant=guarded).update(role="viewer")
    for answer in (
        approver.get("/approvals"),
        approver.post(f"/approvals/{attempt_id}/approve", {"fence": 0, "comment": "x"}),
        approver.post(f"/approvals/{attempt_id}/reject", {"fence": 0, "comment": "x"}),
    ):
        assert answer.status_code == 403
        assert answer.json()["code"] == "role_required"
        assert "needs to be an approver" in answer.json()["message"]
    assert Attempt.objects.get(pk=attempt_id).state == S.MANUAL_REVIEW


def test_a_decision_on_what_moved_since_the_list_is_refused(guarded: Tenant, approver_a: Any, admin_a: Any) -> None:
    attempt_id = agent(guarded).post("/attempts", BIG_CHARGE).json()["attempt_id"]
    seen = Attempt.objects.get(pk=attempt_id).fence
    # Another approver decided it in the dashboard meanwhile.
    moves.retry_approve(attempt=Attempt.objects.get(pk=attempt_id), actor=Actor.user(admin_a), comment="fine")
    stale = approver_api(guarded, approver_a).post(f"/approvals/{attempt_id}/reject", {"fence": seen, "comment": "x"})
    assert stale.status_code == 409
    assert stale.json()["code"] == "stale_fence", stale.json()  # decided already: nothing to reject
    assert "now INTENT_RECORDED" in stale.json()["message"]
    assert Attempt.objects.get(pk=attempt_id).state == S.INTENT_RECORDED


def test_scopes_keep_agents_and_approvers_apart(guarded: Tenant, tenant_b: Tenant, approver_a: Any) -> None:
    shop = agent(guarded)
    assert shop.get("/approvals").json()["code"] == "insufficient_scope"
    approver = approver_api(guarded, approver_a)
    assert approver.post("/attempts", BIG_CHARGE).json()["code"] == "insufficient_scope"
    # Another tenant's attempt looks like none at all.
    theirs = agent(tenant_b).post("/attempts", intent("k:1")).json()
    assert approver.post(f"/approvals/{theirs['id']}/reject", {"fence": 0, "comment": "x"}).status_code == 404
    # READ beside DECIDE is allowed (an approver's tool reads what it decides).
    assert approver_api(guarded, approver_a, DECIDE, READ).get("/attempts").status_code == 200


@pytest.mark.parametrize(
    ("scopes", "person", "says"),
    [
        ([DECIDE], None, "acts for a person"),
        ([DECIDE, TokenScope.WRITE.value], "approver", "cannot also have attempts:write"),
        ([DECIDE], "operator", "needs to be an approver"),
        (BOTH, "approver", "only an approvals:decide token acts for a person"),
    ],
)
def test_a_token_that_would_blur_who_decides_is_not_issued(
    guarded: Tenant, approver_a: Any, operator_a: Any, scopes: list[str], person: str | None, says: str
) -> None:
    who = {"approver": approver_a, "operator": operator_a, None: None}[person]
    with pytest.raises(InvalidField, match=says):
        token_create(tenant=guarded, name="x", scopes=scopes, actor=Actor.system("t"), person=who)


def test_create_api_token_issues_an_approvers_token(guarded: Tenant, approver_a: Any) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    out, err = StringIO(), StringIO()
    call_command(
        "create_api_token", "--tenant", "acme", "--name", "approvals", "--scope", DECIDE, "--person", "approver-a",
        stdout=out, stderr=err,
    )  # fmt: skip
    assert "acting for approver-a" in err.getvalue()
    assert Api(out.getvalue().strip()).get("/approvals").status_code == 200
    with pytest.raises(CommandError, match="acts for a person"):
        call_command("create_api_token", "--tenant", "acme", "--name", "x", "--scope", DECIDE, stdout=out, stderr=err)
    with pytest.raises(CommandError, match="no person 'nobody'"):
        call_command("create_api_token", "--tenant", "acme", "--name", "x", "--scope", DECIDE, "--person", "nobody")
    # Without --scope: an agent's token, as before.
    call_command("create_api_token", "--tenant", "acme", "--name", "agent", stdout=out, stderr=err)
    assert "scopes attempts:read attempts:write" in err.getvalue()

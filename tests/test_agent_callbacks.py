"""An agent's callback: decisions on the attempts its API token recorded,
signed, delivered to a real receiver, so the agent need not poll."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from ledgerdash.ledger import moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken, Attempt, Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.tokens import token_create, token_revoke
from ledgerdash.notify import services, worker
from ledgerdash.notify.models import Channel, Delivery
from tests.api_support import BOTH, Api, intent
from tests.conftest import RECONCILER, TOOLS_V1
from tests.notify_receiver import Receiver

SYSTEM = Actor.system("tests")


@pytest.fixture
def receiver() -> Any:
    r = Receiver().start()
    yield r
    r.stop()


def _token(tenant: Tenant, name: str) -> tuple[ApiToken, Api]:
    row, raw = token_create(tenant=tenant, name=name, scopes=BOTH, actor=SYSTEM)
    return row, Api(raw)


def _unknown_via_api(api: Api, key: str) -> Attempt:
    created = api.record(key)
    fence = api.dispatch(created["id"]).json()["fence"]
    assert api.outcome(created["id"], "unknown", fence, reason="timeout").status_code == 200
    return Attempt.objects.get(pk=created["id"])


def test_the_agent_hears_the_reconciler_and_the_approver(
    tenant_a: Tenant, receiver: Receiver, operator_a: Any, approver_a: Any
) -> None:
    token, api = _token(tenant_a, "billing agent")
    other, other_api = _token(tenant_a, "another agent")
    callback = services.channel_create(
        tenant=tenant_a, name="billing callback", kind="agent", target=receiver.url, actor=SYSTEM, token=token
    )
    receiver.secret = callback.secret
    mine = _unknown_via_api(api, "mine")
    theirs = _unknown_via_api(other_api, "theirs")
    for attempt in (mine, theirs):
        moves.attempt_escalate(
            attempt=attempt,
            actor=RECONCILER,
            fence=attempt.fence,
            reason="not idempotent",
            lookup={"status": "not_found"},
        )
    assert worker.run_pass(worker="test").sent == 1  # the other token's attempt is not this agent's business
    (settled,) = receiver.received
    assert settled["signed"]
    assert settled["body"]["event"] == "agent_decision"
    assert settled["body"]["attempt"]["id"] == mine.pk
    assert settled["body"]["details"]["decision"] == "settled"
    assert settled["body"]["details"]["to_state"] == "MANUAL_REVIEW"

    retry = moves.retry_request(attempt=mine, actor=Actor.user(operator_a), reason="not found at the provider")
    moves.retry_approve(
        attempt=retry, actor=Actor.user(approver_a), comment="checked", safe_because="the agent's call timed out"
    )
    assert worker.run_pass(worker="test").sent == 1
    approved = receiver.received[-1]["body"]
    assert approved["attempt"]["id"] == retry.pk
    assert approved["attempt"]["parent_id"] == mine.pk
    assert approved["details"]["decision"] == "retry_approved"
    assert approved["details"]["idempotency_key"] == "mine"
    assert receiver.refused == []
    assert Delivery.objects.filter(channel=callback).count() == 2
    assert other.pk != token.pk


def test_a_rejected_retry_is_announced(tenant_a: Tenant, receiver: Receiver, operator_a: Any, approver_a: Any) -> None:
    token, api = _token(tenant_a, "agent")
    callback = services.channel_create(
        tenant=tenant_a, name="cb", kind="agent", target=receiver.url, actor=SYSTEM, token=token
    )
    receiver.secret = callback.secret
    original = _unknown_via_api(api, "rejected")
    original = moves.attempt_escalate(attempt=original, actor=RECONCILER, fence=original.fence, reason="x")
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="try again")
    moves.retry_reject(attempt=retry, actor=Actor.user(approver_a), comment="the original may have happened")
    worker.run_pass(worker="test")
    decisions = [entry["body"]["details"]["decision"] for entry in receiver.received]
    assert decisions == ["settled", "retry_rejected"]


def test_the_agent_hears_when_a_call_its_policy_held_is_approved_or_rejected(
    tenant_a: Tenant, receiver: Receiver, approver_a: Any
) -> None:
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals={"charge_card": "amount_cents > `50000`"}, actor=SYSTEM)
    token, api = _token(tenant_a, "checkout agent")
    callback = services.channel_create(
        tenant=tenant_a, name="checkout callback", kind="agent", target=receiver.url, actor=SYSTEM, token=token
    )
    receiver.secret = callback.secret
    held = []
    for n in (1, 2):
        body = intent(f"order:{n}:charge", tool_name="charge_card", args={"amount_cents": 90000})
        answer = api.post("/attempts", body)
        assert answer.json()["code"] == "awaiting_approval"
        held.append(Attempt.objects.get(pk=answer.json()["attempt_id"]))
    moves.retry_approve(attempt=held[0], actor=Actor.user(approver_a), comment="known customer")
    moves.retry_reject(attempt=held[1], actor=Actor.user(approver_a), comment="over the limit")
    assert worker.run_pass(worker="test").sent == 2
    decisions = {d["body"]["attempt"]["id"]: d["body"]["details"]["decision"] for d in receiver.received}
    assert decisions == {held[0].pk: "call_approved", held[1].pk: "call_rejected"}
    assert all(d["signed"] for d in receiver.received)


def test_a_callback_needs_a_live_token_of_its_own_tenant(tenant_a: Tenant, tenant_b: Tenant) -> None:
    token, _ = _token(tenant_a, "agent")
    url = "https://agent.example.com/cb"
    with pytest.raises(ValidationError, match="names the API token"):
        services.channel_create(tenant=tenant_a, name="x", kind="agent", target=url, actor=SYSTEM)
    with pytest.raises(ValidationError, match="another tenant"):
        services.channel_create(tenant=tenant_b, name="x", kind="agent", target=url, actor=SYSTEM, token=token)
    with pytest.raises(ValidationError, match="only an agent callback"):
        services.channel_create(tenant=tenant_a, name="x", kind="webhook", target=url, actor=SYSTEM, token=token)
    token_revoke(token=token, actor=SYSTEM)
    token.refresh_from_db()
    with pytest.raises(ValidationError, match="revoked"):
        services.channel_create(tenant=tenant_a, name="x", kind="agent", target=url, actor=SYSTEM, token=token)
    assert not Channel.objects.exists()


def test_each_attempt_names_the_token_its_agent_called_with(tenant_a: Tenant, operator_a: Any) -> None:
    """Whom a decision is told is a column of the attempt: the token of the
    call, kept by the linked retry a person requests; none in process."""
    token, api = _token(tenant_a, "billing agent")
    other, other_api = _token(tenant_a, "another agent")
    mine = _unknown_via_api(api, "mine")
    assert mine.api_token_id == token.pk
    review = moves.attempt_escalate(attempt=mine, actor=RECONCILER, fence=mine.fence, reason="not idempotent")
    retry = moves.retry_request(attempt=review, actor=Actor.user(operator_a), reason="resend")
    assert retry.api_token_id == token.pk
    # Another agent reusing the key with other arguments: its linked attempt is that agent's call.
    conflict = other_api.post("/attempts", intent("mine", args={"to": "elsewhere@example.com"})).json()
    assert Attempt.objects.get(pk=conflict["attempt_id"]).api_token_id == other.pk
    from tests.conftest import record

    assert record(tenant_a, "in-process").api_token_id is None


def test_attempts_recorded_before_the_column_get_their_token_from_the_actor_they_named(
    tenant_a: Tenant, operator_a: Any
) -> None:
    import importlib

    from django.apps import apps

    backfill = importlib.import_module("ledgerdash.ledger.migrations.0022_attempt_api_token").token_of_each_attempt
    token, api = _token(tenant_a, "billing agent")
    mine = _unknown_via_api(api, "mine")
    review = moves.attempt_escalate(attempt=mine, actor=RECONCILER, fence=mine.fence, reason="not idempotent")
    retry = moves.retry_request(attempt=review, actor=Actor.user(operator_a), reason="resend")
    Attempt.objects.update(api_token=None)
    backfill(apps, None)
    assert set(Attempt.objects.filter(pk__in=[mine.pk, retry.pk]).values_list("api_token_id", flat=True)) == {token.pk}

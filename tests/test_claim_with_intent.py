"""Two commits per call where a tool allows it: the intent and its dispatch
claim commit together (``Tool.claim_with_intent``), and a crash after that
commit, before the request left, is recovered by a lookup."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledgerdash.ledger import audit, recording
from ledgerdash.ledger.errors import AttemptInFlight
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.reconciler import Reconciler
from tests.conftest import AGENT, TOOLS_V1
from tests.sandboxes import Sandbox, unique_key

S = State
pytestmark = pytest.mark.usefixtures("sandbox_tools")


@pytest.fixture
def claiming(sandbox_tools: Sandbox) -> Sandbox:
    Tool.objects.filter(name="send_email").update(claim_with_intent=True)
    return sandbox_tools


def intent(tenant: Any, key: str, *, claim: bool = True, tool: str = "send_email") -> recording.Recorded:
    return recording.record_intent(
        tenant=tenant,
        task_id="t",
        tool_name=tool,
        idempotency_key=key,
        args={"to": "ap@example.com", "n": 1},
        actor=AGENT,
        claim=claim,
    )


def transitions(attempt: Attempt) -> list[tuple[str, str, int | None]]:
    return [
        (e.from_state, e.to_state, e.fence)
        for e in AttemptEvent.objects.filter(attempt=attempt, kind="transition").order_by("seq")
    ]


def test_the_intent_and_its_claim_commit_together(tenant_a: Any, claiming: Sandbox) -> None:
    recorded = intent(tenant_a, unique_key("k"))
    attempt = Attempt.objects.get(pk=recorded.attempt.pk)
    assert recorded.created
    assert recorded.claimed
    assert recorded.attempt.fence == 1
    assert (attempt.state, attempt.fence, attempt.dispatch_fence, attempt.dispatch_count) == (S.DISPATCHED, 1, 1, 1)
    assert attempt.first_dispatched_at == attempt.created_at
    assert attempt.next_check_at is not None
    assert attempt.lands_by is not None
    # It may be sent until its lease ends, and land until the maximum request time after that.
    assert attempt.lands_by > attempt.next_check_at
    assert transitions(attempt) == [("", S.INTENT_RECORDED, 0), (S.INTENT_RECORDED, S.DISPATCHED, 1)]
    claim = AttemptEvent.objects.filter(attempt=attempt).order_by("seq").last()
    assert claim is not None
    assert claim.details["claimed_with_intent"] is True
    assert audit.verify_tenant(tenant_a).ok


@pytest.mark.postgres
def test_on_postgresql_the_pair_is_one_statement(tenant_a: Any, claiming: Sandbox) -> None:
    intent(tenant_a, unique_key("warm"))  # the process now knows the tenant's authority
    with CaptureQueriesContext(connection) as captured:
        recorded = intent(tenant_a, unique_key("k"))
    statements = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 1
    assert recorded.claimed


@pytest.mark.postgres
@pytest.mark.parametrize("tenant", ["tenant_a", "tenant_striped"])
def test_the_pair_is_a_statement_psycopg_keeps_parsed(
    tenant: str, claiming: Sandbox, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg parses a statement again on every call (some 0.2 ms) unless it
    has at most 50 parameters and 4096 bytes: the pair, the largest of an
    agent's statements, must stay within both, in one chain or several."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

    from ledgerdash.ledger.store import statements as events

    owner = request.getfixturevalue(tenant)
    intent(owner, unique_key("warm"))  # the process now knows the tenant's authority: the statement is guarded
    sent: list[tuple[int, int]] = []
    execute = events._execute_append

    def measured(sql: str, params: list[Any], rows: list[Any]) -> Any:
        sent.append((len(sql.encode()), len(params)))
        return execute(sql, params, rows)

    monkeypatch.setattr(events, "_execute_append", measured)
    assert intent(owner, unique_key("k")).claimed
    ((size, params),) = sent
    assert params <= MAX_CACHED_STATEMENT_PARAMS
    assert size <= MAX_CACHED_STATEMENT_LENGTH


def test_the_wrapper_sends_a_claimed_call_without_another_claim(tenant_a: Any, claiming: Sandbox) -> None:
    send = recording.provider_tool("send_email", key="welcome:{user}")
    user = unique_key("u")
    with recording.task(tenant="acme", task_id="t"):
        send(user=user, to="new@example.com")
        again = send(user=user, to="new@example.com")
    attempt = Attempt.objects.get(idempotency_key=f"welcome:{user}")
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.dispatch_count == 1
    assert transitions(attempt) == [
        ("", S.INTENT_RECORDED, 0),
        (S.INTENT_RECORDED, S.DISPATCHED, 1),
        (S.DISPATCHED, S.OUTCOME_CONFIRMED, 2),
    ]
    assert again["payload_hash"] == attempt.args_hash
    assert claiming.count(f"welcome:{user}") == 1


def test_a_tool_without_the_setting_records_the_intent_alone(tenant_a: Any, sandbox_tools: Sandbox) -> None:
    recorded = intent(tenant_a, unique_key("k"))
    assert recorded.created
    assert not recorded.claimed
    assert recorded.attempt.state == S.INTENT_RECORDED


def test_a_call_held_for_approval_is_never_claimed(tenant_a: Any, claiming: Sandbox) -> None:
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, actor=Actor.system("tests"), approvals={"send_email": ""})
    recorded = intent(tenant_a, unique_key("k"))
    assert not recorded.claimed
    assert recorded.attempt.state == S.MANUAL_REVIEW
    assert recorded.attempt.dispatch_count == 0


def test_a_key_recorded_before_is_not_claimed_again(tenant_a: Any, claiming: Sandbox) -> None:
    key = unique_key("k")
    first = intent(tenant_a, key)
    again = intent(tenant_a, key)
    assert first.claimed
    assert not again.created
    assert not again.claimed
    with pytest.raises(AttemptInFlight):
        recording.refuse_unless_dispatchable(again.attempt)


def test_a_crash_after_the_pair_committed_is_recovered_by_lookup(tenant_a: Any, claiming: Sandbox) -> None:
    """The agent died after the commit, before its request left: DISPATCHED,
    nothing at the provider. Once the request could no longer land, the
    lookup says not found and the reconciler sends it, once."""
    attempt = intent(tenant_a, unique_key("k")).attempt
    assert claiming.count(attempt.provider_key) == 0
    past = timezone.now() - timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=past, lands_by=past)
    Reconciler(label="reconciler-test").run_pass()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.dispatch_count == 2
    assert claiming.count(attempt.provider_key) == 1


def test_the_setting_needs_a_lookup(sandbox_tools: Sandbox) -> None:
    tool = Tool(
        name="no_lookup",
        config={"dispatch_url": "https://api.example.com/send"},
        idempotent=True,
        claim_with_intent=True,
    )
    with pytest.raises(ValidationError) as caught:
        tool.full_clean()
    assert "needs a lookup" in str(caught.value)


def test_the_setting_needs_an_idempotent_tool(sandbox_tools: Sandbox) -> None:
    tool = Tool.objects.get(name="charge_card")  # not idempotent; it has a lookup
    tool.claim_with_intent = True
    with pytest.raises(ValidationError) as caught:
        tool.full_clean()
    assert "needs an idempotent tool" in str(caught.value)

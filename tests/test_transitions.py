from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledgerdash.ledger import audit, clock, moves, recording, rules
from ledgerdash.ledger.errors import (
    AttemptNotFound,
    AuthorizationChanged,
    ClaimLost,
    IllegalTransition,
    MissingEvidence,
    OwnershipError,
    RequestIdConflict,
    RetryPending,
    StaleFence,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tool
from ledgerdash.ledger.moves import LEGAL_MOVES
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import AGENT, RECONCILER, TOOLS_V1, events_of, ledger_snapshot, record, together
from tests.factories import attempt_in

S = State

# DESIGN.md's table, plus the moves the transitions module documents.
EXPECTED_MOVES = {
    (S.INTENT_RECORDED, S.DISPATCHED): {"agent", "reconciler"},
    (S.INTENT_RECORDED, S.FAILED): {"agent", "reconciler", "user"},
    (S.INTENT_RECORDED, S.MANUAL_REVIEW): {"agent", "reconciler"},
    (S.DISPATCHED, S.OUTCOME_CONFIRMED): {"agent", "reconciler"},
    (S.DISPATCHED, S.FAILED_RETRYABLE): {"agent", "reconciler"},
    (S.DISPATCHED, S.FAILED): {"agent", "reconciler"},
    (S.DISPATCHED, S.UNKNOWN): {"agent", "reconciler"},
    (S.FAILED_RETRYABLE, S.DISPATCHED): {"agent", "reconciler"},
    (S.FAILED_RETRYABLE, S.MANUAL_REVIEW): {"agent", "reconciler"},
    (S.FAILED_RETRYABLE, S.OUTCOME_CONFIRMED): {"agent"},
    (S.FAILED_RETRYABLE, S.FAILED): {"agent"},
    (S.UNKNOWN, S.OUTCOME_CONFIRMED): {"agent", "reconciler"},
    (S.UNKNOWN, S.FAILED): {"agent"},
    (S.UNKNOWN, S.FAILED_RETRYABLE): {"agent"},
    (S.UNKNOWN, S.DISPATCHED): {"reconciler"},
    (S.UNKNOWN, S.UNKNOWN): {"reconciler"},
    (S.UNKNOWN, S.MANUAL_REVIEW): {"reconciler"},
    (S.MANUAL_REVIEW, S.OUTCOME_CONFIRMED): {"user", "agent"},
    (S.MANUAL_REVIEW, S.FAILED): {"user", "agent"},
    (S.MANUAL_REVIEW, S.RECONCILED): {"user"},
    (S.MANUAL_REVIEW, S.INTENT_RECORDED): {"user"},
    (S.MANUAL_REVIEW, S.UNKNOWN): {"user"},
    # back before a person: its dispatcher withdraws the word it failed on
    (S.FAILED, S.MANUAL_REVIEW): {"agent"},
}


def test_legal_moves_are_the_designed_table() -> None:
    assert {k: set(v) for k, v in LEGAL_MOVES.items()} == EXPECTED_MOVES


def test_terminal_states_have_no_way_out_but_a_withdrawn_refusal() -> None:
    ways_out = {move for move in LEGAL_MOVES if move[0] in (S.OUTCOME_CONFIRMED, S.FAILED, S.RECONCILED)}
    assert ways_out == {(S.FAILED, S.MANUAL_REVIEW)}
    assert LEGAL_MOVES[(S.FAILED, S.MANUAL_REVIEW)] == {"agent"}


@dataclass(frozen=True)
class Op:
    """One public way to move an attempt: its target state and actor kind."""

    to: str
    actor: str
    run: Callable[[Attempt, Any], Attempt]
    #: narrower than the table: the only state this function starts from
    only_from: str | None = None
    #: the dispatcher's own report, sent with its dispatch fence: about an
    #: attempt that moved on, it is recorded as evidence, never refused
    dispatcher_report: bool = False


def _after_backoff(attempt: Attempt, step: Callable[[], Attempt]) -> Attempt:
    """Run ``step`` once a retryable failure's back-off has passed."""
    if attempt.state == S.FAILED_RETRYABLE and attempt.next_check_at is not None:
        with clock.frozen_at(attempt.next_check_at):
            return step()
    return step()


USER = "user"


def _user_actor(users: Any) -> Actor:
    return Actor.user(users["operator"])


OPS: dict[str, Op] = {
    "agent dispatches": Op(
        S.DISPATCHED, "agent", lambda a, u: _after_backoff(a, lambda: recording.mark_dispatched(a, actor=AGENT))
    ),
    "reconciler dispatches": Op(
        S.DISPATCHED,
        "reconciler",
        lambda a, u: moves.attempt_dispatch(attempt=a, actor=RECONCILER, fence=a.fence),
    ),
    "agent confirms": Op(
        S.OUTCOME_CONFIRMED,
        "agent",
        lambda a, u: recording.confirm(
            a, provider_request_id=a.provider_request_id or "req-9", fence=a.dispatch_fence or a.fence, actor=AGENT
        ),
        dispatcher_report=True,
    ),
    "reconciler confirms": Op(
        S.OUTCOME_CONFIRMED,
        "reconciler",
        lambda a, u: moves.attempt_confirm(attempt=a, fence=a.fence, actor=RECONCILER, provider_request_id="req-9"),
    ),
    "agent fails": Op(
        S.FAILED,
        "agent",
        lambda a, u: recording.fail(a, reason="no", fence=a.dispatch_fence or a.fence, actor=AGENT),
        dispatcher_report=True,
    ),
    "agent fails retryably": Op(
        S.FAILED_RETRYABLE, "agent", lambda a, u: recording.fail_retryable(a, reason="429", actor=AGENT)
    ),
    "agent marks unknown": Op(
        S.UNKNOWN, "agent", lambda a, u: recording.mark_unknown(a, reason="timeout", actor=AGENT)
    ),
    "lease expires": Op(
        S.UNKNOWN,
        "reconciler",
        lambda a, u: moves.attempt_expire_lease(attempt=a, actor=RECONCILER, fence=a.fence),
        only_from=S.DISPATCHED,
    ),
    "intent abandoned": Op(
        S.FAILED, "reconciler", lambda a, u: moves.attempt_abandon(attempt=a, actor=RECONCILER, fence=a.fence)
    ),
    "reconciler backs off": Op(
        S.UNKNOWN,
        "reconciler",
        lambda a, u: moves.attempt_check_later(
            attempt=a, actor=RECONCILER, fence=a.fence, reason="provider down", lookup={"status": "unavailable"}
        ),
        only_from=S.UNKNOWN,
    ),
    "reconciler escalates": Op(
        S.MANUAL_REVIEW,
        "reconciler",
        lambda a, u: moves.attempt_escalate(attempt=a, actor=RECONCILER, fence=a.fence, reason="not idempotent"),
    ),
    "operator verifies": Op(
        S.OUTCOME_CONFIRMED,
        USER,
        lambda a, u: moves.attempt_verify(attempt=a, actor=_user_actor(u), evidence="seen in dashboard"),
    ),
    "operator marks failed": Op(
        S.FAILED,
        USER,
        lambda a, u: moves.attempt_mark_failed(attempt=a, actor=_user_actor(u), reason="never sent"),
        only_from=S.MANUAL_REVIEW,
    ),
    "operator asks for a re-check": Op(
        S.UNKNOWN, USER, lambda a, u: moves.attempt_recheck(attempt=a, actor=_user_actor(u))
    ),
    "agent abandons its intent": Op(
        S.FAILED,
        "agent",
        lambda a, u: recording.abandon(a, reason="re-ran with other arguments", actor=AGENT),
        only_from=S.INTENT_RECORDED,
    ),
    "operator abandons an intent": Op(
        S.FAILED,
        USER,
        lambda a, u: moves.intent_abandon(attempt=a, actor=_user_actor(u), reason="agent is gone"),
        only_from=S.INTENT_RECORDED,
    ),
    "reconciler waits for the request to land": Op(
        S.UNKNOWN,
        "reconciler",
        lambda a, u: moves.attempt_wait_for_landing(
            attempt=a, actor=RECONCILER, fence=a.fence, lookup={"status": "not_found"}
        ),
        only_from=S.UNKNOWN,
    ),
}


@pytest.fixture
def users(operator_a: Any, approver_a: Any) -> dict[str, Any]:
    return {"operator": operator_a, "approver": approver_a}


def _expect_legal(state: str, op: Op) -> bool:
    if op.only_from is not None and state != op.only_from:
        return False
    if op.actor == USER and op.to == S.UNKNOWN and state == S.UNKNOWN:
        return True  # a re-check of an UNKNOWN attempt just makes it due now
    return op.actor in LEGAL_MOVES.get((state, op.to), frozenset())


#: States a dispatcher's report finds the attempt settled in: the report is
#: evidence, not a move.
SETTLED_FOR_REPORTS = (S.OUTCOME_CONFIRMED, S.FAILED, S.RECONCILED)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("op_name", list(OPS))
def test_every_move_is_allowed_exactly_when_the_table_says(
    state: str, op_name: str, tenant_a: Any, users: dict[str, Any]
) -> None:
    op = OPS[op_name]
    attempt = attempt_in(state, tenant_a, requester=users["operator"], approver=users["approver"], silent=True)
    before_events = AttemptEvent.objects.count()
    if op.dispatcher_report and state == S.FAILED and op.to == S.OUTCOME_CONFIRMED:
        # It failed on this dispatcher's own word; its receipt withdraws that word: a person decides.
        op.run(attempt, users)
        attempt.refresh_from_db()
        assert attempt.state == S.MANUAL_REVIEW
        new = list(AttemptEvent.objects.filter(seq__gt=0).order_by("seq"))[before_events:]
        assert [(e.kind, e.to_state) for e in new] == [
            ("transition", S.MANUAL_REVIEW),
            ("late_report", ""),
            ("incident", ""),
        ]
    elif op.dispatcher_report and state in SETTLED_FOR_REPORTS and attempt.dispatch_fence is not None:
        snapshot = ledger_snapshot()
        op.run(attempt, users)
        assert ledger_snapshot()[2] == snapshot[2]  # no state, fence or owner moved
        new = list(AttemptEvent.objects.filter(seq__gt=0).order_by("seq"))[before_events:]
        # recorded as evidence (and an incident when it contradicts the
        # ledger), or nothing at all when it repeats what was recorded
        assert {e.kind for e in new} <= {"late_report", "incident"}
        assert bool(new) != (state == op.to)
    elif _expect_legal(state, op):
        moved = op.run(attempt, users)
        moved.refresh_from_db()
        assert moved.state == op.to
        new = list(AttemptEvent.objects.filter(seq__gt=0).order_by("seq"))[before_events:]
        assert len(new) == 1
        assert new[0].attempt_id == attempt.pk
        assert new[0].actor_kind == op.actor
        if new[0].kind == "transition":
            assert (new[0].from_state, new[0].to_state) == (state, op.to)
            assert new[0].fence == moved.fence
    else:
        snapshot = ledger_snapshot()
        with pytest.raises((IllegalTransition, StaleFence)):
            op.run(attempt, users)
        assert ledger_snapshot() == snapshot


def test_an_intent_is_recorded_with_its_event(tenant_a: Any) -> None:
    attempt = record(tenant_a)
    assert attempt.state == S.INTENT_RECORDED
    assert attempt.fence == 0
    assert attempt.policy_version == 1
    assert attempt.credential_scope == "email:send"
    (event,) = events_of(attempt)
    assert (event.from_state, event.to_state, event.kind) == ("", S.INTENT_RECORDED, "transition")
    assert event.details["args_hash"] == attempt.args_hash


def test_dispatch_returns_a_fence_and_sets_the_lease(tenant_a: Any, settings: Any) -> None:
    settings.LEDGER_DISPATCH_LEASE_SECONDS = 30
    settings.LEDGER_MAX_REQUEST_SECONDS = 10
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    assert attempt.fence == 1
    assert attempt.dispatch_fence == 1
    assert attempt.dispatch_count == 1
    assert attempt.next_check_at is not None
    assert attempt.lands_by is not None
    assert (attempt.next_check_at - attempt.updated_at).total_seconds() == 30
    # The dispatcher may send until its lease ends; the request may land until the maximum request time after.
    assert (attempt.lands_by - attempt.updated_at).total_seconds() == 30 + 10


def test_a_lease_is_stretched_past_a_long_request_time(tenant_a: Any, settings: Any) -> None:
    settings.LEDGER_DISPATCH_LEASE_SECONDS = 30
    Tool.objects.create(name="send_email", config={"lookup_url": "http://127.0.0.1:9/x"}, max_request_seconds=40)
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    assert attempt.next_check_at is not None
    assert attempt.lands_by is not None
    assert (attempt.next_check_at - attempt.updated_at).total_seconds() == 40 + 10
    assert (attempt.lands_by - attempt.updated_at).total_seconds() == 40 + 10 + 40


def test_a_tool_refuses_a_lease_that_does_not_exceed_its_request_time(db: None) -> None:
    tool = Tool(
        name="slow", config={"lookup_url": "http://127.0.0.1:9/x"}, dispatch_lease_seconds=5, max_request_seconds=5
    )
    with pytest.raises(ValidationError, match="must exceed the maximum request time"):
        tool.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        tool.save()


def test_an_agent_cannot_resend_a_retryable_failure_during_its_back_off(tenant_a: Any) -> None:
    failed = recording.fail_retryable(recording.mark_dispatched(record(tenant_a), actor=AGENT), reason="429")
    assert failed.next_check_at is not None
    snapshot = ledger_snapshot()
    with pytest.raises(RetryPending):
        moves.attempt_dispatch(attempt=failed, actor=AGENT, fence=failed.fence)
    assert ledger_snapshot() == snapshot
    with clock.frozen_at(failed.next_check_at):
        assert moves.attempt_dispatch(attempt=failed, actor=AGENT, fence=failed.fence).state == S.DISPATCHED


def test_the_fence_refuses_a_stale_worker(tenant_a: Any) -> None:
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    stale_fence = attempt.fence
    claimed = moves.attempts_claim_due(limit=10, now=attempt.next_check_at)
    assert [a.pk for a in claimed] == [attempt.pk]
    moves.attempt_expire_lease(attempt=claimed[0], actor=RECONCILER, fence=claimed[0].fence)
    reclaimed = moves.attempts_claim_due(limit=10, now=claimed[0].next_check_at)
    assert reclaimed[0].lands_by is not None
    with clock.frozen_at(reclaimed[0].lands_by + timedelta(seconds=1)):  # once the first can no longer land
        retried = moves.attempt_dispatch(attempt=reclaimed[0], actor=RECONCILER, fence=reclaimed[0].fence)
    # The original worker comes back with its old fence: its report is evidence, never a move.
    report = recording.report_outcome(
        attempt, outcome="confirmed", provider_request_id="late", fence=stale_fence, actor=AGENT
    )
    assert report.late
    now = Attempt.objects.get(pk=attempt.pk)
    assert (now.state, now.fence, now.provider_request_id) == (S.DISPATCHED, retried.fence, "")
    assert events_of(attempt)[-1].kind == "late_report"
    # A fence no dispatch of this attempt ever held is refused, and nothing is written.
    snapshot = ledger_snapshot()
    with pytest.raises(StaleFence):
        recording.confirm(attempt, provider_request_id="forged", fence=retried.fence + 7, actor=AGENT)
    assert ledger_snapshot() == snapshot


def test_a_stale_reconciler_cannot_complete_a_superseded_claim(tenant_a: Any) -> None:
    attempt = recording.mark_unknown(recording.mark_dispatched(record(tenant_a), actor=AGENT), reason="t", actor=AGENT)
    (first,) = moves.attempts_claim_due(limit=1, now=attempt.next_check_at)
    # The first worker stalls past its claim lease; a second worker claims it.
    (second,) = moves.attempts_claim_due(limit=1, now=first.next_check_at)
    assert second.fence == first.fence + 1
    with pytest.raises(StaleFence):
        moves.attempt_confirm(attempt=first, fence=first.fence, actor=RECONCILER, provider_request_id="r")
    confirmed = moves.attempt_confirm(attempt=second, fence=second.fence, actor=RECONCILER, provider_request_id="r")
    assert confirmed.state == S.OUTCOME_CONFIRMED


def test_a_late_outcome_report_from_the_original_dispatcher_is_accepted(tenant_a: Any) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    # The agent's response finally arrives; it still holds its dispatch fence.
    confirmed = recording.confirm(dispatched, provider_request_id="req-late", actor=AGENT)
    assert confirmed.state == S.OUTCOME_CONFIRMED
    last = events_of(confirmed)[-1]
    assert last.details["late_report"]["provider_request_id"] == "req-late"
    assert last.actor_kind == "agent"
    assert (last.from_state, last.to_state) == (S.UNKNOWN, S.OUTCOME_CONFIRMED)


def test_a_late_report_after_a_re_dispatch_is_evidence_about_the_earlier_dispatch(tenant_a: Any) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    assert unknown.lands_by is not None
    with clock.frozen_at(unknown.lands_by + timedelta(seconds=1)):  # once the first can no longer land
        resent = moves.attempt_dispatch(attempt=unknown, actor=RECONCILER, fence=unknown.fence)
    report = recording.report_outcome(dispatched, outcome="confirmed", provider_request_id="req-late", actor=AGENT)
    assert report.late
    assert (report.attempt.state, report.attempt.fence) == (S.DISPATCHED, resent.fence)
    (event,) = events_of(dispatched)[-1:]
    assert event.kind == "late_report"
    assert "an earlier dispatcher" in event.reason
    assert event.details["report"]["provider_request_id"] == "req-late"


def test_confirming_needs_evidence(tenant_a: Any) -> None:
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    snapshot = ledger_snapshot()
    with pytest.raises(MissingEvidence):
        recording.confirm(attempt, actor=AGENT)
    assert ledger_snapshot() == snapshot


def test_the_request_id_is_recorded_at_once_and_cannot_be_swapped(tenant_a: Any) -> None:
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    attempt = recording.record_request_id(attempt, "req-1", actor=AGENT)
    assert Attempt.objects.get(pk=attempt.pk).provider_request_id == "req-1"
    assert events_of(attempt)[-1].kind == "request_id"
    with pytest.raises(RequestIdConflict):
        recording.confirm(attempt, provider_request_id="req-2", actor=AGENT)
    confirmed = recording.confirm(attempt, actor=AGENT)
    assert confirmed.provider_request_id == "req-1"


def test_entering_unknown_assigns_the_tenant_owner_and_keeps_it(tenant_a: Any, operator_a: Any) -> None:
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    unknown = recording.mark_unknown(attempt, reason="timeout", actor=AGENT)
    assert unknown.owner_id == tenant_a.default_owner_id
    assert events_of(unknown)[-1].details["owner_assigned"]["by"] == "tenant default owner"
    moves.attempt_assign(attempt=unknown, owner=operator_a, actor=Actor.user(operator_a))
    unknown.refresh_from_db()
    escalated = moves.attempt_escalate(attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="x")
    assert escalated.owner_id == operator_a.pk  # never silently reassigned


def test_on_call_beats_the_default_owner(tenant_a: Any, operator_a: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from ledgerdash.ledger.models import OnCallShift

    now = timezone.now()
    OnCallShift.objects.create(
        tenant=tenant_a, user=operator_a, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)
    )
    attempt = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    assert recording.mark_unknown(attempt, reason="t", actor=AGENT).owner_id == operator_a.pk


def test_an_owned_state_cannot_be_left_unowned(tenant_a: Any, operator_a: Any) -> None:
    unknown = attempt_in(S.UNKNOWN, tenant_a)
    with pytest.raises(OwnershipError):
        moves.attempt_assign(attempt=unknown, owner=None, actor=Actor.user(operator_a))


def test_a_policy_change_before_dispatch_links_a_reviewed_attempt_instead_of_killing_the_key(tenant_a: Any) -> None:
    attempt = record(tenant_a)
    narrowed = {**TOOLS_V1, "send_email": []}
    policy_publish(tenant=tenant_a, tools=narrowed, actor=Actor.system("t"), note="email may not send any more")
    with pytest.raises(AuthorizationChanged) as caught:
        recording.mark_dispatched(attempt, actor=AGENT)
    original = Attempt.objects.get(pk=attempt.pk)
    linked = Attempt.objects.get(parent=original)
    # Not sent, and not left to die: the original is under review beside a
    # linked attempt under the current policy, scope never wider.
    assert original.state == S.MANUAL_REVIEW
    assert original.dispatch_count == 0
    assert original.owner_id is not None
    assert linked.state == S.MANUAL_REVIEW
    assert linked.policy_version == 2
    assert linked.credential_scope == ""
    assert caught.value.attempt == linked
    assert caught.value.original == original
    assert "email:send is not allowed for send_email by policy v2" in str(caught.value)
    # The original was never sent, so approving the linked attempt needs no reason.
    assert rules.original_standing(original).proof == f"the original #{original.pk} was never sent"


def test_a_policy_version_that_leaves_the_tool_as_it_was_does_not_stop_a_dispatch(tenant_a: Any) -> None:
    attempt = record(tenant_a)
    policy_publish(
        tenant=tenant_a, tools={**TOOLS_V1, "new_tool": ["x:y"]}, actor=Actor.system("t"), note="adds a tool"
    )
    dispatched = recording.mark_dispatched(attempt, actor=AGENT)
    assert dispatched.state == S.DISPATCHED
    assert dispatched.policy_version == 1  # recorded under v1...
    assert events_of(dispatched)[-1].details["policy_version"] == 2  # ...and re-checked under v2 when sent


def test_two_dispatchers_one_claim(tenant_a: Any) -> None:
    attempt = record(tenant_a)
    copy = Attempt.objects.get(pk=attempt.pk)
    recording.mark_dispatched(attempt, actor=AGENT)
    with pytest.raises(ClaimLost):
        recording.mark_dispatched(copy, actor=Actor.agent("second worker"))


def test_escalating_for_a_retry_links_an_attempt_never_wider(tenant_a: Any) -> None:
    attempt = record(tenant_a, tool_name="charge_card", args={"amount": 5}, credential_scope="payments:charge")
    unknown = recording.mark_unknown(recording.mark_dispatched(attempt, actor=AGENT), reason="t", actor=AGENT)
    narrower = {**TOOLS_V1, "charge_card": ["payments:refund"]}
    policy_publish(tenant=tenant_a, tools=narrower, actor=Actor.system("t"), note="v2")
    original, linked = moves.attempt_escalate_for_retry(
        attempt=unknown, actor=RECONCILER, fence=unknown.fence, changes=["policy is now v2"]
    )
    assert original.state == S.MANUAL_REVIEW
    assert linked is not None
    assert linked.state == S.MANUAL_REVIEW
    assert linked.parent_id == original.pk
    assert linked.policy_version == 2
    assert linked.credential_scope == ""  # charge ∩ refund: nothing wider than either
    assert linked.provider_key == original.provider_key
    assert linked.owner_id == tenant_a.default_owner_id


def test_events_are_chained_per_tenant(tenant_a: Any, tenant_b: Any) -> None:
    from ledgerdash.ledger import chain

    record(tenant_a, "a-1")
    record(tenant_b, "b-1")
    record(tenant_a, "a-2")
    for tenant in (tenant_a, tenant_b):
        prev = chain.GENESIS
        events = list(AttemptEvent.objects.filter(tenant=tenant).order_by("seq"))
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        for event in events:
            assert event.prev_hash == prev
            assert event.hash == chain.link(prev, event.content_hash)
            prev = event.hash
        assert tenant.chain_heads.get().hash == prev


@pytest.mark.django_db
def test_an_attempt_read_by_id_is_the_one_the_orm_reads(tenant_a: Any, operator_a: Any) -> None:
    """The read every API request about an attempt makes builds the instance
    from its row itself; field for field it is what a query set gives, JSON
    decoded and datetimes aware, on either database."""
    attempt = recording.confirm(
        recording.mark_dispatched(record(tenant_a), actor=AGENT),
        provider_request_id="req-1",
        result={"id": "msg-1", "n": [1, 2.5, None, True]},
        actor=AGENT,
    )
    moves.attempt_assign(attempt=attempt, owner=operator_a, actor=Actor.user(operator_a))
    expected = Attempt.objects.get(pk=attempt.pk)
    for read in (moves.get_attempt(attempt.pk), moves.get_attempt(attempt.pk, tenant_id=tenant_a.pk)):
        assert not read._state.adding
        assert read._state.db == expected._state.db
        for field in Attempt._meta.concrete_fields:
            got, want = getattr(read, field.attname), getattr(expected, field.attname)
            assert (type(got), got) == (type(want), want), field.name
    assert expected.result == {"id": "msg-1", "n": [1, 2.5, None, True]}
    assert expected.first_dispatched_at is not None
    assert expected.first_dispatched_at.tzinfo is not None
    assert expected.owner_id == operator_a.pk
    with pytest.raises(AttemptNotFound):
        moves.get_attempt(attempt.pk, tenant_id=tenant_a.pk + 1000)


def test_a_comment_is_an_event(tenant_a: Any, operator_a: Any) -> None:
    attempt = record(tenant_a)
    event = moves.attempt_comment(attempt=attempt, actor=Actor.user(operator_a), text="looking")
    assert (event.kind, event.reason, event.actor_user_id) == ("comment", "looking", operator_a.pk)


# --- PostgreSQL, outside a transaction: a change and its event in one statement -------


def _assert_chain_intact(tenant: Any) -> None:
    from ledgerdash.ledger import chain
    from ledgerdash.ledger.models import ChainHead

    prev = chain.GENESIS
    events = list(AttemptEvent.objects.filter(tenant=tenant).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    for event in events:
        assert event.content_hash == chain.content_hash(chain.event_content(event))
        assert event.prev_hash == prev
        assert event.hash == chain.link(prev, event.content_hash)
        prev = event.hash
    head = ChainHead.objects.get(tenant=tenant)
    assert (head.seq, head.hash) == (len(events), prev)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_agents_of_one_tenant_keep_its_chain_whole(tenant_a: Any) -> None:
    """Eight agents of one tenant recording, dispatching and confirming at
    once: every attempt has its three moves, and the tenant has one unbroken
    chain, by this module's own walk and by verify_audit's."""
    errors: list[BaseException] = []
    agents, calls = 8, 25

    def agent(n: int) -> None:
        actor = Actor.agent(f"agent-{n}")
        try:
            for i in range(calls):
                attempt = recording.record_intent(
                    tenant="acme",
                    task_id=f"task-{n}",
                    tool_name="send_email",
                    idempotency_key=f"k-{n}-{i}",
                    args={"n": n, "i": i},
                    actor=actor,
                ).attempt
                attempt = recording.mark_dispatched(attempt, actor=actor)
                recording.confirm(attempt, provider_request_id=f"req-{n}-{i}", actor=actor)
        except BaseException as exc:
            errors.append(exc)

    together(agent, range(agents))
    assert errors == []
    assert Attempt.objects.filter(state=S.OUTCOME_CONFIRMED).count() == agents * calls
    assert AttemptEvent.objects.filter(tenant=tenant_a, attempt__isnull=False).count() == agents * calls * 3
    for attempt in Attempt.objects.all():
        assert [(e.from_state, e.to_state, e.fence) for e in events_of(attempt)] == [
            ("", S.INTENT_RECORDED, 0),
            (S.INTENT_RECORDED, S.DISPATCHED, 1),
            (S.DISPATCHED, S.OUTCOME_CONFIRMED, 2),
        ]
        assert attempt.fence == 2
    _assert_chain_intact(tenant_a)
    (result,) = audit.verify([tenant_a], save=False)
    assert result.ok, result
    seqs = list(AttemptEvent.objects.filter(tenant=tenant_a).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_tenants_first_event_creates_its_chain_head(make_user: Any) -> None:
    from django.db import connection

    from ledgerdash.ledger.models import ChainHead, Tenant

    # A tenant and policy written behind the application's back (raw SQL):
    # through the application, creating the tenant is its chain's first event.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_tenant (slug, name, is_active, created_at) VALUES ('fresh', 'Fresh', true, now()) "
            "RETURNING id"
        )
        (tenant_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO ledger_policy (tenant_id, version, tools, note, created_at) VALUES (%s, 1, %s, '', now())",
            [tenant_id, json.dumps(TOOLS_V1)],
        )
    tenant = Tenant.objects.get(pk=tenant_id)
    assert not ChainHead.objects.filter(tenant=tenant).exists()
    attempt = record(tenant, "first")
    assert [e.seq for e in events_of(attempt)] == [1]
    _assert_chain_intact(tenant)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stale_compare_and_set_writes_neither_change_nor_event(tenant_a: Any) -> None:
    attempt = record(tenant_a)
    stale = Attempt.objects.get(pk=attempt.pk)
    recording.mark_dispatched(attempt, actor=AGENT)
    before = ledger_snapshot()
    with pytest.raises(ClaimLost):
        recording.mark_dispatched(stale, actor=AGENT)
    assert ledger_snapshot() == before
    _assert_chain_intact(tenant_a)


@pytest.mark.postgres
def test_the_suite_runs_the_moves_as_production_runs_them(tenant_a: Any) -> None:
    """On PostgreSQL a change and its event are one statement outside any
    transaction; the test case's own wrapping transaction does not turn
    that path off, so every move above is tested on it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    attempt = record(tenant_a)
    with CaptureQueriesContext(connection) as captured:
        recording.mark_dispatched(attempt, actor=AGENT)
    statements = [q["sql"] for q in captured.captured_queries if "ledger_attemptevent" in q["sql"]]
    assert len(statements) == 1
    assert statements[0].lstrip().startswith("WITH changed AS")
    # Inside a caller's transaction the ledger's own path takes over instead.
    with transaction.atomic(), CaptureQueriesContext(connection) as inside:
        moves.attempt_comment(attempt=attempt, actor=AGENT, text="seen")
    assert not any(q["sql"].lstrip().startswith("WITH changed AS") for q in inside.captured_queries)


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_one_statement_change_sends_every_value_as_the_orm_would() -> None:
    """The values a change sends skip the ORM's conversions only where those
    would return the value itself: for every column of an attempt and every
    kind of value, what is sent equals what ``get_db_prep_save`` returns."""
    import datetime as dt
    import warnings

    from django.db import connection

    from ledgerdash.ledger.store import statements

    aware = dt.datetime(2026, 12, 1, 14, 0, tzinfo=dt.UTC)
    samples: list[Any] = [
        "text", "", 7, 0, True, False, None, aware, aware.replace(tzinfo=None), {"a": [1, "b"]}, ["x"], 1.5,
        S.DISPATCHED,
    ]  # fmt: skip
    for field in Attempt._meta.concrete_fields:
        column = statements._column(field.name)
        assert column.field is field
        for value in samples:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a naive datetime, as the ORM warns of it
                try:
                    expected = field.get_db_prep_save(value, connection)
                except (TypeError, ValueError, ValidationError):
                    continue  # a value the field refuses: both ways refuse it, by the same call
                sent = column.db_value(value, connection)
            assert type(sent) is type(expected), (field.name, value, expected)
            assert repr(sent) == repr(expected), (field.name, value, expected)
    # The ORM is skipped for text and datetimes, never for JSON or integers
    # (typed by the column's size), and a naive datetime still gets its warning.
    kinds = {f.get_internal_type(): statements._column(f.name).as_is for f in Attempt._meta.concrete_fields}
    assert (kinds["CharField"], kinds["TextField"], kinds["DateTimeField"]) == (str, str, dt.datetime)
    assert (kinds["JSONField"], kinds["PositiveIntegerField"], kinds["ForeignKey"]) == (None, None, None)
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        statements._column("updated_at").db_value(aware.replace(tzinfo=None), connection)


def test_a_late_report_sent_twice_is_recorded_once(tenant_a: Any) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    moves.attempt_confirm(attempt=unknown, fence=unknown.fence, actor=RECONCILER, provider_request_id="req-1")
    first = recording.report_outcome(dispatched, outcome="confirmed", provider_request_id="req-1", actor=AGENT)
    # The answer was lost on the way back: the dispatcher sends the same report again.
    again = recording.report_outcome(dispatched, outcome="confirmed", provider_request_id="req-1", actor=AGENT)
    assert first.late
    assert again.replayed
    assert [e.kind for e in events_of(dispatched)].count("late_report") == 1


def _under_review_after_its_lease(tenant: Any) -> Attempt:
    """An attempt whose dispatcher went silent: its lease ran out, the lookups ran out, a person decides."""
    dispatched = recording.mark_dispatched(record(tenant, "k-review"), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    return moves.attempt_escalate(attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="checks ran out")


def test_a_late_report_that_settled_an_attempt_under_review_is_a_replay_when_sent_again(tenant_a: Any) -> None:
    reviewed = _under_review_after_its_lease(tenant_a)
    dispatched_with = reviewed.dispatch_fence
    first = recording.report_outcome(
        reviewed, outcome="failed_retryable", reason="rejected before acting", fence=dispatched_with, actor=AGENT
    )
    again = recording.report_outcome(
        reviewed, outcome="failed_retryable", reason="rejected before acting", fence=dispatched_with, actor=AGENT
    )
    assert first.late
    assert first.attempt.state == S.FAILED
    assert again.replayed
    assert [(e.from_state, e.to_state) for e in events_of(reviewed)][-1] == (S.MANUAL_REVIEW, S.FAILED)


def test_a_report_sent_again_after_recovery_moved_the_attempt_on_is_still_a_replay(tenant_a: Any) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    fence = dispatched.fence
    recording.report_outcome(dispatched, outcome="unknown", reason="timed out", fence=fence, actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=timezone.now() + timedelta(hours=1))
    moves.attempt_check_later(
        attempt=claimed, actor=RECONCILER, fence=claimed.fence, reason="503", lookup={"status": "unavailable"}
    )
    before = len(events_of(dispatched))
    again = recording.report_outcome(dispatched, outcome="unknown", reason="timed out", fence=fence, actor=AGENT)
    assert again.replayed
    assert len(events_of(dispatched)) == before


@pytest.mark.parametrize("refusal", ["failed", "failed_retryable"])
def test_a_refusal_after_its_own_dispatchers_unknown_settles_nothing(tenant_a: Any, refusal: str) -> None:
    """The dispatcher said it could not tell whether its request landed, and later reported a
    refusal: that is the refusal of a later request of the same dispatch (its SDK sent it again),
    and says nothing of the first request's fate. The report is kept; the reconciler goes on
    looking the side effect up, and the time its first request may land stays as it was."""
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    fence = dispatched.fence
    unknown = recording.report_outcome(dispatched, outcome="unknown", reason="timed out", fence=fence, actor=AGENT)
    assert unknown.attempt.state == S.UNKNOWN
    refused = recording.report_outcome(dispatched, outcome=refusal, reason="declined", fence=fence, actor=AGENT)
    assert refused.late
    now = Attempt.objects.get(pk=dispatched.pk)
    assert (now.state, now.lands_by, now.failed_because) == (S.UNKNOWN, unknown.attempt.lands_by, "")
    last = events_of(dispatched)[-1]
    assert (last.kind, last.details["report"]["outcome"]) == ("late_report", refusal)
    # Sent again, it is a replay.
    assert recording.report_outcome(dispatched, outcome=refusal, reason="declined", fence=fence, actor=AGENT).replayed


def test_a_refusal_after_its_dispatchers_late_unknown_leaves_the_attempt_with_a_person(tenant_a: Any) -> None:
    reviewed = _under_review_after_its_lease(tenant_a)
    fence = reviewed.dispatch_fence
    said = recording.report_outcome(reviewed, outcome="unknown", reason="timed out", fence=fence, actor=AGENT)
    assert said.late
    assert said.attempt.state == S.MANUAL_REVIEW
    refused = recording.report_outcome(reviewed, outcome="failed", reason="declined", fence=fence, actor=AGENT)
    assert refused.late
    assert Attempt.objects.get(pk=reviewed.pk).state == S.MANUAL_REVIEW
    assert [e.kind for e in events_of(reviewed)][-2:] == ["late_report", "late_report"]


def test_a_refusal_without_an_unknown_before_it_still_settles_an_attempt_under_review(tenant_a: Any) -> None:
    reviewed = _under_review_after_its_lease(tenant_a)
    refused = recording.report_outcome(
        reviewed, outcome="failed", reason="declined", fence=reviewed.dispatch_fence, actor=AGENT
    )
    assert refused.attempt.state == S.FAILED

"""The ways a crash (or a slow provider, or a person's guess) could turn a
tool call into a duplicate or a lost action, outside the drill's crash
points; each is closed by a rule of the ledger, tested here on both
databases:

1. the intent is durable before dispatch even when the caller has a transaction open;
2. a request still on its way is not taken for lost (heartbeats, the
   maximum request time, "not found" only counts once it can no longer land),
   and a late landing after a retry went out is an incident, never silent;
3. a person's "failed" is a claim, not the provider's word;
4. a policy change between intent and dispatch links an attempt for review;
5. an effect confirmed by a lookup replays what the provider said;
6. recovery and agents survive a database that drops their connection;
7. an agent can give up an intent it never sent.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

import ledgerdash_client as ledger_client
from ledgerdash.ledger import clock, moves, recording, rules
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    IllegalTransition,
    InsideTransaction,
    LedgerUnavailable,
    StaleFence,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, FailedBecause, Incident, State, Tenant, Tool
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash_client.outcomes import NothingHappened
from tests.conftest import AGENT, RECONCILER, ledger_snapshot, record
from tests.factories import an_hour_ago, attempt_in
from tests.sandboxes import Sandbox, unique_key

S = State


# --- 1. a caller's transaction --------------------------------------------------------------


def test_a_tool_called_inside_the_callers_transaction_is_refused_before_anything_is_recorded(
    tenant_a: Tenant, sandbox_tools: Sandbox
) -> None:
    send = recording.provider_tool("send_email", key="invoice:{invoice}:send")
    invoice = unique_key("inv")
    before = ledger_snapshot()
    with (
        recording.task(tenant="acme", task_id="t"),
        pytest.raises(InsideTransaction, match="must not run inside an open database transaction"),
        transaction.atomic(),
    ):
        send(invoice=invoice, to="ap@example.com")
    assert ledger_snapshot() == before
    assert sandbox_tools.count(f"invoice:{invoice}:send") == 0


@pytest.mark.parametrize(
    "step",
    [
        lambda a: recording.mark_dispatched(a, actor=AGENT),
        lambda a: recording.abandon(a, actor=AGENT),
    ],
    ids=["dispatch", "abandon"],
)
def test_every_agent_step_refuses_an_open_transaction(tenant_a: Tenant, step: Any) -> None:
    attempt = record(tenant_a)
    with pytest.raises(InsideTransaction), transaction.atomic():
        step(attempt)
    with pytest.raises(InsideTransaction), transaction.atomic():
        record(tenant_a, "another-key")
    dispatched = recording.mark_dispatched(attempt, actor=AGENT)
    with pytest.raises(InsideTransaction), transaction.atomic():
        recording.confirm(dispatched, provider_request_id="r-1", actor=AGENT)


@pytest.mark.postgres  # committed for real: SQLite's test database cannot be emptied after (append-only)
@pytest.mark.django_db(transaction=True)
def test_the_intent_and_the_claim_are_committed_before_the_tool_runs(tenant_a: Tenant) -> None:
    seen: dict[str, Any] = {}

    def look_from_another_connection() -> None:
        try:
            seen["rows"] = list(Attempt.objects.filter(idempotency_key="k-visible").values_list("state", flat=True))
        finally:
            connection.close()

    @recording.tool("send_email", key="k-visible")
    def send(call: recording.ToolCall, *, to: str) -> dict[str, str]:
        reader = threading.Thread(target=look_from_another_connection)
        reader.start()
        reader.join()
        call.record_request_id("msg-1")
        return {"id": "msg-1"}

    with recording.task(tenant="acme", task_id="t"):
        send(to="ap@example.com")
    # While the tool ran, recovery (another connection) could already see the claim.
    assert seen["rows"] == [S.DISPATCHED]


# --- 2. a request still on its way ---------------------------------------------------------------


def test_a_heartbeat_extends_the_lease_and_the_time_the_request_may_land(tenant_a: Tenant, settings: Any) -> None:
    settings.LEDGER_DISPATCH_LEASE_SECONDS = 30
    settings.LEDGER_MAX_REQUEST_SECONDS = 10
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    later = dispatched.updated_at + timedelta(seconds=25)
    with clock.frozen_at(later):
        beaten = recording.heartbeat(dispatched, actor=AGENT)
    assert beaten.next_check_at == later + timedelta(seconds=30)
    assert beaten.lands_by == later + timedelta(seconds=30 + 10)  # it may send until the new lease ends
    assert beaten.last_heartbeat_at == later
    assert (beaten.state, beaten.fence) == (S.DISPATCHED, dispatched.fence)  # the dispatcher's fence stays valid


def test_only_the_current_dispatcher_may_beat(tenant_a: Tenant) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    assert unknown.lands_by is not None
    with clock.frozen_at(unknown.lands_by + timedelta(seconds=1)):  # sent again once the first could not land
        moves.attempt_dispatch(attempt=unknown, actor=RECONCILER, fence=unknown.fence)
    with pytest.raises(StaleFence, match="dispatched again since"):
        recording.heartbeat(dispatched, actor=AGENT)


def test_a_beat_after_the_lease_ran_out_still_says_the_request_may_land(tenant_a: Tenant) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    assert unknown.lands_by is not None
    later = unknown.lands_by + timedelta(minutes=5)
    with clock.frozen_at(later):
        beaten = recording.heartbeat(dispatched, actor=AGENT)
    assert beaten.state == S.UNKNOWN
    assert beaten.next_check_at == unknown.next_check_at  # the reconciler's schedule is its own
    assert beaten.lands_by is not None
    assert beaten.lands_by > later


def test_a_tool_can_say_its_work_is_still_running(tenant_a: Tenant) -> None:
    @recording.tool("send_email", key="k-beat")
    def long_job(call: recording.ToolCall, *, to: str) -> str:
        call.heartbeat()
        call.record_request_id("msg-beat")
        return "done"

    with recording.task(tenant="acme", task_id="t"):
        long_job(to="ap@example.com")
    assert Attempt.objects.get(idempotency_key="k-beat").last_heartbeat_at is not None


@pytest.mark.postgres  # the beat comes from a thread of its own, on a connection of its own
@pytest.mark.django_db(transaction=True)
def test_the_wrapper_beats_while_a_long_tool_runs(tenant_a: Tenant, settings: Any) -> None:
    settings.LEDGER_DISPATCH_LEASE_SECONDS = 3
    settings.LEDGER_MAX_REQUEST_SECONDS = 1

    @recording.tool("send_email", key="k-long")
    def slow(call: recording.ToolCall, *, to: str) -> str:
        # Work longer than a third of the lease: wait for a beat to land (no sleep-and-hope).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Attempt.objects.filter(idempotency_key="k-long", last_heartbeat_at__isnull=False).exists():
                break
            time.sleep(0.05)
        call.record_request_id("msg-long")
        return "sent"

    with recording.task(tenant="acme", task_id="t"):
        assert slow(to="ap@example.com") == "sent"
    attempt = Attempt.objects.get(idempotency_key="k-long")
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.last_heartbeat_at is not None


def test_the_http_adapter_gives_up_after_the_tools_maximum_request_time(
    tenant_a: Tenant, sandbox_tools: Sandbox
) -> None:
    sandbox_tools.faults("send_email", latency_ms=3000)
    Tool.objects.filter(name="send_email").update(max_request_seconds=0.3)
    send = recording.provider_tool("send_email", key="slow:{n}")
    n = unique_key("n")
    # The provider answers after 3 s; the adapter gave up at the tool's 0.3 s, not at the answer.
    with recording.task(tenant="acme", task_id="t"), pytest.raises(TimeoutError, match=r"within 0\.3s"):
        send(n=n)
    attempt = Attempt.objects.get(idempotency_key=f"slow:{n}")
    assert attempt.state == S.UNKNOWN  # the request may have landed: the reconciler looks it up


def _unknown_non_idempotent(tenant: Tenant) -> Attempt:
    """A charge whose agent reported UNKNOWN just now: its request may still land."""
    attempt = recording.mark_dispatched(record(tenant, unique_key("c"), tool_name="charge_card"), actor=AGENT)
    return recording.mark_unknown(attempt, reason="connection reset", actor=AGENT)


def test_not_found_before_the_request_could_land_proves_nothing(tenant_a: Tenant, sandbox_tools: Sandbox) -> None:
    attempt = _unknown_non_idempotent(tenant_a)
    assert attempt.lands_by is not None
    summary = Reconciler(label="r").run_pass()
    attempt.refresh_from_db()
    assert summary.decisions["waiting"] == 1
    assert attempt.state == S.UNKNOWN  # not escalated on a "not found" that proves nothing yet
    assert attempt.last_lookup == "not_found"
    assert attempt.next_check_at is not None
    assert attempt.next_check_at > attempt.lands_by
    event = AttemptEvent.objects.filter(attempt=attempt).order_by("seq").last()
    assert event is not None
    assert event.details["counts_as_evidence"] is False
    # Once it can no longer land, the same answer is evidence: a person decides.
    Reconciler(label="r", clock=lambda: attempt.next_check_at).run_pass()
    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert attempt.last_lookup_at is not None
    assert attempt.last_lookup_at >= attempt.lands_by
    assert rules.original_standing(attempt, now=attempt.last_lookup_at).proof is not None


def test_approving_a_retry_over_an_early_not_found_needs_a_reason(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    original = _unknown_non_idempotent(tenant_a)
    (claimed,) = moves.attempts_claim_due(limit=1, now=original.next_check_at)
    escalated = moves.attempt_escalate(
        attempt=claimed, actor=RECONCILER, fence=claimed.fence, reason="not idempotent", lookup={"status": "not_found"}
    )
    assert escalated.last_lookup_at is not None
    assert escalated.lands_by is not None
    assert escalated.last_lookup_at < escalated.lands_by
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend")
    with clock.frozen_at(escalated.lands_by + timedelta(seconds=1)), pytest.raises(ApprovalRefused) as caught:
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok")
    assert "was asked before its request could no longer land" in str(caught.value)
    with clock.frozen_at(escalated.lands_by + timedelta(seconds=1)):
        approved = moves.retry_approve(
            attempt=retry,
            actor=Actor.user(approver_a),
            comment="ok",
            safe_because="the provider's dashboard shows no charge an hour later",
        )
    assert approved.state == S.INTENT_RECORDED


def test_a_retry_cannot_be_approved_while_the_original_request_may_still_land(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    with an_hour_ago():
        dispatched = recording.mark_dispatched(record(tenant_a, tool_name="charge_card"), actor=AGENT)
        unknown = recording.mark_unknown(dispatched, reason="timeout", actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1)
    moves.attempt_escalate(
        attempt=claimed, actor=RECONCILER, fence=claimed.fence, reason="x", lookup={"status": "not_found"}
    )
    # Its dispatcher is still alive and waiting on the request: it beats.
    assert unknown.dispatch_fence is not None
    recording.heartbeat(unknown, fence=unknown.dispatch_fence, actor=AGENT)
    retry = moves.retry_request(attempt=unknown, actor=Actor.user(operator_a), reason="resend")
    with pytest.raises(ApprovalRefused, match="may still land at the provider until"):
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok")


def _retry_went_out(tenant: Tenant, operator: Any, approver: Any) -> tuple[Attempt, Attempt]:
    """The original's dispatcher is still waiting on its request when recovery
    settles it as not found and an approved retry is sent and confirmed.
    Returns (the dispatcher's copy of the original, the retry)."""
    with an_hour_ago():
        dispatched = recording.mark_dispatched(record(tenant, tool_name="charge_card"), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    moves.attempt_escalate(
        attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="x", lookup={"status": "not_found"}
    )
    retry = moves.retry_request(attempt=dispatched, actor=Actor.user(operator), reason="resend")
    approved = moves.retry_approve(attempt=retry, actor=Actor.user(approver), comment="ok")
    sent = moves.attempt_dispatch(attempt=approved, actor=RECONCILER, fence=approved.fence)
    moves.attempt_confirm(attempt=sent, fence=sent.fence, actor=RECONCILER, provider_request_id="req-retry")
    return dispatched, Attempt.objects.get(pk=retry.pk)


def test_a_late_landing_after_a_retry_went_out_is_a_duplicate_incident_never_dropped(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    dispatched, retry = _retry_went_out(tenant_a, operator_a, approver_a)
    assert Attempt.objects.get(pk=dispatched.pk).state == S.RECONCILED
    report = recording.report_outcome(dispatched, outcome="confirmed", provider_request_id="req-original", actor=AGENT)
    assert report.late is True
    original = Attempt.objects.get(pk=dispatched.pk)
    assert original.state == S.RECONCILED  # a fact about the past, not a new decision
    kinds = list(AttemptEvent.objects.filter(attempt=original).order_by("seq").values_list("kind", flat=True))
    assert kinds[-2:] == ["late_report", "incident"]
    late = AttemptEvent.objects.get(attempt=original, kind="late_report")
    assert late.details["report"] == {"outcome": "confirmed", "provider_request_id": "req-original"}
    incident = Incident.objects.get(attempt=original)
    assert (incident.kind, incident.status, incident.retry_id) == ("duplicate", "open", retry.pk)
    assert incident.owner_id == tenant_a.default_owner_id
    assert "may have happened twice" in incident.summary
    # People settle it, saying what they did; that is in the chain too.
    resolved = moves.incident_resolve(
        incident=incident, actor=Actor.user(operator_a), resolution="refunded the second charge"
    )
    assert resolved.status == "resolved"
    assert AttemptEvent.objects.filter(attempt=original, kind="incident", details__action="resolved").exists()


def test_a_late_confirmation_of_an_attempt_under_review_settles_it(tenant_a: Tenant) -> None:
    with an_hour_ago():
        dispatched = recording.mark_dispatched(record(tenant_a, tool_name="charge_card"), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    moves.attempt_escalate(attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="not idempotent")
    confirmed = recording.confirm(dispatched, provider_request_id="req-late", actor=AGENT)
    assert confirmed.state == S.OUTCOME_CONFIRMED
    assert confirmed.provider_request_id == "req-late"


# --- 3. a person's "failed" is a claim --------------------------------------------------------


def test_an_original_marked_failed_by_a_person_still_needs_a_reason_to_approve_its_retry(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    original = attempt_in(S.MANUAL_REVIEW, tenant_a)
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="resend")
    failed = moves.attempt_mark_failed(
        attempt=original, actor=Actor.user(operator_a), reason="customer says nothing arrived"
    )
    assert failed.failed_because == FailedBecause.PERSON
    with pytest.raises(ApprovalRefused, match="marked failed by a person, not by the provider"):
        moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok")
    approved = moves.retry_approve(
        attempt=retry,
        actor=Actor.user(approver_a),
        comment="ok",
        safe_because="the provider's support confirmed in writing that it never arrived",
    )
    assert approved.state == S.INTENT_RECORDED


def test_an_original_the_provider_refused_needs_no_reason(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> None:
    with an_hour_ago():
        dispatched = recording.mark_dispatched(record(tenant_a, tool_name="charge_card"), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    moves.attempt_escalate(attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="not idempotent")
    retry = moves.retry_request(attempt=dispatched, actor=Actor.user(operator_a), reason="resend")
    # The original dispatcher finally hears back: the provider refused it.
    failed = recording.fail(dispatched, reason="card declined", actor=AGENT)
    assert (failed.state, failed.failed_because) == (S.FAILED, FailedBecause.PROVIDER)
    approved = moves.retry_approve(attempt=retry, actor=Actor.user(approver_a), comment="ok")
    assert approved.state == S.INTENT_RECORDED


# --- 7. an agent gives up an intent it never sent ---------------------------------------------------


def test_an_agent_abandons_a_never_sent_intent_and_its_reworded_retry_can_be_approved(
    tenant_a: Tenant, approver_a: Any
) -> None:
    original = record(tenant_a, "k-reworded", args={"to": "a@example.com"})
    from ledgerdash.ledger.errors import IdempotencyConflict

    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "k-reworded", args={"to": "a@example.com", "note": "please"})
    linked = caught.value.attempt
    with pytest.raises(ApprovalRefused, match="may yet be sent"):
        moves.retry_approve(attempt=linked, actor=Actor.user(approver_a), comment="ok")
    abandoned = recording.abandon(original, reason="re-ran with reworded arguments", actor=AGENT)
    assert (abandoned.state, abandoned.failed_because) == (S.FAILED, FailedBecause.ABANDONED)
    event = AttemptEvent.objects.filter(attempt=original).order_by("seq").last()
    assert event is not None
    assert (event.actor_kind, event.to_state, event.details["comment"]) == (
        "agent",
        S.FAILED,
        "re-ran with reworded arguments",
    )
    approved = moves.retry_approve(attempt=linked, actor=Actor.user(approver_a), comment="ok")
    assert approved.state == S.INTENT_RECORDED


def test_only_a_never_sent_intent_can_be_abandoned_and_only_with_its_fence(tenant_a: Tenant) -> None:
    attempt = record(tenant_a)
    dispatched = recording.mark_dispatched(attempt, actor=AGENT)
    with pytest.raises(IllegalTransition, match="only an intent that was never sent"):
        recording.abandon(dispatched, actor=AGENT)
    fresh = record(tenant_a, "k-2")
    with pytest.raises(StaleFence):
        recording.abandon(fresh, fence=7, actor=AGENT)


# --- 6. a database that drops connections ---------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.own_session
def test_an_agent_whose_connection_was_cut_recovers_on_its_next_call(tenant_a: Tenant) -> None:
    import psycopg

    first = record(tenant_a, "k-before")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    settings_dict = connection.settings_dict
    with psycopg.connect(
        host=settings_dict["HOST"], port=settings_dict["PORT"], user=settings_dict["USER"], dbname=settings_dict["NAME"]
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    with pytest.raises(LedgerUnavailable):
        recording.mark_dispatched(first, actor=AGENT)
    # The broken connection was dropped: the next call connects afresh.
    assert recording.mark_dispatched(first, actor=AGENT).state == S.DISPATCHED


# --- the client over HTTP ----------------------------------------------------------------------------


def test_the_client_replays_a_lookup_answer_and_refuses_to_replay_nothing() -> None:
    session = ledger_client._OverHttp(
        ledger_client.TaskContext(client=ledger_client.LedgerClient("http://127.0.0.1:9", "t"), task_id="t")
    )
    answered = ledger_client.Attempt.from_json(
        {
            "id": 1,
            "state": S.OUTCOME_CONFIRMED,
            "fence": 2,
            "task_id": "t",
            "tool_name": "x",
            "idempotency_key": "k",
            "provider_key": "k",
            "args_hash": "0" * 64,
            "result": {"id": "eff_1"},
            "result_source": "lookup",
        }
    )
    assert session.replay(answered) == {"id": "eff_1"}
    nothing = ledger_client.Attempt.from_json({**answered.data, "result": None, "result_source": ""})
    with pytest.raises(ledger_client.ResultUnavailable, match="the effect happened, do not call the tool again"):
        session.replay(nothing)


def test_heartbeats_and_abandoning_over_the_api(tenant_a: Tenant) -> None:
    from tests.api_support import Api, issue_token

    api = Api(issue_token(tenant_a))
    attempt = api.record("k-api")
    abandoned = api.post(f"/attempts/{attempt['id']}/abandon", {"fence": attempt["fence"], "reason": "reworded"})
    assert abandoned.status_code == 200
    assert abandoned.json()["state"] == S.FAILED
    other = api.record("k-api-2")
    dispatched = api.dispatch(other["id"]).json()
    beat = api.post(f"/attempts/{other['id']}/heartbeat", {"fence": dispatched["fence"]})
    assert beat.status_code == 200
    assert beat.json()["lands_by"] is not None
    stale = api.post(f"/attempts/{other['id']}/heartbeat", {"fence": dispatched["fence"] + 5})
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_fence")


def test_the_time_a_request_may_land_is_in_the_attempt_resource(tenant_a: Tenant) -> None:
    from tests.api_support import Api, issue_token

    api = Api(issue_token(tenant_a))
    attempt = api.record("k-res")
    dispatched = api.dispatch(attempt["id"]).json()
    assert dispatched["lands_by"] is not None
    assert timezone.datetime.fromisoformat(dispatched["lands_by"]) > timezone.now()


def test_a_database_lost_between_dispatch_and_send_sends_nothing_and_says_so(
    tenant_a: Tenant, sandbox_tools: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover right after DISPATCHED: the tool's settings cannot be read, so nothing goes to the
    provider, and the agent hears a refusal it can act on (call again), not the database's own error."""
    from django.db import OperationalError

    from ledgerdash.ledger.providers import registry

    def unreachable(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("consuming input failed: server closed the connection unexpectedly")

    monkeypatch.setattr(registry, "profile_for", unreachable)
    send = recording.provider_tool("send_email", key="invoice:{invoice}:send")
    invoice = unique_key("inv")
    with recording.task(tenant="acme", task_id="t"), pytest.raises(NothingHappened, match="nothing was sent"):
        send(invoice=invoice, to="ap@example.com")
    assert sandbox_tools.count(f"invoice:{invoice}:send") == 0
    attempt = Attempt.objects.get(idempotency_key=f"invoice:{invoice}:send")
    assert attempt.state == S.FAILED_RETRYABLE  # recorded as provably not sent: it may be sent again

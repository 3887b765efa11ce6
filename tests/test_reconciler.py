"""Recovery rules, each against the real sandbox provider process."""

from __future__ import annotations

import http.client
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import NothingHappened, OutcomeUnknown, ResultUnavailable, StaleFence
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers import registry
from ledgerdash.ledger.providers.base import Dispatched, Lookup, LookupStatus, ProviderAdapter
from ledgerdash.ledger.reconciler import Reconciler
from tests.conftest import AGENT, TOOLS_V1, ledger_snapshot, record
from tests.sandboxes import Sandbox, unique_key

S = State
pytestmark = pytest.mark.usefixtures("sandbox_tools")


def make_due(attempt: Attempt) -> None:
    """Move the clock past the attempt's lease or back-off, and with it past
    the time its request could still land (time travel, not a state change)."""
    past = timezone.now() - timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=past, lands_by=past)


def reconcile() -> Any:
    return Reconciler(label="reconciler-test").run_pass()


def crashed_after_send(
    tenant: Tenant, sandbox: Sandbox, *, tool: str = "send_email", key: str | None = None
) -> Attempt:
    """An agent recorded, dispatched and sent the request, then died before hearing back."""
    key = unique_key(tool)
    args = {"to": "ap@example.com", "n": 1}
    attempt = recording.mark_dispatched(record(tenant, key, tool_name=tool, args=args), actor=AGENT)
    status, _ = sandbox.perform(tool, attempt.provider_key, args)
    assert status == 201
    return attempt


def dispatched_never_sent(tenant: Tenant, *, tool: str = "send_email") -> Attempt:
    """An agent committed DISPATCHED and died before its request left."""
    return recording.mark_dispatched(record(tenant, unique_key(tool), tool_name=tool, args={"n": 2}), actor=AGENT)


def last_event(attempt: Attempt) -> AttemptEvent:
    event = AttemptEvent.objects.filter(attempt=attempt).order_by("seq").last()
    assert event is not None
    return event


# --- the rules ---------------------------------------------------------------------------


def test_a_dispatch_past_its_lease_is_looked_up_and_confirmed(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = crashed_after_send(tenant_a, sandbox)
    make_due(attempt)
    summary = reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.provider_request_id.startswith("eff_")
    assert summary.decisions["confirmed"] == 1
    transitions_seen = [
        (e.from_state, e.to_state, e.actor_kind)
        for e in AttemptEvent.objects.filter(attempt=attempt, kind="transition").order_by("seq")
    ]
    assert transitions_seen[-2:] == [
        (S.DISPATCHED, S.UNKNOWN, "reconciler"),
        (S.UNKNOWN, S.OUTCOME_CONFIRMED, "reconciler"),
    ]
    event = last_event(attempt)
    assert event.details["lookup"]["status"] == "found"
    assert event.details["lookup"]["payload_hash"] == attempt.args_hash
    assert "payload hash matches" in event.reason
    assert sandbox.count(attempt.provider_key) == 1


def test_not_found_and_idempotent_is_sent_again_with_the_same_key(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = dispatched_never_sent(tenant_a)
    make_due(attempt)
    summary = reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.dispatch_count == 2
    assert summary.decisions["resent"] == 1
    assert sandbox.count(attempt.provider_key) == 1
    redispatch = AttemptEvent.objects.get(attempt=attempt, from_state=S.UNKNOWN, to_state=S.DISPATCHED)
    assert "not found at the provider" in redispatch.reason
    assert redispatch.details["provider_key"] == attempt.provider_key


def test_not_found_and_not_idempotent_goes_to_a_person(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = dispatched_never_sent(tenant_a, tool="charge_card")
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert "not idempotent" in attempt.last_note
    assert attempt.owner_id == tenant_a.default_owner_id
    assert attempt.last_lookup == "not_found"
    assert sandbox.count(attempt.provider_key) == 0


def test_found_with_another_payload_goes_to_a_person(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = dispatched_never_sent(tenant_a)
    sandbox.perform("send_email", attempt.provider_key, {"someone": "else"})
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert attempt.last_lookup == "mismatch"
    assert "another payload" in attempt.last_note


def test_facts_first_a_found_effect_is_confirmed_even_after_a_policy_change(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = crashed_after_send(tenant_a, sandbox)
    policy_publish(tenant=tenant_a, tools={"open_ticket": ["tickets:write"]}, actor=Actor.system("t"))
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED


def test_not_found_after_a_policy_change_gets_a_linked_attempt_for_review(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = dispatched_never_sent(tenant_a)
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"), note="v2")
    make_due(attempt)
    summary = reconcile()
    attempt.refresh_from_db()
    linked = Attempt.objects.get(parent=attempt)
    assert summary.decisions["linked"] == 1
    assert attempt.state == S.MANUAL_REVIEW
    assert linked.state == S.MANUAL_REVIEW
    assert linked.policy_version == 2
    assert linked.provider_key == attempt.provider_key
    assert set(linked.credential_scope.split()) <= set(attempt.credential_scope.split())
    assert "scope email:send is not allowed for send_email by policy v2" in attempt.last_note
    assert sandbox.count(attempt.provider_key) == 0  # nothing was sent under yesterday's authority


def test_a_narrowed_scope_never_widens_on_the_linked_attempt(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = recording.mark_dispatched(
        record(tenant_a, unique_key("c"), tool_name="open_ticket", args={"t": 1}), actor=AGENT
    )
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "open_ticket": ["tickets:read"]}, actor=Actor.system("t"))
    make_due(attempt)
    reconcile()
    linked = Attempt.objects.get(parent=attempt)
    assert linked.credential_scope == ""  # tickets:write ∩ tickets:read
    assert linked.tenant_id == attempt.tenant_id


def test_an_unavailable_provider_means_back_off_and_decide_nothing(tenant_a: Tenant, sandbox: Sandbox) -> None:
    sandbox.faults("send_email", lookup_5xx=True)
    attempt = crashed_after_send(tenant_a, sandbox)
    make_due(attempt)
    before = timezone.now()
    summary = reconcile()
    attempt.refresh_from_db()
    assert summary.decisions["backed_off"] == 1
    assert attempt.state == S.UNKNOWN
    assert attempt.check_count == 1
    assert attempt.last_lookup == "unavailable"
    assert attempt.next_check_at is not None
    assert attempt.next_check_at > before
    assert "HTTP 503" in last_event(attempt).details["lookup"]["detail"]
    assert reconcile().claimed == 0  # not due again yet


def test_a_lookup_timeout_is_unavailable_not_an_answer(tenant_a: Tenant, sandbox: Sandbox) -> None:
    sandbox.faults("send_email", lookup_timeout=True, lookup_timeout_seconds=3)
    attempt = crashed_after_send(tenant_a, sandbox)
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.UNKNOWN
    assert "TimeoutError" in last_event(attempt).details["lookup"]["detail"]
    assert "no complete answer within" in last_event(attempt).details["lookup"]["detail"]


def test_exhausted_checks_go_to_a_person(tenant_a: Tenant, sandbox: Sandbox) -> None:
    Tool.objects.filter(name="send_email").update(max_checks=2)
    sandbox.faults("send_email", lookup_5xx=True)
    attempt = crashed_after_send(tenant_a, sandbox)
    make_due(attempt)
    reconcile()
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert "checks exhausted" in attempt.last_note


def test_past_the_key_retention_not_found_proves_nothing(tenant_a: Tenant, sandbox: Sandbox) -> None:
    Tool.objects.filter(name="send_email").update(key_retention_seconds=60)
    attempt = dispatched_never_sent(tenant_a)
    Attempt.objects.filter(pk=attempt.pk).update(first_dispatched_at=timezone.now() - timedelta(minutes=2))
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert "key retention" in attempt.last_note
    assert sandbox.count(attempt.provider_key) == 0


def test_a_lost_response_leaves_unknown_then_the_reconciler_confirms(tenant_a: Tenant, sandbox: Sandbox) -> None:
    sandbox.faults("send_email", lose_response=True, lose_response_count=1)
    send = recording.provider_tool("send_email", key="invoice:{invoice}:lost")
    invoice = unique_key("inv")
    with recording.task(tenant="acme", task_id="t"), pytest.raises(http.client.RemoteDisconnected):
        send(invoice=invoice, to="ap@example.com")
    attempt = Attempt.objects.get(idempotency_key=f"invoice:{invoice}:lost")
    assert attempt.state == S.UNKNOWN
    with recording.task(tenant="acme", task_id="t"), pytest.raises(OutcomeUnknown):
        send(invoice=invoice, to="ap@example.com")
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert sandbox.count(attempt.provider_key) == 1
    with recording.task(tenant="acme", task_id="t"):
        replay = send(invoice=invoice, to="ap@example.com")
    # Confirmed by a lookup: the re-run gets what the provider answered, and nothing is sent.
    assert attempt.result_source == "lookup"
    assert replay["id"] == attempt.provider_request_id
    assert replay["payload_hash"] == attempt.args_hash
    assert sandbox.count(attempt.provider_key) == 1


class LookupWithoutAnswer(ProviderAdapter):
    """A provider whose lookup says "found, this request id, this hash" and nothing more."""

    def dispatch(self, *, key: str, args: dict[str, Any], on_request_id: Any = None) -> Dispatched:
        raise NothingHappened("this adapter only looks up")

    def lookup(self, *, key: str, args_hash: str) -> Lookup:
        return Lookup(LookupStatus.FOUND, request_id=f"req-{key}", payload_hash=args_hash)


def test_a_re_run_of_an_effect_confirmed_without_an_answer_says_so_instead_of_returning_nothing(
    tenant_a: Tenant, sandbox: Sandbox
) -> None:
    Tool.objects.filter(name="open_ticket").update(
        adapter=Tool.Adapter.PYTHON, config={"class": "tests.test_reconciler.LookupWithoutAnswer"}
    )
    attempt = recording.mark_dispatched(record(tenant_a, unique_key("t"), tool_name="open_ticket"), actor=AGENT)
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert (attempt.state, attempt.result_source, attempt.result) == (S.OUTCOME_CONFIRMED, "", None)
    ticket = recording.tool("open_ticket", key=lambda _args: attempt.idempotency_key)(lambda call, **kw: "sent")
    with recording.task(tenant="acme", task_id="t"), pytest.raises(ResultUnavailable) as caught:
        ticket(**attempt.args)
    assert caught.value.attempt.pk == attempt.pk
    assert "the effect happened, do not call the tool again" in str(caught.value)


def test_a_provider_tool_runs_end_to_end(tenant_a: Tenant, sandbox: Sandbox) -> None:
    send = recording.provider_tool("send_email", key="welcome:{user}")
    user = unique_key("u")
    with recording.task(tenant="acme", task_id="t"):
        response = send(user=user, to="new@example.com")
        again = send(user=user, to="new@example.com")
    assert response["payload_hash"] == normalize_args({"user": user, "to": "new@example.com"})[1]
    assert again == response
    assert sandbox.count(f"welcome:{user}") == 1


def test_rejected_before_acting_is_retried_after_the_back_off(tenant_a: Tenant, sandbox: Sandbox) -> None:
    sandbox.faults("open_ticket", reject=True, reject_count=1)
    send = recording.provider_tool("open_ticket", key="ticket:{n}")
    n = unique_key("t")
    with recording.task(tenant="acme", task_id="t"), pytest.raises(recording.NothingHappened):
        send(n=n)
    attempt = Attempt.objects.get(idempotency_key=f"ticket:{n}")
    assert attempt.state == S.FAILED_RETRYABLE
    assert sandbox.count(attempt.provider_key) == 0
    make_due(attempt)
    summary = reconcile()
    attempt.refresh_from_db()
    assert summary.decisions["resent"] == 1
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert sandbox.count(attempt.provider_key) == 1


def test_the_sandbox_performs_every_request_in_non_idempotent_mode(sandbox: Sandbox) -> None:
    key = unique_key("dup")
    assert sandbox.perform("charge_card", key, {"a": 1})[0] == 201
    assert sandbox.perform("charge_card", key, {"a": 1})[0] == 201
    assert sandbox.count(key) == 2
    assert sandbox.perform("send_email", key, {"a": 1})[0] == 201
    assert sandbox.perform("send_email", key, {"a": 1})[0] == 200  # honoured: the same effect
    assert sandbox.perform("send_email", key, {"a": 2})[0] == 422  # reused with another payload: refused
    assert sandbox.count(key) == 3


@pytest.mark.slow  # a sandbox process of its own
def test_the_sandbox_forgets_keys_past_its_retention(tmp_path: Any) -> None:
    import time

    from tests.sandboxes import sandbox_process

    with sandbox_process(tmp_path, key_retention=0.5) as short:
        key = unique_key("r")
        assert short.perform("send_email", key, {"a": 1})[0] == 201
        assert short.lookup("send_email", key)[0] == 200
        time.sleep(0.7)
        assert short.lookup("send_email", key)[0] == 404  # "not found" though it happened
        assert short.perform("send_email", key, {"a": 1})[0] == 201
        assert short.count(key) == 2


def test_an_intent_nobody_dispatched_is_abandoned_after_its_lease(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = record(tenant_a, unique_key("i"))
    assert reconcile().claimed == 0  # within its lease: not due
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.FAILED
    assert "abandoned" in attempt.last_note
    assert "nothing was sent" in attempt.last_note


def test_an_approved_retry_is_dispatched_by_the_reconciler(
    tenant_a: Tenant, sandbox: Sandbox, operator_a: Any, approver_a: Any
) -> None:

    attempt = dispatched_never_sent(tenant_a, tool="charge_card")
    make_due(attempt)
    reconcile()  # not idempotent: MANUAL_REVIEW, last lookup not_found
    retry = moves.retry_request(attempt=attempt, actor=Actor.user(operator_a), reason="customer asks")
    moves.retry_approve(
        attempt=retry,
        actor=Actor.user(approver_a),
        comment="lookup says not found",
    )
    reconcile()
    retry.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state == S.RECONCILED
    assert retry.state == S.OUTCOME_CONFIRMED
    assert sandbox.count(retry.provider_key) == 1


def test_a_tool_without_an_adapter_goes_to_a_person(tenant_a: Tenant) -> None:
    Tool.objects.filter(name="send_email").delete()
    attempt = dispatched_never_sent(tenant_a)
    make_due(attempt)
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert "no provider adapter" in attempt.last_note


def test_a_stale_reconciler_cannot_complete_a_superseded_claim(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempt = crashed_after_send(tenant_a, sandbox)
    make_due(attempt)
    (first_claim,) = moves.attempts_claim_due(limit=1)
    # The first worker stalls past its claim lease; a second one takes over and settles it.
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=timezone.now() - timedelta(seconds=1))
    reconcile()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    snapshot = ledger_snapshot()
    profile = registry.profile_for("send_email")
    with pytest.raises(StaleFence):
        Reconciler(label="stale").reconcile_one(first_claim, profile)
    assert ledger_snapshot() == snapshot


def test_a_second_pass_writes_nothing(tenant_a: Tenant, sandbox: Sandbox) -> None:
    sandbox.faults("open_ticket", lookup_5xx=True)
    attempts = [crashed_after_send(tenant_a, sandbox), dispatched_never_sent(tenant_a)]
    attempts.append(dispatched_never_sent(tenant_a, tool="charge_card"))
    attempts.append(crashed_after_send(tenant_a, sandbox, tool="open_ticket"))
    for attempt in attempts:
        make_due(attempt)
    first = reconcile()
    assert first.changed >= 4
    snapshot = ledger_snapshot()
    second = reconcile()
    assert second.claimed == 0
    assert ledger_snapshot() == snapshot


def test_every_decision_writes_its_reason_and_lookup(tenant_a: Tenant, sandbox: Sandbox) -> None:
    attempts = [crashed_after_send(tenant_a, sandbox), dispatched_never_sent(tenant_a, tool="charge_card")]
    for attempt in attempts:
        make_due(attempt)
    reconcile()
    for event in AttemptEvent.objects.filter(actor_kind="reconciler", attempt__in=attempts):
        assert event.reason
        if event.to_state in (S.OUTCOME_CONFIRMED, S.MANUAL_REVIEW):
            assert "lookup" in event.details


def test_the_tool_config_is_validated(sandbox: Sandbox) -> None:
    from django.core.exceptions import ValidationError

    bad = Tool(name="x", config={"dispatch_url": "ftp://nope", "surprise": 1})
    with pytest.raises(ValidationError, match="unknown HTTP adapter settings: surprise"):
        bad.clean()
    with pytest.raises(ValidationError, match="http"):
        Tool(name="x", config={"dispatch_url": "ftp://nope"}).clean()
    with pytest.raises(ValidationError, match="only"):
        Tool(name="x", config={"dispatch_url": "http://h/{nope}"}).clean()
    Tool(name="x", config={"lookup_url": "https://h/x?key={key}"}).clean()


def test_after_its_connection_was_lost_a_worker_takes_up_its_own_claims_at_once(
    tenant_a: Tenant, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claims of a pass broken by a lost connection are this worker's own: once it is back, it
    decides them in its next pass instead of leaving them until the claim lease ends."""
    from django.db import OperationalError

    from ledgerdash.ledger import reconciler as module

    intents = [record(tenant_a, f"blip-{n}") for n in range(5)]
    for attempt in intents:
        make_due(attempt)
    worker = Reconciler(label="reconciler-blip")
    decide = Reconciler.reconcile_one
    calls: list[int] = []

    def broken_on_the_third(self: Reconciler, attempt: Attempt, tool: Any) -> str:
        calls.append(attempt.pk)
        if len(calls) == 3:
            raise OperationalError("server closed the connection unexpectedly")
        return decide(self, attempt, tool)

    monkeypatch.setattr(Reconciler, "reconcile_one", broken_on_the_third)
    monkeypatch.setattr(module, "connection_lost", lambda: True)
    with pytest.raises(OperationalError):
        worker.run_pass()
    held = Attempt.objects.filter(pk__in=[a.pk for a in intents], state=State.INTENT_RECORDED)
    assert held.count() == 3  # two decided before the connection went; three still claimed
    assert all(a.next_check_at > timezone.now() for a in held)  # claimed until the lease ends
    monkeypatch.setattr(Reconciler, "reconcile_one", decide)
    summary = worker.run_pass()  # the connection is back
    assert summary.decisions["abandoned"] == 3, summary
    assert not Attempt.objects.filter(pk__in=[a.pk for a in intents], state=State.INTENT_RECORDED).exists()

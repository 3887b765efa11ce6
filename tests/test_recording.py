from __future__ import annotations

import math
from typing import Any

import pytest

from ledgerdash.ledger import recording
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import (
    AttemptFailed,
    AttemptInFlight,
    IdempotencyConflict,
    InvalidArgs,
    InvalidField,
    InvalidKey,
    NothingHappened,
    OutcomeUnknown,
    PermanentFailure,
    ScopeNotAllowed,
    TenantInactive,
    ToolNotAllowed,
    UnderReview,
    UnknownTenant,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from tests.conftest import AGENT, events_of, ledger_snapshot, record, together

S = State


# --- canonical form ------------------------------------------------------------------


def test_the_hash_ignores_key_order_and_whitespace() -> None:
    a = normalize_args({"b": [1, 2.0, {"y": "é", "x": None}], "a": True})
    b = normalize_args({"a": True, "b": [1, 2, {"x": None, "y": "é"}]})
    assert a == b
    assert a[0] == {"a": True, "b": [1, 2, {"x": None, "y": "é"}]}


def test_the_hash_is_sha256_of_rfc8785_bytes() -> None:
    import hashlib

    _, digest = normalize_args({"z": 1.0, "a": "é", "m": [True, None, 1e21]})
    assert digest == hashlib.sha256('{"a":"é","m":[true,null,1e+21],"z":1}'.encode()).hexdigest()


# --- re-recording -------------------------------------------------------------------


def test_the_same_key_and_args_return_the_existing_attempt(tenant_a: Tenant) -> None:
    first = recording.record_intent(
        tenant="acme", task_id="t", tool_name="send_email", idempotency_key="k", args={"to": "x", "n": 1}
    )
    snapshot = ledger_snapshot()
    again = recording.record_intent(
        tenant="acme", task_id="t-restarted", tool_name="send_email", idempotency_key="k", args={"n": 1, "to": "x"}
    )
    assert first.created is True
    assert again.created is False
    assert again.attempt.pk == first.attempt.pk
    assert ledger_snapshot() == snapshot


def test_the_same_key_with_other_args_records_a_linked_attempt_for_review(tenant_a: Tenant) -> None:
    original = record(tenant_a, "k", args={"amount": 10})
    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "k", args={"amount": 11})
    linked = caught.value.attempt
    assert linked.state == S.MANUAL_REVIEW
    assert linked.parent_id == original.pk
    assert linked.idempotency_key == original.idempotency_key
    assert linked.provider_key != original.provider_key  # the provider would answer with the original
    assert linked.owner_id == tenant_a.default_owner_id
    assert f"#{original.pk}" in linked.last_note
    assert str(linked.pk) in str(caught.value)
    # Re-recording the second arguments again finds the linked attempt, writes nothing.
    snapshot = ledger_snapshot()
    assert record(tenant_a, "k", args={"amount": 11}).pk == linked.pk
    assert ledger_snapshot() == snapshot
    # And the original arguments still find the original.
    assert record(tenant_a, "k", args={"amount": 10}).pk == original.pk


def test_the_same_key_for_another_tool_is_a_conflict(tenant_a: Tenant) -> None:
    record(tenant_a, "k", args={"a": 1})
    with pytest.raises(IdempotencyConflict) as caught:
        record(tenant_a, "k", args={"a": 1}, tool_name="open_ticket")
    assert "different tool" in caught.value.attempt.last_note


def test_keys_are_per_tenant(tenant_a: Tenant, tenant_b: Tenant) -> None:
    a = record(tenant_a, "shared-key")
    b = record(tenant_b, "shared-key", args={"other": True})
    assert a.pk != b.pk
    assert b.parent_id is None


def test_scope_defaults_to_the_policy_and_may_be_narrowed(tenant_a: Tenant) -> None:
    wide = record(tenant_a, "c1", tool_name="charge_card")
    narrow = record(tenant_a, "c2", tool_name="charge_card", credential_scope="payments:charge")
    assert wide.credential_scope == "payments:charge payments:refund"
    assert narrow.credential_scope == "payments:charge"


# --- bad input writes nothing ----------------------------------------------------------


class NotJson:
    pass


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_INPUT = [
    ("args not serializable", {"args": {"when": NotJson()}}, InvalidArgs),
    ("args a set", {"args": {"ids": {1, 2}}}, InvalidArgs),
    ("args not an object", {"args": [1, 2]}, InvalidArgs),
    ("args with NaN", {"args": {"x": math.nan}}, InvalidArgs),
    ("args with Infinity", {"args": {"x": math.inf}}, InvalidArgs),
    ("args with a non-string key", {"args": {1: "x"}}, InvalidArgs),
    ("args with a lone surrogate", {"args": {"x": "\ud800"}}, InvalidArgs),
    ("args with NUL", {"args": {"x": "a\x00b"}}, InvalidArgs),
    ("args too deep", {"args": {"x": _nested(40)}}, InvalidArgs),
    ("args too large", {"args": {"x": "y" * 70_000}}, InvalidArgs),
    ("args int beyond 2**53", {"args": {"x": 2**60}}, InvalidArgs),
    ("unknown tenant", {"tenant": "nope"}, UnknownTenant),
    ("tool not allowed", {"tool_name": "delete_database"}, ToolNotAllowed),
    ("scope not allowed", {"credential_scope": "email:send email:admin"}, ScopeNotAllowed),
    ("empty key", {"idempotency_key": ""}, InvalidKey),
    ("blank key", {"idempotency_key": "   "}, InvalidKey),
    ("key too long", {"idempotency_key": "k" * 256}, InvalidKey),
    ("key with control characters", {"idempotency_key": "a\nb"}, InvalidKey),
    ("key not a string", {"idempotency_key": 42}, InvalidKey),
    ("empty task", {"task_id": ""}, InvalidField),
    ("tool name too long", {"tool_name": "t" * 300}, InvalidField),
]


@pytest.mark.parametrize(("case", "overrides", "error"), BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_gets_a_named_error_and_writes_nothing(
    tenant_a: Tenant, case: str, overrides: dict[str, Any], error: type[Exception]
) -> None:
    record(tenant_a, "existing")
    snapshot = ledger_snapshot()
    fields: dict[str, Any] = {
        "tenant": "acme",
        "task_id": "t",
        "tool_name": "send_email",
        "idempotency_key": "k-new",
        "args": {"to": "x"},
    }
    fields.update(overrides)
    with pytest.raises(error) as caught:
        recording.record_intent(**fields)
    assert str(caught.value)
    assert ledger_snapshot() == snapshot


def test_a_key_of_exactly_255_characters_is_fine(tenant_a: Tenant) -> None:
    assert record(tenant_a, "k" * 255).idempotency_key == "k" * 255


def test_an_inactive_tenant_records_nothing(tenant_a: Tenant) -> None:
    Tenant.objects.filter(pk=tenant_a.pk).update(is_active=False)
    snapshot = ledger_snapshot()
    with pytest.raises(TenantInactive):
        recording.record_intent(tenant="acme", task_id="t", tool_name="send_email", idempotency_key="k", args={})
    assert ledger_snapshot() == snapshot


# --- the one-line wrapper ----------------------------------------------------------------


class FakeProvider:
    """Counts what the tool actually did; the tests check it against the ledger."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, key: str, **payload: Any) -> dict[str, Any]:
        self.sent.append((key, payload))
        return {"id": f"req-{len(self.sent)}", "to": payload["to"]}


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def send_email(provider: FakeProvider) -> Any:
    @recording.tool("send_email", key="invoice:{invoice}:send")
    def send_email(call: recording.ToolCall, *, invoice: int, to: str) -> dict[str, Any]:
        response = provider.send(call.key, invoice=invoice, to=to)
        call.record_request_id(response["id"])
        return response

    return send_email


def test_the_wrapper_records_dispatches_and_confirms(tenant_a: Tenant, send_email: Any, provider: FakeProvider) -> None:
    with recording.task(tenant="acme", task_id="billing-1", agent="worker-1"):
        result = send_email(invoice=7, to="ap@example.com")
    assert result == {"id": "req-1", "to": "ap@example.com"}
    assert provider.sent == [("invoice:7:send", {"invoice": 7, "to": "ap@example.com"})]
    attempt = Attempt.objects.get()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.provider_request_id == "req-1"
    assert attempt.args == {"invoice": 7, "to": "ap@example.com"}
    assert [(e.kind, e.to_state) for e in events_of(attempt)] == [
        ("transition", S.INTENT_RECORDED),
        ("transition", S.DISPATCHED),
        ("request_id", ""),
        ("transition", S.OUTCOME_CONFIRMED),
    ]
    assert {e.actor_label for e in events_of(attempt)} == {"worker-1"}


def test_a_rerun_replays_the_confirmed_result_without_calling_the_tool(
    tenant_a: Tenant, send_email: Any, provider: FakeProvider
) -> None:
    with recording.task(tenant="acme", task_id="billing-1"):
        first = send_email(invoice=7, to="ap@example.com")
    snapshot = ledger_snapshot()
    with recording.task(tenant="acme", task_id="billing-1"):
        again = send_email(invoice=7, to="ap@example.com")
    assert again == first
    assert len(provider.sent) == 1
    assert ledger_snapshot() == snapshot


def test_a_rerun_refuses_while_the_outcome_is_unknown(tenant_a: Tenant, provider: FakeProvider) -> None:
    @recording.tool("send_email", key="k-{n}")
    def flaky(call: recording.ToolCall, *, n: int) -> None:
        provider.send(call.key, to="x")
        raise TimeoutError("read timed out")

    with recording.task(tenant="acme", task_id="t"), pytest.raises(TimeoutError):
        flaky(n=1)
    attempt = Attempt.objects.get()
    assert attempt.state == S.UNKNOWN
    assert "TimeoutError" in attempt.last_error
    with recording.task(tenant="acme", task_id="t"), pytest.raises(OutcomeUnknown):
        flaky(n=1)
    assert len(provider.sent) == 1


def test_a_rerun_refuses_while_under_review(tenant_a: Tenant, send_email: Any, provider: FakeProvider) -> None:
    record(tenant_a, "invoice:7:send", args={"invoice": 7, "to": "someone-else"})
    with recording.task(tenant="acme", task_id="t"), pytest.raises(IdempotencyConflict):
        send_email(invoice=7, to="ap@example.com")
    with recording.task(tenant="acme", task_id="t"), pytest.raises(UnderReview):
        send_email(invoice=7, to="ap@example.com")
    assert provider.sent == []


def test_a_claim_held_elsewhere_is_not_dispatched_twice(
    tenant_a: Tenant, send_email: Any, provider: FakeProvider
) -> None:
    attempt = record(tenant_a, "invoice:7:send", args={"invoice": 7, "to": "ap@example.com"})
    recording.mark_dispatched(attempt, actor=Actor.agent("other worker"))
    with recording.task(tenant="acme", task_id="t"), pytest.raises(AttemptInFlight):
        send_email(invoice=7, to="ap@example.com")
    assert provider.sent == []


def test_nothing_happened_is_retryable_and_a_rerun_sends_again(tenant_a: Tenant) -> None:
    calls: list[str] = []

    @recording.tool("open_ticket", key="ticket-{n}")
    def open_ticket(call: recording.ToolCall, *, n: int) -> dict[str, str]:
        calls.append(call.key)
        if len(calls) == 1:
            raise NothingHappened("429 rate limited before acting")
        call.record_request_id("T-1")
        return {"ticket": "T-1"}

    with recording.task(tenant="acme", task_id="t"), pytest.raises(NothingHappened):
        open_ticket(n=1)
    attempt = Attempt.objects.get()
    assert attempt.state == S.FAILED_RETRYABLE
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=None)  # the back-off has passed
    with recording.task(tenant="acme", task_id="t"):
        assert open_ticket(n=1) == {"ticket": "T-1"}
    assert calls == ["ticket-1", "ticket-1"]  # the same key both times
    assert Attempt.objects.get().state == S.OUTCOME_CONFIRMED


def test_a_permanent_failure_is_final(tenant_a: Tenant) -> None:
    @recording.tool("open_ticket", key="ticket-{n}")
    def open_ticket(call: recording.ToolCall, *, n: int) -> None:
        raise PermanentFailure("400 project archived")

    with recording.task(tenant="acme", task_id="t"), pytest.raises(PermanentFailure):
        open_ticket(n=1)
    assert Attempt.objects.get().state == S.FAILED
    with recording.task(tenant="acme", task_id="t"), pytest.raises(AttemptFailed, match="project archived"):
        open_ticket(n=1)


def test_a_tool_without_a_receipt_leaves_the_outcome_unknown(tenant_a: Tenant) -> None:
    @recording.tool("open_ticket", key="ticket-{n}")
    def open_ticket(call: recording.ToolCall, *, n: int) -> str:
        return "ok"  # "HTTP 200" is not a receipt

    with recording.task(tenant="acme", task_id="t"):
        assert open_ticket(n=1) == "ok"
    attempt = Attempt.objects.get()
    assert attempt.state == S.UNKNOWN
    assert "without a receipt" in attempt.last_note


def test_the_wrapper_needs_a_task(tenant_a: Tenant, send_email: Any) -> None:
    with pytest.raises(recording.NoTask):
        send_email(invoice=1, to="x")


def test_positional_arguments_are_recorded_by_name(tenant_a: Tenant) -> None:
    @recording.tool("send_email", key="invoice:{invoice}:send")
    def send(call: recording.ToolCall, invoice: int, to: str, cc: str = "") -> dict[str, str]:
        call.record_request_id(f"r-{invoice}")
        return {"ok": to}

    with recording.task(tenant="acme", task_id="t"):
        send(8, "ap@example.com")
    assert Attempt.objects.get().args == {"invoice": 8, "to": "ap@example.com", "cc": ""}


# --- concurrency on PostgreSQL ---------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_recording_one_key_make_one_attempt(tenant_a: Tenant) -> None:
    results: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            recorded = recording.record_intent(
                tenant="acme",
                task_id=f"task-{n}",
                tool_name="send_email",
                idempotency_key="invoice:7:send",
                args={"to": "ap@example.com", "invoice": 7},
                actor=Actor.agent(f"worker-{n}"),
            )
            results.append((recorded.attempt.pk, recorded.created))
        except BaseException as exc:
            errors.append(exc)

    together(worker, range(20))
    assert errors == []
    assert len(results) == 20
    assert len({pk for pk, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Attempt.objects.count() == 1
    assert AttemptEvent.objects.filter(attempt__isnull=False, to_state=S.INTENT_RECORDED).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_dispatching_one_attempt_one_wins(tenant_a: Tenant) -> None:
    attempt = record(tenant_a)
    # Every worker holds the attempt as it was before anyone dispatched it.
    copies = [Attempt.objects.get(pk=attempt.pk) for _ in range(20)]
    outcomes: list[str] = []

    def worker(numbered: tuple[int, Attempt]) -> None:
        n, copy = numbered
        try:
            recording.mark_dispatched(copy, actor=Actor.agent(f"w{n}"))
            outcomes.append("won")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    together(worker, list(enumerate(copies)))
    assert outcomes.count("won") == 1
    assert outcomes.count("ClaimLost") == 19
    assert AttemptEvent.objects.filter(attempt=attempt, to_state=S.DISPATCHED).count() == 1


def test_agent_actor_defaults_to_host_and_pid(tenant_a: Tenant) -> None:
    attempt = recording.record_intent(tenant="acme", task_id="t", tool_name="send_email", idempotency_key="k", args={})
    (event,) = events_of(attempt.attempt)
    assert event.actor_kind == "agent"
    assert ":" in event.actor_label
    assert AGENT.kind == "agent"


def test_a_result_the_ledger_cannot_store_is_not_replayed_but_the_outcome_is_recorded(tenant_a: Tenant) -> None:
    @recording.tool("open_ticket", key="ticket-{n}")
    def open_ticket(call: recording.ToolCall, *, n: int) -> dict[str, str]:
        call.record_request_id("T-9")
        return {"title": "nul \x00 inside"}  # PostgreSQL cannot store U+0000

    with recording.task(tenant="acme", task_id="t"):
        assert open_ticket(n=1) == {"title": "nul \x00 inside"}
    attempt = Attempt.objects.get()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.result is None

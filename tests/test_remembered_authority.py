"""An agent's intent and dispatch are checked against the authority its
process read last, each change guarded in its one statement by that
authority still being current; a refusal, and every change the guard
stops, rest on a read made now (PostgreSQL: elsewhere every step reads)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledgerdash.ledger import recording
from ledgerdash.ledger.errors import AuthorizationChanged, TenantInactive, ToolNotAllowed
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tool
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import AGENT, TOOLS_V1, record

pytestmark = pytest.mark.postgres

SYSTEM = Actor.system("tests")


def _statements(captured: CaptureQueriesContext) -> list[str]:
    # (The test case's savepoints stand in for production's autocommit.)
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def test_once_read_an_intent_and_its_dispatch_are_one_statement_each(tenant_a: Any) -> None:
    first = record(tenant_a, "k-known-1")
    with CaptureQueriesContext(connection) as intent:
        second = record(tenant_a, "k-known-2")
    with CaptureQueriesContext(connection) as dispatch:
        claimed = recording.mark_dispatched(second, actor=AGENT)
    (insert,) = _statements(intent)
    (claim,) = _statements(dispatch)
    assert insert.lstrip().startswith("WITH changed AS (\nINSERT")
    assert claim.lstrip().startswith("WITH changed AS (\nUPDATE")
    assert "is_active" in insert  # the guard rides along
    assert "is_active" in claim
    assert claimed.state == State.DISPATCHED
    # Ids come from a block the process reserved: unique, increasing within it.
    assert first.pk < second.pk
    assert Attempt.objects.get(pk=second.pk).events.first().details["idempotency_key"] == "k-known-2"


def test_a_tool_withdrawn_after_the_process_read_the_policy_is_refused(tenant_a: Any) -> None:
    record(tenant_a, "k-before")  # the process now remembers v1, which allows send_email
    policy_publish(tenant=tenant_a, tools={"charge_card": TOOLS_V1["charge_card"]}, actor=SYSTEM)
    before = AttemptEvent.objects.count()
    with pytest.raises(ToolNotAllowed):
        record(tenant_a, "k-after")
    assert not Attempt.objects.filter(idempotency_key="k-after").exists()
    assert AttemptEvent.objects.count() == before


def test_a_tenant_deactivated_after_the_process_read_it_records_nothing(tenant_a: Any) -> None:
    record(tenant_a, "k-before")
    type(tenant_a).objects.filter(pk=tenant_a.pk).update(is_active=False)
    with pytest.raises(TenantInactive):
        # The task's tenant object still says active: the guard is what notices.
        recording.record_intent(
            tenant=tenant_a, task_id="t", tool_name="send_email", idempotency_key="k-after", args={"n": 1}, actor=AGENT
        )
    assert not Attempt.objects.filter(idempotency_key="k-after").exists()


def test_a_remembered_refusal_is_asked_again(tenant_a: Any) -> None:
    policy_publish(tenant=tenant_a, tools={"charge_card": TOOLS_V1["charge_card"]}, actor=SYSTEM)
    with pytest.raises(ToolNotAllowed):
        record(tenant_a, "k-refused")
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, actor=SYSTEM)
    allowed = record(tenant_a, "k-allowed")
    assert allowed.policy_version == 3


def test_a_policy_change_after_the_intent_stops_the_remembered_dispatch(tenant_a: Any) -> None:
    attempt = record(tenant_a, "k-changed")  # remembered: v1 allows send_email
    policy_publish(tenant=tenant_a, tools={"charge_card": TOOLS_V1["charge_card"]}, actor=SYSTEM)
    with pytest.raises(AuthorizationChanged):
        recording.mark_dispatched(attempt, actor=AGENT)
    assert Attempt.objects.get(pk=attempt.pk).state == State.MANUAL_REVIEW
    assert Attempt.objects.get(pk=attempt.pk).dispatch_count == 0


def test_a_version_that_keeps_the_tool_dispatches_under_the_new_one(tenant_a: Any) -> None:
    attempt = record(tenant_a, "k-kept")
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "extra": []}, actor=SYSTEM)
    claimed = recording.mark_dispatched(attempt, actor=AGENT)
    assert claimed.state == State.DISPATCHED
    event = claimed.events.order_by("-seq").first()
    assert event is not None
    assert event.details["policy_version"] == 2


def test_a_tool_lease_changed_since_the_read_is_the_one_the_dispatch_uses(tenant_a: Any) -> None:
    Tool.objects.create(name="send_email", dispatch_lease_seconds=60, max_request_seconds=10)
    first = recording.mark_dispatched(record(tenant_a, "k-lease-1"), actor=AGENT)
    Tool.objects.filter(name="send_email").update(dispatch_lease_seconds=600)
    second = recording.mark_dispatched(record(tenant_a, "k-lease-2"), actor=AGENT)
    assert first.next_check_at is not None
    assert second.next_check_at is not None
    assert (first.next_check_at - first.updated_at).total_seconds() == 60
    assert (second.next_check_at - second.updated_at).total_seconds() == 600


def test_a_recorded_key_is_matched_under_the_authority_read_now(tenant_a: Any) -> None:
    first = record(tenant_a, "k-again")
    again = record(tenant_a, "k-again")
    assert again.pk == first.pk


def test_ids_reserved_before_a_sequence_reset_are_replaced(tenant_a: Any) -> None:
    """A block of ids reserved before the sequence was reset (a restore, a
    flush) may name rows that exist by now: the intent takes a fresh block."""
    first = record(tenant_a, "k-block-1")
    # The next id of this process's block, taken meanwhile by a row written elsewhere.
    taken = Attempt.objects.get(pk=first.pk)
    taken.pk, taken.idempotency_key, taken.provider_key = first.pk + 1, "k-elsewhere", "k-elsewhere"
    taken._state.adding = True
    taken.save(force_insert=True)
    second = record(tenant_a, "k-block-2")
    assert second.pk not in (first.pk, first.pk + 1)
    assert Attempt.objects.get(pk=second.pk).idempotency_key == "k-block-2"
    assert Attempt.objects.get(pk=first.pk + 1).idempotency_key == "k-elsewhere"


def test_a_policy_row_handed_out_again_is_not_taken_for_the_remembered_one(tenant_a: Any) -> None:
    """After a restore or a flush that resets the sequences, another policy
    may carry the id of the one this process remembers: its creation time
    tells them apart, and the new one decides."""
    from ledgerdash.ledger.models import Policy

    record(tenant_a, "k-before")
    current = Policy.objects.filter(tenant=tenant_a).order_by("-version").first()
    assert current is not None
    # The same id, another row: written behind the application's back.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_policy SET tools = %s::jsonb, created_at = %s WHERE id = %s",
            [
                json.dumps({"charge_card": TOOLS_V1["charge_card"]}),
                current.created_at + timedelta(seconds=1),
                current.pk,
            ],
        )
    with pytest.raises(ToolNotAllowed):
        record(tenant_a, "k-after")
    assert not Attempt.objects.filter(idempotency_key="k-after").exists()

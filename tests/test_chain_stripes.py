"""A tenant whose events are kept in several hash chains ("stripes"): each
attempt's events in one chain, every chain whole, and verify_audit naming a
break in any one of them."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, transaction

from ledgerdash.ledger import audit, chain, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainHead, State, Tenant
from tests import tamper
from tests.conftest import record, together
from tests.factories import attempt_in

STRIPES = 4


def assert_chains_whole(tenant: Tenant) -> dict[int, list[AttemptEvent]]:
    """Every chain of ``tenant`` links from the start to its head, numbered
    stripe + 1, + N, + 2N, …, and holds only its own attempts' events."""
    n = tenant.chain_stripes
    by_stripe: dict[int, list[AttemptEvent]] = {s: [] for s in range(n)}
    for event in AttemptEvent.objects.filter(tenant=tenant).order_by("seq"):
        stripe = chain.stripe_of_seq(event.seq, n)
        assert chain.stripe_of(event.attempt_id, n) == stripe, event
        by_stripe[stripe].append(event)
    heads = {h.stripe: h for h in ChainHead.objects.filter(tenant=tenant)}
    assert sorted(heads) == list(range(n))
    for stripe, events in by_stripe.items():
        prev = chain.GENESIS
        assert [e.seq for e in events] == [stripe + 1 + k * n for k in range(len(events))]
        for event in events:
            assert event.prev_hash == prev
            assert event.hash == chain.link(prev, event.content_hash)
            prev = event.hash
        assert (heads[stripe].seq, heads[stripe].hash) == ((events[-1].seq, prev) if events else (0, chain.GENESIS))
    return by_stripe


def settled(tenant: Tenant, key: str) -> Attempt:
    attempt = recording.mark_dispatched(record(tenant, key))
    return recording.confirm(attempt, provider_request_id=f"req-{key}")


def test_each_attempts_events_stay_in_one_of_the_tenants_chains(tenant_striped: Tenant) -> None:
    attempts = [settled(tenant_striped, f"k-{n}") for n in range(9)]
    by_stripe = assert_chains_whole(tenant_striped)
    assert all(len(events) >= 3 for events in by_stripe.values()), "nine attempts reach all four chains"
    for attempt in attempts:
        seqs = list(AttemptEvent.objects.filter(attempt=attempt).order_by("seq").values_list("seq", flat=True))
        assert len(seqs) == 3
        assert {chain.stripe_of_seq(seq, STRIPES) for seq in seqs} == {attempt.pk % STRIPES}
    # What happens to the tenant as a whole (its creation, its policy) is in chain 0.
    tenant_events = AttemptEvent.objects.filter(tenant=tenant_striped, attempt__isnull=True)
    assert tenant_events.exists()
    assert {chain.stripe_of_seq(seq, STRIPES) for seq in tenant_events.values_list("seq", flat=True)} == {0}
    (result,) = audit.verify([tenant_striped])
    assert result.ok, result.describe()
    assert result.events == AttemptEvent.objects.filter(tenant=tenant_striped).count()
    assert f"in {STRIPES} chains" in result.describe()
    assert sorted(result.reached) == sorted((events[-1].seq, events[-1].hash) for events in by_stripe.values())


def test_a_tenant_with_one_chain_is_numbered_as_always(tenant_a: Tenant) -> None:
    for n in range(3):
        settled(tenant_a, f"k-{n}")
    seqs = list(AttemptEvent.objects.filter(tenant=tenant_a).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert list(ChainHead.objects.filter(tenant=tenant_a).values_list("stripe", "seq")) == [(0, seqs[-1])]


def test_the_number_of_chains_is_fixed_once_the_tenant_has_events(tenant_striped: Tenant) -> None:
    with pytest.raises(DatabaseError, match="fixed once it has events"), transaction.atomic():
        Tenant.objects.filter(pk=tenant_striped.pk).update(chain_stripes=2)
    tenant_striped.refresh_from_db()
    assert tenant_striped.chain_stripes == STRIPES


@pytest.fixture
def striped_ledger(tenant_striped: Tenant) -> dict[int, list[AttemptEvent]]:
    for n, state in enumerate([State.OUTCOME_CONFIRMED, State.MANUAL_REVIEW, State.FAILED] * 3):
        attempt_in(state, tenant_striped, key=f"s-{n}")
    return assert_chains_whole(tenant_striped)


def broken(tenant: Tenant, known: list[audit.KnownHead] | None = None) -> audit.Break:
    result = audit.verify_tenant(Tenant.objects.get(pk=tenant.pk), known or [])
    assert result.broken is not None
    return result.broken


@tamper.commits
def test_an_edited_event_in_one_chain_is_named(
    striped_ledger: dict[int, list[AttemptEvent]], tenant_striped: Tenant
) -> None:
    victim = striped_ledger[2][1]
    tamper.edit(victim.pk, reason="nothing to see here")
    found = broken(tenant_striped)
    assert (found.problem, found.seq, found.event_id) == (audit.EDITED, victim.seq, victim.pk)


@tamper.commits
def test_an_event_removed_from_the_middle_of_one_chain_is_missing(
    striped_ledger: dict[int, list[AttemptEvent]], tenant_striped: Tenant
) -> None:
    events = striped_ledger[3]
    gone, after = events[1], events[2]
    tamper.delete(gone.pk)
    found = broken(tenant_striped)
    assert (found.problem, found.seq, found.event_id) == (audit.MISSING, after.seq, after.pk)
    assert f"seq {gone.seq} missing before tenant initech seq {after.seq}" in found.message


@tamper.commits
def test_the_newest_event_of_one_chain_removed_leaves_its_head_past_the_end(
    striped_ledger: dict[int, list[AttemptEvent]], tenant_striped: Tenant
) -> None:
    last = striped_ledger[1][-1]
    tamper.delete(last.pk)
    found = broken(tenant_striped)
    assert found.problem == audit.HEAD_MISMATCH
    assert f"tenant initech chain 1: the chain ends at seq {last.seq - STRIPES} but its head says {last.seq}" in (
        found.message
    )


@tamper.commits
def test_a_chain_cut_back_with_its_head_is_caught_by_a_head_kept_elsewhere(
    striped_ledger: dict[int, list[AttemptEvent]], tenant_striped: Tenant
) -> None:
    (first,) = audit.verify([tenant_striped])
    assert first.ok
    last = striped_ledger[2][-1]
    kept = last.seq - STRIPES
    tamper.execute("DELETE FROM ledger_attemptevent WHERE id = %s", [last.pk])
    tamper.execute(
        "UPDATE ledger_chainhead SET seq = %s, hash = %s WHERE tenant_id = %s AND stripe = 2",
        [kept, striped_ledger[2][-2].hash, tenant_striped.pk],
    )
    # The other chains and this one agree with their heads: only the earlier walk's heads tell.
    (again,) = audit.verify([tenant_striped])
    assert again.broken is not None
    assert again.broken.problem == audit.TAIL_LOST
    assert f"tenant initech chain 2: the chain ends at seq {kept}, but the verify_audit of " in again.broken.message
    assert f"seq {last.seq} were removed" in again.broken.message


@tamper.commits
def test_an_event_moved_to_another_chain_is_caught(
    striped_ledger: dict[int, list[AttemptEvent]], tenant_striped: Tenant
) -> None:
    # Two chains' first events swapped: each now sits where the other chain's should.
    one, other = striped_ledger[1][0], striped_ledger[2][0]
    tamper.swap(one.pk, other.pk)
    found = broken(tenant_striped)
    assert found.problem == audit.REORDERED
    assert found.seq == min(one.seq, other.seq)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_agents_recording_side_by_side_in_one_tenant_leave_every_chain_whole(tenant_striped: Tenant) -> None:
    errors: list[BaseException] = []

    def agent(n: int) -> None:
        try:
            for call in range(8):
                attempt = recording.record_intent(
                    tenant="initech",
                    task_id=f"task-{n}",
                    tool_name="send_email",
                    idempotency_key=f"agent-{n}-call-{call}",
                    args={"to": "ap@example.com", "invoice": call},
                    actor=Actor.agent(f"agent-{n}"),
                ).attempt
                recording.confirm(recording.mark_dispatched(attempt), provider_request_id=f"r-{n}-{call}")
        except BaseException as exc:
            errors.append(exc)

    together(agent, range(6))
    assert errors == []
    by_stripe = assert_chains_whole(tenant_striped)
    assert (
        sum(len(events) for events in by_stripe.values()) == AttemptEvent.objects.filter(tenant=tenant_striped).count()
    )
    assert Attempt.objects.filter(tenant=tenant_striped, state=State.OUTCOME_CONFIRMED).count() == 48
    (result,) = audit.verify([tenant_striped])
    assert result.ok, result.describe()

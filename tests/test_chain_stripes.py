"""A tenant whose events are kept in several hash chains ("stripes"): each
attempt's events in one chain, every chain whole, and verify_audit naming a
break in any one of them."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, transaction
from django.utils import timezone

from ledgerdash.ledger import audit, chain, clock, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainHead, State, Tenant
from ledgerdash.ledger.queries import events_of_attempts
from reviews import exports
from tests import tamper
from tests.conftest import record, together
from tests.factories import attempt_in, recorded_in_chain
from tests.test_exports import export_cli, rows_of, verify_file

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


# --- exports ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "ndjson"])
def test_an_export_carries_every_chain_to_its_head_and_verifies_offline(
    striped_ledger: dict[int, list[AttemptEvent]], tmp_path: Path, fmt: str
) -> None:
    path = export_cli(tmp_path, "--tenant", "initech", fmt=fmt)
    rows = rows_of(path)
    details = rows[0]["details"]
    assert (json.loads(details) if fmt == "csv" else details)["chains"] == {"initech": STRIPES}
    events = [int(r["event_seq"]) for r in rows if r["record"] == "event"]
    assert events == sorted(e.seq for chain_events in striped_ledger.values() for e in chain_events)
    heads = [r for r in rows if r["record"] == "head"]
    assert [(int(h["event_seq"]), h["hash"]) for h in heads] == [
        (events[-1].seq, events[-1].hash) for events in striped_ledger.values()
    ]
    result = verify_file(path)
    assert result.returncode == 0, result.stdout + result.stderr
    for stripe, chain_events in striped_ledger.items():
        last = chain_events[-1]
        assert f"initech chain {stripe}: VERIFIED seq {stripe + 1}..{last.seq} every {STRIPES}" in result.stdout
    # Its head rows are heads to keep: verify_audit takes them.
    assert call_command("verify_audit", "--known-heads", str(path)) is None


def test_an_export_stops_at_the_heads_it_read_first(
    striped_ledger: dict[int, list[AttemptEvent]], tenant_striped: Tenant, tmp_path: Path, monkeypatch: Any
) -> None:
    read_heads = exports.chain_heads
    later: list[Attempt] = []

    def heads_then_more(tenants: list[Tenant]) -> Any:
        heads = read_heads(tenants)
        later.extend(settled(tenant_striped, f"later-{n}") for n in range(4))
        return heads

    monkeypatch.setattr(exports, "chain_heads", heads_then_more)
    path = export_cli(tmp_path, "--tenant", "initech")
    exported = {int(r["event_id"]) for r in rows_of(path) if r["record"] == "event"}
    assert exported
    assert not exported & set(AttemptEvent.objects.filter(attempt__in=later).values_list("pk", flat=True))
    assert verify_file(path).returncode == 0


def test_a_filtered_striped_export_with_links_walks_every_chain(
    striped_ledger: dict[int, list[AttemptEvent]], tmp_path: Path
) -> None:
    path = export_cli(tmp_path, "--tenant", "initech", "--state", "MANUAL_REVIEW", "--links")
    assert any(r["record"] == "link" for r in rows_of(path))
    result = verify_file(path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("VERIFIED") == STRIPES


def test_a_row_dropped_from_one_chain_of_an_export_fails_offline(
    striped_ledger: dict[int, list[AttemptEvent]], tmp_path: Path
) -> None:
    path = export_cli(tmp_path, "--tenant", "initech", fmt="ndjson")
    gone = striped_ledger[2][1]
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if f'"event_id": {gone.pk},' not in line]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = verify_file(path)
    assert result.returncode == 1
    assert f"seq {gone.seq} to {gone.seq} (every {STRIPES}) missing before it" in result.stdout
    # Without its last chain's head row, the file was cut short.
    path.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    assert f"no head row for chain {STRIPES - 1}: the file was cut short" in verify_file(path).stdout


@pytest.mark.postgres
def test_the_server_formatted_striped_export_is_the_same_file(
    striped_ledger: dict[int, list[AttemptEvent]], tmp_path: Path, monkeypatch: Any
) -> None:
    before = set(AttemptEvent.objects.values_list("pk", flat=True))
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast = export_cli(tmp_path / "fast", "--tenant", "initech")
    monkeypatch.setattr(exports, "_server_formats", lambda request: False)
    slow = export_cli(tmp_path / "slow", "--tenant", "initech")

    def events(path: Path) -> list[dict[str, Any]]:
        # The first export's own event is in the second: compare what both saw.
        return [r for r in rows_of(path) if r["record"] == "event" and int(r["event_id"]) in before]

    assert len(events(fast)) == len(before)
    assert events(fast) == events(slow)
    assert verify_file(fast).returncode == 0


# --- reading a tenant's attempts together ---------------------------------------------------------


def settled_in_chain(tenant: Tenant, stripe: int, key: str) -> Attempt:
    """A settled attempt of ``tenant`` whose events are in chain ``stripe``."""
    attempt = recording.mark_dispatched(recorded_in_chain(tenant, stripe, key))
    return recording.confirm(attempt, provider_request_id=key)


def test_attempts_in_different_chains_are_read_in_the_order_things_happened(tenant_striped: Tenant) -> None:
    for n in range(3):
        settled_in_chain(tenant_striped, 3, f"busy-{n}")
    start = timezone.now()
    with clock.frozen_at(start + timedelta(minutes=1)):
        first = settled_in_chain(tenant_striped, 3, "first")
    with clock.frozen_at(start + timedelta(minutes=2)):
        then = settled_in_chain(tenant_striped, 1, "then")
    first_seqs = [e.seq for e in AttemptEvent.objects.filter(attempt=first).order_by("seq")]
    then_seqs = [e.seq for e in AttemptEvent.objects.filter(attempt=then).order_by("seq")]
    assert max(then_seqs) < min(first_seqs), "the quiet chain numbers below the busy one"
    events = events_of_attempts([first, then])
    assert [e.seq for e in events] == first_seqs + then_seqs
    assert [e.created_at for e in events] == sorted(e.created_at for e in events)


def test_the_overview_counts_what_each_chain_appended_since_the_last_walk(tenant_striped: Tenant) -> None:
    from reviews.queries import ChainStatus

    for n in range(5):
        settled(tenant_striped, f"before-{n}")
    (result,) = audit.verify([tenant_striped])
    assert result.ok
    added = [settled(tenant_striped, f"after-{n}") for n in range(3)]
    tenant = Tenant.objects.get(pk=tenant_striped.pk)
    heads = tuple(ChainHead.objects.filter(tenant=tenant).order_by("stripe").values_list("seq", flat=True))
    status = ChainStatus(tenant, heads, tenant.chain_check)
    assert status.appended_since == AttemptEvent.objects.filter(attempt__in=added).count() == 9
    assert ChainStatus(tenant, heads, None).appended_since == AttemptEvent.objects.filter(tenant=tenant).count()

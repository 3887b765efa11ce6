"""verify_audit walks each tenant's chain and names the first event that
was edited, removed or moved behind the application's back."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledgerdash.ledger import audit, chain
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainCheck, ChainHead, State, Tenant
from tests import tamper
from tests.factories import attempt_in


@pytest.fixture
def ledger(tenant_a: Tenant, tenant_b: Tenant) -> list[AttemptEvent]:
    """A few attempts in each tenant; tenant A's events in chain order."""
    for n, state in enumerate([State.OUTCOME_CONFIRMED, State.MANUAL_REVIEW, State.FAILED]):
        attempt_in(state, tenant_a, key=f"a-{n}")
        attempt_in(state, tenant_b, key=f"b-{n}")
    return list(AttemptEvent.objects.filter(tenant=tenant_a).order_by("seq"))


def verify_output(*args: str) -> tuple[str, int]:
    from io import StringIO

    out = StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue() + str(exc), exc.returncode
    return out.getvalue(), 0


def only(tenant: Tenant) -> audit.ChainResult:
    (result,) = audit.verify([tenant])
    return result


def test_an_untouched_ledger_verifies(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    output, code = verify_output()
    assert code == 0
    assert "acme: ok" in output
    assert "globex: ok" in output
    assert "2 chains verified" in output
    head = ChainHead.objects.get(tenant=tenant_a)
    check = ChainCheck.objects.get(tenant=tenant_a)
    assert check.ok
    assert check.verified_seq == head.seq == len(ledger)


@tamper.commits
def test_it_names_an_edited_event(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    victim = ledger[4]
    tamper.edit(victim.pk, reason="nothing to see here")
    output, code = verify_output("--tenant", "acme")
    assert code == 1
    assert f"tenant acme seq {victim.seq} (event id {victim.pk}) was edited: its fields no longer match" in output
    check = ChainCheck.objects.get(tenant=tenant_a)
    assert (check.ok, check.problem, check.break_seq, check.break_event_id) == (False, "edited", victim.seq, victim.pk)


@tamper.commits
def test_it_names_an_event_edited_with_its_own_hashes_recomputed(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    victim, after = ledger[3], ledger[4]
    victim.details = {"forged": True}
    new_content = chain.content_hash(chain.event_content(victim))
    tamper.edit(
        victim.pk, details='{"forged": true}', content_hash=new_content, hash=chain.link(victim.prev_hash, new_content)
    )
    broken = only(tenant_a).broken
    assert broken is not None
    assert (broken.problem, broken.seq, broken.event_id) == ("missing", after.seq, after.pk)
    assert "is not in the chain any more" in broken.message


@tamper.commits
def test_it_names_the_gap_a_deleted_event_leaves(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    victim, after = ledger[2], ledger[3]
    tamper.delete(victim.pk)
    output, code = verify_output("--tenant", "acme")
    assert code == 1
    assert f"seq {victim.seq} missing before tenant acme seq {after.seq} (event id {after.pk})" in output
    assert ChainCheck.objects.get(tenant=tenant_a).problem == "missing"


@tamper.commits
def test_it_notices_the_newest_events_removed(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    tamper.delete(ledger[-1].pk, ledger[-2].pk)
    broken = only(tenant_a).broken
    assert broken is not None
    assert broken.problem == "head mismatch"
    assert f"ends at seq {len(ledger) - 2} but its head says {len(ledger)}" in broken.message


@tamper.commits
def test_it_names_reordered_events(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    first, second = ledger[5], ledger[6]
    tamper.swap(first.pk, second.pk)
    output, code = verify_output()
    assert code == 1
    assert (
        f"tenant acme seq {first.seq} (event id {second.pk}) was written after seq {second.seq} "
        f"(event id {first.pk}), but sits at seq {first.seq}"
    ) in output
    assert "globex: ok" in output  # the other tenant's chain is its own
    assert ChainCheck.objects.get(tenant=tenant_a).problem == "reordered"


def test_it_notices_an_attempt_without_events(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    template = Attempt.objects.filter(tenant=tenant_a).first()
    assert template is not None
    orphan = Attempt.objects.create(
        tenant=tenant_a,
        task_id="t",
        tool_name="send_email",
        idempotency_key="orphan",
        provider_key="orphan",
        args={},
        args_hash=template.args_hash,
        state=State.OUTCOME_CONFIRMED,
        policy_version=1,
    )
    broken = only(tenant_a).broken
    assert broken is not None
    assert broken.problem == "attempt without events"
    assert f"attempt #{orphan.pk} has no events" in broken.message


def test_an_unknown_tenant_is_an_error(ledger: list[AttemptEvent]) -> None:
    output, code = verify_output("--tenant", "nobody")
    assert code == 1
    assert "no such tenant: nobody" in output


def test_the_walk_reads_in_chunks(ledger: list[AttemptEvent], tenant_a: Tenant, monkeypatch: Any) -> None:
    monkeypatch.setattr(audit, "CHUNK", 2)
    result = only(tenant_a)
    assert result.ok
    assert result.events == len(ledger)

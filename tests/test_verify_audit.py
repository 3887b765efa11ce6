"""verify_audit walks each tenant's chain and names the first event that
was edited, removed or moved behind the application's back."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
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


# --- heads kept elsewhere: a chain that lost its tail, or was rewritten ---------------------------


def _head(tenant: Tenant) -> tuple[int, str]:
    head = ChainHead.objects.get(tenant=tenant)
    return head.seq, head.hash


@tamper.commits
def test_a_tail_cut_with_its_head_moved_back_is_caught_by_a_kept_head(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    seq, digest = _head(tenant_a)
    tamper.cut_tail(tenant_a.pk, seq - 2)
    assert verify_output("--tenant", "acme", "--no-save")[1] == 0  # consistent in itself: the walk alone is fooled
    output, code = verify_output("--tenant", "acme", "--known-head", f"acme:{seq}:{digest}")
    assert code == 1
    assert (
        f"acme: BROKEN (tail lost) tenant acme: the chain ends at seq {seq - 2}, but --known-head (acme:{seq}) "
        f"saw it reach seq {seq} ({digest[:16]}…): seq {seq - 1} to {seq} were removed"
    ) in output
    assert ChainCheck.objects.get(tenant=tenant_a).problem == "tail lost"


@tamper.commits
def test_the_furthest_head_an_earlier_run_verified_is_kept_and_checked(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    assert verify_output()[1] == 0
    seq, digest = _head(tenant_a)
    check = ChainCheck.objects.get(tenant=tenant_a)
    assert check.reached_heads == [[seq, digest]]
    tamper.cut_tail(tenant_a.pk, seq - 1)
    output, code = verify_output()
    assert code == 1
    assert f"the chain ends at seq {seq - 1}, but the verify_audit of " in output
    assert f"saw it reach seq {seq} ({digest[:16]}…): seq {seq} were removed" in output
    assert "globex: ok" in output
    # A broken walk does not lower the head it must reach: the next run still says so.
    check.refresh_from_db()
    assert (check.ok, check.reached_heads) == (False, [[seq, digest]])
    assert verify_output()[1] == 1


@tamper.commits
def test_an_emptied_ledger_is_caught_by_the_head_an_earlier_run_kept(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    assert verify_output()[1] == 0
    seq, _ = _head(tenant_a)
    tamper.execute("DELETE FROM ledger_attemptevent WHERE tenant_id = %s", [tenant_a.pk])
    tamper.execute("UPDATE ledger_chainhead SET seq = 0, hash = %s WHERE tenant_id = %s", ["0" * 64, tenant_a.pk])
    tamper.execute("DELETE FROM ledger_providerid WHERE tenant_id = %s", [tenant_a.pk])  # they name the attempts
    tamper.execute("DELETE FROM ledger_attempt WHERE tenant_id = %s", [tenant_a.pk])
    output, code = verify_output("--tenant", "acme")
    assert code == 1
    assert "the chain ends at seq 0, but the verify_audit of" in output
    assert f"seq 1 to {seq} were removed" in output


@tamper.commits
def test_a_history_rewritten_with_every_hash_recomputed_is_caught_at_a_kept_head(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    seq, digest = _head(tenant_a)
    victim = ledger[2]
    prev = ledger[1].hash
    for event in ledger[2:]:  # forge one event, then re-link everything after it
        values: dict[str, Any] = {}
        if event.pk == victim.pk:
            event.details = {"forged": True}
            values["details"] = '{"forged": true}'
        content = chain.content_hash(chain.event_content(event))
        linked = chain.link(prev, content)
        tamper.edit(event.pk, **values, content_hash=content, prev_hash=prev, hash=linked)
        prev = linked
    tamper.execute("UPDATE ledger_chainhead SET hash = %s WHERE tenant_id = %s", [prev, tenant_a.pk])
    assert verify_output("--tenant", "acme", "--no-save")[1] == 0  # every link recomputed: the walk alone is fooled
    output, code = verify_output("--tenant", "acme", "--known-head", f"acme:{seq}:{digest}")
    assert code == 1
    assert f"acme: BROKEN (rewritten) tenant acme seq {seq} (event id {ledger[-1].pk}) is not the head" in output
    assert "the history up to it was rewritten" in output


@tamper.commits
def test_kept_heads_are_read_from_an_export_and_from_backup_output(
    ledger: list[AttemptEvent], tenant_a: Tenant, tmp_path: Path
) -> None:
    export = tmp_path / "acme.csv"
    call_command("export_audit", "--tenant", "acme", "--out", str(export))
    backup_lines = tmp_path / "backup.txt"
    seq, digest = _head(tenant_a)
    backup_lines.write_text(f"backed up …\n  acme: chain head at backup time seq {seq} {digest}\n")
    assert verify_output("--known-heads", str(export), "--known-heads", str(backup_lines), "--no-save")[1] == 0
    tamper.cut_tail(tenant_a.pk, seq - 3)
    for source in (export, backup_lines):
        output, code = verify_output("--tenant", "acme", "--known-heads", str(source), "--no-save")
        assert code == 1
        assert f"but {source} (acme:" in output
        assert "(tail lost)" in output


def test_a_kept_head_that_does_not_parse_or_names_no_tenant_is_an_error(
    ledger: list[AttemptEvent], tmp_path: Path
) -> None:
    assert "is not TENANT:SEQ:HASH" in verify_output("--known-head", "acme:7")[0]
    assert "is not TENANT:SEQ:HASH" in verify_output("--known-head", "acme:x:" + "0" * 64)[0]
    assert "names no tenant of this ledger: nobody" in verify_output("--known-head", "nobody:1:" + "a" * 64)[0]
    notes = tmp_path / "notes.txt"
    notes.write_text("nothing here\n")
    output, code = verify_output("--known-heads", str(notes))
    assert code == 1
    assert "names no chain head" in output


# --- incremental: from the heads the last walk verified ------------------------------------------


def test_an_incremental_walk_reads_only_what_was_appended_since(ledger: list[AttemptEvent], tenant_a: Tenant) -> None:
    assert verify_output()[1] == 0
    before = len(ledger)
    attempt_in(State.OUTCOME_CONFIRMED, tenant_a, key="a-later")
    added = AttemptEvent.objects.filter(tenant=tenant_a).count() - before
    (result, _) = audit.verify(incremental=True)
    assert result.ok, result.describe()
    assert (result.walked, result.events) == (added, before + added)
    assert f"acme: ok, {before + added} events, head seq {before + added}" in result.describe()
    assert f"({added} new since the last walk)" in result.describe()
    check = ChainCheck.objects.get(tenant=tenant_a)
    assert check.reached_heads == [list(_head(tenant_a))]
    # Nothing new: nothing read, still verified up to the head.
    (again, _) = audit.verify(incremental=True)
    assert (again.ok, again.walked, again.events) == (True, 0, before + added)


def test_an_incremental_walk_without_an_earlier_one_walks_everything(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    (result, _) = audit.verify(incremental=True)
    assert (result.ok, result.walked, result.events) == (True, None, len(ledger))  # None: a full walk


@tamper.commits
def test_an_incremental_walk_catches_an_edit_after_the_verified_head(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    assert verify_output()[1] == 0
    attempt_in(State.OUTCOME_CONFIRMED, tenant_a, key="a-later")
    victim = AttemptEvent.objects.filter(tenant=tenant_a).order_by("-seq")[1]
    tamper.edit(victim.pk, reason="changed later")
    output, code = verify_output("--tenant", "acme", "--incremental")
    assert code == 1
    assert f"tenant acme seq {victim.seq} (event id {victim.pk}) was edited" in output


@tamper.commits
def test_an_incremental_walk_catches_the_verified_head_rewritten_or_removed(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    assert verify_output()[1] == 0
    seq, digest = _head(tenant_a)
    tamper.edit(ledger[-1].pk, hash="f" * 64)
    output, code = verify_output("--tenant", "acme", "--incremental", "--no-save")
    assert code == 1
    assert f"acme: BROKEN (rewritten) tenant acme seq {seq} (event id {ledger[-1].pk}) is not the head" in output
    tamper.delete(ledger[-1].pk)
    output, code = verify_output("--tenant", "acme", "--incremental")
    assert code == 1
    assert f"acme: BROKEN (tail lost) tenant acme: seq {seq}, where the verify_audit of" in output
    assert f"saw the chain ({digest[:16]}…), is gone" in output
    assert ChainCheck.objects.get(tenant=tenant_a).verified_seq == 0  # nothing verified from a head that is gone


@tamper.commits
def test_an_incremental_walk_does_not_reread_what_it_verified_before(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    """The limit it trades for speed: an edit behind the verified head is the full walk's to find."""
    assert verify_output()[1] == 0
    victim = ledger[2]
    tamper.edit(victim.pk, reason="edited behind the head")
    assert verify_output("--tenant", "acme", "--incremental", "--no-save")[1] == 0
    output, code = verify_output("--tenant", "acme")
    assert code == 1
    assert f"seq {victim.seq} (event id {victim.pk}) was edited" in output


def _orphan(tenant: Tenant, key: str, created_at: Any = None) -> Attempt:
    """An attempt with no events (as if they had been removed)."""
    template = Attempt.objects.filter(tenant=tenant).first()
    assert template is not None
    orphan = Attempt.objects.create(
        tenant=tenant, task_id="t", tool_name="send_email", idempotency_key=key, provider_key=key, args={},
        args_hash=template.args_hash, state=State.OUTCOME_CONFIRMED, policy_version=1,
    )  # fmt: skip
    if created_at is not None:
        Attempt.objects.filter(pk=orphan.pk).update(created_at=created_at)
    return orphan


def test_an_incremental_walk_checks_the_attempts_recorded_since_the_last_walk(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    assert verify_output()[1] == 0
    orphan = _orphan(tenant_a, "new-orphan")
    (result,) = audit.verify([tenant_a], incremental=True, save=False)
    assert result.broken is not None
    assert result.broken.problem == audit.NO_EVENTS
    assert f"attempt #{orphan.pk} has no events" in result.broken.message


def test_an_incremental_walk_leaves_older_attempts_to_the_full_walk(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    """Its reads follow what was added since: an attempt recorded well
    before the last walk is the full walk's to check (its events' seqs
    missing from the chain are the full walk's to see as well)."""
    assert verify_output()[1] == 0
    walked = ChainCheck.objects.get(tenant=tenant_a).reached_at
    assert walked is not None
    old = _orphan(tenant_a, "old-orphan", created_at=walked - audit.INCREMENTAL_OVERLAP - timedelta(minutes=1))
    (incremental,) = audit.verify([tenant_a], incremental=True, save=False)
    assert incremental.ok, incremental.describe()
    (full,) = audit.verify([tenant_a], save=False)
    assert full.broken is not None
    assert f"attempt #{old.pk} has no events" in full.broken.message
    # Within the overlap before the last walk, the incremental walk looks too.
    recent = _orphan(tenant_a, "recent-orphan", created_at=walked - timedelta(minutes=5))
    (again,) = audit.verify([tenant_a], incremental=True, save=False)
    assert again.broken is not None
    assert f"attempt #{recent.pk} has no events" in again.broken.message


def test_an_incremental_walk_follows_each_of_several_chains(tenant_striped: Tenant) -> None:
    for n in range(6):
        attempt_in(State.OUTCOME_CONFIRMED, tenant_striped, key=f"s-{n}")
    assert audit.verify([tenant_striped])[0].ok
    total = AttemptEvent.objects.filter(tenant=tenant_striped).count()
    for n in range(6, 9):
        attempt_in(State.OUTCOME_CONFIRMED, tenant_striped, key=f"s-{n}")
    (result,) = audit.verify([tenant_striped], incremental=True)
    assert result.ok, result.describe()
    now = AttemptEvent.objects.filter(tenant=tenant_striped).count()
    assert (result.walked, result.events) == (now - total, now)
    assert result.verified_seq == max(ChainHead.objects.filter(tenant=tenant_striped).values_list("seq", flat=True))


@tamper.commits
def test_an_incremental_walk_still_checks_kept_heads_behind_where_it_starts(
    ledger: list[AttemptEvent], tenant_a: Tenant
) -> None:
    """A head kept outside the database is what catches someone who rewrites the history and the
    last walk's record of it alike; the incremental walk checks it without reading up to it."""
    early = ledger[1]
    assert verify_output()[1] == 0
    assert verify_output("--incremental", "--known-head", f"acme:{early.seq}:{early.hash}")[1] == 0
    output, code = verify_output("--incremental", "--no-save", "--known-head", f"acme:{early.seq}:{'0' * 64}")
    assert code == 1
    assert f"acme: BROKEN (rewritten) tenant acme seq {early.seq} (event id {early.pk}) is not the head" in output
    tamper.delete(early.pk)
    output, code = verify_output("--incremental", "--no-save", "--known-head", f"acme:{early.seq}:{early.hash}")
    assert code == 1
    assert f"acme: BROKEN (tail lost) tenant acme: seq {early.seq}, where --known-head" in output

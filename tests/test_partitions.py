"""The events' partitions on PostgreSQL: each one protected as the whole
table is, ranges made ahead (and the tail closed when writes reached it),
the oldest settled and verified ones archived to files, verified across
archive and live as one chain per tenant, and restored."""

from __future__ import annotations

import gzip
import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from ledgerdash.ledger import archive, audit, clock, moves, partitions, recording, rules
from ledgerdash.ledger.errors import StaleFence
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, EventArchive, Incident, State, Tenant
from ledgerdash.ledger.store.chains import event_record
from tests import tamper
from tests.conftest import AGENT, RECONCILER, record
from tests.database_roles import admin_connect, owner_url
from tests.test_backup import manage

pytestmark = pytest.mark.postgres
FIRST = "ledger_attemptevent_0"


def _settled(tenant: Tenant, key: str) -> None:
    attempt = record(tenant, key)
    attempt = recording.mark_dispatched(attempt, actor=AGENT)
    recording.confirm(attempt, provider_request_id=f"req-{key}", actor=AGENT)


def _owner(*args: str) -> subprocess.CompletedProcess[str]:
    """A command as the role that owns the tables (partitions are made and dropped by their owner)."""
    return manage(*args, url=owner_url())


def _next_event_id(value: int) -> None:
    with admin_connect() as admin:
        admin.execute("SELECT setval('ledger_attemptevent_id_seq', %s, false)", [value])


def _small_ranges() -> None:
    """Ranges of 40 ids from 10,000,000 on; the first range (below it) keeps the tenants' first events."""
    assert _owner("event_partitions", "--make-ahead", "3", "--size", "40").returncode == 0
    _next_event_id(10_000_000)


def _archive_the_first_two(tenant: Tenant, tmp_path: Path) -> None:
    """Enough settled attempts after what the test wrote to close its range, verified, then the first
    two ranges archived (the tenants' first events, and the test's)."""
    for n in range(20):
        _settled(tenant, f"after-{n}")
    assert all(r.ok for r in audit.verify())
    done = _owner("archive_events", str(tmp_path), "--older-than", "0", "--limit", "2")
    assert done.returncode == 0, done.stderr


def test_every_partition_keeps_the_tables_protections(tenant_a: Tenant) -> None:
    names = [p.name for p in partitions.partitions()]
    assert names[0] == FIRST
    assert partitions.partitions()[-1].tail
    with admin_connect() as admin:
        for name in names:
            triggers = {
                row[0] for row in admin.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass", [name])
            }
            assert {f"{name}_no_truncate", "ledger_attemptevent_append_only"} <= triggers, name
            unique = admin.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = %s "
                "AND indexdef LIKE 'CREATE UNIQUE%%(tenant_id, seq)'",
                [name],
            ).fetchall()
            assert unique, name
    record(tenant_a, "k-1")
    # The app's own role reads a partition (pg_dump does) and changes nothing there.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {FIRST}")
    for statement in (f"DELETE FROM {FIRST}", f"UPDATE {FIRST} SET reason = 'x'", f"TRUNCATE {FIRST}"):
        assert "permission denied" in _refused(statement)


def _refused(statement: str) -> str:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    except DatabaseError as exc:
        return str(exc)
    return ""


@pytest.mark.django_db(transaction=True)
def test_a_chain_head_never_moves_back(tenant_a: Tenant) -> None:
    record(tenant_a, "k-1")
    with admin_connect() as admin, pytest.raises(psycopg.errors.RestrictViolation, match="only moves forward"):
        admin.execute("UPDATE ledger_chainhead SET seq = 0 WHERE tenant_id = %s", [tenant_a.pk])


def _forge(tenant_id: int, *, seq: int) -> int:
    """An event INSERTed by hand, as the app's role could, at ``seq``; its id."""
    with admin_connect() as admin:
        row = admin.execute(
            "INSERT INTO ledger_attemptevent (tenant_id, seq, kind, actor_kind, actor_label, from_state, to_state, "
            "reason, details, created_at, content_hash, prev_hash, hash) "
            "VALUES (%s, %s, 'comment', 'system', 'forger', '', '', '', '{}', now(), %s, %s, %s) RETURNING id",
            [tenant_id, seq, "1" * 64, "2" * 64, "3" * 64],
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_a_seq_is_given_once_across_partitions(tenant_a: Tenant) -> None:
    record(tenant_a, "k-1")  # seq 1 onwards, in the first partition
    assert _owner("event_partitions", "--make-ahead", "1", "--size", "100").returncode == 0
    _next_event_id(10_000_050)  # the next event lands in another partition
    with pytest.raises(psycopg.errors.UniqueViolation, match="already has an event at seq 1"):
        _forge(tenant_a.pk, seq=1)


@pytest.mark.django_db(transaction=True)
def test_ranges_are_made_ahead_and_a_reached_tail_is_closed() -> None:
    done = _owner("event_partitions", "--make-ahead", "2", "--size", "100")
    assert done.returncode == 0, done.stderr
    assert "made ledger_attemptevent_10000000 for ids 10,000,000 to 10,000,100" in done.stdout
    assert "made ledger_attemptevent_10000200 for ids 10,000,200 on (the tail)" in done.stdout
    again = _owner("event_partitions", "--make-ahead", "2", "--size", "100")
    assert "nothing to make" in again.stdout
    # Nobody ran it while the writes went past every range: they land in the
    # tail, then the next run closes it at a round bound past them.
    _next_event_id(10_000_250)
    tenant = Tenant.objects.create(slug="late", name="Late")
    event_record(tenant=tenant, kind=EventKind.POLICY, actor=Actor.system("tests"), details={"n": 1})
    closed = _owner("event_partitions", "--make-ahead", "1", "--size", "100")
    assert closed.returncode == 0, closed.stderr
    assert "closed ledger_attemptevent_10000200 at id 10,000,300: writes had reached it" in closed.stdout
    layout = [(p.low, p.high) for p in partitions.partitions()]
    assert layout[-3:] == [(10_000_200, 10_000_300), (10_000_300, 10_000_400), (10_000_400, None)]
    assert AttemptEvent.objects.filter(tenant=tenant, id__gte=10_000_250).count() == 2  # both in the closed tail


@pytest.mark.django_db(transaction=True)
def test_archive_verify_across_and_restore(tenant_a: Tenant, tenant_striped: Tenant, tmp_path: Path) -> None:
    _small_ranges()
    for n in range(20):
        _settled(tenant_a, f"a-{n}")
        _settled(tenant_striped, f"s-{n}")
    total = {t.pk: AttemptEvent.objects.filter(tenant=t).count() for t in (tenant_a, tenant_striped)}
    assert AttemptEvent.objects.filter(id__gte=10_000_080).exists()  # writes went past the second range

    refused = _owner("archive_events", str(tmp_path), "--older-than", "0", "--limit", "2")
    assert refused.returncode != 0
    assert "which no verify_audit that held has reached: run verify_audit first" in refused.stderr
    assert all(r.ok for r in audit.verify())

    done = _owner("archive_events", str(tmp_path), "--older-than", "0", "--limit", "2")
    assert done.returncode == 0, done.stderr
    assert f"archived {FIRST}: " in done.stdout
    assert "archived ledger_attemptevent_10000000: 40 events" in done.stdout
    archived = EventArchive.objects.get(name="ledger_attemptevent_10000000")
    archived_events = sum(a.events for a in EventArchive.objects.all())
    manifest = json.loads((tmp_path / "ledger_attemptevent_10000000.json").read_text())
    assert manifest["sha256"] == archived.sha256
    assert {c["tenant"] for c in manifest["chains"]} == {tenant_a.slug, tenant_striped.slug}
    assert not AttemptEvent.objects.filter(id__lt=10_000_040).exists()  # gone from the database
    assert AttemptEvent.objects.count() == sum(total.values()) - archived_events

    # The next range holds events of an attempt still moving: it stays.
    with admin_connect() as admin:
        (attempt_id,) = admin.execute(
            "SELECT attempt_id FROM ledger_attemptevent WHERE id >= 10000040 AND attempt_id IS NOT NULL LIMIT 1"
        ).fetchone()
        admin.execute("SET session_replication_role = replica")
        admin.execute("UPDATE ledger_attempt SET state = %s WHERE id = %s", [State.UNKNOWN, attempt_id])
    held = _owner("archive_events", str(tmp_path), "--older-than", "0")
    assert held.returncode != 0
    assert f"holds events of attempt #{attempt_id}, which is not settled" in held.stderr

    # Live alone: each chain starts where the archive ends it.
    results = {r.tenant.pk: r for r in audit.verify(save=False)}
    assert all(r.ok for r in results.values()), [r.describe() for r in results.values()]
    assert results[tenant_a.pk].events == total[tenant_a.pk]
    assert "archived, not read" in results[tenant_a.pk].describe()
    # Archive and live as one chain per tenant.
    across = audit.verify(save=False, archive_dir=tmp_path)
    assert all(r.ok for r in across), [r.describe() for r in across]
    assert {r.tenant.pk: r.events for r in across} == total
    ok = manage("verify_audit", "--archive", str(tmp_path), "--no-save", url=owner_url())
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # An edited archive file is caught by its digest...
    data = tmp_path / archived.file
    original = data.read_bytes()
    with gzip.open(data, "rt") as handle:
        lines = handle.readlines()
    lines[0] = lines[0].replace('"kind":"', '"kind":"x', 1)
    with gzip.open(data, "wt") as handle:
        handle.writelines(lines)
    with pytest.raises(archive.ArchiveError, match="the file was changed or replaced"):
        audit.verify(save=False, archive_dir=tmp_path)
    data.write_bytes(original)

    # An event written into the database at a seq the archive holds (the
    # database cannot see the archived one to refuse it): the walk can.
    forged = _forge(tenant_a.pk, seq=1)
    (caught,) = audit.verify([tenant_a], save=False)
    assert caught.broken is not None
    assert caught.broken.problem == audit.BEHIND_ARCHIVE
    assert f"seq 1 (event id {forged}) is in the database, but the archive holds tenant acme up to seq" in (
        caught.broken.message
    )
    tamper.execute("DELETE FROM ledger_attemptevent WHERE id = %s", [forged])

    # Restore: the newest archive first.
    first_out = _owner("restore_events", str(tmp_path), FIRST)
    assert first_out.returncode != 0
    assert "restore ledger_attemptevent_10000000 first" in first_out.stderr
    back = _owner("restore_events", str(tmp_path), "ledger_attemptevent_10000000")
    assert back.returncode == 0, back.stderr
    assert AttemptEvent.objects.filter(id__lt=10_000_040).count() == 40
    assert all(r.ok for r in audit.verify(save=False))
    restored = [p for p in partitions.partitions() if p.name == "ledger_attemptevent_10000000"]
    assert restored
    assert restored[0].high == 10_000_040
    with admin_connect() as admin, pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
        admin.execute("DELETE FROM ledger_attemptevent_10000000 WHERE id = 10000000")
    with admin_connect() as admin, pytest.raises(psycopg.errors.RestrictViolation, match="TRUNCATE refused"):
        admin.execute("TRUNCATE ledger_attemptevent_10000000")


def test_an_archive_file_edited_with_its_manifest_is_still_caught(tmp_path: Path, tenant_a: Tenant) -> None:
    row = {"tenant_id": tenant_a.pk, "seq": 1}
    path = tmp_path / "ledger_attemptevent_5.ndjson.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps(row) + "\n")
    record_ = EventArchive(name="ledger_attemptevent_5", high=10, file=path.name, sha256="0" * 64, events=1)
    (tmp_path / "ledger_attemptevent_5.json").write_text(
        json.dumps({"format": archive.FORMAT, "sha256": archive._sha256(path), "chains": [], "events": 1})
    )
    with pytest.raises(archive.ArchiveError, match="the ledger recorded 0000000000000000"):
        archive.read_manifest(tmp_path, record_)


@pytest.mark.django_db(transaction=True)
def test_what_the_ledger_heard_of_a_side_effect_outlives_the_archive_of_its_events(
    tenant_a: Tenant, operator_a: Any, tmp_path: Path
) -> None:
    """The send rule and the approval weigh every late report that a side
    effect happened; archiving the partition that holds the report must not
    make the ledger forget it."""
    _small_ranges()
    original = recording.mark_dispatched(record(tenant_a, "pay:heard"), actor=AGENT)
    fence = original.fence
    unknown = recording.mark_unknown(original, reason="the connection dropped", fence=fence)
    reviewed = moves.attempt_escalate(attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="checks ran out")
    moves.attempt_mark_failed(attempt=reviewed, actor=Actor.user(operator_a), reason="the customer saw nothing")
    # The original dispatcher wakes: the provider acted (a receipt without a request id).
    late = recording.report_outcome(original, outcome="confirmed", result_ref="receipt-77", fence=fence)
    assert late.late
    assert late.attempt.state == State.FAILED
    assert Incident.objects.filter(attempt=original).exists()
    heard = rules.what_happened([Attempt.objects.get(pk=original.pk)])
    assert heard is not None
    assert "receipt-77" in heard[0]

    _archive_the_first_two(tenant_a, tmp_path)
    assert not AttemptEvent.objects.filter(attempt_id=original.pk, kind=EventKind.LATE_REPORT).exists()

    assert rules.what_happened([Attempt.objects.get(pk=original.pk)]) == heard


@pytest.mark.django_db(transaction=True)
def test_a_report_from_an_earlier_dispatch_is_kept_after_its_claim_was_archived(
    tenant_a: Tenant, tmp_path: Path
) -> None:
    """Its first dispatcher paused while the reconciler sent the call again and it was confirmed;
    the partition holding the first claim was archived; the first dispatcher's report is still
    evidence, never refused as coming from a dispatch the ledger cannot find."""
    _small_ranges()
    dispatched = recording.mark_dispatched(record(tenant_a, "mail:resent"), actor=AGENT)
    (claimed,) = moves.attempts_claim_due(limit=1, now=dispatched.next_check_at)
    unknown = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    assert unknown.lands_by is not None
    with clock.frozen_at(unknown.lands_by + timedelta(seconds=1)):
        resent = moves.attempt_dispatch(attempt=unknown, actor=RECONCILER, fence=unknown.fence)
    recording.confirm(resent, provider_request_id="req-resent", actor=RECONCILER)
    _archive_the_first_two(tenant_a, tmp_path)
    assert not AttemptEvent.objects.filter(attempt_id=dispatched.pk).exists()  # its history left

    report = recording.report_outcome(dispatched, outcome="unknown", reason="no answer", actor=AGENT)
    assert report.late
    assert report.attempt.state == State.OUTCOME_CONFIRMED
    (event,) = AttemptEvent.objects.filter(attempt_id=dispatched.pk, kind=EventKind.LATE_REPORT)
    assert "an earlier dispatcher" in event.reason
    # Anyone else with an old fence is still refused.
    with pytest.raises(StaleFence):
        recording.report_outcome(dispatched, outcome="unknown", reason="?", actor=RECONCILER)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first", ["on time", "late"])
def test_a_report_sent_again_after_its_event_was_archived_is_still_a_replay(
    tenant_a: Tenant, tmp_path: Path, first: str
) -> None:
    """The dispatcher's answer was lost; it paused, and sent the same report again after the
    partition holding the event that applied it was archived. The ledger still knows the report:
    nothing is written twice."""
    _small_ranges()
    dispatched = recording.mark_dispatched(record(tenant_a, f"sms:again-{first}"), actor=AGENT)
    fence = dispatched.fence
    if first == "late":
        recording.report_outcome(dispatched, outcome="unknown", reason="timed out", fence=fence, actor=AGENT)
    applied = recording.report_outcome(
        dispatched, outcome="confirmed", provider_request_id="req-again", fence=fence, actor=AGENT
    )
    assert applied.attempt.state == State.OUTCOME_CONFIRMED
    assert applied.late == (first == "late")
    _archive_the_first_two(tenant_a, tmp_path)
    assert not AttemptEvent.objects.filter(attempt_id=dispatched.pk).exists()  # its history left

    again = recording.report_outcome(
        dispatched, outcome="confirmed", provider_request_id="req-again", fence=fence, actor=AGENT
    )
    assert again.replayed
    assert not AttemptEvent.objects.filter(attempt_id=dispatched.pk).exists()
    assert Attempt.objects.get(pk=dispatched.pk).fence == applied.attempt.fence


def test_a_restore_loads_exactly_the_bytes_it_hashed(tmp_path: Path, tenant_a: Tenant) -> None:
    """The same events compressed again are other bytes than the ledger archived: read once, hashed as
    they are loaded, they are refused at the end of the file (inside the restore's transaction)."""
    path = tmp_path / "ledger_attemptevent_5.ndjson.gz"
    lines = [
        json.dumps({"tenant_id": tenant_a.pk, "seq": n, "created_at": "2026-01-01T00:00:00+00:00"}) + "\n"
        for n in range(1, 200)
    ]
    with gzip.open(path, "wt", compresslevel=9) as handle:
        handle.writelines(lines)
    record_ = EventArchive(
        name="ledger_attemptevent_5", high=10, file=path.name, sha256=archive._sha256(path), events=len(lines)
    )
    assert [row["seq"] for row in archive.hashed_rows(tmp_path, record_)] == list(range(1, 200))

    with gzip.open(path, "wt", compresslevel=1) as handle:  # the same rows, other bytes
        handle.writelines(lines)
    read = []
    with pytest.raises(archive.ArchiveError, match="the file was changed or replaced"):
        read.extend(row["seq"] for row in archive.hashed_rows(tmp_path, record_))
    assert read == list(range(1, 200))  # every row read before the digest could be known


@pytest.mark.django_db(transaction=True)
def test_an_attempt_whose_events_were_archived_says_where_they_went(
    tenant_a: Tenant, operator_a: Any, tmp_path: Path
) -> None:
    from django.test import Client

    _small_ranges()
    _settled(tenant_a, "pay:old")
    original = Attempt.objects.get(idempotency_key="pay:old")
    _archive_the_first_two(tenant_a, tmp_path)
    assert not AttemptEvent.objects.filter(attempt_id=original.pk).exists()
    held = EventArchive.objects.get(name="ledger_attemptevent_10000000")
    browser = Client()
    browser.force_login(operator_a)

    page = browser.get(f"/attempts/{original.pk}/").content.decode()

    assert f"archived to {held.file}" in page
    assert "verify_audit --archive" in page
    assert f"restore_events DIR {held.name}" in page
    settled_late = record(tenant_a, "pay:new")
    assert "archived to" not in browser.get(f"/attempts/{settled_late.pk}/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_person_named_by_archived_events_cannot_be_deleted(
    tenant_a: Tenant, operator_a: Any, admin_user: Any, tmp_path: Path
) -> None:
    """Their id is in the archived events (and in their hashes): deleting them would leave an archive
    that restores into a database that refuses it."""
    from django.db.models import ProtectedError
    from django.test import Client

    _small_ranges()
    attempt = recording.mark_dispatched(record(tenant_a, "pay:person"), actor=AGENT)
    attempt = recording.mark_unknown(attempt, reason="the connection dropped", fence=attempt.fence)
    attempt = moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="checks ran out")
    moves.attempt_mark_failed(attempt=attempt, actor=Actor.user(operator_a), reason="the customer saw nothing")
    _archive_the_first_two(tenant_a, tmp_path)
    held = EventArchive.objects.get(name="ledger_attemptevent_10000000")
    assert operator_a.pk in held.people
    assert not AttemptEvent.objects.filter(actor_user=operator_a).exists()  # no live event protects them

    with pytest.raises(ProtectedError, match=f"archived to {held.file}"):
        operator_a.delete()

    browser = Client()
    browser.force_login(admin_user)
    page = browser.get(f"/admin/auth/user/{operator_a.pk}/delete/").content.decode()
    assert held.file in page
    assert browser.post(f"/admin/auth/user/{operator_a.pk}/delete/", {"post": "yes"}).status_code == 200
    assert type(operator_a).objects.filter(pk=operator_a.pk).exists()

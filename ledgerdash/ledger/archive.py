"""Archiving the oldest partitions of the events to files, and bringing them back.

A partition leaves the database (PostgreSQL; run as the owner) only when:

- it is **closed**: no id it takes is still to be handed out, and its newest
  event is older than the retention asked for;
- it is the **oldest** partition still in the database: the archive is a
  prefix of every chain, so a walk of the live events starts where the
  archive ends;
- it is **settled**: every attempt with an event in it is settled (an
  attempt still moving keeps its history at hand for the people and the
  reconciler that need it);
- it is **verified**: each chain with events in it was walked by
  ``verify_audit`` past its last event there, and the walk held;
- its rows **link**: each chain's first event in it follows the end the
  archive already holds of that chain (or starts the chain), and every
  event's hashes are recomputed as it is written.

Then its rows go to ``<partition>.ndjson.gz`` (one event a line, in
(tenant, seq) order, gzip), with ``<partition>.json`` beside it (the range,
the file's SHA-256, and where each chain began and ended in it), both
flushed to disk, and the file read back from the disk (every event
parsed and counted) before the database lets go: an :class:`~ledgerdash.ledger.models.EventArchive` row is
written, and the partition is detached and dropped, in one transaction.

``verify_audit`` then starts each chain from where the archive ended it (it
says how many events it did not read); ``verify_audit --archive DIR`` reads
the files as well and walks archive and live as one chain per tenant.
:func:`restore` puts a partition back from its files.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

from django.conf import settings
from django.db import connection, transaction
from django.db.models import ProtectedError
from django.db.models.signals import pre_delete
from django.utils.dateparse import parse_datetime

from ledgerdash.ledger import chain, clock, partitions
from ledgerdash.ledger.models import TERMINAL_STATES, ChainCheck, EventArchive, Tenant

FORMAT = "ledgerdash-events-archive/1"
#: The columns an archived event keeps, in the file's order: a walk's (the
#: hashed fields and the links) and where the event sits (id, tenant, seq).
COLUMNS = (
    "id",
    "tenant_id",
    "seq",
    *(name for name in chain.HASHED_FIELDS if name != "tenant_id"),
    "content_hash",
    "prev_hash",
    "hash",
)
CHUNK = 5000
#: How long archiving and restoring wait for the events' lock before giving up (run again later).
LOCK_TIMEOUT = "10s"


class ArchiveError(RuntimeError):
    """Why a partition was not archived or restored, or an archive does not hold."""


@dataclass
class ChainEnds:
    """Where one chain begins and ends in one partition."""

    tenant_id: int
    tenant: str
    stripe: int
    first_seq: int
    prev_hash: str
    last_seq: int = 0
    hash: str = ""
    events: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Archived:
    """Where each chain's archived part ends, over every archive in the database."""

    #: (tenant_id, stripe) -> (last seq, its hash)
    ends: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)
    events: dict[int, int] = field(default_factory=dict)
    #: The newest archived event's time: attempts older than it may have all their events archived.
    last_at: datetime | None = None
    archives: list[EventArchive] = field(default_factory=list)

    def of(self, tenant_id: int) -> dict[int, tuple[int, str]]:
        return {stripe: end for (tenant, stripe), end in self.ends.items() if tenant == tenant_id}


def archived() -> Archived:
    """What the archives hold, from their rows in the database (none restored)."""
    found = Archived()
    for archive in EventArchive.objects.filter(restored_at__isnull=True).order_by("high"):
        found.archives.append(archive)
        for ends in archive.chains:
            found.ends[ends["tenant_id"], ends["stripe"]] = (ends["last_seq"], ends["hash"])
            found.events[ends["tenant_id"]] = found.events.get(ends["tenant_id"], 0) + ends["events"]
        if archive.last_at is not None:
            found.last_at = archive.last_at
    return found


def _row(values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(COLUMNS, values, strict=True))
    row["created_at"] = chain.timestamp(row["created_at"])
    return row


def _check_row(row: dict[str, Any], where: str) -> None:
    fields = dict(row, created_at=parse_datetime(row["created_at"]))
    recomputed = chain.content_hash(chain.event_content(SimpleNamespace(**fields)))
    if recomputed != row["content_hash"] or chain.link(row["prev_hash"], row["content_hash"]) != row["hash"]:
        raise ArchiveError(f"{where}: event id {row['id']} (seq {row['seq']}) does not match its hashes")


def _refusal(partition: partitions.Partition, now: datetime, older_than: timedelta) -> str | None:
    """Why ``partition`` may not leave yet (None: it may)."""
    if partition.tail or partition.high is None:
        return f"{partition.name} takes every id from {partition.low:,} on: it is still being written"
    if partitions.ids_given_out() < partition.high:
        return f"{partition.name} is still being written (ids up to {partition.high:,})"
    if partition.last_at is not None and partition.last_at > now - older_than:
        return f"{partition.name}'s newest event ({partition.last_at:%Y-%m-%d %H:%M} UTC) is within the retention"
    with connection.cursor() as cursor:
        terminal = [str(state) for state in TERMINAL_STATES]
        cursor.execute(
            f'SELECT a.id, a.state FROM ledger_attempt a WHERE a.id IN (SELECT attempt_id FROM "{partition.name}") '
            "AND NOT (a.state = ANY(%s)) ORDER BY a.id LIMIT 1",
            [terminal],
        )
        open_attempt = cursor.fetchone()
    if open_attempt is not None:
        return f"{partition.name} holds events of attempt #{open_attempt[0]}, which is not settled ({open_attempt[1]})"
    return None


def _chain_tails(partition: partitions.Partition) -> dict[tuple[int, int], int]:
    """(tenant, stripe) -> the last seq of that chain in the partition."""
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT e.tenant_id, (e.seq - 1) % t.chain_stripes, max(e.seq) FROM "{partition.name}" e '
            "JOIN ledger_tenant t ON t.id = e.tenant_id GROUP BY 1, 2"
        )
        return {(tenant, stripe): last for tenant, stripe, last in cursor.fetchall()}


def _unverified(partition: partitions.Partition) -> str | None:
    """Whether a chain has events in the partition that no walk that held has reached."""
    checks = {check.tenant_id: check for check in ChainCheck.objects.all()}
    stripes = dict(Tenant.objects.values_list("pk", "chain_stripes"))
    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    for (tenant_id, stripe), last in sorted(_chain_tails(partition).items()):
        check = checks.get(tenant_id)
        heads = check.reached_heads if check else []
        reached = {chain.stripe_of_seq(seq, stripes[tenant_id]): seq for seq, _ in heads}
        if check is None or not check.ok or reached.get(stripe, 0) < last:
            return (
                f"{partition.name} holds tenant {slugs[tenant_id]}'s events to seq {last} (chain {stripe}), "
                "which no verify_audit that held has reached: run verify_audit first"
            )
    return None


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _export(partition: partitions.Partition, directory: Path, before: Archived) -> tuple[Path, list[ChainEnds], int]:
    """Write the partition's rows; check each one's hashes and each chain's
    links, the first against where the archive already ends it."""
    stripes = dict(Tenant.objects.values_list("pk", "chain_stripes"))
    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    target = directory / f"{partition.name}.ndjson.gz"
    partial = target.with_suffix(".gz.partial")
    ends: dict[tuple[int, int], ChainEnds] = {}
    count = 0
    last = (0, 0)
    with gzip.open(partial, "wt", encoding="utf-8") as out, connection.cursor() as cursor:
        while True:
            cursor.execute(
                f'SELECT {", ".join(COLUMNS)} FROM "{partition.name}" WHERE (tenant_id, seq) > (%s, %s) '
                "ORDER BY tenant_id, seq LIMIT %s",
                [*last, CHUNK],
            )
            rows = cursor.fetchall()
            if not rows:
                break
            for values in rows:
                row = _row(values)
                if isinstance(row["details"], str):
                    row["details"] = json.loads(row["details"])
                where = f"{partition.name}, tenant {slugs[row['tenant_id']]}"
                _check_row(row, where)
                step = stripes[row["tenant_id"]]
                stripe = chain.stripe_of_seq(row["seq"], step)
                key = (row["tenant_id"], stripe)
                current = ends.get(key)
                if current is None:
                    seq_before, hash_before = before.ends.get(key, (0, chain.GENESIS))
                    expected = seq_before + step if seq_before else stripe + 1
                    if row["seq"] != expected or row["prev_hash"] != hash_before:
                        raise ArchiveError(
                            f"{where} chain {stripe}: seq {row['seq']} does not follow where the archive ends "
                            f"that chain (seq {seq_before}): run verify_audit"
                        )
                    current = ends[key] = ChainEnds(
                        row["tenant_id"], slugs[row["tenant_id"]], stripe, row["seq"], row["prev_hash"]
                    )
                elif row["seq"] != current.last_seq + step or row["prev_hash"] != current.hash:
                    raise ArchiveError(
                        f"{where} chain {stripe}: seq {row['seq']} does not follow seq {current.last_seq}"
                    )
                current.last_seq, current.hash, current.events = row["seq"], row["hash"], current.events + 1
                out.write(json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n")
                count += 1
            last = (rows[-1][1], rows[-1][2])
    _fsync(partial)
    partial.rename(target)
    return target, sorted(ends.values(), key=lambda e: (e.tenant_id, e.stripe)), count


def archive_oldest(
    directory: Path,
    *,
    older_than: timedelta,
    limit: int | None = None,
    archived: Callable[[EventArchive], object] | None = None,
) -> list[EventArchive]:
    """Archive the oldest partitions, one after the other, while each may
    leave (see the module's docstring); stop at the first that may not, and
    say why when none left. ``archived`` is told of each as it is done."""
    if connection.vendor != "postgresql":
        raise ArchiveError("archiving moves partitions of the events out of PostgreSQL; SQLite keeps one table")
    directory.mkdir(parents=True, exist_ok=True)
    done: list[EventArchive] = []
    while limit is None or len(done) < limit:
        oldest = partitions.partitions()[0]
        now = clock.now()
        reason = _refusal(oldest, now, older_than) or _unverified(oldest)
        if reason is not None:
            if not done:
                raise ArchiveError(reason)
            break
        done.append(_archive(oldest, directory, now))
        if archived is not None:
            archived(done[-1])
    return done


def _newest(partition: partitions.Partition) -> datetime | None:
    """The newest time of the partition's events and of their attempts: an
    attempt older than the newest archive may have had every event archived
    (its time and its first event's are taken a moment apart, and the
    highest id is not always the newest time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT greatest((SELECT max(created_at) FROM "{partition.name}"), (SELECT max(a.created_at) '
            f'FROM ledger_attempt a WHERE a.id IN (SELECT attempt_id FROM "{partition.name}")))'
        )
        (newest,) = cursor.fetchone()
    return newest


def _read_back(target: Path, count: int) -> str:
    """The file as a restore will read it, from the disk: every line parsed,
    counted against what was written; its SHA-256."""
    read = 0
    with gzip.open(target, "rt", encoding="utf-8") as handle:
        for line in handle:
            json.loads(line)
            read += 1
    if read != count:
        raise ArchiveError(f"{target} holds {read} events read back, {count} were written: nothing left")
    return _sha256(target)


def _archive(partition: partitions.Partition, directory: Path, now: datetime) -> EventArchive:
    target, ends, count = _export(partition, directory, archived())
    digest = _read_back(target, count)
    newest = _newest(partition)
    manifest = {
        "format": FORMAT,
        "partition": partition.name,
        "low": partition.low,
        "high": partition.high,
        "file": target.name,
        "sha256": digest,
        "events": count,
        "first_at": partition.first_at and chain.timestamp(partition.first_at),
        "last_at": newest and chain.timestamp(newest),
        "archived_at": chain.timestamp(now),
        "chains": [e.as_dict() for e in ends],
    }
    manifest_path = directory / f"{partition.name}.json"
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    _fsync(manifest_path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert partition.high is not None
    with transaction.atomic(), connection.cursor() as cursor:
        # Detaching waits for every reader of the events, and every reader
        # then waits for it: give up after a while rather than hold them all.
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        # A write still on its way to the partition ends before the count.
        cursor.execute(f'LOCK TABLE "{partition.name}" IN SHARE MODE')
        cursor.execute(f'SELECT count(*) FROM "{partition.name}"')
        (still,) = cursor.fetchone()
        if still != count:
            raise ArchiveError(f"{partition.name} holds {still} events now, {count} when it was written: nothing left")
        cursor.execute(
            f'SELECT DISTINCT actor_user_id FROM "{partition.name}" WHERE actor_user_id IS NOT NULL ORDER BY 1'
        )
        people = [user_id for (user_id,) in cursor.fetchall()]
        record = EventArchive.objects.create(
            people=people,
            name=partition.name,
            low=partition.low,
            high=partition.high,
            file=target.name,
            sha256=digest,
            events=count,
            first_at=partition.first_at,
            last_at=newest,
            chains=manifest["chains"],
            archived_at=now,
        )
        cursor.execute(f"ALTER TABLE {partitions.PARENT} DETACH PARTITION {partition.name}")
        cursor.execute(f"DROP TABLE {partition.name}")
    return record


def keeps_person(user: Any) -> str | None:
    """Why ``user`` may not be deleted (None: nothing archived names them): an archive waiting to be
    restored holds events that name them, and the database would refuse those events without them."""
    waiting = EventArchive.objects.filter(restored_at__isnull=True)
    joined = getattr(user, "date_joined", None)
    holding = [
        archive.file
        for archive in waiting
        if (archive.people is not None and user.pk in archive.people)
        # Archived before the people were kept: anyone who could have acted in it.
        or (archive.people is None and (joined is None or archive.last_at is None or joined <= archive.last_at))
    ]
    if not holding:
        return None
    return (
        f"{user} acted in events archived to {', '.join(holding)}: those events name them (and their hashes "
        "cover it), so the archive could not be restored without them. Deactivate the account instead "
        "(Active: off)"
    )


def _refuse_deleting_archived_people(sender: Any, instance: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql":
        return  # archives are PostgreSQL's
    reason = keeps_person(instance)
    if reason is not None:
        raise ProtectedError(reason, {instance})


def read_manifest(directory: Path, archive: EventArchive, *, digest: bool = True) -> dict[str, Any]:
    """The archive's manifest, checked against its row in the database and (``digest``) its file's
    digest."""
    path = directory / f"{archive.name}.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArchiveError(f"{archive.name}: no {path.name} in {directory}") from None
    except json.JSONDecodeError as exc:
        raise ArchiveError(f"{path}: not JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise ArchiveError(f"{path}: not an archive of ledger events ({manifest.get('format')!r})")
    data = directory / archive.file
    if not data.exists():
        raise ArchiveError(f"{archive.name}: no {archive.file} in {directory}")
    if digest:
        _digest_is(_sha256(data), archive)
    if manifest.get("sha256") != archive.sha256:
        raise ArchiveError(f"{path}: names another SHA-256 than the ledger recorded when it archived it")
    if manifest.get("chains") != archive.chains or manifest.get("events") != archive.events:
        raise ArchiveError(f"{path}: its chains or counts differ from what the ledger recorded when it archived it")
    return manifest


def _digest_is(digest: str, archive: EventArchive) -> None:
    if digest != archive.sha256:
        raise ArchiveError(
            f"{archive.file}: its SHA-256 is {digest[:16]}…, the ledger recorded {archive.sha256[:16]}… "
            "when it archived it: the file was changed or replaced"
        )


class _Hashing(io.RawIOBase):
    """A file read once, front to back, hashing every byte it hands on."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        self.sha256.update(data)
        buffer[: len(data)] = data
        return len(data)


def hashed_rows(directory: Path, archive: EventArchive) -> Iterator[dict[str, Any]]:
    """The archive's events as :func:`rows` gives them, from one reading of its file whose bytes are
    hashed as they are read: once the last row is given, the digest of exactly those bytes is held to
    what the ledger recorded (:class:`ArchiveError` if it differs), so a file changed after a check
    cannot be what is loaded."""
    with open(directory / archive.file, "rb") as raw:
        hashing = _Hashing(raw)
        with gzip.open(io.BufferedReader(hashing), "rt", encoding="utf-8") as handle:
            yield from _parsed(handle)
        while hashing.read(1 << 20):
            pass  # whatever follows the compressed stream is part of the file too
    _digest_is(hashing.sha256.hexdigest(), archive)


def rows(directory: Path, archive: EventArchive) -> Iterator[dict[str, Any]]:
    """The archive's events in its file's order ((tenant, seq)), each as the
    fields a walk reads (``created_at`` a datetime again)."""
    with gzip.open(directory / archive.file, "rt", encoding="utf-8") as handle:
        yield from _parsed(handle)


def _parsed(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Each line of an archive file as the fields a walk reads (``created_at`` a datetime again)."""
    for line in lines:
        row = json.loads(line)
        row["created_at"] = parse_datetime(row["created_at"])
        yield row


class Reader:
    """The archived events of one tenant after another (ascending ids), from
    every archive file at once: each file is read once, front to back."""

    def __init__(self, directory: Path, found: Archived) -> None:
        self.directory = directory
        self.archives = found.archives
        for archive in self.archives:
            read_manifest(directory, archive)
        self._streams = [rows(directory, archive) for archive in self.archives]
        self._next: list[dict[str, Any] | None] = [next(stream, None) for stream in self._streams]
        self._last_tenant = 0

    def of(self, tenant_id: int) -> Iterator[dict[str, Any]]:
        """This tenant's archived events, archive by archive (so, per chain, in seq order)."""
        if tenant_id < self._last_tenant:
            raise ValueError("tenants are read in ascending id order")
        self._last_tenant = tenant_id
        for index, stream in enumerate(self._streams):
            row = self._next[index]
            while row is not None and row["tenant_id"] < tenant_id:
                row = next(stream, None)
            while row is not None and row["tenant_id"] == tenant_id:
                yield {name: value for name, value in row.items() if name != "tenant_id"}
                row = next(stream, None)
            self._next[index] = row


def restore(directory: Path, name: str) -> EventArchive:
    """Put an archived partition back into the database from its files: the
    partition is made again for its range, its rows loaded and checked
    against the archive's digest and chains, then attached. Run as the
    owner. The chains are whole again in the database; the archive's row
    stays, marked restored."""
    if connection.vendor != "postgresql":
        raise ArchiveError("archives are restored into PostgreSQL")
    waiting = archived().archives
    archive = next((a for a in waiting if a.name == name), None)
    if archive is None:
        raise ArchiveError(f"no archived partition {name} waits to be restored")
    if archive is not waiting[-1]:
        # The archive stays the oldest part of every chain (what the walks rely on).
        raise ArchiveError(f"restore {waiting[-1].name} first: the newest archive comes back first")
    # The file's digest is checked on the very bytes loaded (hashed_rows), not on an earlier reading.
    read_manifest(directory, archive, digest=False)
    low = "MINVALUE" if archive.low is None else str(archive.low)
    loading = f"{name}_restoring"
    columns = ", ".join(COLUMNS)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"CREATE TABLE {loading} (LIKE {partitions.PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        count = 0
        with cursor.cursor.copy(f"COPY {loading} ({columns}) FROM STDIN") as copy:
            for row in hashed_rows(directory, archive):
                _check_row(dict(row, created_at=chain.timestamp(row["created_at"])), name)
                copy.write_row([json.dumps(row[c]) if c == "details" else row[c] for c in COLUMNS])
                count += 1
        if count != archive.events:
            raise ArchiveError(f"{archive.file} holds {count} events; the ledger archived {archive.events}")
        high = archive.high
        bounds = f"id < {high}" if archive.low is None else f"id >= {archive.low} AND id < {high}"
        cursor.execute(f"ALTER TABLE {loading} ADD CONSTRAINT {loading}_bound CHECK ({bounds})")
        cursor.execute(f"ALTER TABLE {loading} RENAME TO {name}")
        for statement in partitions.own_statements(name):
            cursor.execute(statement)
        cursor.execute(f"ALTER TABLE {partitions.PARENT} ATTACH PARTITION {name} FOR VALUES FROM ({low}) TO ({high})")
        cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {loading}_bound")
        archive.restored_at = clock.now()
        archive.save(update_fields=["restored_at"])
    return archive


pre_delete.connect(_refuse_deleting_archived_people, sender=settings.AUTH_USER_MODEL, dispatch_uid="archived-people")

"""Verifying the event chains: is every tenant's log complete and unmodified?

A walk reads a tenant's events in seq order (keyset chunks on the
(tenant, seq) index, values rather than model instances) and checks, for
each one:

- its seq is the next one (1, 2, 3, …): a gap means events are **missing**;
- its content hash, recomputed from its fields, is the stored one, and its
  hash is ``link(prev_hash, content_hash)``: otherwise it was **edited**;
- its ``prev_hash`` is the hash of the event before it: otherwise it was
  **reordered** (the event it follows sits elsewhere in the chain) or the
  event it follows is **missing** (no event has that hash any more);

then that the tenant's :class:`ChainHead` is where the walk ended (**head
mismatch**: e.g. the newest events were removed) and that every attempt of
the tenant has at least one event (**attempt without events**). The first
break is reported with the event named; the walk stops there.

What a walk alone cannot see: someone with write access who rewrites an
event *and* recomputes every hash after it *and* moves the head, or who
removes the newest events (or truncates the table) *and* moves the head
back. That is what heads kept elsewhere are for. Each :class:`KnownHead`
(one from an export's trailer, ``backup_ledger``'s output, or a
``--known-head`` argument, and the furthest head an earlier walk verified,
kept in :class:`ChainCheck`) must still be on the chain: the event at its
seq must carry its hash (else the history up to it was **rewritten**), and
the chain must reach it (else its **tail was lost**). The ``export`` events
in the chain record heads too, but they sit after the head they name, so
whoever cuts the tail removes them with it: only a head kept outside the
chain (or an earlier walk's) can tell the chain was longer.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef
from django.utils import timezone

from ledgerdash.ledger import archive as archives
from ledgerdash.ledger import chain
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainCheck, ChainHead, Tenant
from ledgerdash.ledger.queries import events_by_seq

CHUNK = 5000
#: How far before the last walk an incremental walk looks for attempts without events.
INCREMENTAL_OVERLAP = timedelta(hours=1)

EDITED = "edited"
MISSING = "missing"
REORDERED = "reordered"
HEAD_MISMATCH = "head mismatch"
NO_EVENTS = "attempt without events"
REWRITTEN = "rewritten"
TAIL_LOST = "tail lost"
BEHIND_ARCHIVE = "behind the archive"

#: What a walk reads of each event of one tenant (an archive's file keeps the same, with the tenant).
_FIELDS = tuple(name for name in archives.COLUMNS if name != "tenant_id")


@dataclass(frozen=True)
class Break:
    problem: str
    message: str
    seq: int | None = None
    event_id: int | None = None


@dataclass(frozen=True)
class KnownHead:
    """A head of a tenant's chain seen earlier, and where it was seen."""

    seq: int
    hash: str
    source: str


@dataclass
class ChainResult:
    tenant: Tenant
    events: int
    #: The furthest seq the walk verified (over all of the tenant's chains).
    verified_seq: int
    #: The newest head (over all of the tenant's chains).
    head_seq: int
    head_hash: str
    checked_at: datetime
    duration_ms: int
    broken: Break | None = None
    #: Where each chain's walk ended, ``(seq, hash)``, for the chains with events.
    reached: tuple[tuple[int, str], ...] = ()
    #: An incremental walk's events read (those after the heads it started from); None: a full walk.
    walked: int | None = None
    #: Archived events counted, not read (the walk started where the archive ends the chains).
    archived: int = 0

    @property
    def ok(self) -> bool:
        return self.broken is None

    def describe(self) -> str:
        if self.broken is None:
            chains = f" in {self.tenant.chain_stripes} chains" if self.tenant.chain_stripes > 1 else ""
            newest = "newest head" if chains else "head"
            since = "" if self.walked is None else f" ({self.walked} new since the last walk)"
            if self.archived:
                since += f" ({self.archived} archived, not read: --archive DIR reads them)"
            return (
                f"{self.tenant.slug}: ok, {self.events} events{chains}, {newest} seq {self.head_seq} "
                f"{self.head_hash[:16]}…{since}"
            )
        return f"{self.tenant.slug}: BROKEN ({self.broken.problem}) {self.broken.message}"


def _events(tenant_id: int, after: int = 0) -> Iterator[dict[str, Any]]:
    return events_by_seq(AttemptEvent.objects.filter(tenant_id=tenant_id), _FIELDS, chunk=CHUNK, after=after)


def _name(tenant: Tenant, row: Mapping[str, Any]) -> str:
    return f"tenant {tenant.slug} seq {row['seq']} (event id {row['id']})"


def _chain(tenant: Tenant, stripe: int) -> str:
    """How a message names one of the tenant's chains: the chain, when it has one."""
    return f"tenant {tenant.slug}" if tenant.chain_stripes == 1 else f"tenant {tenant.slug} chain {stripe}"


def _seqs(first: int, last: int, step: int) -> str:
    return f"seq {first}" if first == last else f"seq {first} to {last}" + (f" (every {step})" if step > 1 else "")


def _unlinked(tenant: Tenant, row: dict[str, Any], expected_seq: int) -> Break:
    """``row`` does not follow the event before it in its chain: say whether
    its predecessor moved (reordered) or is gone (missing)."""
    name = _name(tenant, row)
    step = tenant.chain_stripes
    if row["seq"] > expected_seq:
        gap = _seqs(expected_seq, row["seq"] - step, step)
        return Break(MISSING, f"{gap} missing before {name}", row["seq"], row["id"])
    moved = (
        AttemptEvent.objects.filter(tenant_id=tenant.pk, hash=row["prev_hash"]).values_list("seq", "id").first()
        if row["prev_hash"] != chain.GENESIS
        else (0, None)
    )
    if moved is None:
        return Break(
            MISSING,
            f"the event {name} follows (hash {row['prev_hash'][:16]}…) is not in the chain any more",
            row["seq"],
            row["id"],
        )
    where = "the start of the chain" if moved[0] == 0 else f"seq {moved[0]} (event id {moved[1]})"
    return Break(
        REORDERED,
        f"{name} was written after {where}, but sits at seq {row['seq']}",
        row["seq"],
        row["id"],
    )


def _kept_head_problem(tenant: Tenant, known: Iterable[KnownHead], reached: dict[int, int]) -> Break | None:
    """A known head beyond where its chain's walk ended (``reached``: the
    last verified seq of each chain, 0 for none)."""
    step = tenant.chain_stripes
    beyond = [k for k in known if k.seq > reached[chain.stripe_of_seq(k.seq, step)]]
    if not beyond:
        return None
    furthest = max(beyond, key=lambda k: k.seq)
    stripe = chain.stripe_of_seq(furthest.seq, step)
    end = reached[stripe]
    first_lost = end + step if end else stripe + 1
    return Break(
        TAIL_LOST,
        f"{_chain(tenant, stripe)}: the chain ends at seq {end}, but {furthest.source} saw it reach seq "
        f"{furthest.seq} ({furthest.hash[:16]}…): {_seqs(first_lost, furthest.seq, step)} were removed",
        first_lost,
    )


def _head_problem(
    tenant: Tenant, heads: dict[int, tuple[int, str]], reached: dict[int, int], prev: dict[int, str]
) -> Break | None:
    """A chain whose head is not where its walk ended (or a head of a chain
    the tenant does not keep)."""
    step = tenant.chain_stripes
    for stripe in sorted(set(heads) | set(reached)):
        head_seq, head_hash = heads.get(stripe, (0, chain.GENESIS))
        if stripe not in reached:
            if head_seq == 0:
                continue
            return Break(
                HEAD_MISMATCH,
                f"tenant {tenant.slug}: a head at seq {head_seq} for chain {stripe}, but the tenant keeps "
                f"{step} chain{'s' if step > 1 else ''}",
                head_seq,
            )
        end, last_hash = reached[stripe], prev[stripe]
        if end == head_seq and last_hash == head_hash:
            continue
        if end < head_seq:
            first = end + step if end else stripe + 1
            message = f"{_chain(tenant, stripe)}: the chain ends at seq {end} but its head says {head_seq}"
            return Break(HEAD_MISMATCH, message + f" (seq {first} onwards missing)", first)
        return Break(
            HEAD_MISMATCH,
            f"{_chain(tenant, stripe)}: the head (seq {head_seq}, {head_hash[:16]}…) is not the last event "
            f"(seq {end}, {last_hash[:16]}…)",
            end,
        )
    return None


def _rewritten(tenant: Tenant, row: Mapping[str, Any], kept: KnownHead) -> Break:
    """The event ``row`` (id, seq, hash) sits where ``kept`` saw another."""
    return Break(
        REWRITTEN,
        f"{_name(tenant, row)} is not the head {kept.source} saw at seq {kept.seq} "
        f"({kept.hash[:16]}…, now {row['hash'][:16]}…): the history up to it was rewritten",
        row["seq"],
        row["id"],
    )


def _start_problem(tenant: Tenant, since: list[KnownHead]) -> Break | None:
    """Whether each of these heads (those an incremental walk starts from,
    and the kept heads behind them, which it will not read) is still the
    event at its seq, with its hash."""
    found = {
        row["seq"]: row
        for row in AttemptEvent.objects.filter(tenant_id=tenant.pk, seq__in=[k.seq for k in since]).values(
            "id", "seq", "hash"
        )
    }
    for kept in since:
        row = found.get(kept.seq)
        if row is None:
            return Break(
                TAIL_LOST,
                f"tenant {tenant.slug}: seq {kept.seq}, where {kept.source} saw the chain ({kept.hash[:16]}…), is gone",
                kept.seq,
            )
        if row["hash"] != kept.hash:
            return _rewritten(tenant, row, kept)
    return None


@dataclass(frozen=True)
class ArchivedPart:
    """The part of a tenant's chains that was archived (a prefix of each)."""

    #: stripe -> (seq, hash) of the chain's last archived event.
    ends: dict[int, tuple[int, str]]
    events: int
    #: The newest archived event's time (any tenant's): an attempt older than
    #: it may have had every event archived.
    before: datetime | None
    #: The archived events themselves, read from the files, to walk before
    #: the live ones; None: start each chain where the archive ends it.
    rows: Iterable[dict[str, Any]] | None = None


def _behind_archive(tenant: Tenant, ends: dict[int, tuple[int, str]]) -> Break | None:
    """A live event at a seq its chain's archived part holds: the archive is
    a prefix of each chain, so no event in the database may sit at or before
    where it ends (one written there would not be read by a walk that
    starts at that end)."""
    step = tenant.chain_stripes
    furthest = max(end for end, _ in ends.values())
    for row in AttemptEvent.objects.filter(tenant_id=tenant.pk, seq__lte=furthest).order_by("seq").values("id", "seq"):
        stripe = chain.stripe_of_seq(row["seq"], step)
        end = ends.get(stripe, (0, ""))[0]
        if row["seq"] <= end:
            return Break(
                BEHIND_ARCHIVE,
                f"{_name(tenant, row)} is in the database, but the archive holds {_chain(tenant, stripe)} "
                f"up to seq {end}",
                row["seq"],
                row["id"],
            )
    return None


def verify_tenant(
    tenant: Tenant,
    known: Iterable[KnownHead] = (),
    *,
    since: Iterable[KnownHead] = (),
    archive: ArchivedPart | None = None,
    attempts_since: datetime | None = None,
) -> ChainResult:
    """Walk the tenant's events in seq order, each against the one before it
    in its own chain (a tenant with several keeps them interleaved by seq:
    see :mod:`ledgerdash.ledger.chain`).

    ``since``: the heads an earlier walk verified, at most one per chain (an
    incremental walk). Each must still be the event at its seq, as must the
    ``known`` heads behind them; the walk then reads only the events
    appended after them (the events it reads follow what was added since,
    not the ledger's size; so does the check for attempts without events,
    given ``attempts_since``: it looks only at attempts recorded from then
    on). It does not read the events before those heads again: an edit
    there is the full walk's to find, as is an older attempt whose events
    were all removed (that also leaves its chain short of the seqs they
    had, which is the full walk's to see). A chain that had
    no events at the last walk is read from its start.

    ``archive``: the part of the chains archived out of the database. With
    its rows, they are walked first, and each chain must pass through where
    the archive recorded it ending; without, each chain starts there (as an
    incremental walk starts from a head: heads kept from before it cannot be
    checked), and the archived events are counted, not read."""
    started = time.monotonic()
    since = list(since)
    known = list(known)
    step = tenant.chain_stripes
    starts: dict[int, tuple[int, str]] = {}
    if archive is not None and archive.rows is not None:
        since = []  # a walk through the archive is a full walk
        known += [KnownHead(seq, digest, "the archive of the events") for seq, digest in archive.ends.values()]
    elif archive is not None and archive.ends:
        ends = archive.ends
        since = [k for k in since if k.seq > ends.get(chain.stripe_of_seq(k.seq, step), (0, ""))[0]]
        known = [k for k in known if k.seq > ends.get(chain.stripe_of_seq(k.seq, step), (0, ""))[0]]
        starts = dict(ends)  # a head in ``since`` goes further
    kept_at: dict[int, list[KnownHead]] = {}
    for head_kept in known:
        kept_at.setdefault(head_kept.seq, []).append(head_kept)
    heads = {h.stripe: (h.seq, h.hash) for h in ChainHead.objects.filter(tenant_id=tenant.pk)}
    # Per chain: the seq its next event must have, and that event's prev_hash.
    expected = {stripe: stripe + 1 for stripe in range(step)}
    prev = dict.fromkeys(range(step), chain.GENESIS)
    for stripe, (seq, digest) in starts.items():
        expected[stripe], prev[stripe] = seq + step, digest
    for kept in since:
        stripe = chain.stripe_of_seq(kept.seq, step)
        expected[stripe], prev[stripe] = kept.seq + step, kept.hash
    before = {stripe: _events_up_to(stripe, expected[stripe] - step, step) for stripe in range(step)}
    count = 0
    behind = [k for k in known if k.seq < expected[chain.stripe_of_seq(k.seq, step)] and k not in since]
    broken = _start_problem(tenant, since + behind) if since or behind else None
    if broken is None and archive is not None and archive.ends:
        broken = _behind_archive(tenant, archive.ends)
    started_from = broken is None
    rows: Iterable[dict[str, Any]] = iter(())
    if started_from:
        rows = _events(tenant.pk, after=min(expected.values()) - step)
        if archive is not None and archive.rows is not None:
            rows = itertools.chain(archive.rows, rows)
    for row in rows:
        stripe = chain.stripe_of_seq(row["seq"], step)
        if row["seq"] < expected[stripe]:
            continue  # verified before, behind this chain's starting head
        fields = SimpleNamespace(tenant_id=tenant.pk, **row)
        recomputed = chain.content_hash(chain.event_content(fields))
        if recomputed != row["content_hash"] or chain.link(row["prev_hash"], row["content_hash"]) != row["hash"]:
            what = "its fields" if recomputed != row["content_hash"] else "its hashes"
            broken = Break(EDITED, f"{_name(tenant, row)} was edited: {what} no longer match", row["seq"], row["id"])
            break
        if row["seq"] != expected[stripe] or row["prev_hash"] != prev[stripe]:
            broken = _unlinked(tenant, row, expected[stripe])
            break
        belongs = chain.stripe_of(row["attempt_id"], step)
        if belongs != stripe:
            broken = Break(
                REORDERED,
                f"{_name(tenant, row)} sits in chain {stripe}, but its attempt's events belong to chain {belongs}",
                row["seq"],
                row["id"],
            )
            break
        other = next((k for k in kept_at.get(row["seq"], ()) if k.hash != row["hash"]), None)
        if other is not None:
            broken = _rewritten(tenant, row, other)
            break
        prev[stripe], expected[stripe], count = row["hash"], row["seq"] + step, count + 1
    # Where each chain's walk ended: the seq before the one it expected next (0: no events).
    reached = {stripe: max(expected[stripe] - step, 0) if started_from else 0 for stripe in range(step)}
    if broken is None:
        broken = _head_problem(tenant, heads, reached, prev)
    if broken is None:
        broken = _kept_head_problem(tenant, known, reached)
    if broken is None:
        attempts = Attempt.objects.filter(tenant_id=tenant.pk)
        if archive is not None and archive.before is not None:
            attempts = attempts.filter(created_at__gt=archive.before)  # older ones' events may be archived
        if attempts_since is not None:
            attempts = attempts.filter(created_at__gte=attempts_since)
        silent = (
            attempts.filter(~Exists(AttemptEvent.objects.filter(attempt_id=OuterRef("pk"))))
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        if silent is not None:
            broken = Break(NO_EVENTS, f"tenant {tenant.slug}: attempt #{silent} has no events (they were removed)")
    head_seq, head_hash = max(heads.values(), default=(0, chain.GENESIS))
    return ChainResult(
        tenant=tenant,
        events=count + sum(before.values()),
        walked=count if since else None,
        archived=archive.events if archive is not None and archive.rows is None else 0,
        verified_seq=max(reached.values()),
        head_seq=head_seq,
        head_hash=head_hash,
        checked_at=timezone.now(),
        duration_ms=int((time.monotonic() - started) * 1000),
        broken=broken,
        reached=tuple((reached[stripe], prev[stripe]) for stripe in range(step) if reached[stripe]),
    )


def _events_up_to(stripe: int, seq: int, step: int) -> int:
    """How many events chain ``stripe`` holds up to ``seq``, one of its own
    (its seqs are stripe + 1, then every ``step``); 0 before its first."""
    return (seq - stripe - 1) // step + 1 if seq > stripe else 0


def verify(
    tenants: Iterable[Tenant] | None = None,
    *,
    save: bool = True,
    known: dict[str, list[KnownHead]] | None = None,
    incremental: bool = False,
    archive_dir: Path | None = None,
    walked: Callable[[ChainResult], object] | None = None,
) -> list[ChainResult]:
    """Walk each tenant's chains (all tenants by default) against the heads
    ``known`` by tenant slug and the furthest heads an earlier walk verified;
    with ``save``, keep each result as the tenant's :class:`ChainCheck` for
    the dashboard. ``incremental``: start each walk from those furthest
    heads (see :func:`verify_tenant`); a tenant never walked is walked whole.
    Where partitions of the events were archived, each chain starts where
    the archive ends it; ``archive_dir``: read the archive's files there and
    walk them first (:mod:`ledgerdash.ledger.archive`). ``walked`` is told of
    each tenant's result as its walk ends (a progress bar counts them)."""
    chosen = list(tenants if tenants is not None else Tenant.objects.order_by("slug"))
    found = archives.archived() if connection.vendor == "postgresql" else archives.Archived()
    reader = archives.Reader(archive_dir, found) if archive_dir is not None else None
    checks = list(ChainCheck.objects.filter(tenant__in=chosen, reached_at__isnull=False))
    earlier = {
        check.tenant_id: [
            KnownHead(seq, digest, f"the verify_audit of {check.reached_at:%Y-%m-%d %H:%M:%S} UTC")
            for seq, digest in check.reached_heads
        ]
        for check in checks
    }
    # An incremental walk checks the attempts recorded since the last walk
    # that held, and those of the hour before it: an attempt's time is taken
    # before its transaction commits, which no statement timeout lets last that long.
    walked_at = {check.tenant_id: check.reached_at - INCREMENTAL_OVERLAP for check in checks if check.reached_at}
    by_tenant: dict[int, ChainResult] = {}
    # The archive's files are read once, front to back: tenant by tenant, by id.
    for tenant in sorted(chosen, key=lambda t: t.pk):
        kept = list((known or {}).get(tenant.slug, ()))
        kept += earlier.get(tenant.pk, [])
        since = earlier.get(tenant.pk, []) if incremental else []
        part = None
        if found.archives:
            part = ArchivedPart(
                ends=found.of(tenant.pk),
                events=found.events.get(tenant.pk, 0),
                before=found.last_at,
                rows=reader.of(tenant.pk) if reader is not None else None,
            )
        by_tenant[tenant.pk] = verify_tenant(
            tenant,
            kept,
            since=since,
            archive=part,
            attempts_since=walked_at.get(tenant.pk) if incremental else None,
        )
        if walked is not None:
            walked(by_tenant[tenant.pk])
    results = [by_tenant[tenant.pk] for tenant in chosen]
    if save:
        for result in results:
            record_check(result)
    return results


def record_check(result: ChainResult) -> None:
    broken = result.broken
    ChainCheck.objects.update_or_create(
        tenant=result.tenant,
        defaults={
            "checked_at": result.checked_at,
            "ok": result.ok,
            "verified_seq": result.verified_seq,
            "events": result.events,
            "problem": broken.problem if broken else "",
            "break_seq": broken.seq if broken else None,
            "break_event_id": broken.event_id if broken else None,
            "message": broken.message if broken else "",
            "duration_ms": result.duration_ms,
            # Only a chain that verified moves the furthest heads seen: a
            # broken walk must not forget how far the chains once reached.
            **(
                {"reached_heads": [list(end) for end in result.reached], "reached_at": result.checked_at}
                if result.ok and result.reached
                else {}
            ),
        },
    )


# --- heads kept elsewhere ---------------------------------------------------------------------

_HEX64 = re.compile(r"[0-9a-f]{64}")
#: ``backup_ledger``'s lines: "  acme: chain head at backup time seq 12 <hash>"
_BACKUP_LINE = re.compile(r"^\s*(?P<tenant>\S+): chain head at backup time seq (?P<seq>\d+) (?P<hash>[0-9a-f]{64})\s*$")


class KnownHeadError(ValueError):
    pass


def parse_known_head(text: str, source: str = "--known-head") -> tuple[str, KnownHead]:
    """``TENANT:SEQ:HASH`` as a (tenant slug, head) pair."""
    try:
        tenant, seq, digest = text.strip().rsplit(":", 2)
        number = int(seq)
    except ValueError:
        raise KnownHeadError(f"{text!r} is not TENANT:SEQ:HASH") from None
    if not tenant or number < 1 or not _HEX64.fullmatch(digest):
        raise KnownHeadError(f"{text!r} is not TENANT:SEQ:HASH (seq from 1, a sha256 in lower-case hex)")
    return tenant, KnownHead(number, digest, f"{source} ({tenant}:{number})")


def read_known_heads(path: Path) -> list[tuple[str, KnownHead]]:
    """The heads a file names: an export's ``head`` rows (CSV or NDJSON),
    ``backup_ledger``'s output, or lines of ``TENANT:SEQ:HASH``."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KnownHeadError(f"cannot read {source}: {exc}") from None
    heads: list[tuple[str, KnownHead]] = []
    if text.startswith("record,"):
        for row in csv.DictReader(io.StringIO(text, newline="")):
            # Undo the export's formula neutralization (one leading quote).
            cells = {k: (v[1:] if v and v.startswith("'") else v) for k, v in row.items()}
            if cells.get("record") == "head" and cells["event_seq"] != "0":  # 0: a chain without events
                heads.append(parse_known_head(f"{cells['tenant']}:{cells['event_seq']}:{cells['hash']}", source))
    elif text.startswith("{"):
        for line in text.splitlines():
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    raise KnownHeadError(f"{source}: a line is not JSON") from None
                if row.get("record") == "head" and row["event_seq"] != 0:
                    heads.append(parse_known_head(f"{row['tenant']}:{row['event_seq']}:{row['hash']}", source))
    else:
        for line in text.splitlines():
            match = _BACKUP_LINE.match(line)
            if match:
                heads.append(parse_known_head(f"{match['tenant']}:{match['seq']}:{match['hash']}", source))
            elif line.count(":") >= 2 and _HEX64.search(line):
                heads.append(parse_known_head(line, source))
    if not heads:
        raise KnownHeadError(
            f"{source} names no chain head (an export, backup_ledger's output, or TENANT:SEQ:HASH lines)"
        )
    return heads

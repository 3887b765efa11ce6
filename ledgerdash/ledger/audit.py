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

What a walk cannot see: someone with write access who rewrites an event
*and* recomputes every hash after it *and* moves the head. That is what
exported heads are for: an auditor who kept an earlier head (it is in every
export's trailer) finds it no longer on the chain.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from django.db.models import Exists, OuterRef
from django.utils import timezone

from ledgerdash.ledger import chain
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainCheck, ChainHead, Tenant
from ledgerdash.ledger.queries import events_by_seq

CHUNK = 5000

EDITED = "edited"
MISSING = "missing"
REORDERED = "reordered"
HEAD_MISMATCH = "head mismatch"
NO_EVENTS = "attempt without events"

_FIELDS = ("id", "seq", *(f for f in chain.HASHED_FIELDS if f != "tenant_id"), "content_hash", "prev_hash", "hash")


@dataclass(frozen=True)
class Break:
    problem: str
    message: str
    seq: int | None = None
    event_id: int | None = None


@dataclass
class ChainResult:
    tenant: Tenant
    events: int
    verified_seq: int
    head_seq: int
    head_hash: str
    checked_at: datetime
    duration_ms: int
    broken: Break | None = None

    @property
    def ok(self) -> bool:
        return self.broken is None

    def describe(self) -> str:
        if self.broken is None:
            return f"{self.tenant.slug}: ok, {self.events} events, head seq {self.head_seq} {self.head_hash[:16]}…"
        return f"{self.tenant.slug}: BROKEN ({self.broken.problem}) {self.broken.message}"


def _events(tenant_id: int) -> Iterator[dict[str, Any]]:
    return events_by_seq(AttemptEvent.objects.filter(tenant_id=tenant_id), _FIELDS, chunk=CHUNK)


def _name(tenant: Tenant, row: dict[str, Any]) -> str:
    return f"tenant {tenant.slug} seq {row['seq']} (event id {row['id']})"


def _unlinked(tenant: Tenant, row: dict[str, Any], expected_seq: int) -> Break:
    """``row`` does not follow the event before it: say whether its
    predecessor moved (reordered) or is gone (missing)."""
    name = _name(tenant, row)
    if row["seq"] > expected_seq:
        gap = f"seq {expected_seq}" if row["seq"] == expected_seq + 1 else f"seq {expected_seq} to {row['seq'] - 1}"
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


def verify_tenant(tenant: Tenant) -> ChainResult:
    started = time.monotonic()
    head = ChainHead.objects.filter(tenant_id=tenant.pk).first()
    head_seq, head_hash = (head.seq, head.hash) if head else (0, chain.GENESIS)
    expected_seq, prev, count = 1, chain.GENESIS, 0
    broken: Break | None = None
    for row in _events(tenant.pk):
        fields = SimpleNamespace(tenant_id=tenant.pk, **row)
        recomputed = chain.content_hash(chain.event_content(fields))
        if recomputed != row["content_hash"] or chain.link(row["prev_hash"], row["content_hash"]) != row["hash"]:
            what = "its fields" if recomputed != row["content_hash"] else "its hashes"
            broken = Break(EDITED, f"{_name(tenant, row)} was edited: {what} no longer match", row["seq"], row["id"])
            break
        if row["seq"] != expected_seq or row["prev_hash"] != prev:
            broken = _unlinked(tenant, row, expected_seq)
            break
        prev, expected_seq, count = row["hash"], expected_seq + 1, count + 1
    verified_seq = expected_seq - 1
    if broken is None and (verified_seq != head_seq or prev != head_hash):
        if verified_seq < head_seq:
            message = f"tenant {tenant.slug}: the chain ends at seq {verified_seq} but its head says {head_seq}"
            broken = Break(HEAD_MISMATCH, message + f" (seq {verified_seq + 1} onwards missing)", verified_seq + 1)
        else:
            broken = Break(
                HEAD_MISMATCH,
                f"tenant {tenant.slug}: the head (seq {head_seq}, {head_hash[:16]}…) is not the last event "
                f"(seq {verified_seq}, {prev[:16]}…)",
                verified_seq,
            )
    if broken is None:
        silent = (
            Attempt.objects.filter(tenant_id=tenant.pk)
            .filter(~Exists(AttemptEvent.objects.filter(attempt_id=OuterRef("pk"))))
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        if silent is not None:
            broken = Break(NO_EVENTS, f"tenant {tenant.slug}: attempt #{silent} has no events (they were removed)")
    return ChainResult(
        tenant=tenant,
        events=count,
        verified_seq=verified_seq,
        head_seq=head_seq,
        head_hash=head_hash,
        checked_at=timezone.now(),
        duration_ms=int((time.monotonic() - started) * 1000),
        broken=broken,
    )


def verify(tenants: Iterable[Tenant] | None = None, *, save: bool = True) -> list[ChainResult]:
    """Walk each tenant's chain (all tenants by default); with ``save``,
    keep each result as the tenant's :class:`ChainCheck` for the dashboard."""
    results = [verify_tenant(t) for t in (tenants if tenants is not None else Tenant.objects.order_by("slug"))]
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
        },
    )

"""Appending events to their tenants' hash chains, in the caller's
transaction: one statement for a single event on PostgreSQL
(:mod:`.statements`), else each chain head locked and moved by the ORM."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from ledgerdash.ledger import chain, clock
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, event_row
from ledgerdash.ledger.models import AttemptEvent, ChainHead, Tenant
from ledgerdash.ledger.store.statements import append_one
from ledgerdash.ledger.store.switches import enabled


def append_events(events: list[EventDraft], *, now: datetime | None = None) -> list[AttemptEvent]:
    """Append events to their tenants' hash chains. Must run inside a transaction.

    Called last in every transaction, after the attempt rows are written, so
    the chain-head lock (one per tenant) is held for as short a time as
    possible and always taken after attempt locks (no lock-order deadlocks).
    """
    connection = transaction.get_connection()
    assert connection.in_atomic_block, "events are appended inside the change's transaction"
    now = now or clock.now()
    if len(events) == 1 and enabled("one_statement") and connection.vendor == "postgresql":
        row = append_one(events[0], now)
        if row is not None:
            return [row]
    # Read now, not from chains_of: this path makes a tenant's first event,
    # and a tenant id that a rolled-back transaction used (SQLite hands it
    # out again) may have had another number of chains.
    stripes = dict(Tenant.objects.filter(pk__in={e.tenant_id for e in events}).values_list("pk", "chain_stripes"))
    chains: dict[tuple[int, int], list[EventDraft]] = {}
    for event in events:
        n = stripes.get(event.tenant_id, 1)  # no such tenant: its foreign key refuses the event
        chains.setdefault((event.tenant_id, chain.stripe_of(event.attempt_id, n)), []).append(event)
    rows: list[AttemptEvent] = []
    for tenant_id, stripe in sorted(chains):  # one lock order for every transaction
        n = stripes.get(tenant_id, 1)
        head = _locked_head(tenant_id, stripe, n)
        seq, prev = head.seq, head.hash
        for event in chains[tenant_id, stripe]:
            seq = chain.next_seq(seq, stripe, n)
            row = event_row(event, now)
            row.seq, row.prev_hash = seq, prev
            row.hash = this_hash = chain.link(prev, row.content_hash)
            rows.append(row)
            prev = this_hash
        ChainHead.objects.filter(tenant_id=tenant_id, stripe=stripe).update(seq=seq, hash=prev)
    AttemptEvent.objects.bulk_create(rows)
    return rows


def _locked_head(tenant_id: int, stripe: int, stripes: int) -> ChainHead:
    """The head of the tenant's ``stripe``, locked. A tenant's first event
    makes the heads of all its stripes, so a tenant that has one head has
    them all (the one-statement paths rely on it)."""
    heads = ChainHead.objects.select_for_update()
    head = heads.filter(tenant_id=tenant_id, stripe=stripe).first()
    if head is None:
        ChainHead.objects.bulk_create(
            [ChainHead(tenant_id=tenant_id, stripe=s, seq=0, hash=chain.GENESIS) for s in range(stripes)],
            ignore_conflicts=True,
        )
        head = heads.get(tenant_id=tenant_id, stripe=stripe)
    return head


def event_record(
    *, tenant: Tenant | int, kind: EventKind, actor: Actor, reason: str = "", details: dict[str, Any] | None = None
) -> AttemptEvent:
    """Record something that happened to a tenant's ledger as a whole (an
    export, a policy change, a drill run) in its chain."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    with transaction.atomic():
        (row,) = append_events([EventDraft(tenant_id, None, kind, actor, reason=reason, details=details or {})])
    return row

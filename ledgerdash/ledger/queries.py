"""Reads of the ledger that more than one part of the project shares."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import F, Q, QuerySet
from django.db.models.functions import Mod

from ledgerdash.ledger import chain
from ledgerdash.ledger.models import OWNED_STATES, Attempt, AttemptEvent, ChainHead, Tenant


def needs_attention(tenant_ids: Iterable[int]) -> QuerySet[Attempt]:
    """The UNKNOWN and MANUAL_REVIEW queues of these tenants, oldest first."""
    return (
        Attempt.objects.filter(tenant_id__in=list(tenant_ids), state__in=OWNED_STATES)
        .select_related("tenant", "owner")
        .order_by("created_at", "id")
    )


def events_by_seq(
    events: QuerySet[AttemptEvent], fields: Iterable[str], *, chunk: int, after: int = 0
) -> Iterator[dict[str, Any]]:
    """``fields`` of ``events`` (one tenant's) in chain order, from the one
    after seq ``after``, read in keyset chunks of ``chunk`` rows: memory
    stays flat however long the chain."""
    fields = tuple(fields)
    last = after
    while True:
        rows = list(events.filter(seq__gt=last).order_by("seq").values(*fields)[:chunk])
        if not rows:
            return
        yield from rows
        last = rows[-1]["seq"]


def events_of_attempts(attempts: list[Attempt], events: QuerySet[AttemptEvent] | None = None) -> list[AttemptEvent]:
    """The events of these attempts (of one tenant: a linked chain, a drill
    case's), in the order they happened. Each attempt's are in seq order;
    across attempts, seq is that order where the tenant keeps one chain.
    A tenant with several numbers its chains side by side (a busy chain
    ahead of a quiet one: :mod:`ledgerdash.ledger.chain`), so there the
    attempts' runs are merged by the time each event was recorded."""
    if not attempts:
        return []
    qs = AttemptEvent.objects.all() if events is None else events
    rows = list(qs.filter(attempt__in=attempts).order_by("seq"))
    chains = Tenant.objects.filter(pk=attempts[0].tenant_id).values_list("chain_stripes", flat=True).first() or 1
    if chains == 1:
        return rows
    runs: dict[int | None, list[AttemptEvent]] = {}
    for row in rows:
        runs.setdefault(row.attempt_id, []).append(row)
    return list(heapq.merge(*runs.values(), key=lambda event: (event.created_at, event.seq)))


def chain_heads(tenants: Iterable[Tenant]) -> dict[int, list[tuple[int, str]]]:
    """Each tenant's chain heads, ``(seq, hash)`` for each of its chains in
    chain order (``(0, GENESIS)`` for a chain without events), in one query."""
    heads = {t.pk: [(0, chain.GENESIS)] * t.chain_stripes for t in tenants}
    for tenant_id, stripe, seq, digest in ChainHead.objects.filter(tenant_id__in=list(heads)).values_list(
        "tenant_id", "stripe", "seq", "hash"
    ):
        if stripe < len(heads[tenant_id]):
            heads[tenant_id][stripe] = (seq, digest)
    return heads


def per_chain(events: QuerySet[AttemptEvent], seqs: list[int], lookup: str) -> QuerySet[AttemptEvent]:
    """``events`` (one tenant's) whose seq stands in ``lookup`` (``gt``,
    ``lte``, …) to the seq ``seqs`` gives for its chain (one seq per chain,
    in chain order): past a reader's positions, up to the heads, … A tenant
    with several chains numbers them side by side, so one bound cannot
    stand for all of them."""
    if len(seqs) == 1:
        return events.filter(**{f"seq__{lookup}": seqs[0]})
    bounds = Q()
    for stripe, seq in enumerate(seqs):
        bounds |= Q(chain=stripe, **{f"seq__{lookup}": seq})
    return events.annotate(chain=Mod(F("seq") - 1, len(seqs))).filter(bounds)

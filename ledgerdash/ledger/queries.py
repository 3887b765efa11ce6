"""Reads of the ledger that more than one part of the project shares."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import QuerySet

from ledgerdash.ledger.models import OWNED_STATES, Attempt, AttemptEvent


def needs_attention(tenant_ids: Iterable[int]) -> QuerySet[Attempt]:
    """The UNKNOWN and MANUAL_REVIEW queues of these tenants, oldest first."""
    return (
        Attempt.objects.filter(tenant_id__in=list(tenant_ids), state__in=OWNED_STATES)
        .select_related("tenant", "owner")
        .order_by("created_at", "id")
    )


def events_by_seq(events: QuerySet[AttemptEvent], fields: Iterable[str], *, chunk: int) -> Iterator[dict[str, Any]]:
    """``fields`` of ``events`` (one tenant's) in chain order, read in keyset
    chunks of ``chunk`` rows: memory stays flat however long the chain."""
    fields = tuple(fields)
    last = 0
    while True:
        rows = list(events.filter(seq__gt=last).order_by("seq").values(*fields)[:chunk])
        if not rows:
            return
        yield from rows
        last = rows[-1]["seq"]

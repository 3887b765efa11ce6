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


# Table and column names come from the model; the values are parameters.
_ATTEMPT_OF_TENANT = "SELECT {columns} FROM {table} WHERE id = %s AND tenant_id = %s".format(  # noqa: S608
    columns=", ".join(f'"{field.column}"' for field in Attempt._meta.concrete_fields), table=Attempt._meta.db_table
)


def attempt_of_tenant(attempt_id: int, tenant_id: int) -> Attempt | None:
    """The attempt ``attempt_id`` if it is ``tenant_id``'s, else None, in one
    plain query: every ingest API call on an attempt starts here, and
    compiling the ORM's ``get()`` cost more than running it."""
    return next(iter(Attempt.objects.raw(_ATTEMPT_OF_TENANT, [attempt_id, tenant_id])), None)

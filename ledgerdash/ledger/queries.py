"""Reads of the ledger that more than one part of the project shares."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from ledgerdash.ledger.models import Attempt, State

NEEDS_ATTENTION = (State.UNKNOWN, State.MANUAL_REVIEW)


def needs_attention(tenant_ids: Iterable[int]) -> QuerySet[Attempt]:
    """The UNKNOWN and MANUAL_REVIEW queues of these tenants, oldest first."""
    return (
        Attempt.objects.filter(tenant_id__in=list(tenant_ids), state__in=NEEDS_ATTENTION)
        .select_related("tenant", "owner")
        .order_by("created_at", "id")
    )


def chain_of(attempt: Attempt) -> QuerySet[Attempt]:
    """Every attempt sharing ``attempt``'s key in its tenant: the root and its linked retries."""
    return Attempt.objects.filter(tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key).order_by("id")

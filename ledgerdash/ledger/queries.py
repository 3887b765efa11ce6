"""Reads of the ledger that more than one part of the project shares."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from ledgerdash.ledger.models import OWNED_STATES, Attempt


def needs_attention(tenant_ids: Iterable[int]) -> QuerySet[Attempt]:
    """The UNKNOWN and MANUAL_REVIEW queues of these tenants, oldest first."""
    return (
        Attempt.objects.filter(tenant_id__in=list(tenant_ids), state__in=OWNED_STATES)
        .select_related("tenant", "owner")
        .order_by("created_at", "id")
    )

"""Reads the dashboard's views and exports share, always scoped to the user's tenants."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet

from ledgerdash.ledger.models import Attempt, State, Tenant


def tenants_for(user: Any) -> QuerySet[Tenant]:
    if not user.is_authenticated:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=user)


def attempts_for(user: Any) -> QuerySet[Attempt]:
    return Attempt.objects.filter(tenant__in=tenants_for(user)).select_related("tenant", "owner")


def queue_counts(user: Any) -> dict[str, int]:
    rows = (
        attempts_for(user)
        .filter(state__in=[State.UNKNOWN, State.MANUAL_REVIEW])
        .values("state")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts = {State.UNKNOWN.value: 0, State.MANUAL_REVIEW.value: 0}
    counts.update({row["state"]: row["n"] for row in rows})
    return counts

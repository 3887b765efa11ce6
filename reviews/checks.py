"""System checks for what the ledger cannot see: people and their roles."""

from __future__ import annotations

from typing import Any

from django.core.checks import Tags, Warning, register
from django.db import DatabaseError

from ledgerdash.ledger.models import Tenant
from reviews.models import Membership, Role, roles_at_least


@register(Tags.database)
def default_owners_are_members(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """Stuck work goes to a tenant's default owner; one who is not an
    operator of the tenant cannot act on it from the dashboard. (A database
    check: ``manage.py check --database default``.)"""
    try:
        tenants = list(Tenant.objects.filter(is_active=True).select_related("default_owner"))
        operators = set(
            Membership.objects.filter(role__in=roles_at_least(Role.OPERATOR)).values_list("tenant_id", "user_id")
        )
    except DatabaseError:  # not migrated yet
        return []
    problems = []
    for tenant in tenants:
        if tenant.default_owner_id is None:
            problems.append(
                Warning(
                    f"tenant {tenant.slug} has no default owner: UNKNOWN work is left unowned when nobody is on call",
                    hint="Set a default owner in the admin (Ledger, Tenants).",
                    id="ledgerdash.W001",
                )
            )
        elif (tenant.pk, tenant.default_owner_id) not in operators:
            problems.append(
                Warning(
                    f"tenant {tenant.slug}'s default owner {tenant.default_owner} is not an operator of it",
                    hint="Make them an operator (Reviews, Memberships) or choose another default owner.",
                    id="ledgerdash.W002",
                )
            )
    return problems

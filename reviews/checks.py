"""System checks for what the ledger cannot see: people and their roles."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError

from ledgerdash.ledger.models import Membership, Role, Tenant, roles_at_least


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


@register()
def single_sign_on_group_roles(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """OIDC_GROUP_ROLES must parse, or nobody could sign in through the provider."""
    if not getattr(settings, "OIDC_ENABLED", False):
        return []
    from reviews.sso import parse_group_roles

    try:
        mapping = parse_group_roles(settings.OIDC_GROUP_ROLES)
    except ValueError as exc:
        return [Error(f"OIDC_GROUP_ROLES: {exc}", hint="group=tenant:role, comma-separated", id="ledgerdash.E010")]
    if not mapping:
        return [
            Error("OIDC_ENABLED is on but OIDC_GROUP_ROLES grants nothing: nobody could sign in", id="ledgerdash.E011")
        ]
    return []


@register(Tags.database, deploy=True)
def runtime_role_owns_nothing(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """On PostgreSQL the app should connect as the runtime role (``manage.py
    db_roles``): a superuser or the tables' owner can switch the ledger's
    triggers off. (``manage.py check --deploy --database default``.)"""
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_user, rolsuper, pg_has_role(current_user, "
                "(SELECT relowner FROM pg_class WHERE oid = to_regclass('ledger_attemptevent')), 'USAGE') "
                "FROM pg_roles WHERE rolname = current_user"
            )
            user, superuser, owns_events = cursor.fetchone()
    except DatabaseError:
        return []
    if superuser or owns_events:
        what = "a superuser" if superuser else "the owner of the ledger's tables"
        return [
            Warning(
                f"the app connects to PostgreSQL as {user}, {what}: it could switch the ledger's triggers off",
                hint="Connect as a runtime role: manage.py db_roles (docs/security.md, Deploying: database roles).",
                id="ledgerdash.W010",
            )
        ]
    return []

"""Roles, checked where people act. Each role can do what the ones before it can."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reviews.models import Membership, Role


def role_in(user: Any, tenant_id: int) -> Membership | None:
    if not user.is_authenticated or not user.is_active:
        return None
    return Membership.objects.filter(user=user, tenant_id=tenant_id).first()


def can(user: Any, tenant_id: int, role: Role | str) -> bool:
    membership = role_in(user, tenant_id)
    return membership is not None and membership.can(role)


def may_act_as(user: Any, role: Role | str) -> Callable[[int], str | None]:
    """For the ledger's approval re-check, which runs inside its transaction:
    a callable answering None when ``user`` holds ``role`` for the tenant now,
    else the reason they may not act."""

    def check(tenant_id: int) -> str | None:
        membership = role_in(user, tenant_id)
        if membership is None:
            return f"{user.get_username()} is not a member of the tenant any more"
        if not membership.can(role):
            return f"{user.get_username()} is a {membership.role} of the tenant, not an {role}"
        return None

    return check

"""Who may see and do what, in which tenant: the one place both the dashboard
and the API ask.

People are members of tenants with a role (:class:`~ledgerdash.ledger.models.Role`:
viewer < operator < approver < admin, each able to do what the ones before it
can); agents hold API tokens of one tenant (:mod:`ledgerdash.ledger.tokens`).
Everything a person may read is scoped here (:func:`tenants_for`,
:func:`attempts_for`); whether they may act is :func:`refusal`, which the
ledger's moves ask again inside their own transaction.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet

from ledgerdash.ledger.models import Attempt, Membership, Role, Tenant, roles_at_least

__all__ = [
    "Person",
    "Role",
    "attempts_for",
    "can",
    "member_names_who_can",
    "refusal",
    "refusal_by",
    "role_in",
    "tenant_ids_for",
    "tenants_for",
]


#: Whoever a request or a move speaks for: ``request.user`` as Django gives it,
#: or None where nobody is signed in.
type Person = AbstractBaseUser | AnonymousUser | None


def _active(user: Person) -> User | None:
    """The signed-in, active account behind ``user``; None for anyone else."""
    return user if isinstance(user, User) and user.is_active else None


def role_in(user: Person, tenant_id: int) -> Membership | None:
    """``user``'s membership of the tenant, or None (also for inactive or anonymous users)."""
    if (account := _active(user)) is None:
        return None
    return Membership.objects.filter(user=account, tenant_id=tenant_id).first()


def can(user: Person, tenant_id: int, role: Role | str) -> bool:
    membership = role_in(user, tenant_id)
    return membership is not None and membership.can(role)


def _with_article(role: str) -> str:
    return f"an {role}" if role[:1] in "aeiou" else f"a {role}"


def refusal(user: Person, tenant_id: int, role: Role | str, *, tenant: str = "the tenant") -> str | None:
    """Why ``user`` may not act as ``role`` in the tenant now, in words
    (``tenant``: how to name it); None when they may."""
    account = _active(user)
    return refusal_by(account, role_in(account, tenant_id) if account is not None else None, role, tenant=tenant)


def refusal_by(
    user: Person, membership: Membership | None, role: Role | str, *, tenant: str = "the tenant"
) -> str | None:
    """:func:`refusal`, for a caller that has read ``user``'s membership already."""
    if (account := _active(user)) is None:
        return "this account is not active"
    name = account.get_username()
    if membership is None:
        return f"{name} is not a member of {tenant}"
    if not membership.can(role):
        return f"{name} is {_with_article(membership.role)} of {tenant} and needs to be {_with_article(str(role))}"
    return None


def tenants_for(user: Person) -> QuerySet[Tenant]:
    """The tenants ``user`` is a member of (with any role)."""
    if (account := _active(user)) is None:
        return Tenant.objects.none()
    return Tenant.objects.filter(memberships__user=account)


def tenant_ids_for(user: Person, role: Role | str = Role.VIEWER) -> list[int]:
    """The tenants in which ``user`` holds at least ``role``."""
    if (account := _active(user)) is None:
        return []
    return list(
        Membership.objects.filter(user=account, role__in=roles_at_least(role))
        .order_by("tenant_id")
        .values_list("tenant_id", flat=True)
    )


def roles_by_tenant(user: Person) -> dict[int, Role]:
    """``user``'s role in each of their tenants, in one read (for a page
    that asks several "where may they…" questions)."""
    if (account := _active(user)) is None:
        return {}
    return {
        tenant_id: Role(role)
        for tenant_id, role in Membership.objects.filter(user=account).values_list("tenant_id", "role")
    }


def attempts_for(user: Person) -> QuerySet[Attempt]:
    """Every attempt ``user`` may read: their tenants', nobody else's."""
    return Attempt.objects.filter(tenant__in=tenants_for(user)).select_related("tenant", "owner")


def member_names_who_can(tenant_ids: Iterable[int], role: Role | str = Role.OPERATOR) -> list[tuple[int, str]]:
    """(user id, username) of the active members of these tenants holding at
    least ``role``, each once, by username: the choices of an owner picker
    (a list page draws one for every request, so no model instances)."""
    return list(
        Membership.objects.filter(tenant_id__in=list(tenant_ids), role__in=roles_at_least(role), user__is_active=True)
        .order_by("user__username", "user_id")
        .values_list("user_id", "user__username")
        .distinct()
    )

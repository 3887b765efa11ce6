"""Sign-in throttling (django-axes) as the ledger sees it: lockouts and unlocks
are events in the chains of the tenants the account belongs to, and a tenant's
admins unlock their members.

django-axes counts failed sign-ins per username, on the dashboard's login and
on ``/admin/`` alike (both authenticate through its backend), and refuses the
account after ``AXES_FAILURE_LIMIT`` failures for ``AXES_COOLOFF_TIME``.
Accounts are locked by username, not by address: behind a proxy every client
shares an address, and an attacker trying one account from many addresses
must still be stopped. Rate limits per address belong in front of the app.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from axes.models import AccessAttempt
from axes.signals import user_locked_out
from axes.utils import reset
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import Membership, Role
from ledgerdash.ledger.store import event_record

LOCKED = EventKind.ACCOUNT_LOCKED
UNLOCKED = EventKind.ACCOUNT_UNLOCKED
THROTTLE = Actor.system("sign-in throttling")

LOCKED_MESSAGE = (
    "Too many failed sign-ins for this account: it is locked until {until} UTC. "
    "An admin of your tenant can unlock it sooner."
)


def cooloff() -> timedelta:
    value = settings.AXES_COOLOFF_TIME
    return value if isinstance(value, timedelta) else timedelta(hours=float(value))


def _tenant_ids_of(username: str) -> list[int]:
    return list(
        Membership.objects.filter(user__username=username).order_by("tenant_id").values_list("tenant_id", flat=True)
    )


@receiver(user_locked_out, dispatch_uid="reviews.accounts.record_lockout")
def record_lockout(sender: Any, request: HttpRequest, username: str | None, ip_address: str | None, **_: Any) -> None:
    """The moment an account is locked, in each of its tenants' chains.

    django-axes signals again for every attempt refused while the lock
    holds; only the failure that crossed the limit has its count set, so a
    flood of refused attempts writes one event, not one each."""
    failures = getattr(request, "axes_failures_since_start", None)
    if not username or failures is None:
        return
    until = timezone.now() + cooloff()
    for tenant_id in _tenant_ids_of(username):
        event_record(
            tenant=tenant_id,
            kind=LOCKED,
            actor=THROTTLE,
            reason=f"{username} locked out after {failures} failed sign-ins",
            details={
                "username": username,
                "failures": failures,
                "ip_address": ip_address or "",
                "path": request.path,
                "locked_until": until.isoformat(),
            },
        )


def locked_usernames(usernames: list[str], *, now: Any = None) -> set[str]:
    """Which of ``usernames`` are locked now (failures at the limit within the cool-off)."""
    since = (now or timezone.now()) - cooloff()
    return set(
        AccessAttempt.objects.filter(
            username__in=usernames,
            failures_since_start__gte=settings.AXES_FAILURE_LIMIT,
            attempt_time__gte=since,
        ).values_list("username", flat=True)
    )


def unlockable_by(admin: Any) -> Any:
    """The memberships an admin may unlock: every member of the tenants they administer."""
    tenants = Membership.objects.filter(user=admin, role=Role.ADMIN).values("tenant_id")
    return Membership.objects.filter(tenant_id__in=tenants).select_related("user", "tenant")


def account_unlock(*, username: str, by: AbstractBaseUser) -> int:
    """Lift ``username``'s lockout, if ``by`` administers one of its tenants; an
    event in each of the account's tenants' chains. Returns the attempts cleared."""
    if not unlockable_by(by).filter(user__username=username).exists():
        raise PermissionDenied("only an admin of one of this account's tenants may unlock it")
    with transaction.atomic():
        cleared = reset(username=username)
        for tenant_id in _tenant_ids_of(username):
            event_record(
                tenant=tenant_id,
                kind=UNLOCKED,
                actor=Actor.user(by),
                reason=f"{username} unlocked by {by.get_username()}",
                details={"username": username, "attempts_cleared": cleared},
            )
    return cleared


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """What a locked account sees, on the dashboard's login and /admin/'s: the
    login page with the reason, 429 Too Many Requests."""
    until = timezone.now() + cooloff()
    attempt = (
        AccessAttempt.objects.filter(username=(credentials or {}).get("username") or request.POST.get("username"))
        .order_by("-attempt_time")
        .values_list("attempt_time", flat=True)
        .first()
    )
    if attempt is not None:
        until = attempt + cooloff()
    form = AuthenticationForm(request)
    return render(
        request,
        "registration/login.html",
        {
            "form": form,
            "locked_out": LOCKED_MESSAGE.format(until=f"{until:%Y-%m-%d %H:%M}"),
            "next": request.POST.get("next", ""),
        },
        status=429,
    )

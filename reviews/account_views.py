"""Members of the tenants a person administers, and unlocking a locked account."""

from __future__ import annotations

from itertools import groupby

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from reviews import accounts


@login_required
@require_safe
def members(request: HttpRequest) -> HttpResponse:
    """Every member of the tenants you administer, with whether sign-in is locked."""
    assert request.user.is_authenticated  # login_required
    memberships = list(accounts.unlockable_by(request.user).order_by("user__username", "tenant__slug"))
    if not memberships:
        raise PermissionDenied("only a tenant's admins see its members")
    locked = accounts.locked_usernames([m.user.username for m in memberships])
    people = [
        {"username": username, "memberships": list(group), "locked": username in locked}
        for username, group in groupby(memberships, key=lambda m: m.user.username)
    ]
    return render(
        request,
        "reviews/members.html",
        {
            "people": people,
            "title": "Members",
            "failure_limit": settings.AXES_FAILURE_LIMIT,
            "administered": sorted({m.tenant.slug for m in memberships if m.user_id == request.user.pk}),
        },
    )


@login_required
@require_POST
def member_unlock(request: HttpRequest) -> HttpResponse:
    assert request.user.is_authenticated  # login_required
    username = request.POST.get("username", "")
    cleared = accounts.account_unlock(username=username, by=request.user)  # 403 unless you administer them
    if cleared:
        messages.success(request, f"{username} may sign in again; the unlock is recorded in the tenants' chains.")
    else:
        messages.info(request, f"{username} was not locked; the unlock is recorded all the same.")
    return redirect("reviews:members")

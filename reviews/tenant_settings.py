"""A tenant's settings and their history, for the tenant's admins: who is a
member with which role, who is on call, how its tools reach their providers,
and every change to any of it (the configuration events of the tenant's
chain, newest first).

A tenant admin changes a member's role here; the change is recorded by the
ledger's configuration hook (:mod:`ledgerdash.ledger.configuration`), like
every other path that changes it. Other tenants' settings are a 404; a
member below admin gets a 403.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST, require_safe

from ledgerdash.ledger import secrets, tenancy
from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import AttemptEvent, Membership, OnCallShift, Role, Tenant, ToolCredential

#: The events a settings history shows: changes to who may do what and how tools reach providers.
CONFIG_KINDS = [
    EventKind.TENANT,
    EventKind.MEMBERSHIP,
    EventKind.ON_CALL,
    EventKind.POLICY,
    EventKind.TOOL,
    EventKind.CREDENTIAL,
    EventKind.API_TOKEN,
    EventKind.ACCOUNT_LOCKED,
    EventKind.ACCOUNT_UNLOCKED,
]
HISTORY_LIMIT = 200

LAST_ADMIN = "{user} is the tenant's last admin: make someone else admin first"


class RoleForm(forms.Form):
    membership = forms.IntegerField()
    role = forms.ChoiceField(choices=Role.choices)


def _tenant_for_admin(request: HttpRequest, slug: str) -> Tenant:
    tenant: Tenant = get_object_or_404(tenancy.tenants_for(request.user), slug=slug)
    refusal = tenancy.refusal(request.user, tenant.pk, Role.ADMIN)
    if refusal is not None:
        raise PermissionDenied(f"only the tenant's admins see its settings: {refusal}")
    return tenant


def diff_rows(details: Any) -> list[tuple[str, Any, Any]]:
    """A configuration event's change as (setting, before, after) rows; "·" where there was none."""
    if not isinstance(details, dict) or not isinstance(details.get("changed"), list):
        return []
    before = details.get("before")
    after = details.get("after")
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    return [(str(name), before.get(name, "·"), after.get(name, "·")) for name in details["changed"]]


def history(tenant: Tenant) -> list[AttemptEvent]:
    """The tenant's configuration events, newest first, each with its ``diff_rows``."""
    events = list(
        AttemptEvent.objects.filter(tenant=tenant, kind__in=CONFIG_KINDS, attempt__isnull=True).order_by("-seq")[
            :HISTORY_LIMIT
        ]
    )
    for event in events:
        event.diff_rows = diff_rows(event.details)  # type: ignore[attr-defined]
    return events


@login_required
@require_safe
def tenant_settings(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant_for_admin(request, slug)
    context: dict[str, Any] = {
        "title": f"{tenant.slug} settings",
        "tenant": tenant,
        "members": Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username"),
        "shifts": OnCallShift.objects.filter(tenant=tenant).select_related("user").order_by("-starts_at")[:50],
        "roles": Role.choices,
        "events": history(tenant),
        "history_limit": HISTORY_LIMIT,
    }
    context.update(_extra_context(tenant))
    return render(request, "reviews/tenant_settings.html", context)


def _extra_context(tenant: Tenant) -> dict[str, Any]:
    """The tenant's credential bindings: names, and whether each resolves now (never the value)."""
    bindings = ToolCredential.objects.filter(tenant=tenant).select_related("tool").order_by("tool__name", "placeholder")
    return {"credentials": [(b, secrets.is_set(b.secret_name)) for b in bindings]}


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _tenant_for_admin(request, slug)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a member and one of the roles.")
        return redirect("reviews:tenant_settings", slug=tenant.slug)
    with transaction.atomic():
        membership = (
            Membership.objects.select_for_update()
            .filter(tenant=tenant, pk=form.cleaned_data["membership"])
            .select_related("user")
            .first()
        )
        if membership is None:
            raise Http404("no such member of this tenant")
        role = form.cleaned_data["role"]
        admins = Membership.objects.filter(tenant=tenant, role=Role.ADMIN).exclude(pk=membership.pk)
        if membership.role == Role.ADMIN and role != Role.ADMIN and not admins.exists():
            messages.error(request, LAST_ADMIN.format(user=membership.user.get_username()))
            return redirect("reviews:tenant_settings", slug=tenant.slug)
        if membership.role == role:
            messages.info(request, f"{membership.user.get_username()} is already {role}; nothing changed.")
            return redirect("reviews:tenant_settings", slug=tenant.slug)
        membership.role = role
        membership.save(update_fields=["role"])  # the configuration hook appends the event
    messages.success(request, f"{membership.user.get_username()} is now {role}; the change is in the tenant's chain.")
    return redirect("reviews:tenant_settings", slug=tenant.slug)

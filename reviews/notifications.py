"""Notification channels and rules for tenant admins, and the deliveries
that died. Every change goes through :mod:`ledgerdash.notify.services`
(an event in the tenant's chain); only a tenant's admins see or change them."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from ledgerdash.ledger import tenancy
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken, Role, Tenant
from ledgerdash.notify import services, worker
from ledgerdash.notify.models import Audience, Channel, ChannelKind, Delivery, DeliveryStatus, Rule, RuleEvent

ONLY_ADMINS = "only a tenant's admins manage its notifications"


def _admin_tenants(request: HttpRequest) -> list[Tenant]:
    tenants = list(Tenant.objects.filter(pk__in=tenancy.tenant_ids_for(request.user, Role.ADMIN)).order_by("slug"))
    if not tenants:
        raise PermissionDenied(ONLY_ADMINS)
    return tenants


def _for_admin(request: HttpRequest, model: type[Any], pk: Any) -> Any:
    """The row, if it belongs to a tenant of the user's; 404 for other
    tenants' rows, 403 for members who are not admins."""
    row = model.objects.select_related("tenant").filter(pk=pk, tenant__in=tenancy.tenants_for(request.user)).first()
    if row is None:
        raise Http404
    if not tenancy.can(request.user, row.tenant_id, Role.ADMIN):
        raise PermissionDenied(ONLY_ADMINS)
    return row


def actor_of(request: HttpRequest) -> Actor:
    assert request.user.is_authenticated  # login_required
    return Actor.user(request.user)


class ChannelForm(forms.Form):
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), empty_label=None)
    name = forms.CharField(max_length=100, strip=True)
    kind = forms.ChoiceField(choices=ChannelKind.choices)
    target = forms.CharField(
        max_length=1000,
        strip=True,
        help_text="The URL (webhook, Slack, agent callback) or addresses, comma-separated (email).",
    )
    token = forms.ModelChoiceField(
        queryset=ApiToken.objects.none(),
        required=False,
        label="API token (agent callbacks)",
        help_text="Decisions on the attempts this token records are sent to the callback.",
    )

    def __init__(self, *args: Any, tenants: list[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = Tenant.objects.filter(pk__in=[t.pk for t in tenants])  # type: ignore[attr-defined]
        self.fields["token"].queryset = ApiToken.objects.filter(  # type: ignore[attr-defined]
            tenant__in=tenants, revoked_at__isnull=True
        ).select_related("tenant")
        self.fields["token"].label_from_instance = lambda t: f"{t.tenant.slug}: {t.prefix} ({t.name})"  # type: ignore[attr-defined]


class ChannelEditForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    target = forms.CharField(max_length=1000, strip=True)
    enabled = forms.BooleanField(required=False)
    rotate_secret = forms.BooleanField(required=False, label="Rotate the signing secret (webhooks)")


class RuleForm(forms.Form):
    event = forms.ChoiceField(choices=RuleEvent.choices)
    channel = forms.ModelChoiceField(queryset=Channel.objects.none(), empty_label=None)
    audience = forms.ChoiceField(choices=Audience.choices, initial=Audience.CHANNEL, help_text="Email channels only.")
    enabled = forms.BooleanField(required=False, initial=True)
    sla_minutes = forms.IntegerField(
        min_value=1,
        max_value=100_000,
        required=False,
        label="SLA (minutes)",
        help_text="Empty: the tenant's own SLA, the one the overview counts late work by.",
    )
    tool_sla = forms.CharField(
        required=False,
        label="SLA per tool",
        help_text='JSON, tool name to minutes, e.g. {"send_email": 30}',
        widget=forms.TextInput,
    )
    repeat_minutes = forms.IntegerField(min_value=0, max_value=100_000, initial=60, help_text="0: once")
    stalled_minutes = forms.IntegerField(min_value=1, max_value=100_000, initial=10, label="Reconciler stalled after")

    def __init__(self, *args: Any, tenants: list[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["channel"].queryset = Channel.objects.filter(  # type: ignore[attr-defined]
            tenant__in=tenants
        ).select_related("tenant")
        self.fields["channel"].label_from_instance = lambda c: f"{c.tenant.slug}: {c.name} ({c.kind})"  # type: ignore[attr-defined]

    def clean_tool_sla(self) -> dict[str, int]:
        text = self.cleaned_data["tool_sla"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            raise forms.ValidationError('not JSON: write it like {"send_email": 30}') from None
        if not isinstance(value, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value.values()
        ):
            raise forms.ValidationError("tool names with a whole number of minutes above 0")
        return value

    def values(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data["channel_id"] = data.pop("channel").pk
        return data


@login_required
@require_safe
def notification_list(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    return _render_list(request, tenants)


def _render_list(request: HttpRequest, tenants: list[Tenant]) -> HttpResponse:
    deliveries = Delivery.objects.filter(tenant__in=tenants).select_related("channel", "tenant")
    context = {
        "title": "Notifications",
        "channels": Channel.objects.filter(tenant__in=tenants).select_related("tenant", "token"),
        "rules": Rule.objects.filter(tenant__in=tenants).select_related("tenant", "channel"),
        "dead": deliveries.filter(status=DeliveryStatus.DEAD).order_by("-created_at")[:100],
        "recent": deliveries.exclude(status=DeliveryStatus.DEAD).order_by("-created_at")[:20],
    }
    template = "reviews/notifications.html#dead" if request.htmx else "reviews/notifications.html"  # type: ignore[attr-defined]
    return render(request, template, context)


@login_required
@require_http_methods(["GET", "POST"])
def channel_create(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    form = ChannelForm(request.POST or None, tenants=tenants)
    if request.method == "POST" and form.is_valid():
        try:
            channel = services.channel_create(actor=actor_of(request), **form.cleaned_data)
        except ValidationError as exc:
            form.add_error("token" if "token" in str(exc) else "target", exc)
        else:
            messages.success(request, f"Channel {channel.name} created; the change is recorded in the tenant's chain.")
            return render(request, "reviews/notification_secret.html", {"channel": channel, "title": "Channel created"})
    return render(request, "reviews/notification_form.html", {"form": form, "title": "New channel"})


@login_required
@require_http_methods(["GET", "POST"])
def channel_edit(request: HttpRequest, pk: int) -> HttpResponse:
    channel: Channel = _for_admin(request, Channel, pk)
    initial = {"name": channel.name, "target": channel.target, "enabled": channel.enabled}
    form = ChannelEditForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        rotate = data.pop("rotate_secret")
        changes = {k: v for k, v in data.items() if v != initial[k]}
        try:
            services.channel_update(channel=channel, actor=actor_of(request), rotate_secret=rotate, **changes)
        except ValidationError as exc:
            form.add_error("target", exc)
        else:
            messages.success(request, f"Channel {channel.name} saved; the change is recorded in the tenant's chain.")
            if rotate and channel.kind in services.SIGNED:
                return render(
                    request, "reviews/notification_secret.html", {"channel": channel, "title": "Secret rotated"}
                )
            return redirect("reviews:notifications")
    return render(
        request, "reviews/notification_form.html", {"form": form, "title": f"Channel {channel.name}", "row": channel}
    )


@login_required
@require_http_methods(["GET", "POST"])
def rule_create(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    form = RuleForm(request.POST or None, tenants=tenants)
    if request.method == "POST" and form.is_valid():
        values = form.values()
        channel = form.cleaned_data["channel"]
        services.rule_create(tenant=channel.tenant, actor=actor_of(request), **values)
        messages.success(request, "Rule created; the change is recorded in the tenant's chain.")
        return redirect("reviews:notifications")
    return render(request, "reviews/notification_form.html", {"form": form, "title": "New rule"})


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HttpRequest, pk: int) -> HttpResponse:
    rule: Rule = _for_admin(request, Rule, pk)
    initial = {name: getattr(rule, name) for name in services.RULE_FIELDS if name != "channel_id"}
    initial["channel"] = rule.channel
    initial["tool_sla"] = json.dumps(rule.tool_sla) if rule.tool_sla else ""
    form = RuleForm(request.POST or None, initial=initial, tenants=[rule.tenant])
    if request.method == "POST" and form.is_valid():
        values = form.values()
        changes = {k: v for k, v in values.items() if v != getattr(rule, k)}
        services.rule_update(rule=rule, actor=actor_of(request), **changes)
        messages.success(request, "Rule saved; the change is recorded in the tenant's chain.")
        return redirect("reviews:notifications")
    return render(
        request, "reviews/notification_form.html", {"form": form, "title": f"Rule: {rule.get_event_display()}"}
    )


@login_required
@require_POST
def delivery_resend(request: HttpRequest, pk: str) -> HttpResponse:
    delivery: Delivery = _for_admin(request, Delivery, pk)
    try:
        worker.delivery_resend(delivery=delivery, actor=actor_of(request))
    except worker.NotDead as exc:
        messages.info(request, str(exc))
    else:
        messages.success(request, f"Delivery {delivery.pk} will be sent again (same delivery id).")
    if request.htmx:  # type: ignore[attr-defined]
        return _render_list(request, _admin_tenants(request))
    return redirect("reviews:notifications")

"""Admin pages for the ledger. Attempts are read-only here: every state
change goes through the transitions module, so the admin cannot bypass
fences, events or approvals. Events are read-only (the database also refuses
to change them)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from ledgerdash.ledger.models import Attempt, AttemptEvent, OnCallShift, Policy, Tenant, Tool, validate_policy_tools


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PolicyInline(admin.TabularInline):
    model = Policy
    extra = 0
    fields = ("version", "tools", "note", "created_by", "created_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active", "default_owner", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["slug", "name"]
    inlines = [PolicyInline]


class PolicyForm(forms.ModelForm):
    class Meta:
        model = Policy
        fields = ["tenant", "tools", "note"]

    def clean_tools(self) -> Any:
        tools = self.cleaned_data["tools"]
        validate_policy_tools(tools)
        return tools


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    """Adding a policy creates the tenant's next version; versions are never edited."""

    form = PolicyForm
    list_display = ["tenant", "version", "note", "created_by", "created_at"]
    list_filter = ["tenant"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        from ledgerdash.ledger.policies import policy_publish
        from ledgerdash.ledger.transitions import Actor

        published = policy_publish(
            tenant=obj.tenant,
            tools=obj.tools,
            note=obj.note,
            actor=Actor.user(request.user),  # type: ignore[arg-type]
        )
        obj.pk, obj.version = published.pk, published.version


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    """Provider adapters per tool; the form validates the adapter config (Tool.clean)."""

    list_display = ["name", "adapter", "idempotent", "key_retention_seconds", "max_checks", "max_dispatches", "enabled"]
    list_filter = ["adapter", "idempotent", "enabled"]
    search_fields = ["name"]


@admin.register(OnCallShift)
class OnCallShiftAdmin(admin.ModelAdmin):
    list_display = ["tenant", "user", "starts_at", "ends_at"]
    list_filter = ["tenant"]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "tenant",
        "tool_name",
        "idempotency_key",
        "state",
        "owner",
        "provider_request_id",
        "created_at",
    ]
    list_filter = ["state", "tenant", "tool_name"]
    search_fields = ["idempotency_key", "task_id", "provider_request_id"]
    list_select_related = ["tenant", "owner"]
    raw_id_fields = ["parent", "owner", "requested_by", "approved_by"]


@admin.register(AttemptEvent)
class AttemptEventAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "seq", "attempt", "kind", "from_state", "to_state", "actor_label", "created_at"]
    list_filter = ["kind", "tenant"]
    list_select_related = ["tenant"]
    raw_id_fields = ["attempt", "actor_user"]

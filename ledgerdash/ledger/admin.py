"""Admin pages for the ledger. Attempts are read-only here: every state
change goes through the moves (:mod:`ledgerdash.ledger.moves`), so the admin cannot bypass
fences, events or approvals. Events are read-only (the database also refuses
to change them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from ledgerdash.ledger import archive
from ledgerdash.ledger.errors import InvalidField
from ledgerdash.ledger.models import (
    ApiToken,
    Attempt,
    AttemptEvent,
    DrillRun,
    OnCallShift,
    Policy,
    Tenant,
    TokenScope,
    Tool,
    ToolCredential,
    validate_policy_approvals,
    validate_policy_tools,
)


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

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Chosen when the tenant is made; its events' seqs depend on it.
        return ("chain_stripes",) if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its chain must stay verifiable: deactivate it instead


class PolicyForm(forms.ModelForm):
    class Meta:
        model = Policy
        fields = ["tenant", "tools", "approvals", "note"]
        help_texts = {
            "approvals": 'Tools whose calls wait for an approver before they are sent: {"pay": "amount_cents > '
            '`50000`"} (a JMESPath condition over the arguments), or {"pay": ""} for every call.'
        }

    def clean_tools(self) -> Any:
        tools = self.cleaned_data["tools"]
        validate_policy_tools(tools)
        return tools

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "tools" in data:
            try:
                validate_policy_approvals(data.get("approvals") or {}, data["tools"])
            except ValidationError as exc:
                self.add_error("approvals", exc)
        return data


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
        from ledgerdash.ledger.events import Actor
        from ledgerdash.ledger.policies import policy_publish

        published = policy_publish(
            tenant=obj.tenant,
            tools=obj.tools,
            approvals=obj.approvals or {},
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


@admin.register(ToolCredential)
class ToolCredentialAdmin(admin.ModelAdmin):
    """A tenant's credential for a tool, by name: the secret stays in the
    secrets file or the environment, and no page shows it (only whether it
    resolves)."""

    list_display = ["tenant", "tool", "placeholder", "secret_name", "resolves"]
    fields = ["tenant", "tool", "placeholder", "secret_name"]
    list_filter = ["tenant", "tool"]
    list_select_related = ["tenant", "tool"]
    search_fields = ["placeholder", "secret_name"]

    @admin.display(boolean=True, description="resolves now")
    def resolves(self, obj: ToolCredential) -> bool:
        from ledgerdash.ledger.secrets import is_set

        return is_set(obj.secret_name)


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
    raw_id_fields = ["parent", "owner", "requested_by", "api_token", "approved_by"]


@admin.register(AttemptEvent)
class AttemptEventAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "seq", "attempt", "kind", "from_state", "to_state", "actor_label", "created_at"]
    list_filter = ["kind", "tenant"]
    list_select_related = ["tenant"]
    raw_id_fields = ["attempt", "actor_user"]


def _default_expiry() -> Any:
    from ledgerdash.ledger.tokens import DEFAULT_LIFETIME

    return timezone.now() + DEFAULT_LIFETIME


class ApiTokenCreateForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=TokenScope.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=[TokenScope.WRITE.value],
        help_text="An agent that records and reports needs write only; add read for lookups.",
    )
    expires_at = forms.DateTimeField(
        required=False,
        initial=_default_expiry,
        help_text="Empty: never expires. Prefer an expiry and rotate the token before it.",
    )

    class Meta:
        model = ApiToken
        fields = ["tenant", "name", "scopes", "person", "expires_at"]

    def clean(self) -> dict[str, Any]:
        from ledgerdash.ledger.tokens import token_scopes

        data = super().clean() or {}
        if data.get("tenant") is not None and data.get("scopes"):
            try:
                token_scopes(tenant=data["tenant"], scopes=data["scopes"], person=data.get("person"))
            except InvalidField as exc:
                raise forms.ValidationError(str(exc)) from None
        return data

    def clean_expires_at(self) -> Any:
        expires_at = self.cleaned_data["expires_at"]
        if expires_at is not None and expires_at <= timezone.now() + timedelta(minutes=1):
            raise forms.ValidationError("the expiry must be in the future")
        return expires_at


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued here (the secret is shown once, on the page that
    follows) and revoked with the list action; they are never edited or
    deleted, so the list stays a record of who could write to the ledger."""

    list_display = ["prefix", "name", "tenant", "scopes", "status", "expires_at", "last_used_at", "created_at"]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name"]
    list_select_related = ["tenant"]
    actions = ["revoke"]
    readonly_fields = [
        "tenant",
        "name",
        "prefix",
        "scopes",
        "person",
        "created_by",
        "created_at",
        "expires_at",
        "revoked_at",
        "revoked_by",
        "last_used_at",
    ]

    @admin.display(description="status")
    def status(self, obj: ApiToken) -> str:
        return obj.state_at(timezone.now())

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = ApiTokenCreateForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ApiTokenCreateForm.Meta.fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # view only; revoking is the list action

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.change_apitoken")

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        from ledgerdash.ledger.events import Actor
        from ledgerdash.ledger.tokens import token_create

        token, raw = token_create(
            tenant=form.cleaned_data["tenant"],
            name=form.cleaned_data["name"],
            scopes=form.cleaned_data["scopes"],
            expires_at=form.cleaned_data["expires_at"],
            actor=Actor.user(request.user),  # type: ignore[arg-type]
            person=form.cleaned_data.get("person"),
        )
        obj.pk, obj.prefix, obj.scopes = token.pk, token.prefix, token.scopes
        obj._raw_token = raw  # type: ignore[attr-defined]  # shown once by response_add, never stored

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: Any = None) -> HttpResponse:
        response = TemplateResponse(
            request,
            "admin/ledger/apitoken/created.html",
            {
                **self.admin_site.each_context(request),
                "title": "API token issued",
                "opts": self.opts,
                "token": obj,
                "secret": obj._raw_token,  # type: ignore[attr-defined]
            },
        )
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        from ledgerdash.ledger.events import Actor
        from ledgerdash.ledger.tokens import token_revoke

        actor = Actor.user(request.user)  # type: ignore[arg-type]
        live = list(queryset.filter(revoked_at__isnull=True))
        for token in live:
            token_revoke(token=token, actor=actor)
        self.message_user(request, f"Revoked {len(live)} token(s).", messages.SUCCESS)


@admin.register(DrillRun)
class DrillRunAdmin(ReadOnlyAdmin):
    """Stored crash-drill reports (the dashboard shows them to tenant members)."""

    list_display = ["id", "tenant", "ok", "cases_total", "cases_failed", "mode", "seed", "database", "started_at"]
    list_filter = ["ok", "tenant", "database"]


class PersonAdmin(UserAdmin):
    """Django's user admin, whose delete page also names the archives that keep a person (their
    events left the database, so no foreign key shows them)."""

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        to_delete, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        kept = [reason for person in objs if (reason := archive.keeps_person(person)) is not None]
        return to_delete, model_count, perms_needed, [*protected, *kept]


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), PersonAdmin)

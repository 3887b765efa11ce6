"""Configuration is audited: every change to who may do what (tenants,
memberships and roles, on-call shifts, policies) and to how a tool reaches
its provider (tools, tenants' credential bindings) is an event in the
affected tenants' chains, saying who made it and what changed, before and
after. Secrets are never in an event: credentials are bound by name, and
header values and secret-like settings of a tool show only the names they
reference.

Which rows are configuration, and how they are hooked so that no path of
the application can skip the event, is :mod:`ledgerdash.ledger.audited`.
Who made a change comes from :func:`acting_as`: the dashboard and
``/admin/`` set it to the signed-in person for the whole request
(:class:`ActorMiddleware`), the single sign-on sets it to the identity
provider, and a change made with none set (a management command, a shell)
is recorded as the process that made it (``manage.py demo``).

Which chains: a tenant's own changes, its memberships, shifts and
credential bindings go to its chain; a policy version to its tenant's; a
tool's change to every tenant whose current policy allows the tool (before
and after a rename). Policy versions are final: a version is never edited
or deleted, a change is the next version (:func:`~ledgerdash.ledger.policies.policy_publish`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F, OuterRef, Subquery
from django.db.models.signals import pre_delete
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from ledgerdash.ledger import audited, retention
from ledgerdash.ledger.events import Actor, EventDraft, EventKind
from ledgerdash.ledger.models import Membership, OnCallShift, Policy, Tenant, Tool, ToolCredential
from ledgerdash.ledger.store import append_events

if TYPE_CHECKING:
    from django.db.models import Model

POLICY_FINAL = "policy versions are final: publish the next version instead of editing or deleting one"
BULK_CONFLICTS = "configuration rows are not written with conflict handling: each change must be its own event"
TENANT_KEPT = "a tenant is never deleted (its chain must stay verifiable): deactivate it instead"

NOT_SHOWN = "(not shown)"
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_LIKE = re.compile(r"secret|token|password|passwd|credential|auth|api_?key|private", re.IGNORECASE)


class ConfigurationRefused(Exception):
    """A configuration write the ledger will not make (its message says why)."""


# --- who --------------------------------------------------------------------------------

_actor: ContextVar[Actor | None] = ContextVar("ledgerdash_config_actor", default=None)
#: The signed-in person of the request being answered, asked for lazily (:class:`ActorMiddleware`).
_request_person: ContextVar[Callable[[], Actor | None] | None] = ContextVar("ledgerdash_request_person", default=None)


@contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    """Record configuration changes made inside as made by ``actor``."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> Actor:
    actor = _actor.get()
    if actor is not None:
        return actor
    person = _request_person.get()
    if person is not None and (actor := person()) is not None:
        return actor
    argv = sys.argv
    if len(argv) > 1 and argv[0].endswith("manage.py"):
        return Actor.system(f"manage.py {argv[1]}")
    return Actor.system("system")


class ActorMiddleware:
    """Configuration changed while answering a signed-in person's request
    (the dashboard, ``/admin/``) is recorded as theirs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        # Asked only when a change is recorded: most requests (probes, the
        # API) never read the session, and must not need the database for it.
        def person() -> Actor | None:
            user = getattr(request, "user", None)
            return Actor.user(user) if user is not None and user.is_authenticated else None

        token = _request_person.set(person)
        try:
            return self.get_response(request)
        finally:
            _request_person.reset(token)


# --- what -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A configuration row as the audit sees it. ``values`` is compared;
    ``shown`` (secrets removed) is what an event keeps."""

    kind: EventKind
    what: str
    label: str
    tenant_ids: frozenset[int]
    values: dict[str, Any]
    shown: dict[str, Any] = field(default_factory=dict)


def _username(user_id: int | None) -> str | None:
    if user_id is None:
        return None
    from django.contrib.auth import get_user_model

    name = get_user_model()._default_manager.filter(pk=user_id).values_list("username", flat=True).first()
    return name if name is not None else f"user #{user_id}"


def _slug(tenant_id: int) -> str:
    return Tenant._base_manager.filter(pk=tenant_id).values_list("slug", flat=True).first() or f"tenant #{tenant_id}"


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def masked(key: str, value: Any) -> Any:
    """A tool setting as an event may show it: header values and secret-like
    settings show only the ``${NAME}`` references they contain."""
    if isinstance(value, dict):
        hide_all = key == "headers"
        return {k: (secret_names(v) if hide_all else masked(k, v)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(key, v) for v in value]
    if isinstance(value, str):
        if _SECRET_LIKE.search(key):
            return secret_names(value)
        return re.sub(r"(?<=://)[^/@\s]+@", "(not shown)@", value)  # credentials in a URL
    return value


def secret_names(value: Any) -> str:
    names = _REFERENCE.findall(value) if isinstance(value, str) else []
    return " ".join(f"${{{n}}}" for n in names) + (" " if names else "") + NOT_SHOWN


def tenants_allowing(*tool_names: str) -> frozenset[int]:
    """Tenants whose current (latest) policy version allows any of ``tool_names``."""
    latest = Policy.objects.filter(tenant=OuterRef("tenant")).order_by("-version").values("version")[:1]
    current = Policy.objects.annotate(latest=Subquery(latest)).filter(version=F("latest"))
    return frozenset(
        tenant_id
        for tenant_id, tools in current.values_list("tenant_id", "tools")
        if isinstance(tools, dict) and any(name in tools for name in tool_names)
    )


def snapshot(row: Model) -> Snapshot:
    if isinstance(row, Tenant):
        values: dict[str, Any] = {
            "slug": row.slug,
            "name": row.name,
            "is_active": row.is_active,
            "default_owner": _username(row.default_owner_id),
            "sla_minutes": row.sla_minutes,
            # The tenant's first event says how many chains its events are kept in (where not one).
            **({"chain_stripes": row.chain_stripes} if row.chain_stripes != 1 else {}),
        }
        return Snapshot(EventKind.TENANT, "tenant", row.slug, frozenset({row.pk}), values)
    if isinstance(row, Membership):
        user, slug = _username(row.user_id), _slug(row.tenant_id)
        values = {"user": user, "tenant": slug, "role": row.role}
        return Snapshot(EventKind.MEMBERSHIP, "membership", f"{user} in {slug}", frozenset({row.tenant_id}), values)
    if isinstance(row, OnCallShift):
        user = _username(row.user_id)
        values = {"user": user, "starts_at": _when(row.starts_at), "ends_at": _when(row.ends_at)}
        return Snapshot(EventKind.ON_CALL, "on-call shift", f"{user}", frozenset({row.tenant_id}), values)
    if isinstance(row, Policy):
        values = {"version": row.version, "tools": row.tools, "note": row.note}
        return Snapshot(EventKind.POLICY, "policy", f"v{row.version}", frozenset({row.tenant_id}), values)
    if isinstance(row, Tool):
        values = {
            "name": row.name,
            "adapter": row.adapter,
            "config": row.config,
            "idempotent": row.idempotent,
            "key_retention_seconds": row.key_retention_seconds,
            "dispatch_lease_seconds": row.dispatch_lease_seconds,
            "backoff_base_seconds": row.backoff_base_seconds,
            "max_checks": row.max_checks,
            "max_dispatches": row.max_dispatches,
            "max_request_seconds": row.max_request_seconds,
            "lookup_lag_seconds": row.lookup_lag_seconds,
            "claim_with_intent": row.claim_with_intent,
            "enabled": row.enabled,
        }
        shown = {**values, "config": masked("config", row.config)}
        return Snapshot(EventKind.TOOL, "tool", row.name, tenants_allowing(row.name), values, shown)
    if isinstance(row, ToolCredential):
        slug = _slug(row.tenant_id)
        tool = Tool._base_manager.filter(pk=row.tool_id).values_list("name", flat=True).first() or f"#{row.tool_id}"
        # The secret's name, never its value (which the database does not hold).
        values = {"tenant": slug, "tool": tool, "placeholder": row.placeholder, "secret_name": row.secret_name}
        label = f"{tool} ${{{row.placeholder}}} in {slug}"
        return Snapshot(EventKind.CREDENTIAL, "credential binding", label, frozenset({row.tenant_id}), values)
    raise TypeError(f"{type(row).__name__} is not a configuration row")


def _shown(snap: Snapshot) -> dict[str, Any]:
    return snap.shown or snap.values


def _text(value: Any) -> str:
    if value is None or value == "":
        return "(empty)"
    return str(value)


def _config_changes(old: Any, new: Any) -> list[str]:
    """The tool settings that differ (``headers.Authorization`` for a header), never their values."""
    old = old if isinstance(old, dict) else {}
    new = new if isinstance(new, dict) else {}
    names: list[str] = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        if key == "headers" and isinstance(old.get(key, {}), dict) and isinstance(new.get(key, {}), dict):
            headers_old, headers_new = old.get(key, {}), new.get(key, {})
            names += [
                f"headers.{h}"
                for h in sorted(set(headers_old) | set(headers_new))
                if headers_old.get(h) != headers_new.get(h)
            ]
        else:
            names.append(key)
    return names


def record_change(*, before: Snapshot | None, instance: Model | None, deleted: bool = False) -> None:
    """Append the event a configuration write makes, in the write's transaction.
    ``before`` is the row as it was (None: created); ``instance`` as it is
    now (with ``deleted``: as it was when it was deleted). A write that
    changed nothing appends nothing."""
    assert instance is not None
    after = None if deleted else snapshot(instance)
    if deleted:
        before = before or snapshot(instance)
    if isinstance(instance, Policy) and before is not None:
        raise ConfigurationRefused(POLICY_FINAL)
    current = after or before
    assert current is not None
    if before is None:
        change, changed = "created", sorted(_shown(current))
        old: dict[str, Any] | None = None
        new: dict[str, Any] | None = _shown(current)
        summary = f"{current.what} {current.label} created"
    elif after is None:
        change, changed = "deleted", sorted(_shown(before))
        old, new = _shown(before), None
        summary = f"{before.what} {before.label} removed"
    else:
        changed = sorted(k for k in after.values if before.values.get(k) != after.values.get(k))
        if not changed:
            return
        change = "changed"
        old = {k: _shown(before).get(k) for k in changed}
        new = {k: _shown(after).get(k) for k in changed}
        parts = [f"{k} {_text(old[k])} to {_text(new[k])}" if k != "config" else "config" for k in changed]
        summary = f"{after.what} {after.label} changed: " + ", ".join(parts)
    details: dict[str, Any] = {
        "object": current.what,
        "object_id": instance.pk,
        "change": change,
        "changed": changed,
        "before": old,
        "after": new,
    }
    if change == "changed" and "config" in changed and before is not None and after is not None:
        # Which settings moved, also where both sides show "(not shown)".
        details["config_changed"] = _config_changes(before.values.get("config"), after.values.get("config"))
    if isinstance(instance, Policy):
        # A published version, as policy events have always read: the
        # version is the whole change (nothing before it is edited).
        details = {"version": instance.version, "tools": instance.tools}
        if instance.approvals:
            details["approvals"] = instance.approvals
        summary = f"policy v{instance.version} published" + (f": {instance.note}" if instance.note else "")
    if isinstance(instance, Tool) and not deleted:
        retention.note(instance, before.values["config"] if before is not None else None)
    tenant_ids = current.tenant_ids | (before.tenant_ids if before is not None else frozenset())
    if not tenant_ids:
        return  # a tool no tenant allows: no chain is affected
    actor = current_actor()
    with transaction.atomic():
        append_events(
            [
                EventDraft(tenant_id, None, current.kind, actor, reason=summary, details=details)
                for tenant_id in sorted(tenant_ids)
            ]
        )


def refuse_delete(model: type[Model]) -> None:
    """Policies and tenants are never deleted; refused before anything is written."""
    if issubclass(model, Policy):
        raise ConfigurationRefused(POLICY_FINAL)
    if issubclass(model, Tenant):
        raise ConfigurationRefused(TENANT_KEPT)


def _on_delete(sender: type[Model], instance: Model, **kwargs: Any) -> None:
    """Deletes, cascades included: Django sends this inside the deletion's
    transaction, before any row is gone (and, with a receiver connected,
    never deletes these rows by the fast path that skips it)."""
    refuse_delete(type(instance))
    record_change(before=None, instance=instance, deleted=True)


AUDITED: tuple[type[Model], ...] = (Tenant, Membership, OnCallShift, Policy, Tool, ToolCredential)

for _model in AUDITED:
    pre_delete.connect(_on_delete, sender=_model, dispatch_uid=f"ledgerdash-config-{_model._meta.label}")


def refuse_bulk_conflicts() -> None:
    raise ConfigurationRefused(BULK_CONFLICTS)


class _Recorder:
    """This module's functions, as the hook :mod:`ledgerdash.ledger.audited` calls."""

    snapshot = staticmethod(snapshot)
    record_change = staticmethod(record_change)
    refuse_delete = staticmethod(refuse_delete)
    refuse_bulk_conflicts = staticmethod(refuse_bulk_conflicts)


audited.install(_Recorder())

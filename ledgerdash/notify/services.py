"""Changes to a tenant's channels and rules: one function per change, each
recorded as an event in the tenant's chain in the same transaction. Secrets
never go into events."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import transaction

from ledgerdash.ledger import clock
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import ApiToken, Tenant
from ledgerdash.ledger.store import event_record
from ledgerdash.notify import signing
from ledgerdash.notify.models import Channel, ChannelKind, Rule, RuleEvent
from ledgerdash.notify.outbox import start_seqs

CHANNEL_FIELDS = ("name", "kind", "target", "enabled")
RULE_FIELDS = (
    "event",
    "channel_id",
    "audience",
    "enabled",
    "sla_minutes",
    "tool_sla",
    "repeat_minutes",
    "stalled_minutes",
)
WRONG_TENANT = "the channel belongs to another tenant"
NO_CALLBACK_KEY = "an agent callback names the API token whose attempts it follows"
FOREIGN_CALLBACK_KEY = "the API token belongs to another tenant or is revoked"
CALLBACK_ONLY = "only an agent callback names an API token"
SIGNED = frozenset({ChannelKind.WEBHOOK, ChannelKind.AGENT})


def check_target(kind: str, target: str) -> str:
    """The target, cleaned, or a :class:`ValidationError` saying what is wrong."""
    target = target.strip()
    if kind == ChannelKind.EMAIL:
        addresses = [a.strip() for a in target.split(",") if a.strip()]
        if not addresses:
            raise ValidationError("give at least one email address")
        for address in addresses:
            validate_email(address)
        return ", ".join(addresses)
    URLValidator(schemes=["http", "https"])(target)
    return target


def _channel_view(channel: Channel) -> dict[str, Any]:
    token = {"token": channel.token.prefix} if channel.token else {}
    return {f: getattr(channel, f) for f in CHANNEL_FIELDS} | {"channel_id": channel.pk} | token


def _rule_view(rule: Rule) -> dict[str, Any]:
    return {f: getattr(rule, f) for f in RULE_FIELDS} | {"rule_id": rule.pk}


def channel_create(
    *, tenant: Tenant, name: str, kind: str, target: str, actor: Actor, token: ApiToken | None = None
) -> Channel:
    """Create a channel; a webhook or an agent callback gets a new signing
    secret (read it from the returned row once: it is never shown again)."""
    if kind == ChannelKind.AGENT and token is None:
        raise ValidationError(NO_CALLBACK_KEY)
    if kind != ChannelKind.AGENT and token is not None:
        raise ValidationError(CALLBACK_ONLY)
    if token is not None and (token.tenant_id != tenant.pk or token.revoked_at is not None):
        raise ValidationError(FOREIGN_CALLBACK_KEY)
    now = clock.now()
    with transaction.atomic():
        channel = Channel.objects.create(
            tenant=tenant,
            name=name.strip(),
            kind=kind,
            target=check_target(kind, target),
            token=token,
            from_seqs=start_seqs(tenant),
            secret=signing.new_secret() if kind in SIGNED else "",
            created_by_id=actor.user_id,
            created_at=now,
            updated_at=now,
        )
        event_record(
            tenant=tenant,
            kind=EventKind.NOTIFY_CHANNEL,
            actor=actor,
            reason=f"notification channel {channel.name!r} created",
            details={"action": "created", **_channel_view(channel)},
        )
    return channel


def channel_update(*, channel: Channel, actor: Actor, rotate_secret: bool = False, **changes: Any) -> Channel:
    """Change a channel's name, target or enabled flag (``rotate_secret``: a new webhook secret)."""
    unknown = set(changes) - {"name", "target", "enabled"}
    if unknown:
        raise ValueError(f"a channel's {', '.join(sorted(unknown))} cannot be changed")
    if "target" in changes:
        changes["target"] = check_target(channel.kind, changes["target"])
    before = _channel_view(channel)
    with transaction.atomic():
        for name, value in changes.items():
            setattr(channel, name, value)
        fields = [*changes, "updated_at"]
        if rotate_secret and channel.kind in SIGNED:
            channel.secret = signing.new_secret()
            fields.append("secret")
        channel.updated_at = clock.now()
        channel.save(update_fields=fields)
        after = _channel_view(channel)
        changed = {k: [before[k], after[k]] for k in after if before[k] != after[k]}
        action = "disabled" if changed.get("enabled") == [True, False] else "changed"
        event_record(
            tenant=channel.tenant_id,
            kind=EventKind.NOTIFY_CHANNEL,
            actor=actor,
            reason=f"notification channel {channel.name!r} {action}" + (", secret rotated" if rotate_secret else ""),
            details={"action": action, "channel_id": channel.pk, "changed": changed, "secret_rotated": rotate_secret},
        )
    return channel


def _check_rule(tenant_id: int, values: dict[str, Any]) -> None:
    if "event" in values:
        RuleEvent(values["event"])
    if "channel_id" in values and not Channel.objects.filter(pk=values["channel_id"], tenant_id=tenant_id).exists():
        raise ValidationError(WRONG_TENANT)
    tool_sla = values.get("tool_sla")
    if tool_sla is not None and (
        not isinstance(tool_sla, dict)
        or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in tool_sla.items()
        )
    ):
        raise ValidationError("per-tool SLAs are tool names with a whole number of minutes above 0")


def rule_create(*, tenant: Tenant, actor: Actor, **values: Any) -> Rule:
    """Create a rule; it matches events appended from now on."""
    unknown = set(values) - set(RULE_FIELDS)
    if unknown:
        raise ValueError(f"unknown rule fields: {', '.join(sorted(unknown))}")
    _check_rule(tenant.pk, values)
    now = clock.now()
    with transaction.atomic():
        starts = start_seqs(tenant)
        rule = Rule.objects.create(tenant=tenant, from_seqs=starts, created_at=now, updated_at=now, **values)
        event_record(
            tenant=tenant,
            kind=EventKind.NOTIFY_RULE,
            actor=actor,
            reason=f"notification rule {rule.get_event_display()!r} created",
            details={"action": "created", **_rule_view(rule)},
        )
    return rule


def rule_update(*, rule: Rule, actor: Actor, **changes: Any) -> Rule:
    unknown = set(changes) - set(RULE_FIELDS)
    if unknown:
        raise ValueError(f"unknown rule fields: {', '.join(sorted(unknown))}")
    _check_rule(rule.tenant_id, changes)
    before = _rule_view(rule)
    with transaction.atomic():
        for name, value in changes.items():
            setattr(rule, name, value)
        rule.updated_at = clock.now()
        rule.save(update_fields=[*changes, "updated_at"])
        after = _rule_view(rule)
        changed = {k: [before[k], after[k]] for k in after if before[k] != after[k]}
        action = "disabled" if changed.get("enabled") == [True, False] else "changed"
        event_record(
            tenant=rule.tenant_id,
            kind=EventKind.NOTIFY_RULE,
            actor=actor,
            reason=f"notification rule {rule.get_event_display()!r} {action}",
            details={"action": action, "rule_id": rule.pk, "changed": changed},
        )
    return rule

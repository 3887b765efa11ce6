"""The database's configuration written as the file describes it (with
tomli-w); an export applied at once changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import tomli_w
from django.utils import timezone

from ledgerdash.ledger.config.errors import ConfigError, where_at
from ledgerdash.ledger.config.plan import tool_values
from ledgerdash.ledger.config.schema import EMPTY
from ledgerdash.ledger.models import Membership, OnCallShift, Policy, Tenant, Tool, ToolCredential
from ledgerdash.notify.models import Channel, ChannelKind, Rule

# --- export -----------------------------------------------------------------------------


def current() -> dict[str, Any]:
    """The database's configuration, as the file describes it."""
    now = timezone.now()
    tools = {tool.name: tool_values(tool) for tool in Tool.objects.order_by("name")}
    for name, values in tools.items():
        if _holds_null(values["config"]):
            raise ConfigError(
                where_at("tools", name, "config"), "holds a null, which TOML cannot write: change it in /admin/"
            )
    tenants: dict[str, Any] = {}
    for tenant in Tenant.objects.order_by("slug").select_related("default_owner"):
        body: dict[str, Any] = {
            "name": tenant.name,
            "is_active": tenant.is_active,
            "sla_minutes": tenant.sla_minutes,
            "default_owner": tenant.default_owner.get_username() if tenant.default_owner else None,
            # Only where it is not the default: files written before it existed read the same.
            **({"chain_stripes": tenant.chain_stripes} if tenant.chain_stripes != 1 else {}),
        }
        policy = Policy.objects.filter(tenant=tenant).order_by("-version").first()
        if policy is not None:
            body["policy"] = {"tools": dict(policy.tools or {}), "approvals": dict(policy.approvals or {})}
        members = {
            m.user.get_username(): m.role
            for m in Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
        }
        if members:
            body["members"] = members
        credentials = [
            {"tool": c.tool.name, "placeholder": c.placeholder, "secret_name": c.secret_name}
            for c in ToolCredential.objects.filter(tenant=tenant)
            .select_related("tool")
            .order_by("tool__name", "placeholder")
        ]
        if credentials:
            body["credentials"] = credentials
        shifts = [
            {"user": s.user.get_username(), "starts_at": s.starts_at, "ends_at": s.ends_at}
            for s in OnCallShift.objects.filter(tenant=tenant, ends_at__gt=now)
            .select_related("user")
            .order_by("starts_at", "id")
        ]
        if shifts:
            body["on_call"] = shifts
        channels = list(Channel.objects.filter(tenant=tenant).exclude(kind=ChannelKind.AGENT).order_by("name"))
        if channels:
            body["channels"] = [
                {"name": c.name, "kind": c.kind, "target": c.target, "enabled": c.enabled} for c in channels
            ]
        rules = (
            Rule.objects.filter(tenant=tenant, channel__in=channels).select_related("channel").order_by("event", "id")
        )
        exported: dict[tuple[str, str], dict[str, Any]] = {}
        for rule in rules:
            exported.setdefault(
                (rule.event, rule.channel.name),
                {
                    "event": rule.event,
                    "channel": rule.channel.name,
                    "audience": rule.audience,
                    "enabled": rule.enabled,
                    "sla_minutes": rule.sla_minutes,
                    "tool_sla": dict(rule.tool_sla or {}),
                    "repeat_minutes": rule.repeat_minutes,
                    "stalled_minutes": rule.stalled_minutes,
                },
            )
        if exported:
            body["rules"] = list(exported.values())
        tenants[tenant.slug] = body
    allowed = {name for body in tenants.values() for name in body.get("policy", {}).get("tools", {})}
    return {"in_process_tools": sorted(allowed - set(tools)), "tools": tools, "tenants": tenants}


def _holds_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_null(v) for v in value)
    return value is None


def export() -> str:
    """The database's configuration as a file :func:`~ledgerdash.ledger.config.apply`
    takes (applying it at once changes nothing)."""
    header = [
        "# ledgerdash configuration, exported by manage.py ledger_config export.",
        "# Apply with: manage.py ledger_config plan FILE, then apply FILE.",
        '# "" is an empty value (the setting\'s default, for ever, or nobody).',
        "# On-call shifts that have ended are not exported; nothing here is a secret.",
    ]
    return "\n".join(header) + "\n\n" + tomli_w.dumps(_writable(current()))


def _writable(value: Any) -> Any:
    """``value`` as TOML can hold it: no null (an empty value is ""), every time with its offset."""
    if value is None:
        return EMPTY
    if isinstance(value, dict):
        return {key: _writable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_writable(item) for item in value]
    if isinstance(value, datetime) and not timezone.is_aware(value):
        return timezone.make_aware(value, UTC)
    return value

"""The plan: the desired state compared with the database, one step per
thing the file describes (create, change, publish a policy's next version,
or unchanged), then what the database has that the file does not (kept:
nothing is ever deleted). Each row is checked by its model's own validators
first, so what cannot be applied as written is refused here, naming its
place in the file. Planning writes nothing: each step that changes
something carries a :class:`Write`, which :mod:`.apply` makes.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from ledgerdash.ledger.config.errors import ConfigError, first_error, where_at
from ledgerdash.ledger.config.parse import Desired, PolicySpec, TenantSpec
from ledgerdash.ledger.config.schema import TOOL_FIELDS
from ledgerdash.ledger.configuration import masked, secret_names
from ledgerdash.ledger.models import Membership, OnCallShift, Policy, Tenant, Tool, ToolCredential
from ledgerdash.ledger.providers.factory import build_adapter, preset_facts
from ledgerdash.ledger.providers.presets import PresetAdapter
from ledgerdash.notify import services
from ledgerdash.notify.models import HELD_CALLS_MOVED, Channel, ChannelKind, Rule, RuleEvent

NEW_USER_NOTE = (
    "no usable password: set one with manage.py set_password (no prompt) or changepassword, or sign in through"
    " single sign-on"
)
CREATE, CHANGE, PUBLISH, UNCHANGED, KEPT = "create", "change", "publish", "unchanged", "kept"
#: What a :class:`Write` writes.
USER, TENANT, POLICY, TOOL, CREDENTIAL, MEMBERSHIP, SHIFT, CHANNEL, RULE = (
    "user",
    "tenant",
    "policy",
    "tool",
    "credential",
    "membership",
    "shift",
    "channel",
    "rule",
)


@dataclass(frozen=True)
class Write:
    """A write the plan calls for: a new ``thing`` (``row`` is None), or
    ``values`` set on ``row``."""

    thing: str
    #: The slug of the tenant it belongs to ("" for users and tools).
    tenant: str = ""
    #: What the file says of it, where the write needs more than ``values``.
    spec: Any = None
    row: models.Model | None = None
    #: A new row's settings, or the fields of ``row`` that change.
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """One line of the plan: what happens to one thing."""

    action: str
    what: str
    details: list[str] = field(default_factory=list)
    #: What applying the plan writes for it (None: nothing to do).
    write: Write | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        label = {KEPT: "kept (not in the file)"}.get(self.action, self.action)
        text = f"{label:<9} {self.what}"
        if self.details:
            text += ": " + "; ".join(self.details)
        return text


@dataclass
class Plan:
    source: str
    steps: list[Step]
    #: What applies as written but will cost people later (said, never refused).
    warnings: list[str] = field(default_factory=list)

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.write is not None]

    def summary(self) -> str:
        if not self.changes:
            return "no changes"
        counts = {a: sum(1 for s in self.steps if s.action == a) for a in (CREATE, CHANGE, PUBLISH)}
        parts = [f"{n} to {a}" for a, n in counts.items() if n]
        count = len(self.changes)
        return f"{count} change{'' if count == 1 else 's'}: " + ", ".join(parts)

    def lines(self) -> list[str]:
        kept = [s for s in self.steps if s.action == KEPT]
        body = [s.describe() for s in self.steps if s.action != KEPT]
        if kept:
            body += ["not in the file: kept (never deleted):"] + [f"  {s.what}" for s in kept]
        return [*body, *(f"warning: {w}" for w in self.warnings), self.summary()]


def make_plan(desired: Desired) -> Plan:
    """What applying ``desired`` would do; writes nothing. Raises
    :class:`ConfigError` when something cannot be applied as written."""
    steps: list[Step] = []
    steps += _user_steps(desired)
    tools = _tool_instances(desired)
    for tenant in desired.tenants:
        steps += _tenant_steps(tenant)
    for tenant in desired.tenants:
        if tenant.policy is not None:
            steps += _policy_steps(tenant, tenant.policy, set(tools) | set(desired.in_process))
    steps += _tool_steps(desired, tools)
    for tenant in desired.tenants:
        steps += _credential_steps(tenant, tools)
        steps += _member_steps(tenant)
        steps += _shift_steps(tenant)
        steps += _channel_steps(tenant)
        steps += _rule_steps(tenant)
    steps += _kept_steps(desired)
    return Plan(desired.source, steps, _tool_warnings(desired, tools) + _rule_warnings(desired))


def _rule_warnings(desired: Desired) -> list[str]:
    """A rule written with an event whose meaning is changing (retry_awaiting_approval without an
    awaiting_approval rule for the same channel)."""
    warnings = []
    for tenant in desired.tenants:
        twins = {rule.channel for rule in tenant.rules if rule.event == RuleEvent.AWAITING_APPROVAL}
        for rule in tenant.rules:
            if rule.event != RuleEvent.RETRY_AWAITING_APPROVAL or rule.channel in twins:
                continue
            kept = Rule.objects.filter(
                tenant__slug=tenant.slug, channel__name=rule.channel, event=RuleEvent.AWAITING_APPROVAL
            )
            if not kept.exists():
                warnings.append(f"{rule.where}: {HELD_CALLS_MOVED}")
    return warnings


def _tool_warnings(desired: Desired, tools: dict[str, Tool]) -> list[str]:
    """A tool the file describes whose calls the reconciler cannot look up at
    the provider (an HTTP tool without a ``lookup_url``): every call whose
    outcome its agent could not tell (a crash, a timeout) will wait for a person.
    A preset tool whose provider is set up to refuse or hide its calls, as
    the provider answers now (a Jira project without Labels on its create
    screen)."""
    warnings = []
    for spec in desired.tools:
        tool = tools[spec.name]
        if tool.adapter == "http" and not (tool.config or {}).get("lookup_url"):
            warnings.append(
                f"{spec.where}.config: no lookup_url: the reconciler cannot look this tool's calls up, so every "
                "call whose outcome its agent could not tell (a crash, a timeout) goes to a person "
                "(docs/providers.md says what a lookup answers)"
            )
        if tool.adapter == "preset":
            adapter = build_adapter(tool)
            if isinstance(adapter, PresetAdapter):
                warnings += [f"{spec.where}.config: {warning}" for warning in adapter.setup_warnings()]
    return warnings


def _show(value: Any) -> str:
    if value is None:
        return "(empty)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def _moved(name: str, old: Any, new: Any) -> str:
    return f"{name} from {_show(old)} to {_show(new)}"


def _when(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _config_moves(old: Any, new: Any, prefix: str = "config", hide_all: bool = False) -> list[str]:
    """The settings of a tool's config that differ: header values and
    secret-like settings show only the ``${NAME}`` references they hold."""
    old = old if isinstance(old, dict) else {}
    new = new if isinstance(new, dict) else {}
    found = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        name = f"{prefix}.{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            found += _config_moves(a, b, name, hide_all or key == "headers")
            continue
        shown_a, shown_b = (None if v is None else (secret_names(v) if hide_all else masked(key, v)) for v in (a, b))
        found.append(_moved(name, shown_a, shown_b) if shown_a != shown_b else f"{name} changed (not shown)")
    return found


def _refused(where: str, exc: ValidationError) -> ConfigError:
    bad, message = first_error(exc)
    return ConfigError(where_at(where, bad) if bad else where, message)


def _user_steps(desired: Desired) -> list[Step]:
    names = desired.usernames()
    existing = set(get_user_model()._default_manager.filter(username__in=names).values_list("username", flat=True))
    return [
        Step(CREATE, f"user {username}", [NEW_USER_NOTE], Write(USER, values={"username": username}))
        for username in names
        if username not in existing
    ]


def _tenant_steps(spec: TenantSpec) -> list[Step]:
    current = Tenant.objects.filter(slug=spec.slug).select_related("default_owner").first()
    probe = copy.copy(current) if current is not None else Tenant(slug=spec.slug)
    for name, value in spec.values.items():
        if name != "default_owner":
            setattr(probe, name, value)
    try:
        probe.full_clean(exclude=["default_owner", "created_at"])
    except ValidationError as exc:
        raise _refused(spec.where, exc) from None
    what = f"tenant {spec.slug}"
    if current is None:
        details = [f"{k} {_show(v)}" for k, v in spec.values.items()]
        return [Step(CREATE, what, details, Write(TENANT, spec.slug, values=spec.values))]
    now = {
        "name": current.name,
        "is_active": current.is_active,
        "sla_minutes": current.sla_minutes,
        "default_owner": current.default_owner.get_username() if current.default_owner else None,
        "chain_stripes": current.chain_stripes,
    }
    moved = {k: v for k, v in spec.values.items() if now[k] != v}
    if not moved:
        return [Step(UNCHANGED, what)]
    details = [_moved(k, now[k], v) for k, v in moved.items()]
    return [Step(CHANGE, what, details, Write(TENANT, spec.slug, row=current, values=moved))]


def _normal_tools(tools: dict[str, Any]) -> dict[str, list[str]]:
    return {name: sorted(scopes) for name, scopes in tools.items()}


def _policy_steps(tenant: TenantSpec, spec: PolicySpec, known: set[str]) -> list[Step]:
    for name in spec.tools:
        if name not in known:
            raise ConfigError(
                where_at(spec.where, "tools", name),
                "no such tool: describe it under [tools], or name it in in_process_tools "
                "when agents run it in their own process",
            )
    current = (
        Policy.objects.filter(tenant__slug=tenant.slug).order_by("-version").first()
        if Tenant.objects.filter(slug=tenant.slug).exists()
        else None
    )
    what = f"policy of {tenant.slug}"
    if current is not None:
        what += f" v{current.version}"
        old_tools, old_approvals = _normal_tools(current.tools or {}), dict(current.approvals or {})
    else:
        old_tools, old_approvals = {}, {}
    new_tools, new_approvals = _normal_tools(spec.tools), dict(spec.approvals)
    if current is not None and old_tools == new_tools and old_approvals == new_approvals:
        return [Step(UNCHANGED, what)]
    details = []
    for name in sorted(set(old_tools) | set(new_tools)):
        if name not in new_tools:
            details.append(f"drop {name}")
        elif name not in old_tools:
            details.append(f"allow {name} {' '.join(new_tools[name]) or '(no scopes)'}")
        elif old_tools[name] != new_tools[name]:
            details.append(_moved(f"{name} scopes", " ".join(old_tools[name]), " ".join(new_tools[name])))
    for name in sorted(set(old_approvals) | set(new_approvals)):
        if old_approvals.get(name) != new_approvals.get(name):
            details.append(_moved(f"approval of {name}", old_approvals.get(name), new_approvals.get(name)))
    version = (current.version + 1) if current is not None else 1
    return [Step(PUBLISH, f"policy of {tenant.slug} v{version}", details, Write(POLICY, tenant.slug, spec))]


def tool_values(tool: Tool) -> dict[str, Any]:
    """A tool's settings, as the file names them."""
    return {name: getattr(tool, name) for name in TOOL_FIELDS}


def _tool_instances(desired: Desired) -> dict[str, Tool]:
    """Every tool as it will be: the database's, with the file's values over
    them, each checked by the model (``Tool.full_clean``)."""
    tools = {tool.name: tool for tool in Tool.objects.all()}
    for spec in desired.tools:
        current = tools.get(spec.name)
        probe = copy.copy(current) if current is not None else Tool(name=spec.name)
        for name, value in spec.values.items():
            setattr(probe, name, value)
        preset = preset_facts(probe)
        if current is None and preset is not None:
            # A new preset tool takes its provider's facts unless the file states them.
            if "idempotent" not in spec.values:
                probe.idempotent = preset.deduplicates
            if "key_retention_seconds" not in spec.values:
                probe.key_retention_seconds = preset.retention_seconds
        try:
            probe.full_clean()
        except ValidationError as exc:
            raise _refused(spec.where, exc) from None
        tools[spec.name] = probe
    return tools


def _tool_steps(desired: Desired, tools: dict[str, Tool]) -> list[Step]:
    steps = []
    for spec in desired.tools:
        current = Tool.objects.filter(name=spec.name).first()
        what = f"tool {spec.name}"
        if current is None:
            details = [f"{k} {_show(v)}" for k, v in spec.values.items() if k != "config"]
            values = {"name": spec.name, **tool_values(tools[spec.name])}
            steps.append(Step(CREATE, what, details, Write(TOOL, values=values)))
            continue
        now = tool_values(current)
        moved = {k: v for k, v in spec.values.items() if now[k] != v}
        if not moved:
            steps.append(Step(UNCHANGED, what))
            continue
        details = []
        for name, value in moved.items():
            details += _config_moves(now[name], value) if name == "config" else [_moved(name, now[name], value)]
        steps.append(Step(CHANGE, what, details, Write(TOOL, row=current, values=moved)))
    return steps


def _credential_steps(tenant: TenantSpec, tools: dict[str, Tool]) -> list[Step]:
    steps = []
    for spec in tenant.credentials:
        tool = tools.get(spec.tool)
        if tool is None:
            raise ConfigError(where_at(spec.where, "tool"), f"no such tool {spec.tool!r}")
        probe_tool = copy.copy(tool)
        if probe_tool.pk is None:
            probe_tool.pk = 0  # lets the binding's own check read the tool's headers
        probe = ToolCredential(placeholder=spec.placeholder, secret_name=spec.secret_name)
        probe.tool = probe_tool
        try:
            probe.clean_fields(exclude=["tenant", "tool", "created_at"])
            probe.clean()
        except ValidationError as exc:
            raise _refused(spec.where, exc) from None
        what = f"credential binding {spec.tool} ${{{spec.placeholder}}} in {tenant.slug}"
        current = ToolCredential.objects.filter(
            tenant__slug=tenant.slug, tool__name=spec.tool, placeholder=spec.placeholder
        ).first()
        values = {"tool": spec.tool, "placeholder": spec.placeholder, "secret_name": spec.secret_name}
        create = Write(CREDENTIAL, tenant.slug, values=values)
        steps.append(_setting_step(what, current, "secret_name", create, f"secret_name {_show(spec.secret_name)}"))
    return steps


def _setting_step(
    what: str, row: models.Model | None, name: str, create: Write, created: str, show: Any = lambda value: value
) -> Step:
    """The step for a row that the file settles by one setting, ``name``:
    ``create`` it (``created`` says with what), leave it, or change that setting."""
    if row is None:
        return Step(CREATE, what, [created], create)
    wanted = create.values[name]
    if getattr(row, name) == wanted:
        return Step(UNCHANGED, what)
    change = Write(create.thing, create.tenant, row=row, values={name: wanted})
    return Step(CHANGE, what, [_moved(name, show(getattr(row, name)), show(wanted))], change)


def _member_steps(tenant: TenantSpec) -> list[Step]:
    current = {
        m.user.get_username(): m
        for m in Membership.objects.filter(
            tenant__slug=tenant.slug, user__username__in=list(tenant.members)
        ).select_related("user")
    }
    steps = []
    for username, role in tenant.members.items():
        create = Write(MEMBERSHIP, tenant.slug, values={"user": username, "role": role})
        what = f"membership {username} in {tenant.slug}"
        steps.append(_setting_step(what, current.get(username), "role", create, f"role {role}"))
    return steps


def _shift_steps(tenant: TenantSpec) -> list[Step]:
    steps = []
    for spec in tenant.on_call:
        what = f"on-call shift of {spec.user} in {tenant.slug} from {_when(spec.starts_at)}"
        row = OnCallShift.objects.filter(
            tenant__slug=tenant.slug, user__username=spec.user, starts_at=spec.starts_at
        ).first()
        values = {"user": spec.user, "starts_at": spec.starts_at, "ends_at": spec.ends_at}
        create = Write(SHIFT, tenant.slug, values=values)
        steps.append(_setting_step(what, row, "ends_at", create, f"ends_at {_when(spec.ends_at)}", show=_when))
    return steps


def _channel_steps(tenant: TenantSpec) -> list[Step]:
    steps = []
    for spec in tenant.channels:
        what = f"channel {spec.name} in {tenant.slug}"
        row = Channel.objects.filter(tenant__slug=tenant.slug, name=spec.name).first()
        if row is None:
            if spec.kind is None or spec.target is None:
                raise ConfigError(spec.where, "a new channel needs its kind and target")
            details = [f"kind {spec.kind}", f"target {_show(spec.target)}"]
            if spec.enabled is False:
                details.append("disabled")
            steps.append(Step(CREATE, what, details, Write(CHANNEL, tenant.slug, spec)))
            continue
        if spec.kind is not None and spec.kind != row.kind:
            raise ConfigError(
                where_at(spec.where, "kind"),
                f"channel {spec.name!r} is {_show(row.kind)}; a channel's kind is not changed (name a new one)",
            )
        try:
            target = services.check_target(row.kind, spec.target) if spec.target is not None else None
        except ValidationError as exc:
            raise ConfigError(where_at(spec.where, "target"), "; ".join(exc.messages)) from None
        moved: dict[str, Any] = {}
        if target is not None and target != row.target:
            moved["target"] = target
        if spec.enabled is not None and spec.enabled != row.enabled:
            moved["enabled"] = spec.enabled
        if not moved:
            steps.append(Step(UNCHANGED, what))
            continue
        details = [_moved(k, getattr(row, k), v) for k, v in moved.items()]
        steps.append(Step(CHANGE, what, details, Write(CHANNEL, tenant.slug, row=row, values=moved)))
    return steps


def _rule_steps(tenant: TenantSpec) -> list[Step]:
    names = {c.name for c in tenant.channels}
    steps = []
    for spec in tenant.rules:
        channel = Channel.objects.filter(tenant__slug=tenant.slug, name=spec.channel).first()
        if channel is None and spec.channel not in names:
            raise ConfigError(where_at(spec.where, "channel"), f"no channel {spec.channel!r} in {tenant.slug}")
        if channel is not None and channel.kind == ChannelKind.AGENT:
            raise ConfigError(where_at(spec.where, "channel"), "an agent callback needs no rule")
        what = f"rule {spec.event} -> {spec.channel} in {tenant.slug}"
        row = (
            Rule.objects.filter(tenant__slug=tenant.slug, event=spec.event, channel=channel).order_by("id").first()
            if channel is not None
            else None
        )
        if row is None:
            details = [f"{k} {_show(v)}" for k, v in spec.values.items()]
            steps.append(Step(CREATE, what, details, Write(RULE, tenant.slug, spec)))
            continue
        moved = {k: v for k, v in spec.values.items() if getattr(row, k) != v}
        if not moved:
            steps.append(Step(UNCHANGED, what))
            continue
        details = [_moved(k, getattr(row, k), v) for k, v in moved.items()]
        steps.append(Step(CHANGE, what, details, Write(RULE, tenant.slug, row=row, values=moved)))
    return steps


def _kept_steps(desired: Desired) -> list[Step]:
    steps = []
    in_file = {t.slug for t in desired.tenants}
    steps += [
        Step(KEPT, f"tenant {slug}") for slug in Tenant.objects.exclude(slug__in=in_file).values_list("slug", flat=True)
    ]
    tool_names = {t.name for t in desired.tools}
    steps += [
        Step(KEPT, f"tool {name}") for name in Tool.objects.exclude(name__in=tool_names).values_list("name", flat=True)
    ]
    now = timezone.now()
    for tenant in desired.tenants:
        slug = tenant.slug
        if tenant.policy is None:
            policy = Policy.objects.filter(tenant__slug=slug).order_by("-version").first()
            if policy is not None:
                steps.append(Step(KEPT, f"policy of {slug} v{policy.version}"))
        for username, role in (
            Membership.objects.filter(tenant__slug=slug)
            .exclude(user__username__in=list(tenant.members))
            .values_list("user__username", "role")
        ):
            steps.append(Step(KEPT, f"membership {username} in {slug} ({role})"))
        bound = {(c.tool, c.placeholder) for c in tenant.credentials}
        for tool, placeholder in ToolCredential.objects.filter(tenant__slug=slug).values_list(
            "tool__name", "placeholder"
        ):
            if (tool, placeholder) not in bound:
                steps.append(Step(KEPT, f"credential binding {tool} ${{{placeholder}}} in {slug}"))
        shifts = {(s.user, s.starts_at) for s in tenant.on_call}
        for row in OnCallShift.objects.filter(tenant__slug=slug, ends_at__gt=now).select_related("user"):
            if (row.user.get_username(), row.starts_at) not in shifts:
                steps.append(
                    Step(KEPT, f"on-call shift of {row.user.get_username()} in {slug} from {_when(row.starts_at)}")
                )
        channels = {c.name for c in tenant.channels}
        for name in Channel.objects.filter(tenant__slug=slug).values_list("name", flat=True):
            if name not in channels:
                steps.append(Step(KEPT, f"channel {name} in {slug}"))
        rules = {(r.event, r.channel) for r in tenant.rules}
        for event, channel in Rule.objects.filter(tenant__slug=slug).values_list("event", "channel__name"):
            if (event, channel) not in rules:
                steps.append(Step(KEPT, f"rule {event} -> {channel} in {slug}"))
    return steps

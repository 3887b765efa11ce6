"""Configuration as code: tenants, their policies, members, on-call shifts,
credential bindings and notifications, and the tools, described in one TOML
file (``manage.py ledger_config``; see docs/configuration.md).

Three steps: :func:`parse` reads the file into the desired state (plain
dataclasses, every key and type checked, each error naming where in the
file it is); :func:`make_plan` compares it with the database and lists what
would be created or changed, what is already so, and what the database has
that the file does not (kept: nothing is ever deleted), checking each row
with the models' own validators; :func:`apply` makes those changes, in one
transaction. Every change is written the way the dashboard writes it, so
each is an event in the affected tenant's chain: the configuration rows
record their own (:mod:`ledgerdash.ledger.configuration`), a policy is the
next version (:func:`~ledgerdash.ledger.policies.policy_publish`, only when
its tools or approvals differ), notification channels and rules go through
:mod:`ledgerdash.notify.services`.

Secrets are never in the file: a tool's headers reference them as
``${NAME}``, and a tenant binds a name to the name of its own secret.
:func:`export` writes the database's configuration in the same format; an
export applied at once changes nothing.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from ledgerdash.ledger.configuration import acting_as, masked, secret_names
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import (
    Membership,
    OnCallShift,
    Policy,
    Role,
    Tenant,
    Tool,
    ToolCredential,
    validate_policy_approvals,
    validate_policy_tools,
)
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.notify import services
from ledgerdash.notify.models import Audience, Channel, ChannelKind, Rule, RuleEvent

ACTOR = Actor.system("manage.py ledger_config")
DEFAULT_NOTE = "published by manage.py ledger_config"
NEW_USER_NOTE = (
    "no usable password: set one with manage.py set_password (no prompt) or changepassword, or sign in through"
    " single sign-on"
)
#: Nullable fields take this for "not set" (TOML has no null).
EMPTY = ""

# --- errors -----------------------------------------------------------------------------


class ConfigError(Exception):
    """Bad input: ``where`` in the file (a dotted key path), and what is wrong."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    return name if _BARE.match(name) else json.dumps(name, ensure_ascii=False)


def _at(where: str, *keys: str | int) -> str:
    for key in keys:
        where = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{_key(key)}" if where else _key(key))
    return where


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    """The field (None: the row as a whole) and message of a model's first complaint."""
    if hasattr(exc, "error_dict"):
        name, errors = next(iter(exc.message_dict.items()))
        return (None if name == "__all__" else name), "; ".join(errors)
    return None, "; ".join(exc.messages)


# --- types ------------------------------------------------------------------------------


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a table, not {_kind(value)}")
    return value


def _tables(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ConfigError(where, f"must be an array of tables ([[{where}]]), not {_kind(value)}")
    return [_table(item, _at(where, n)) for n, item in enumerate(value)]


def _only(table: dict[str, Any], where: str, known: Iterable[str], required: Iterable[str] = ()) -> None:
    known = list(known)
    for key in table:
        if key not in known:
            raise ConfigError(_at(where, key), f"unknown key (known here: {', '.join(known)})")
    for key in required:
        if key not in table:
            raise ConfigError(_at(where, key), "is required")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(where, f"must be a string, not {_kind(value)}")
    return value


def _check(kind: str, value: Any, where: str) -> Any:
    """``value`` as a field of ``kind`` wants it; nullable kinds (``?``) take "" for empty."""
    if kind.endswith("?"):
        if value == EMPTY:
            return None
        kind = kind[:-1]
    if kind == "str":
        return _text(value, where)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(where, f"must be true or false, not {_kind(value)}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"must be an integer, not {_kind(value)}")
        if value < 0:
            raise ConfigError(where, "must not be negative")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"must be a number, not {_kind(value)}")
        return float(value)
    if kind == "table":
        return _table(value, where)
    if kind == "when":
        if not isinstance(value, datetime):
            raise ConfigError(where, f"must be a date and time (1979-05-27T07:32:00Z), not {_kind(value)}")
        if value.tzinfo is None:
            raise ConfigError(where, "needs an offset (Z for UTC, or +02:00)")
        return value
    raise AssertionError(kind)


def _fields(table: dict[str, Any], where: str, schema: dict[str, str]) -> dict[str, Any]:
    return {name: _check(schema[name], table[name], _at(where, name)) for name in schema if name in table}


# --- the desired state ------------------------------------------------------------------

TOOL_FIELDS = {
    "adapter": "str",
    "config": "table",
    "idempotent": "bool",
    "key_retention_seconds": "int?",
    "max_request_seconds": "number",
    "dispatch_lease_seconds": "number?",
    "backoff_base_seconds": "number",
    "max_checks": "int",
    "max_dispatches": "int",
    "enabled": "bool",
    "claim_with_intent": "bool",
}
TENANT_FIELDS = {
    "name": "str",
    "is_active": "bool",
    "sla_minutes": "int?",
    "default_owner": "str?",
    "chain_stripes": "int",
}
TENANT_PARTS = ("policy", "members", "credentials", "on_call", "channels", "rules")
CREDENTIAL_FIELDS = {"tool": "str", "placeholder": "str", "secret_name": "str"}
SHIFT_FIELDS = {"user": "str", "starts_at": "when", "ends_at": "when"}
CHANNEL_FIELDS = {"name": "str", "kind": "str", "target": "str", "enabled": "bool"}
RULE_FIELDS = {
    "event": "str",
    "channel": "str",
    "audience": "str",
    "enabled": "bool",
    "sla_minutes": "int",
    "tool_sla": "table",
    "repeat_minutes": "int",
    "stalled_minutes": "int",
}
#: Channel kinds the file describes: an agent's callback follows one API
#: token, which is made by hand (its secret is shown once), so it is too.
FILE_CHANNEL_KINDS = (ChannelKind.WEBHOOK, ChannelKind.SLACK, ChannelKind.EMAIL)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    where: str
    #: Only the fields the file gives: the others are left as they are (a new tool: the defaults).
    values: dict[str, Any]


@dataclass(frozen=True)
class PolicySpec:
    where: str
    tools: dict[str, list[str]]
    approvals: dict[str, str]
    note: str


@dataclass(frozen=True)
class CredentialSpec:
    where: str
    tool: str
    placeholder: str
    secret_name: str


@dataclass(frozen=True)
class ShiftSpec:
    where: str
    user: str
    starts_at: datetime
    ends_at: datetime


@dataclass(frozen=True)
class ChannelSpec:
    where: str
    name: str
    kind: str | None
    target: str | None
    enabled: bool | None


@dataclass(frozen=True)
class RuleSpec:
    where: str
    event: str
    channel: str
    values: dict[str, Any]


@dataclass(frozen=True)
class TenantSpec:
    slug: str
    where: str
    values: dict[str, Any]
    policy: PolicySpec | None
    members: dict[str, str]
    credentials: list[CredentialSpec]
    on_call: list[ShiftSpec]
    channels: list[ChannelSpec]
    rules: list[RuleSpec]


@dataclass(frozen=True)
class Desired:
    """What the file says the configuration is."""

    source: str
    tools: list[ToolSpec]
    tenants: list[TenantSpec]
    #: Tools agents run in their own process (no provider adapter, no Tool
    #: row): policies may allow them.
    in_process: list[str] = field(default_factory=list)

    def usernames(self) -> list[tuple[str, str]]:
        """Every person the file names, with where it first does."""
        seen: dict[str, str] = {}
        for tenant in self.tenants:
            owner = tenant.values.get("default_owner")
            if owner:
                seen.setdefault(owner, _at(tenant.where, "default_owner"))
            for username in tenant.members:
                seen.setdefault(username, _at(tenant.where, "members", username))
            for shift in tenant.on_call:
                seen.setdefault(shift.user, _at(shift.where, "user"))
        return list(seen.items())


def parse(text: str, source: str = "the file") -> Desired:
    """The desired state ``text`` describes, or :class:`ConfigError` naming
    where it is wrong (a key path; ``source`` for a file that is not TOML)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    _only(raw, "", ("in_process_tools", "tools", "tenants"))
    tools = [
        _tool(name, _table(body, _at("tools", name))) for name, body in _table(raw.get("tools", {}), "tools").items()
    ]
    tenants = [
        _tenant(slug, _table(body, _at("tenants", slug)))
        for slug, body in _table(raw.get("tenants", {}), "tenants").items()
    ]
    in_process = raw.get("in_process_tools", [])
    if not isinstance(in_process, list):
        raise ConfigError("in_process_tools", f"must be an array of tool names, not {_kind(in_process)}")
    for n, name in enumerate(in_process):
        if not _text(name, _at("in_process_tools", n)).strip():
            raise ConfigError(_at("in_process_tools", n), "a tool name is not empty")
    return Desired(source, tools, tenants, list(in_process))


def parse_file(path: str | Path) -> Desired:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot be read: {exc}") from None
    return parse(text, str(path))


def _username(value: Any, where: str) -> str:
    name = _text(value, where)
    try:
        get_user_model().username_validator(name)
    except ValidationError as exc:
        raise ConfigError(where, f"{name!r} is not a username: {'; '.join(exc.messages)}") from None
    if not name or len(name) > 150:
        raise ConfigError(where, "a username has 1 to 150 characters")
    return name


def _tool(name: str, body: dict[str, Any]) -> ToolSpec:
    where = _at("tools", name)
    _only(body, where, TOOL_FIELDS)
    return ToolSpec(name, where, _fields(body, where, TOOL_FIELDS))


def _tenant(slug: str, body: dict[str, Any]) -> TenantSpec:
    where = _at("tenants", slug)
    _only(body, where, [*TENANT_FIELDS, *TENANT_PARTS])
    values = _fields(body, where, TENANT_FIELDS)
    if values.get("default_owner"):
        _username(values["default_owner"], _at(where, "default_owner"))
    policy = _policy(_table(body["policy"], _at(where, "policy")), _at(where, "policy")) if "policy" in body else None
    members: dict[str, str] = {}
    for username, role in _table(body.get("members", {}), _at(where, "members")).items():
        at = _at(where, "members", username)
        _username(username, at)
        role = _text(role, at)
        if role not in Role.values:
            raise ConfigError(at, f"unknown role {role!r} (one of {', '.join(Role.values)})")
        members[username] = role
    credentials = []
    for n, item in enumerate(_tables(body.get("credentials", []), _at(where, "credentials"))):
        at = _at(where, "credentials", n)
        _only(item, at, CREDENTIAL_FIELDS, required=CREDENTIAL_FIELDS)
        given = _fields(item, at, CREDENTIAL_FIELDS)
        credentials.append(CredentialSpec(at, given["tool"], given["placeholder"], given["secret_name"]))
    _unique([(c.tool, c.placeholder) for c in credentials], credentials, "a second binding of this placeholder")
    on_call = []
    for n, item in enumerate(_tables(body.get("on_call", []), _at(where, "on_call"))):
        at = _at(where, "on_call", n)
        _only(item, at, SHIFT_FIELDS, required=SHIFT_FIELDS)
        given = _fields(item, at, SHIFT_FIELDS)
        _username(given["user"], _at(at, "user"))
        if given["ends_at"] <= given["starts_at"]:
            raise ConfigError(_at(at, "ends_at"), "a shift must end after it starts")
        on_call.append(ShiftSpec(at, given["user"], given["starts_at"], given["ends_at"]))
    _unique([(s.user, s.starts_at) for s in on_call], on_call, "a second shift of this person starting then")
    channels = []
    for n, item in enumerate(_tables(body.get("channels", []), _at(where, "channels"))):
        at = _at(where, "channels", n)
        _only(item, at, CHANNEL_FIELDS, required=["name"])
        given = _fields(item, at, CHANNEL_FIELDS)
        kind = given.get("kind")
        if kind is not None and kind not in FILE_CHANNEL_KINDS:
            raise ConfigError(
                _at(at, "kind"),
                f"{kind!r} is not a channel kind the file describes (one of {', '.join(FILE_CHANNEL_KINDS)}; "
                "an agent callback is made with its API token, in the dashboard)",
            )
        if kind is not None and "target" in given:
            try:
                given["target"] = services.check_target(kind, given["target"])
            except ValidationError as exc:
                raise ConfigError(_at(at, "target"), "; ".join(exc.messages)) from None
        channels.append(ChannelSpec(at, given["name"], kind, given.get("target"), given.get("enabled")))
    _unique([(c.name,) for c in channels], channels, "a second channel of this name")
    rules = []
    for n, item in enumerate(_tables(body.get("rules", []), _at(where, "rules"))):
        at = _at(where, "rules", n)
        _only(item, at, RULE_FIELDS, required=["event", "channel"])
        given = _fields(item, at, RULE_FIELDS)
        if given["event"] not in RuleEvent.values:
            raise ConfigError(_at(at, "event"), f"unknown event (one of {', '.join(RuleEvent.values)})")
        if "audience" in given and given["audience"] not in Audience.values:
            raise ConfigError(_at(at, "audience"), f"unknown audience (one of {', '.join(Audience.values)})")
        for tool, minutes in given.get("tool_sla", {}).items():
            if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes <= 0:
                raise ConfigError(_at(at, "tool_sla", tool), "a whole number of minutes above 0")
        settings = {k: v for k, v in given.items() if k not in ("event", "channel")}
        rules.append(RuleSpec(at, given["event"], given["channel"], settings))
    _unique([(r.event, r.channel) for r in rules], rules, "a second rule for this event and channel")
    return TenantSpec(slug, where, values, policy, members, credentials, on_call, channels, rules)


def _unique(keys: list[tuple[Any, ...]], specs: list[Any], message: str) -> None:
    seen: set[tuple[Any, ...]] = set()
    for key, spec in zip(keys, specs, strict=True):
        if key in seen:
            raise ConfigError(spec.where, message)
        seen.add(key)


def _policy(body: dict[str, Any], where: str) -> PolicySpec:
    _only(body, where, ("tools", "approvals", "note"), required=["tools"])
    tools = _table(body["tools"], _at(where, "tools"))
    approvals = _table(body.get("approvals", {}), _at(where, "approvals"))
    note = _text(body.get("note", DEFAULT_NOTE), _at(where, "note"))
    for name, scopes in tools.items():
        try:
            validate_policy_tools({name: scopes})
        except ValidationError as exc:
            raise ConfigError(_at(where, "tools", name), "; ".join(exc.messages)) from None
    for name, condition in approvals.items():
        try:
            validate_policy_approvals({name: condition}, tools)
        except ValidationError as exc:
            raise ConfigError(_at(where, "approvals", name), "; ".join(exc.messages)) from None
    return PolicySpec(where, dict(tools), dict(approvals), note)


# --- the plan ---------------------------------------------------------------------------

CREATE, CHANGE, PUBLISH, UNCHANGED, KEPT = "create", "change", "publish", "unchanged", "kept"


@dataclass
class Step:
    """One line of the plan: what happens to one thing, and how."""

    action: str
    what: str
    details: list[str] = field(default_factory=list)
    #: Makes the change (None: nothing to do); may return a line to show once.
    run: Callable[[Actor], str | None] | None = field(default=None, repr=False, compare=False)

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

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.run is not None]

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
        return [*body, self.summary()]


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


def _user_model() -> Any:
    return get_user_model()


def _user(username: str | None) -> Any:
    if not username:
        return None
    return _user_model()._default_manager.get_by_natural_key(username)


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
    return Plan(desired.source, steps)


def apply(desired: Desired, *, actor: Actor = ACTOR) -> tuple[Plan, list[str]]:
    """Make the plan's changes in one transaction (all or none); the plan,
    and the lines to show once (a new webhook's signing secret)."""
    shown: list[str] = []
    with transaction.atomic(), acting_as(actor):
        plan = make_plan(desired)
        for step in plan.changes:
            assert step.run is not None
            line = step.run(actor)
            if line:
                shown.append(line)
        left = make_plan(desired).changes
        if left:  # the database must now be as the file says: else undo it all
            raise RuntimeError("apply left changes unmade: " + "; ".join(step.describe() for step in left))
    return plan, shown


def _user_steps(desired: Desired) -> list[Step]:
    existing = set(
        _user_model()
        ._default_manager.filter(username__in=[name for name, _ in desired.usernames()])
        .values_list("username", flat=True)
    )
    steps = []
    for username, _where in desired.usernames():
        if username in existing:
            continue

        def create(_actor: Actor, username: str = username) -> None:
            _user_model()._default_manager.create_user(username=username)

        steps.append(Step(CREATE, f"user {username}", [NEW_USER_NOTE], create))
    return steps


def _tenant_steps(spec: TenantSpec) -> list[Step]:
    current = Tenant.objects.filter(slug=spec.slug).select_related("default_owner").first()
    probe = copy.copy(current) if current is not None else Tenant(slug=spec.slug)
    for name, value in spec.values.items():
        if name != "default_owner":
            setattr(probe, name, value)
    try:
        probe.full_clean(exclude=["default_owner", "created_at"])
    except ValidationError as exc:
        bad, message = _first_error(exc)
        raise ConfigError(_at(spec.where, bad) if bad else spec.where, message) from None
    what = f"tenant {spec.slug}"
    if current is None:

        def create(_actor: Actor) -> None:
            values = {k: v for k, v in spec.values.items() if k != "default_owner"}
            Tenant.objects.create(slug=spec.slug, default_owner=_user(spec.values.get("default_owner")), **values)

        details = [f"{k} {_show(v)}" for k, v in spec.values.items()]
        return [Step(CREATE, what, details, create)]
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

    def change(_actor: Actor) -> None:
        row = Tenant.objects.get(slug=spec.slug)
        for name, value in moved.items():
            setattr(row, name, _user(value) if name == "default_owner" else value)
        row.save()

    return [Step(CHANGE, what, [_moved(k, now[k], v) for k, v in moved.items()], change)]


def _normal_tools(tools: dict[str, Any]) -> dict[str, list[str]]:
    return {name: sorted(scopes) for name, scopes in tools.items()}


def _policy_steps(tenant: TenantSpec, spec: PolicySpec, known: set[str]) -> list[Step]:
    for name in spec.tools:
        if name not in known:
            raise ConfigError(
                _at(spec.where, "tools", name),
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

    def publish(actor: Actor) -> None:
        policy_publish(
            tenant=Tenant.objects.get(slug=tenant.slug),
            tools=spec.tools,
            approvals=spec.approvals,
            note=spec.note,
            actor=actor,
        )

    return [Step(PUBLISH, f"policy of {tenant.slug} v{version}", details, publish)]


def _tool_values(tool: Tool) -> dict[str, Any]:
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
        try:
            probe.full_clean()
        except ValidationError as exc:
            bad, message = _first_error(exc)
            raise ConfigError(_at(spec.where, bad) if bad else spec.where, message) from None
        tools[spec.name] = probe
    return tools


def _tool_steps(desired: Desired, tools: dict[str, Tool]) -> list[Step]:
    steps = []
    for spec in desired.tools:
        current = Tool.objects.filter(name=spec.name).first()
        what = f"tool {spec.name}"
        wanted = _tool_values(tools[spec.name])
        if current is None:

            def create(_actor: Actor, name: str = spec.name, values: dict[str, Any] = wanted) -> None:
                Tool.objects.create(name=name, **values)

            details = [f"{k} {_show(v)}" for k, v in spec.values.items() if k != "config"]
            steps.append(Step(CREATE, what, details, create))
            continue
        now = _tool_values(current)
        moved = {k: v for k, v in spec.values.items() if now[k] != v}
        if not moved:
            steps.append(Step(UNCHANGED, what))
            continue
        details = []
        for name, value in moved.items():
            details += _config_moves(now[name], value) if name == "config" else [_moved(name, now[name], value)]

        def change(_actor: Actor, name: str = spec.name, moved: dict[str, Any] = moved) -> None:
            row = Tool.objects.get(name=name)
            for key, value in moved.items():
                setattr(row, key, value)
            row.save()

        steps.append(Step(CHANGE, what, details, change))
    return steps


def _credential_steps(tenant: TenantSpec, tools: dict[str, Tool]) -> list[Step]:
    steps = []
    for spec in tenant.credentials:
        tool = tools.get(spec.tool)
        if tool is None:
            raise ConfigError(_at(spec.where, "tool"), f"no such tool {spec.tool!r}")
        probe_tool = copy.copy(tool)
        if probe_tool.pk is None:
            probe_tool.pk = 0  # lets the binding's own check read the tool's headers
        probe = ToolCredential(placeholder=spec.placeholder, secret_name=spec.secret_name)
        probe.tool = probe_tool
        try:
            probe.clean_fields(exclude=["tenant", "tool", "created_at"])
            probe.clean()
        except ValidationError as exc:
            bad, message = _first_error(exc)
            raise ConfigError(_at(spec.where, bad) if bad else spec.where, message) from None
        what = f"credential binding {spec.tool} ${{{spec.placeholder}}} in {tenant.slug}"
        current = ToolCredential.objects.filter(
            tenant__slug=tenant.slug, tool__name=spec.tool, placeholder=spec.placeholder
        ).first()

        def create(_actor: Actor, spec: CredentialSpec = spec) -> None:
            ToolCredential.objects.create(
                tenant=Tenant.objects.get(slug=tenant.slug),
                tool=Tool.objects.get(name=spec.tool),
                placeholder=spec.placeholder,
                secret_name=spec.secret_name,
            )

        steps.append(
            _setting_step(
                what, current, "secret_name", spec.secret_name, create, f"secret_name {_show(spec.secret_name)}"
            )
        )
    return steps


def _setting_step(
    what: str,
    row: models.Model | None,
    name: str,
    wanted: Any,
    create: Callable[[Actor], None],
    created: str,
    show: Callable[[Any], Any] = lambda value: value,
) -> Step:
    """The step for a row that the file settles by one setting: create it
    (``created`` says with what), leave it, or change that setting."""
    if row is None:
        return Step(CREATE, what, [created], create)
    if getattr(row, name) == wanted:
        return Step(UNCHANGED, what)

    def change(_actor: Actor) -> None:
        setattr(row, name, wanted)
        row.save()

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
        what = f"membership {username} in {tenant.slug}"
        row = current.get(username)

        def create(_actor: Actor, username: str = username, role: str = role) -> None:
            Membership.objects.create(user=_user(username), tenant=Tenant.objects.get(slug=tenant.slug), role=role)

        steps.append(_setting_step(what, row, "role", role, create, f"role {role}"))
    return steps


def _shift_steps(tenant: TenantSpec) -> list[Step]:
    steps = []
    for spec in tenant.on_call:
        what = f"on-call shift of {spec.user} in {tenant.slug} from {_when(spec.starts_at)}"
        row = OnCallShift.objects.filter(
            tenant__slug=tenant.slug, user__username=spec.user, starts_at=spec.starts_at
        ).first()

        def create(_actor: Actor, spec: ShiftSpec = spec) -> None:
            OnCallShift.objects.create(
                tenant=Tenant.objects.get(slug=tenant.slug),
                user=_user(spec.user),
                starts_at=spec.starts_at,
                ends_at=spec.ends_at,
            )

        steps.append(
            _setting_step(what, row, "ends_at", spec.ends_at, create, f"ends_at {_when(spec.ends_at)}", show=_when)
        )
    return steps


def _when(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _channel_steps(tenant: TenantSpec) -> list[Step]:
    steps = []
    for spec in tenant.channels:
        what = f"channel {spec.name} in {tenant.slug}"
        row = Channel.objects.filter(tenant__slug=tenant.slug, name=spec.name).first()
        if row is None:
            if spec.kind is None or spec.target is None:
                raise ConfigError(spec.where, "a new channel needs its kind and target")

            def create(actor: Actor, spec: ChannelSpec = spec) -> str | None:
                assert spec.kind is not None
                assert spec.target is not None
                channel = services.channel_create(
                    tenant=Tenant.objects.get(slug=tenant.slug),
                    name=spec.name,
                    kind=spec.kind,
                    target=spec.target,
                    actor=actor,
                )
                if spec.enabled is False:
                    services.channel_update(channel=channel, actor=actor, enabled=False)
                if channel.secret:
                    return (
                        f"channel {channel.name} in {tenant.slug}: signing secret {channel.secret} "
                        "(shown only now; rotate it on the channel's page for a new one)"
                    )
                return None

            details = [f"kind {spec.kind}", f"target {_show(spec.target)}"]
            if spec.enabled is False:
                details.append("disabled")
            steps.append(Step(CREATE, what, details, create))
            continue
        if spec.kind is not None and spec.kind != row.kind:
            raise ConfigError(
                _at(spec.where, "kind"),
                f"channel {spec.name!r} is {_show(row.kind)}; a channel's kind is not changed (name a new one)",
            )
        try:
            target = services.check_target(row.kind, spec.target) if spec.target is not None else None
        except ValidationError as exc:
            raise ConfigError(_at(spec.where, "target"), "; ".join(exc.messages)) from None
        moved: dict[str, Any] = {}
        if target is not None and target != row.target:
            moved["target"] = target
        if spec.enabled is not None and spec.enabled != row.enabled:
            moved["enabled"] = spec.enabled
        if not moved:
            steps.append(Step(UNCHANGED, what))
            continue

        def change(actor: Actor, row: Channel = row, moved: dict[str, Any] = moved) -> None:
            services.channel_update(channel=row, actor=actor, **moved)

        details = [_moved(k, getattr(row, k), v) for k, v in moved.items()]
        steps.append(Step(CHANGE, what, details, change))
    return steps


def _rule_steps(tenant: TenantSpec) -> list[Step]:
    names = {c.name for c in tenant.channels}
    steps = []
    for spec in tenant.rules:
        channel = Channel.objects.filter(tenant__slug=tenant.slug, name=spec.channel).first()
        if channel is None and spec.channel not in names:
            raise ConfigError(_at(spec.where, "channel"), f"no channel {spec.channel!r} in {tenant.slug}")
        if channel is not None and channel.kind == ChannelKind.AGENT:
            raise ConfigError(_at(spec.where, "channel"), "an agent callback needs no rule")
        what = f"rule {spec.event} -> {spec.channel} in {tenant.slug}"
        row = (
            Rule.objects.filter(tenant__slug=tenant.slug, event=spec.event, channel=channel).order_by("id").first()
            if channel is not None
            else None
        )
        if row is None:

            def create(actor: Actor, spec: RuleSpec = spec) -> None:
                services.rule_create(
                    tenant=Tenant.objects.get(slug=tenant.slug),
                    actor=actor,
                    event=spec.event,
                    channel_id=Channel.objects.get(tenant__slug=tenant.slug, name=spec.channel).pk,
                    **spec.values,
                )

            steps.append(Step(CREATE, what, [f"{k} {_show(v)}" for k, v in spec.values.items()], create))
            continue
        moved = {k: v for k, v in spec.values.items() if getattr(row, k) != v}
        if not moved:
            steps.append(Step(UNCHANGED, what))
            continue

        def change(actor: Actor, row: Rule = row, moved: dict[str, Any] = moved) -> None:
            services.rule_update(rule=row, actor=actor, **moved)

        steps.append(Step(CHANGE, what, [_moved(k, getattr(row, k), v) for k, v in moved.items()], change))
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


# --- export -----------------------------------------------------------------------------


def current() -> dict[str, Any]:
    """The database's configuration, as the file describes it."""
    now = timezone.now()
    tools = {tool.name: _tool_values(tool) for tool in Tool.objects.order_by("name")}
    for name, values in tools.items():
        if _holds_null(values["config"]):
            raise ConfigError(
                _at("tools", name, "config"), "holds a null, which TOML cannot write: change it in /admin/"
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
    """The database's configuration as a file :func:`apply` takes (applying it at once changes nothing)."""
    data = current()
    lines = [
        "# ledgerdash configuration, exported by manage.py ledger_config export.",
        "# Apply with: manage.py ledger_config plan FILE, then apply FILE.",
        '# "" is an empty value (the setting\'s default, for ever, or nobody).',
        "# On-call shifts that have ended are not exported; nothing here is a secret.",
    ]
    _dump_table(lines, [], data)
    return "\n".join(lines).strip() + "\n"


def _dump_table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, dict) and not _is_tables(v)}
    nested = {k: v for k, v in table.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in table.items() if _is_tables(v)}
    if path and (plain or not (nested or arrays)):
        lines += ["", f"[{'.'.join(_key(p) for p in path)}]"]
    lines += [f"{_key(k)} = {_toml(v)}" for k, v in plain.items()]
    for key, value in nested.items():
        _dump_table(lines, [*path, key], value)
    for key, items in arrays.items():
        for item in items:
            lines += ["", f"[[{'.'.join(_key(p) for p in [*path, key])}]]"]
            lines += [f"{_key(k)} = {_toml(v)}" for k, v in item.items()]


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _toml(value: Any) -> str:
    if value is None:
        return json.dumps(EMPTY)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, datetime):
        return _when(value if timezone.is_aware(value) else timezone.make_aware(value, UTC))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"{type(value).__name__} cannot be written as TOML")


__all__ = [
    "ConfigError",
    "Desired",
    "Plan",
    "Step",
    "apply",
    "current",
    "export",
    "make_plan",
    "parse",
    "parse_file",
]

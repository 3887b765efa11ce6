"""Reading a configuration file into the desired state: plain dataclasses,
every key and type checked, each error naming where in the file it is."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Role, validate_policy_approvals, validate_policy_tools
from ledgerdash.notify import services
from ledgerdash.notify.models import Audience, ChannelKind, RuleEvent

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


def where_at(where: str, *keys: str | int) -> str:
    for key in keys:
        where = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{_key(key)}" if where else _key(key))
    return where


def first_error(exc: ValidationError) -> tuple[str | None, str]:
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
    return [_table(item, where_at(where, n)) for n, item in enumerate(value)]


def _only(table: dict[str, Any], where: str, known: Iterable[str], required: Iterable[str] = ()) -> None:
    known = list(known)
    for key in table:
        if key not in known:
            raise ConfigError(where_at(where, key), f"unknown key (known here: {', '.join(known)})")
    for key in required:
        if key not in table:
            raise ConfigError(where_at(where, key), "is required")


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
    return {name: _check(schema[name], table[name], where_at(where, name)) for name in schema if name in table}


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
    "sla_minutes": "int?",
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
                seen.setdefault(owner, where_at(tenant.where, "default_owner"))
            for username in tenant.members:
                seen.setdefault(username, where_at(tenant.where, "members", username))
            for shift in tenant.on_call:
                seen.setdefault(shift.user, where_at(shift.where, "user"))
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
        _tool(name, _table(body, where_at("tools", name)))
        for name, body in _table(raw.get("tools", {}), "tools").items()
    ]
    tenants = [
        _tenant(slug, _table(body, where_at("tenants", slug)))
        for slug, body in _table(raw.get("tenants", {}), "tenants").items()
    ]
    in_process = raw.get("in_process_tools", [])
    if not isinstance(in_process, list):
        raise ConfigError("in_process_tools", f"must be an array of tool names, not {_kind(in_process)}")
    for n, name in enumerate(in_process):
        if not _text(name, where_at("in_process_tools", n)).strip():
            raise ConfigError(where_at("in_process_tools", n), "a tool name is not empty")
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
    where = where_at("tools", name)
    _only(body, where, TOOL_FIELDS)
    return ToolSpec(name, where, _fields(body, where, TOOL_FIELDS))


def _tenant(slug: str, body: dict[str, Any]) -> TenantSpec:
    where = where_at("tenants", slug)
    _only(body, where, [*TENANT_FIELDS, *TENANT_PARTS])
    values = _fields(body, where, TENANT_FIELDS)
    if values.get("default_owner"):
        _username(values["default_owner"], where_at(where, "default_owner"))
    policy = (
        _policy(_table(body["policy"], where_at(where, "policy")), where_at(where, "policy"))
        if "policy" in body
        else None
    )
    members: dict[str, str] = {}
    for username, role in _table(body.get("members", {}), where_at(where, "members")).items():
        at = where_at(where, "members", username)
        _username(username, at)
        role = _text(role, at)
        if role not in Role.values:
            raise ConfigError(at, f"unknown role {role!r} (one of {', '.join(Role.values)})")
        members[username] = role
    credentials = []
    for n, item in enumerate(_tables(body.get("credentials", []), where_at(where, "credentials"))):
        at = where_at(where, "credentials", n)
        _only(item, at, CREDENTIAL_FIELDS, required=CREDENTIAL_FIELDS)
        given = _fields(item, at, CREDENTIAL_FIELDS)
        credentials.append(CredentialSpec(at, given["tool"], given["placeholder"], given["secret_name"]))
    _unique([(c.tool, c.placeholder) for c in credentials], credentials, "a second binding of this placeholder")
    on_call = []
    for n, item in enumerate(_tables(body.get("on_call", []), where_at(where, "on_call"))):
        at = where_at(where, "on_call", n)
        _only(item, at, SHIFT_FIELDS, required=SHIFT_FIELDS)
        given = _fields(item, at, SHIFT_FIELDS)
        _username(given["user"], where_at(at, "user"))
        if given["ends_at"] <= given["starts_at"]:
            raise ConfigError(where_at(at, "ends_at"), "a shift must end after it starts")
        on_call.append(ShiftSpec(at, given["user"], given["starts_at"], given["ends_at"]))
    _unique([(s.user, s.starts_at) for s in on_call], on_call, "a second shift of this person starting then")
    channels = []
    for n, item in enumerate(_tables(body.get("channels", []), where_at(where, "channels"))):
        at = where_at(where, "channels", n)
        _only(item, at, CHANNEL_FIELDS, required=["name"])
        given = _fields(item, at, CHANNEL_FIELDS)
        kind = given.get("kind")
        if kind is not None and kind not in FILE_CHANNEL_KINDS:
            raise ConfigError(
                where_at(at, "kind"),
                f"{kind!r} is not a channel kind the file describes (one of {', '.join(FILE_CHANNEL_KINDS)}; "
                "an agent callback is made with its API token, in the dashboard)",
            )
        if kind is not None and "target" in given:
            try:
                given["target"] = services.check_target(kind, given["target"])
            except ValidationError as exc:
                raise ConfigError(where_at(at, "target"), "; ".join(exc.messages)) from None
        channels.append(ChannelSpec(at, given["name"], kind, given.get("target"), given.get("enabled")))
    _unique([(c.name,) for c in channels], channels, "a second channel of this name")
    rules = []
    for n, item in enumerate(_tables(body.get("rules", []), where_at(where, "rules"))):
        at = where_at(where, "rules", n)
        _only(item, at, RULE_FIELDS, required=["event", "channel"])
        given = _fields(item, at, RULE_FIELDS)
        if given["event"] not in RuleEvent.values:
            raise ConfigError(where_at(at, "event"), f"unknown event (one of {', '.join(RuleEvent.values)})")
        if "audience" in given and given["audience"] not in Audience.values:
            raise ConfigError(where_at(at, "audience"), f"unknown audience (one of {', '.join(Audience.values)})")
        for tool, minutes in given.get("tool_sla", {}).items():
            if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes <= 0:
                raise ConfigError(where_at(at, "tool_sla", tool), "a whole number of minutes above 0")
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
    tools = _table(body["tools"], where_at(where, "tools"))
    approvals = _table(body.get("approvals", {}), where_at(where, "approvals"))
    note = _text(body.get("note", DEFAULT_NOTE), where_at(where, "note"))
    for name, scopes in tools.items():
        try:
            validate_policy_tools({name: scopes})
        except ValidationError as exc:
            raise ConfigError(where_at(where, "tools", name), "; ".join(exc.messages)) from None
    for name, condition in approvals.items():
        try:
            validate_policy_approvals({name: condition}, tools)
        except ValidationError as exc:
            raise ConfigError(where_at(where, "approvals", name), "; ".join(exc.messages)) from None
    return PolicySpec(where, dict(tools), dict(approvals), note)

"""Reads a file into the desired state: what it says the configuration is.

Two passes, each naming every problem it finds by its place in the file:
the file's shape and types (:mod:`.schema`, pydantic), then what the
models' own validators say of the values (a policy's scopes and approval
conditions, a channel's target) and what must be unique in a tenant. What
needs the database (a tool a policy names exists, a row the models accept)
is checked by :func:`~.plan.make_plan`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pydantic
from django.core.exceptions import ValidationError

from ledgerdash.ledger.config.errors import ConfigError, where_at
from ledgerdash.ledger.config.schema import TENANT_FIELDS, FileTable, PolicyTable, TenantTable, problems
from ledgerdash.ledger.models import validate_policy_approvals, validate_policy_tools
from ledgerdash.notify import services


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

    def usernames(self) -> list[str]:
        """Every person the file names, each once, in the file's order."""
        seen: dict[str, None] = {}
        for tenant in self.tenants:
            owner = tenant.values.get("default_owner")
            if owner:
                seen.setdefault(owner)
            for username in tenant.members:
                seen.setdefault(username)
            for shift in tenant.on_call:
                seen.setdefault(shift.user)
        return list(seen)


def parse(text: str, source: str = "the file") -> Desired:
    """The desired state ``text`` describes, or :class:`ConfigError` naming
    where it is wrong (key paths; ``source`` for a file that is not TOML)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    try:
        file = FileTable.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ConfigError.of(problems(exc)) from None
    reader = _Reader()
    desired = Desired(
        source,
        [ToolSpec(name, where_at("tools", name), tool.given()) for name, tool in file.tools.items()],
        [reader.tenant(slug, tenant) for slug, tenant in file.tenants.items()],
        list(file.in_process_tools),
    )
    if reader.problems:
        raise ConfigError.of(reader.problems)
    return desired


def parse_file(path: str | Path) -> Desired:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot be read: {exc}") from None
    return parse(text, str(path))


class _Reader:
    """The second pass: the values as the models' validators see them."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def check(self, where: str, validator: Callable[..., Any], *args: Any) -> Any:
        """``validator(*args)``, or None with its complaint noted as being at ``where``."""
        try:
            return validator(*args)
        except ValidationError as exc:
            self.problems.append((where, "; ".join(exc.messages)))
            return None

    def unique(self, keys: list[tuple[Any, ...]], wheres: list[str], message: str) -> None:
        seen: set[tuple[Any, ...]] = set()
        for key, where in zip(keys, wheres, strict=True):
            if key in seen:
                self.problems.append((where, message))
            seen.add(key)

    def tenant(self, slug: str, table: TenantTable) -> TenantSpec:
        where = where_at("tenants", slug)
        policy = self.policy(where_at(where, "policy"), table.policy) if table.policy is not None else None
        credentials = [
            CredentialSpec(where_at(where, "credentials", n), c.tool, c.placeholder, c.secret_name)
            for n, c in enumerate(table.credentials)
        ]
        self.unique(
            [(c.tool, c.placeholder) for c in credentials],
            [c.where for c in credentials],
            "a second binding of this placeholder",
        )
        on_call = []
        for n, shift in enumerate(table.on_call):
            on_call.append(ShiftSpec(where_at(where, "on_call", n), shift.user, shift.starts_at, shift.ends_at))
            if shift.ends_at <= shift.starts_at:
                self.problems.append((where_at(where, "on_call", n, "ends_at"), "a shift must end after it starts"))
        self.unique(
            [(s.user, s.starts_at) for s in on_call],
            [s.where for s in on_call],
            "a second shift of this person starting then",
        )
        channels = []
        for n, channel in enumerate(table.channels):
            at = where_at(where, "channels", n)
            target = channel.target
            if channel.kind is not None and target is not None:
                target = self.check(where_at(at, "target"), services.check_target, channel.kind, target)
            channels.append(ChannelSpec(at, channel.name, channel.kind, target, channel.enabled))
        self.unique([(c.name,) for c in channels], [c.where for c in channels], "a second channel of this name")
        rules = [
            RuleSpec(
                where_at(where, "rules", n),
                rule.event,
                rule.channel,
                {k: v for k, v in rule.given().items() if k not in ("event", "channel")},
            )
            for n, rule in enumerate(table.rules)
        ]
        self.unique(
            [(r.event, r.channel) for r in rules],
            [r.where for r in rules],
            "a second rule for this event and channel",
        )
        values = {k: v for k, v in table.given().items() if k in TENANT_FIELDS}
        return TenantSpec(slug, where, values, policy, dict(table.members), credentials, on_call, channels, rules)

    def policy(self, where: str, table: PolicyTable) -> PolicySpec:
        for name, scopes in table.tools.items():
            self.check(where_at(where, "tools", name), validate_policy_tools, {name: scopes})
        for name, condition in table.approvals.items():
            self.check(where_at(where, "approvals", name), validate_policy_approvals, {name: condition}, table.tools)
        return PolicySpec(where, dict(table.tools), dict(table.approvals), table.note)

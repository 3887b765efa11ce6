"""The file's shape: its tables, their keys and each key's type, as pydantic
models. A key the model does not name is refused (``extra="forbid"``), and
so is a value of another type (``strict``: ``"4"`` is no number, ``1`` no
boolean). What only the models' own validators or the database can tell is
checked after this, by :mod:`.parse` and :mod:`.plan`.

:func:`problems` says what pydantic found in the file's words: each
problem's place as a key path (``tenants.acme.on_call[0].ends_at``) and
what is wrong there.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from datetime import date, datetime, time
from typing import Annotated, Any, Union, get_args, get_origin

import pydantic
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from ledgerdash.ledger.config.errors import where_at
from ledgerdash.ledger.models import Role
from ledgerdash.notify.models import Audience, ChannelKind, RuleEvent

#: Nullable settings take this for "not set" (TOML has no null).
EMPTY = ""
DEFAULT_NOTE = "published by manage.py ledger_config"
#: Channel kinds the file describes: an agent's callback follows one API
#: token, which is made by hand (its secret is shown once), so it is too.
FILE_CHANNEL_KINDS = (ChannelKind.WEBHOOK, ChannelKind.SLACK, ChannelKind.EMAIL)


def _wrong(message: str) -> PydanticCustomError:
    return PydanticCustomError("config", "{message}", {"message": message})


def _empty_is_none(value: Any) -> Any:
    return None if value == EMPTY else value


def _one_of(choices: Iterable[str], what: str) -> Callable[[str], str]:
    known = list(choices)

    def check(value: str) -> str:
        if value not in known:
            raise _wrong(f"unknown {what} {value!r} (one of {', '.join(known)})")
        return value

    return check


def _username(name: str) -> str:
    try:
        get_user_model().username_validator(name)
    except ValidationError as exc:
        raise _wrong(f"{name!r} is not a username: {'; '.join(exc.messages)}") from None
    if not name or len(name) > 150:
        raise _wrong("a username has 1 to 150 characters")
    return name


def _tool_name(name: str) -> str:
    if not name.strip():
        raise _wrong("a tool name is not empty")
    return name


def _minutes(value: int) -> int:
    if value <= 0:
        raise _wrong("a whole number of minutes above 0")
    return value


def _channel_kind(kind: str) -> str:
    if kind not in FILE_CHANNEL_KINDS:
        raise _wrong(
            f"{kind!r} is not a channel kind the file describes (one of {', '.join(FILE_CHANNEL_KINDS)}; "
            "an agent callback is made with its API token, in the dashboard)"
        )
    return kind


Count = Annotated[int, Field(ge=0)]
#: A number of times something is done at least once.
AtLeastOnce = Annotated[int, Field(ge=1)]
#: A length of time that must pass (as the database's checks on a tool require).
Seconds = Annotated[float, Field(gt=0)]
#: ``""`` for none: the setting's default, for ever, or nobody.
OptionalCount = Annotated[Count | None, BeforeValidator(_empty_is_none)]
OptionalSeconds = Annotated[Seconds | None, BeforeValidator(_empty_is_none)]
OptionalWait = Annotated[Annotated[float, Field(ge=0)] | None, BeforeValidator(_empty_is_none)]
Username = Annotated[str, AfterValidator(_username)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def given(self) -> dict[str, Any]:
        """The settings the file gives, in the model's order (those it leaves out stay as they are)."""
        return {name: getattr(self, name) for name in type(self).model_fields if name in self.model_fields_set}


class ToolTable(_Table):
    adapter: str | None = None
    config: dict[str, Any] | None = None
    idempotent: bool | None = None
    key_retention_seconds: OptionalCount = None
    max_request_seconds: Seconds | None = None
    dispatch_lease_seconds: OptionalSeconds = None
    lookup_lag_seconds: OptionalWait = None
    backoff_base_seconds: Seconds | None = None
    max_checks: Count | None = None
    max_dispatches: AtLeastOnce | None = None
    enabled: bool | None = None
    claim_with_intent: bool | None = None


class PolicyTable(_Table):
    tools: dict[str, list[str]]
    approvals: dict[str, str] = Field(default_factory=dict)
    note: str = DEFAULT_NOTE


class CredentialTable(_Table):
    tool: str
    placeholder: str
    secret_name: str


class ShiftTable(_Table):
    user: Username
    starts_at: AwareDatetime
    ends_at: AwareDatetime


class ChannelTable(_Table):
    name: str
    kind: Annotated[str, AfterValidator(_channel_kind)] | None = None
    target: str | None = None
    enabled: bool | None = None


class RuleTable(_Table):
    event: Annotated[str, AfterValidator(_one_of(RuleEvent.values, "event"))]
    channel: str
    audience: Annotated[str, AfterValidator(_one_of(Audience.values, "audience"))] | None = None
    enabled: bool | None = None
    sla_minutes: OptionalCount = None
    tool_sla: dict[str, Annotated[int, AfterValidator(_minutes)]] | None = None
    repeat_minutes: Count | None = None
    stalled_minutes: Count | None = None


class TenantTable(_Table):
    name: str | None = None
    is_active: bool | None = None
    sla_minutes: OptionalCount = None
    default_owner: Annotated[Username | None, BeforeValidator(_empty_is_none)] = None
    chain_stripes: Count | None = None
    policy: PolicyTable | None = None
    members: dict[Username, Annotated[str, AfterValidator(_one_of(Role.values, "role"))]] = Field(default_factory=dict)
    credentials: list[CredentialTable] = Field(default_factory=list)
    on_call: list[ShiftTable] = Field(default_factory=list)
    channels: list[ChannelTable] = Field(default_factory=list)
    rules: list[RuleTable] = Field(default_factory=list)


class FileTable(_Table):
    #: Tools agents run in their own process (no provider adapter, no Tool
    #: row): policies may allow them.
    in_process_tools: list[Annotated[str, AfterValidator(_tool_name)]] = Field(
        default_factory=list, description="an array of tool names"
    )
    tools: dict[str, ToolTable] = Field(default_factory=dict)
    tenants: dict[str, TenantTable] = Field(default_factory=dict)


#: The settings of a tool the file describes, in the file's order.
TOOL_FIELDS = tuple(ToolTable.model_fields)
TENANT_FIELDS = ("name", "is_active", "sla_minutes", "default_owner", "chain_stripes")

# --- pydantic's findings in the file's words ---------------------------------------------

#: What a value of the wrong type should have been, by pydantic's error type.
_WANTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "a table",
    "model_type": "a table",
    "list_type": "an array",
    "datetime_type": "a date and time (1979-05-27T07:32:00Z)",
}


def problems(exc: pydantic.ValidationError) -> list[tuple[str, str]]:
    """Each of pydantic's complaints as a place in the file and what is wrong there."""
    found = []
    for error in exc.errors():
        loc = tuple(part for part in error["loc"] if part != "[key]")  # a key's own error is the key's
        found.append((where_at("", *loc), _message(error, loc)))
    return found


def _message(error: Any, loc: tuple[str | int, ...]) -> str:
    kind, value = error["type"], error.get("input")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        table = _model_at(loc[:-1])
        return f"unknown key (known here: {', '.join(table.model_fields)})" if table else "unknown key"
    if kind == "list_type" and _model_at((*loc, 0)) is not None:
        return f"must be an array of tables ([[{where_at('', *loc)}]]), not {_kind(value)}"
    if kind in _WANTED:
        table = _model_at(loc[:-1]) if loc else None
        setting = table.model_fields.get(str(loc[-1])) if table is not None else None
        wanted = setting.description if setting is not None and setting.description else _WANTED[kind]
        return f"must be {wanted}, not {_kind(value)}"
    if kind == "greater_than_equal":
        least = (error.get("ctx") or {}).get("ge", 0)
        return "must not be negative" if least == 0 else f"must be {least:g} or more, not {value!r}"
    if kind == "greater_than":
        return f"must be above {(error.get('ctx') or {}).get('gt', 0):g}, not {value!r}"
    if kind == "timezone_aware":
        return "needs an offset (Z for UTC, or +02:00)"
    return str(error["msg"])  # ours (PydanticCustomError) say it as the file would


def _model_at(loc: tuple[str | int, ...]) -> type[_Table] | None:
    """The model of the table at ``loc`` (None: no table of the file's is there)."""
    kind: Any = FileTable
    for part in loc:
        kind = _bare(kind)
        if isinstance(kind, type) and issubclass(kind, _Table) and isinstance(part, str):
            field = kind.model_fields.get(part)
            if field is None:
                return None
            kind = field.annotation
        elif get_origin(kind) is dict and isinstance(part, str):
            kind = get_args(kind)[1]
        elif get_origin(kind) is list and isinstance(part, int):
            kind = get_args(kind)[0]
        else:
            return None
    kind = _bare(kind)
    return kind if isinstance(kind, type) and issubclass(kind, _Table) else None


def _bare(kind: Any) -> Any:
    """``kind`` without its validators and its ``| None``."""
    while True:
        origin = get_origin(kind)
        if origin is Annotated:
            kind = get_args(kind)[0]
        elif origin in (Union, types.UnionType):
            kind = next(arg for arg in get_args(kind) if arg is not type(None))
        else:
            return kind


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
    if isinstance(value, datetime):
        return "a date and time"
    if isinstance(value, date):
        return "a date"
    if isinstance(value, time):
        return "a time"
    return f"a {type(value).__name__}"

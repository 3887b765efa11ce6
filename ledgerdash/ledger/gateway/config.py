"""The MCP gateway's configuration file (TOML): which ledger tenant records
the calls, which upstream MCP servers it fronts, and per-tool settings.

::

    tenant = "acme"              # the tenant whose policy and ledger the calls go through
    task_id = "support-agent"    # the task calls belong to when the client names none

    [[upstreams]]
    name = "billing"
    command = ["python", "billing_server.py"]   # an MCP server over stdio
    env = { BILLING_TOKEN = "..." }

    [[upstreams]]
    name = "tickets"
    url = "http://127.0.0.1:9000/mcp"           # an MCP server over streamable HTTP
    prefix = "tickets_"                          # its tools are listed as tickets_<name>

    [tools.send_invoice]                         # per listed tool name
    key = "invoice:{invoice_id}:send"            # idempotency key template over the arguments
    scope = ["payments:charge"]                  # credential scope the call asks for
    ledger_tool = "send_invoice"                 # the tool's name in the tenant's policy
    request_id = "structuredContent.id"          # JMESPath to the provider's request id in the result
    on_error = "failed"                          # an isError result: failed | failed_retryable | unknown
    timeout = 30                                 # seconds before an upstream call counts as lost (at most,
                                                 # and by default, the ledger tool's maximum request time)

Every mistake is reported with where it is, before anything starts.
"""

from __future__ import annotations

import string
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jmespath
import jmespath.exceptions

from ledgerdash_client import keys

ON_ERROR = ("failed", "failed_retryable", "unknown")


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says where and why."""


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    prefix: str = ""

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


@dataclass(frozen=True)
class ToolConfig:
    key: str = ""
    scope: tuple[str, ...] | None = None
    ledger_tool: str = ""
    request_id: str = ""
    on_error: str = "failed"
    #: Seconds before an upstream call counts as lost; None: the ledger tool's
    #: maximum request time, which a configured timeout may not exceed.
    timeout: float | None = None

    def ledger_name(self, listed: str) -> str:
        """The tool's name in the tenant's policy and the ledger."""
        return self.ledger_tool or listed


@dataclass(frozen=True)
class GatewayConfig:
    tenant: str
    task_id: str
    upstreams: tuple[UpstreamConfig, ...]
    tools: dict[str, ToolConfig]

    def tool(self, name: str) -> ToolConfig:
        return self.tools.get(name, ToolConfig())


def _str(value: Any, where: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _known(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")


def _upstream(raw: Any, index: int) -> UpstreamConfig:
    where = f"upstreams[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table")
    _known(raw, {"name", "command", "url", "env", "cwd", "prefix"}, where)
    name = _str(raw.get("name"), f"{where}.name")
    command = _strings(raw["command"], f"{where}.command") if "command" in raw else ()
    url = _str(raw.get("url"), f"{where}.url", required=False)
    if bool(command) == bool(url):
        raise ConfigError(f"{where} ({name}): give exactly one of command (stdio) or url (streamable HTTP)")
    if url and not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.url: expected an http:// or https:// URL, got {url!r}")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f"{where}.env: expected a table of strings")
    return UpstreamConfig(
        name=name,
        command=command,
        url=url,
        env=dict(env),
        cwd=_str(raw.get("cwd"), f"{where}.cwd", required=False),
        prefix=_str(raw.get("prefix"), f"{where}.prefix", required=False),
    )


def template_fields(template: str) -> list[str]:
    """The argument names a key template refers to; ConfigError when it is not one."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"key template {template!r}: {exc}") from None
    names = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name or not name.isidentifier():
            raise ConfigError(f"key template {template!r}: placeholders name an argument, like {{invoice_id}}")
        names.append(name)
    return names


def _tool(name: str, raw: Any) -> ToolConfig:
    where = f"tools.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table")
    _known(raw, {"key", "scope", "ledger_tool", "request_id", "on_error", "timeout"}, where)
    key = _str(raw.get("key"), f"{where}.key", required=False)
    if key:
        template_fields(key)
        problem = keys.key_problem(key)
        if problem:
            raise ConfigError(f"{where}.key: {problem}")
    request_id = _str(raw.get("request_id"), f"{where}.request_id", required=False)
    if request_id:
        try:
            jmespath.compile(request_id)
        except jmespath.exceptions.JMESPathError as exc:
            raise ConfigError(f"{where}.request_id: not a JMESPath expression: {exc}") from None
    on_error = raw.get("on_error", "failed")
    if on_error not in ON_ERROR:
        raise ConfigError(f"{where}.on_error: expected one of {', '.join(ON_ERROR)}, got {on_error!r}")
    timeout = raw.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 86400
    ):
        raise ConfigError(f"{where}.timeout: expected seconds between 0 and 86400, got {timeout!r}")
    return ToolConfig(
        key=key,
        scope=_strings(raw["scope"], f"{where}.scope") if "scope" in raw else None,
        ledger_tool=_str(raw.get("ledger_tool"), f"{where}.ledger_tool", required=False),
        request_id=request_id,
        on_error=on_error,
        timeout=None if timeout is None else float(timeout),
    )


def parse(data: dict[str, Any]) -> GatewayConfig:
    _known(data, {"tenant", "task_id", "upstreams", "tools"}, "the file")
    upstreams = data.get("upstreams")
    if not isinstance(upstreams, list) or not upstreams:
        raise ConfigError("upstreams: list at least one upstream MCP server ([[upstreams]])")
    parsed = tuple(_upstream(raw, i) for i, raw in enumerate(upstreams))
    names = [u.name for u in parsed]
    if len(set(names)) != len(names):
        raise ConfigError(f"upstreams: names must differ, got {names}")
    tools = data.get("tools", {})
    if not isinstance(tools, dict):
        raise ConfigError("tools: expected a table of tables ([tools.<name>])")
    return GatewayConfig(
        tenant=_str(data.get("tenant"), "tenant"),
        task_id=_str(data.get("task_id", "mcp-gateway"), "task_id"),
        upstreams=parsed,
        tools={name: _tool(name, raw) for name, raw in tools.items()},
    )


def load(path: str | Path) -> GatewayConfig:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None

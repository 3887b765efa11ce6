"""From a tool's configuration to its adapter.

Reads the configuration through :class:`ToolSettings` rather than the
``Tool`` model, so the model can validate its own configuration (``Tool.clean``)
with this module without an import cycle (the adapters import the ledger's
errors and canonical JSON, which must not depend on the models).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from django.utils.module_loading import import_string

from ledgerdash.ledger.providers import presets
from ledgerdash.ledger.providers.base import ProviderAdapter
from ledgerdash.ledger.providers.http import HttpAdapter, HttpConfig
from ledgerdash.ledger.providers.presets import PresetAdapter

#: The adapter kinds (``Tool.Adapter``'s values).
HTTP = "http"
PYTHON = "python"
PRESET = "preset"


class ToolSettings(Protocol):
    """What building an adapter reads of a tool (a ``Tool`` row)."""

    @property
    def name(self) -> str: ...
    @property
    def adapter(self) -> str: ...
    @property
    def config(self) -> Any: ...
    @property
    def idempotent(self) -> bool: ...
    @property
    def key_retention_seconds(self) -> int | None: ...
    @property
    def max_request_seconds(self) -> float: ...
    @property
    def lookup_lag_seconds(self) -> float | None: ...


@dataclass(frozen=True)
class ToolSpec:
    """A tool's settings without a ``Tool`` row: how an agent (or an MCP
    server in front of a provider) that calls the provider itself, with no
    database, builds the same adapter the reconciler uses."""

    name: str
    adapter: str
    config: Any
    idempotent: bool = False
    key_retention_seconds: int | None = None
    max_request_seconds: float = 30.0
    lookup_lag_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_adapter(
    tool: ToolSettings,
    *,
    credentials: Mapping[str, str] | None = None,
    per_tenant: Iterable[str] = (),
    tenant_label: str = "",
) -> ProviderAdapter:
    """``tool``'s adapter. For an HTTP tool, ``credentials`` are the calling
    tenant's bindings (placeholder -> secret name), ``per_tenant`` every
    placeholder some tenant binds (never filled from a shared secret)."""
    if tool.adapter == HTTP:
        adapter: ProviderAdapter = HttpAdapter(
            tool.name,
            HttpConfig.from_dict(tool.config),
            credentials=credentials,
            per_tenant=per_tenant,
            tenant_label=tenant_label,
        )
    elif tool.adapter == PRESET:
        config = tool.config if isinstance(tool.config, dict) else {}
        adapter = presets.preset(config.get("preset"))(
            tool.name, config, credentials=credentials, per_tenant=per_tenant, tenant_label=tenant_label
        )
    elif tool.adapter == PYTHON:
        config = dict(tool.config)
        path = config.pop("class", None)
        if not isinstance(path, str):
            raise ValueError("a python adapter's config needs 'class': 'package.module.Class'")
        cls = import_string(path)
        if not (isinstance(cls, type) and issubclass(cls, ProviderAdapter)):
            raise TypeError(f"{path} is not a ProviderAdapter")
        adapter = cls(**config)
    else:
        raise ValueError(f"unknown adapter kind {tool.adapter!r}")
    adapter.idempotent = tool.idempotent
    adapter.key_retention = timedelta(seconds=tool.key_retention_seconds) if tool.key_retention_seconds else None
    adapter.max_request_seconds = float(tool.max_request_seconds)
    adapter.lookup_lag_seconds = lookup_lag(tool)
    if isinstance(adapter, PresetAdapter):
        adapter.lag_stated = tool.lookup_lag_seconds is not None
    return adapter


def lookup_lag(tool: ToolSettings) -> float:
    """How far ``tool``'s lookup may lag: its own setting, else its preset's documented lag, else none."""
    if tool.lookup_lag_seconds is not None:
        return float(tool.lookup_lag_seconds)
    if tool.adapter == PRESET and isinstance(tool.config, dict) and tool.config.get("preset") in presets.PRESETS:
        return presets.PRESETS[tool.config["preset"]].documented_lag_seconds
    return 0.0


def placeholders(tool: ToolSettings) -> set[str]:
    """The ``${NAME}`` secrets ``tool`` reads at call time (a tenant may bind
    each to a secret of its own): an HTTP tool's header templates, a preset's
    credential settings."""
    config = tool.config if isinstance(tool.config, dict) else {}
    if tool.adapter == PRESET and config.get("preset") in presets.PRESETS:
        preset = presets.PRESETS[config["preset"]]
        templates = [str(config.get(name, preset.options[name].default)) for name in preset.secret_options()]
    else:
        templates = [v for v in (config.get("headers") or {}).values() if isinstance(v, str)]
    return {name for template in templates for name in string.Template(template).get_identifiers()}


def preset_facts(tool: ToolSettings) -> type[PresetAdapter] | None:
    """The preset ``tool`` names, when it is a preset tool with a known preset."""
    if tool.adapter != PRESET or not isinstance(tool.config, dict):
        return None
    return presets.PRESETS.get(tool.config.get("preset", ""))

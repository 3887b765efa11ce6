"""From a tool name to its configured adapter (the ``Tool`` table)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils.module_loading import import_string

from ledgerdash.ledger.models import Tool
from ledgerdash.ledger.providers.base import ProviderAdapter
from ledgerdash.ledger.providers.http import HttpAdapter


@dataclass(frozen=True)
class ToolProfile:
    """A tool's adapter (which answers whether it is idempotent and how long
    its provider keeps keys) and the numbers the recovery rules use."""

    name: str
    adapter: ProviderAdapter
    backoff_base: float
    max_checks: int
    max_dispatches: int


def build_adapter(tool: Tool) -> ProviderAdapter:
    if tool.adapter == Tool.Adapter.HTTP:
        adapter: ProviderAdapter = HttpAdapter.from_config(tool.name, tool.config)
    elif tool.adapter == Tool.Adapter.PYTHON:
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
    return adapter


def profile(tool: Tool) -> ToolProfile:
    return ToolProfile(
        name=tool.name,
        adapter=build_adapter(tool),
        backoff_base=tool.backoff_base_seconds,
        max_checks=tool.max_checks,
        max_dispatches=tool.max_dispatches,
    )


def profiles() -> dict[str, ToolProfile]:
    """Every enabled tool's profile, read fresh (a reconciler pass calls this once)."""
    return {tool.name: profile(tool) for tool in Tool.objects.filter(enabled=True)}


def profile_for(name: str) -> ToolProfile | None:
    tool = Tool.objects.filter(name=name, enabled=True).first()
    return profile(tool) if tool is not None else None

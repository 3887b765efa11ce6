"""From a tool name to its configured adapter (the ``Tool`` table), with
the calling tenant's credentials (its ``ToolCredential`` bindings).

Tools are global: how a provider behaves (its URLs, whether it honours
keys, how long it keeps them) is the provider's, and policies already say
per tenant which tools it may use. What differs between tenants is the
credential, so that is what a tenant binds, by name (see
:mod:`ledgerdash.ledger.secrets`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ledgerdash.ledger.models import Tool, ToolCredential
from ledgerdash.ledger.providers import factory
from ledgerdash.ledger.providers.base import ProviderAdapter


@dataclass(frozen=True)
class ToolProfile:
    """A tool's adapter (which answers whether it is idempotent and how long
    its provider keeps keys) and the numbers the recovery rules use."""

    name: str
    adapter: ProviderAdapter
    backoff_base: float
    max_checks: int
    max_dispatches: int


@dataclass(frozen=True)
class Binding:
    tenant_id: int
    placeholder: str
    secret_name: str


def build_adapter(
    tool: Tool, *, tenant_id: int | None = None, bindings: Iterable[Binding] | None = None
) -> ProviderAdapter:
    """``tool``'s adapter for calls of tenant ``tenant_id`` (None: with no
    tenant's credentials). ``bindings``: every tenant's bindings for this
    tool, when the caller has read them already."""
    reads_secrets = tool.adapter in (Tool.Adapter.HTTP, Tool.Adapter.PRESET)
    known = list(bindings) if bindings is not None else _bindings(tool) if reads_secrets else []
    return factory.build_adapter(
        tool,
        credentials={b.placeholder: b.secret_name for b in known if b.tenant_id == tenant_id},
        per_tenant={b.placeholder for b in known},
        tenant_label=_tenant_label(tenant_id) if known else "",  # named only in per-tenant messages
    )


def _bindings(tool: Tool) -> list[Binding]:
    if tool.pk is None:
        return []
    rows = ToolCredential.objects.filter(tool=tool).values_list("tenant_id", "placeholder", "secret_name")
    return [Binding(*row) for row in rows]


def _tenant_label(tenant_id: int | None) -> str:
    if tenant_id is None:
        return ""
    from ledgerdash.ledger.models import Tenant

    return Tenant.objects.filter(pk=tenant_id).values_list("slug", flat=True).first() or f"#{tenant_id}"


def profile(tool: Tool, tenant_id: int | None = None, bindings: Iterable[Binding] | None = None) -> ToolProfile:
    return ToolProfile(
        name=tool.name,
        adapter=build_adapter(tool, tenant_id=tenant_id, bindings=bindings),
        backoff_base=tool.backoff_base_seconds,
        max_checks=tool.max_checks,
        max_dispatches=tool.max_dispatches,
    )


class Profiles:
    """Every enabled tool, read fresh (a reconciler pass makes one), and each
    tool's profile for a tenant, built on first use with that tenant's credentials."""

    def __init__(self) -> None:
        self.tools = {tool.name: tool for tool in Tool.objects.filter(enabled=True)}
        self.bindings: dict[int, list[Binding]] = {}
        rows = ToolCredential.objects.filter(tool__enabled=True).values_list(
            "tool_id", "tenant_id", "placeholder", "secret_name"
        )
        for tool_id, tenant_id, placeholder, secret_name in rows:
            self.bindings.setdefault(tool_id, []).append(Binding(tenant_id, placeholder, secret_name))
        self._built: dict[tuple[str, int | None], ToolProfile] = {}

    def get(self, name: str, tenant_id: int | None = None) -> ToolProfile | None:
        tool = self.tools.get(name)
        if tool is None:
            return None
        if (name, tenant_id) not in self._built:
            self._built[name, tenant_id] = profile(tool, tenant_id, self.bindings.get(tool.pk, []))
        return self._built[name, tenant_id]

    def __contains__(self, name: object) -> bool:
        return name in self.tools


def profiles() -> Profiles:
    """Every enabled tool's profiles, read fresh (a reconciler pass calls this once)."""
    return Profiles()


def profile_for(name: str, tenant_id: int | None = None) -> ToolProfile | None:
    """``name``'s profile for calls of ``tenant_id``, or None when no enabled tool has the name."""
    tool = Tool.objects.filter(name=name, enabled=True).first()
    return profile(tool, tenant_id) if tool is not None else None


def lookup_lag_for(name: str) -> float:
    """How far the lookup of tool ``name`` may lag (0 when no tool has the name)."""
    tool = Tool.objects.filter(name=name).only("adapter", "config", "lookup_lag_seconds").first()
    return factory.lookup_lag(tool) if tool is not None else 0.0

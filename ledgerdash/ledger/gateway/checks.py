"""The gateway's configuration held against the ledger it records in.

:mod:`ledgerdash.ledger.gateway.config` checks the file alone; this checks
what only the ledger knows, before anything is served: the tenant exists and
is active, and a tool's timeout may not exceed its maximum request time (the
ledger counts on no request landing later than that after its dispatcher
gave up on it). :func:`notes` says what the tenant's current policy would
refuse: not a reason to refuse to start (a policy changes while the gateway
runs), but what ``--check`` tells the person wiring it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledgerdash.ledger.authority import authorize, current_policy, timing
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.gateway.config import GatewayConfig, ToolConfig
from ledgerdash.ledger.models import Tenant, Tool
from ledgerdash.ledger.recording import parse_scope


def max_request_seconds(ledger_tool: str) -> float:
    """The ledger tool's maximum request time: its row's, else the setting's."""
    row = Tool.objects.filter(name=ledger_tool).values_list("dispatch_lease_seconds", "max_request_seconds").first()
    return timing(*(row or (None, None))).max_request_seconds


def timeout_for(settings: ToolConfig, max_request: float) -> float:
    """How long the gateway waits on an upstream call: the configured
    timeout, never longer than the tool's maximum request time."""
    return max_request if settings.timeout is None else min(settings.timeout, max_request)


def problems(config: GatewayConfig) -> list[str]:
    """What in ``config`` the ledger refuses, each saying where and why."""
    found = []
    tenant = Tenant.objects.filter(slug=config.tenant).first()
    if tenant is None:
        found.append(f"tenant: no tenant {config.tenant!r} in this ledger (give a tenant's slug)")
    elif not tenant.is_active:
        found.append(f"tenant: {config.tenant!r} is deactivated; the ledger refuses every call it would record")
    for listed, settings in sorted(config.tools.items()):
        if settings.timeout is None:
            continue
        name = settings.ledger_name(listed)
        limit = max_request_seconds(name)
        if settings.timeout > limit:
            found.append(
                f"tools.{listed}.timeout: {settings.timeout:g} s exceeds the maximum request time of the ledger "
                f"tool {name} ({limit:g} s); a request the gateway still waits on could land after the ledger "
                f"takes a lookup's 'not found' for proof. Lower the timeout, or raise the tool's maximum request "
                f"time to what its provider really takes"
            )
    return found


def refused_tools(config: GatewayConfig, tools: Mapping[str, ToolConfig]) -> dict[str, str]:
    """Which of ``tools`` (listed name: its settings) the tenant's current
    authority refuses, each with the ledger's own reason (the one check every
    call passes, :func:`~ledgerdash.ledger.authority.authorize`), read once."""
    tenant = Tenant.objects.filter(slug=config.tenant).first()
    if tenant is None:
        return dict.fromkeys(tools, f"no tenant {config.tenant!r} in this ledger")
    policy = current_policy(tenant.pk)
    refused = {}
    for listed, settings in tools.items():
        try:
            authorize(tenant, policy, settings.ledger_name(listed), parse_scope(settings.scope))
        except LedgerError as exc:
            refused[listed] = str(exc)
    return refused


def notes(config: GatewayConfig) -> list[str]:
    """The configured tools the tenant's current policy refuses (their calls are refused)."""
    tenant = Tenant.objects.filter(slug=config.tenant).first()
    if tenant is None:
        return []
    if current_policy(tenant.pk) is None:
        return [f"tenant {config.tenant!r} has no policy yet: every call is refused until one allows its tools"]
    return [
        f"tools.{listed}: {why}: its calls are refused until a policy allows them"
        for listed, why in sorted(refused_tools(config, config.tools).items())
    ]

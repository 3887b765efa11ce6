"""The gateway's configuration held against the ledger it records in.

:mod:`ledgerdash.ledger.gateway.config` checks the file alone; this checks
what only the ledger knows, before anything is served: a tool's timeout may
not exceed its maximum request time (the ledger counts on no request landing
later than that after its dispatcher gave up on it).
"""

from __future__ import annotations

from ledgerdash.ledger.authority import timing
from ledgerdash.ledger.gateway.config import GatewayConfig, ToolConfig
from ledgerdash.ledger.models import Tool


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

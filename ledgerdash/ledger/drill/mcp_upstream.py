"""The crash drill's upstream MCP server: the drill's two tools, served over
stdio with the official MCP SDK, each sending its call to the sandbox
provider through the generic HTTP adapter with the call's ``key`` argument
as its idempotency key (as a real MCP server in front of a provider API
would). The gateway (:mod:`ledgerdash.ledger.gateway`) records every call in
the ledger; the sandbox counts the effects, and recovery looks them up.

    LEDGERDASH_DRILL_ADAPTER='{"dispatch_url": …}' python -m ledgerdash.ledger.drill.mcp_upstream
"""

from __future__ import annotations

import json
import os
from typing import Any

import django

#: The drill's tools as this server lists them; the gateway adds the prefix.
PREFIX = "drill."
ADAPTER_ENV = "LEDGERDASH_DRILL_ADAPTER"
MAX_REQUEST_ENV = "LEDGERDASH_DRILL_MAX_REQUEST_SECONDS"


def _send(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    from ledgerdash.ledger.providers.http import HttpAdapter

    adapter = HttpAdapter.from_config(PREFIX + tool, json.loads(os.environ[ADAPTER_ENV]))
    adapter.max_request_seconds = float(os.environ.get(MAX_REQUEST_ENV, "1.0"))
    sent = adapter.dispatch(key=str(arguments["key"]), args=arguments)
    return {"id": sent.request_id, "ref": sent.result_ref, "response": sent.response}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")
    django.setup()  # the adapter checks arguments against the ledger's limits
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("ledgerdash-drill-upstream")

    @app.tool()
    def send_email(case: str, to: str, amount_cents: int, key: str) -> dict[str, Any]:
        """Send the drill's email at the sandbox provider (idempotent there)."""
        return _send("send_email", {"case": case, "to": to, "amount_cents": amount_cents, "key": key})

    @app.tool()
    def charge_card(case: str, to: str, amount_cents: int, key: str) -> dict[str, Any]:
        """Charge at the sandbox provider (which may ignore the key: then every call is a charge)."""
        return _send("charge_card", {"case": case, "to": to, "amount_cents": amount_cents, "key": key})

    app.run("stdio")


if __name__ == "__main__":
    main()

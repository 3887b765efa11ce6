"""The crash drill's upstream MCP server: the drill's tools, served over
stdio with the official MCP SDK, each sending its call to the provider
through the adapter the drill's tools use, as a real MCP server in front of
a provider's API would. The gateway (:mod:`ledgerdash.ledger.gateway`)
records every call in the ledger; the provider (the sandbox or a replica)
counts the effects, and recovery looks them up.

Against the sandbox the tools take the drill's own arguments, the key among
them. Against a provider's replica they take the preset's arguments, and
the key is the one the gateway sends with each call
(``_meta["io.ledgerdash/provider_key"]``): what a preset writes into the
call, so that recovery finds it.

    LEDGERDASH_DRILL_ADAPTER='{"name": …, "adapter": "http", "config": {…}}' \\
        python -m ledgerdash.ledger.drill.mcp_upstream
"""

from __future__ import annotations

import json
import os
from typing import Any

import django

#: The drill's tools as this server lists them; the gateway adds the prefix.
PREFIX = "drill."
ADAPTER_ENV = "LEDGERDASH_DRILL_ADAPTER"
TOOLS = ("send_email", "charge_card", "send_email_claimed")


def _spec(tool: str) -> Any:
    from ledgerdash.ledger.providers.factory import ToolSpec

    return ToolSpec(**{**json.loads(os.environ[ADAPTER_ENV]), "name": PREFIX + tool})


def _send(tool: str, key: str, arguments: dict[str, Any]) -> dict[str, Any]:
    from ledgerdash.ledger.providers.factory import build_adapter

    sent = build_adapter(_spec(tool)).dispatch(key=key, args=arguments)
    return {"id": sent.request_id, "ref": sent.result_ref, "response": sent.response}


def _sandbox_tools() -> None:
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("ledgerdash-drill-upstream")

    @app.tool()
    def send_email(case: str, to: str, amount_cents: int, key: str) -> dict[str, Any]:
        """Send the drill's email at the sandbox provider (idempotent there)."""
        return _send("send_email", key, {"case": case, "to": to, "amount_cents": amount_cents, "key": key})

    @app.tool()
    def charge_card(case: str, to: str, amount_cents: int, key: str) -> dict[str, Any]:
        """Charge at the sandbox provider (which may ignore the key: then every call is a charge)."""
        return _send("charge_card", key, {"case": case, "to": to, "amount_cents": amount_cents, "key": key})

    app.run("stdio")


def _preset_tools(preset: str) -> None:
    import anyio
    import mcp_types as types
    from mcp.server import Server, ServerRequestContext
    from mcp.server.stdio import stdio_server

    from ledgerdash.ledger.gateway.keys import META_PROVIDER_KEY

    async def list_tools(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        schema = {"type": "object", "additionalProperties": True}
        return types.ListToolsResult(
            tools=[types.Tool(name=name, description=f"{preset} at its replica", input_schema=schema) for name in TOOLS]
        )

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        key = str((params.meta or {}).get(META_PROVIDER_KEY) or "")
        if not key:
            raise ValueError(f"no {META_PROVIDER_KEY} in the call's metadata: this server runs behind the gateway")
        sent = await anyio.to_thread.run_sync(lambda: _send(params.name, key, dict(params.arguments or {})))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(sent))], structured_content=sent
        )

    async def serve() -> None:
        server = Server("ledgerdash-drill-upstream", on_list_tools=list_tools, on_call_tool=call_tool)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledgerdash.settings")
    django.setup()  # the adapter checks arguments against the ledger's limits
    spec = json.loads(os.environ[ADAPTER_ENV])
    if spec.get("adapter") == "preset":
        _preset_tools(spec["config"]["preset"])
    else:
        _sandbox_tools()


if __name__ == "__main__":
    main()

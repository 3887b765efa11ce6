"""``manage.py mcp_gateway CONFIG``: serve the configured upstream MCP servers'
tools as one MCP server, every call recorded in the ledger (see
:mod:`ledgerdash.ledger.gateway`)."""

from __future__ import annotations

import logging
import sys
from functools import partial
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandError, CommandParser

#: What the mcp extra installs: a missing one is a missing extra, not a bug.
EXTRA_MODULES = ("mcp", "mcp_types", "anyio", "uvicorn", "httpx", "httpx2", "jsonschema")


class Command(BaseCommand):
    help = "Serve upstream MCP servers' tools through the ledger, over stdio (default) or streamable HTTP."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("config", help="the gateway's TOML configuration file")
        parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765)
        parser.add_argument("--path", default="/mcp", help="the streamable HTTP endpoint's path")
        parser.add_argument("--agent", default="mcp-gateway", help="who the ledger records as the dispatcher")
        parser.add_argument(
            "--start-wait",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="at start, how long to wait for upstreams still connecting before serving the others' tools "
            "(an upstream that refuses the connection is not waited for; default 10)",
        )
        parser.add_argument("--check", action="store_true", help="read the configuration, report, and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from ledgerdash.ledger.gateway import checks
            from ledgerdash.ledger.gateway.config import ConfigError, load
            from ledgerdash.ledger.gateway.server import Gateway
        except ImportError as exc:
            if (exc.name or "").split(".")[0] not in EXTRA_MODULES:
                raise  # the gateway's own code is broken: not a missing extra
            raise CommandError(f"the MCP gateway needs the mcp extra (pip install 'ledgerdash[mcp]'): {exc}") from None
        try:
            config = load(options["config"])
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        refused = checks.problems(config)
        if refused:
            raise CommandError(f"{options['config']}: " + "; ".join(refused))
        if options["check"]:
            self.stdout.write(
                f"tenant {config.tenant}, task {config.task_id}: {len(config.upstreams)} upstream(s), "
                f"{len(config.tools)} configured tool(s)"
            )
            for note in checks.notes(config):
                self.stdout.write(f"note: {note}")
            return
        # Standard output is the MCP channel under stdio: logs go to standard error.
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        if options["start_wait"] < 0:
            raise CommandError("--start-wait: give a number of seconds, 0 or more")
        gateway = Gateway(config, agent=options["agent"])
        serve = _http(options["host"], options["port"], options["path"]) if options["http"] else _stdio
        anyio.run(partial(gateway.serve, serve, start_wait=options["start_wait"]))


async def _stdio(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _http(host: str, port: int, path: str) -> Any:
    async def run(server: Any) -> None:
        import uvicorn

        app = server.streamable_http_app(streamable_http_path=path, host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        sys.stderr.write(f"mcp gateway listening on http://{host}:{port}{path}\n")
        await uvicorn.Server(config).serve()

    return run

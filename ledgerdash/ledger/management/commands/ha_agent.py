"""The failover drill's agent (started by ``ha_drill``; see ledgerdash.ha.agent)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ledgerdash.ha.agent import Agent


class Command(BaseCommand):
    help = "Call tools, one key after another, until SIGTERM; one JSON line per call (used by ha_drill)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--via", choices=["process", "http"], required=True)
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--tools", required=True, help="JSON: a list of tool specs (name, adapter, config, ...)")
        parser.add_argument("--prefix", required=True, help="the start of every key this agent uses")
        parser.add_argument("--url", default="", help="the ledger's base URL (--via http)")
        parser.add_argument(
            "--token", default=os.environ.get("LEDGERDASH_API_TOKEN", ""), help="an agent's API token (--via http)"
        )
        parser.add_argument("--grace", type=float, default=60.0, help="seconds a call may go on after SIGTERM")

    def handle(self, *args: Any, **options: Any) -> None:
        Agent(
            via=options["via"],
            tenant=options["tenant"],
            tools=json.loads(options["tools"]),
            prefix=options["prefix"],
            url=options["url"],
            token=options["token"],
            grace=options["grace"],
            out=sys.stdout,
        ).run()

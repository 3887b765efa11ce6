"""Run the sandbox provider service (``python -m ledgerdash.sandbox`` does the same)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from ledgerdash.sandbox.server import main


class Command(BaseCommand):
    help = "Run the sandbox provider: a real HTTP service that performs and counts effects, with switchable faults."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8100)
        parser.add_argument("--db", default=str(settings.VAR_DIR / "sandbox.sqlite3"))
        parser.add_argument("--key-retention", type=float, default=86400.0)
        parser.add_argument("--verbose", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        argv = ["--host", options["host"], "--port", str(options["port"]), "--db", options["db"]]
        argv += ["--key-retention", str(options["key_retention"])]
        if options["verbose"]:
            argv.append("--verbose")
        main(argv)

"""The crash drill's agent worker (started by ``crashdrill``; see ledgerdash.ledger.drill.agent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ledgerdash.ledger.drill.agent import serve


class Command(BaseCommand):
    help = "Run drill jobs from standard input, each in a forked agent process (used by crashdrill)."

    def handle(self, *args: Any, **options: Any) -> None:
        serve()

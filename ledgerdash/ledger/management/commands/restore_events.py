"""Bring an archived partition of the events back into the database (PostgreSQL, as the owner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import archive


class Command(BaseCommand):
    help = (
        "Load an archived partition back from DIR (archive_events' files), checked against the digest and the "
        "chains the ledger recorded when it archived it, and attach it again. The newest archive comes back first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", type=Path, metavar="DIR", help="where archive_events wrote the files")
        parser.add_argument("partition", help="the archived partition's name (as archive_events printed it)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            record = archive.restore(options["directory"], options["partition"])
        except archive.ArchiveError as exc:
            raise CommandError(f"nothing restored: {exc}") from None
        self.stdout.write(f"restored {record.name}: {record.events} events from {record.file}")

"""Archive the oldest partitions of the events to files (PostgreSQL, as the owner)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import archive
from ledgerdash.ops.progress import Progress


class Command(BaseCommand):
    help = (
        "Move the oldest partitions of the events out of the database into DIR (gzip NDJSON, with a manifest of "
        "each chain's ends there), one after the other while each is closed, older than --older-than, settled and "
        "verified by verify_audit. Run as the owner. verify_audit --archive DIR walks archive and live together."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", type=Path, metavar="DIR", help="where the archive files go")
        parser.add_argument(
            "--older-than",
            type=int,
            required=True,
            metavar="DAYS",
            help="archive a partition only when its newest event is older than this",
        )
        parser.add_argument("--limit", type=int, help="archive at most this many partitions")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["older_than"] < 0:
            raise CommandError("--older-than is a number of days, at least 0")
        with Progress("partitions archived", total=options["limit"], write=self.stdout.write) as bar:
            try:
                archive.archive_oldest(
                    options["directory"],
                    older_than=timedelta(days=options["older_than"]),
                    limit=options["limit"],
                    archived=lambda record: bar.done(
                        f"archived {record.name}: {record.events} events to {record.file} ({record.sha256})"
                    ),
                )
            except archive.ArchiveError as exc:
                raise CommandError(f"nothing archived: {exc}") from None

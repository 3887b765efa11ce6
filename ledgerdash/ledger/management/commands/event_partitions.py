"""List the events' partitions on PostgreSQL, and make ranges ahead."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import partitions


class Command(BaseCommand):
    help = (
        "The events' partitions (PostgreSQL): their id ranges, rows, size and the time their events span. "
        "--make-ahead N keeps N empty ranges past the one being written (run it as the owner, as migrate runs)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--make-ahead",
            type=int,
            metavar="N",
            help="make ranges until N empty ones lie past the one being written",
        )
        parser.add_argument(
            "--size",
            type=int,
            default=partitions.SIZE,
            help=f"ids per range made (default {partitions.SIZE:,})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["make_ahead"] is not None:
                done = partitions.make_ahead(ahead=options["make_ahead"], size=options["size"])
                for line in done or ["nothing to make: enough ranges lie ahead"]:
                    self.stdout.write(line)
            for partition in partitions.partitions():
                self.stdout.write(partition.describe())
        except (partitions.PartitionsUnavailable, ValueError) as exc:
            raise CommandError(str(exc)) from None

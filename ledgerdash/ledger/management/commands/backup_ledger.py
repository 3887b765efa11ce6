"""Back up the whole database, the ledger included (pg_dump, or SQLite's backup API)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from ledgerdash.ledger import backup
from ledgerdash.ops.logs import LoggedChecks


class Command(LoggedChecks, BaseCommand):
    help = (
        "Write a consistent snapshot of the database to FILE: pg_dump's custom format on PostgreSQL, "
        "a SQLite database file on SQLite. Prints each tenant's chain head, to keep beside the backup."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", required=True, type=Path, help="the backup file to write")

    def handle(self, *args: Any, **options: Any) -> None:
        out: Path = options["out"]
        if out.exists():
            raise CommandError(f"{out} exists; choose a new file")
        heads = backup.heads()
        try:
            backup.backup(out)
        except backup.BackupError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"backed up the {connection.vendor} database to {out} ({out.stat().st_size} bytes)")
        for slug, seq, digest in heads:
            self.stdout.write(f"  {slug}: chain head at backup time seq {seq} {digest}")

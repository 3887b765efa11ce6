"""Restore a backup made by backup_ledger, then verify every chain in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from ledgerdash.ledger import backup
from ledgerdash.ledger.models import Tenant
from ledgerdash.ops.progress import Progress


class Command(BaseCommand):
    help = (
        "Replace this database's contents with a backup_ledger FILE, then walk every tenant's event chain "
        "as verify_audit does. Exit 1, naming the first break, if a chain does not verify."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("backup", type=Path, help="a file written by backup_ledger")
        parser.add_argument(
            "--replace", action="store_true", help="overwrite a database that already holds ledger events"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if backup.has_ledger() and not options["replace"]:
            raise CommandError(
                f"the {connection.vendor} database {connection.settings_dict['NAME']} already holds ledger events; "
                "restore into an empty database, or pass --replace to overwrite it"
            )
        try:
            backup.restore(options["backup"])
        except backup.BackupError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"restored {options['backup']} into the {connection.vendor} database")
        with Progress("restored chains walked", total=Tenant.objects.count(), write=self.stdout.write) as bar:
            results = backup.verify_restored(walked=lambda _result: bar.advance())
        for result in results:
            style = self.style.SUCCESS if result.ok else self.style.ERROR
            self.stdout.write(style(result.describe()))
        broken = [r for r in results if not r.ok]
        if broken:
            raise CommandError(
                f"THE RESTORED LEDGER DOES NOT VERIFY: {len(broken)} of {len(results)} chains are broken "
                f"({'; '.join(r.broken.message for r in broken if r.broken)}). Do not serve from this database; "
                "restore an earlier backup.",
                returncode=1,
            )
        self.stdout.write(f"restored ledger verified: {len(results)} chains")

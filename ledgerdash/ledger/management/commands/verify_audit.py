"""Walk every tenant's event chain and report the first break, with the event named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import audit
from ledgerdash.ledger.archive import ArchiveError
from ledgerdash.ledger.models import Tenant
from ledgerdash.ops.logs import LoggedChecks
from ledgerdash.ops.progress import Progress


class Command(LoggedChecks, BaseCommand):
    help = (
        "Verify the hash-chained event log of each tenant (all by default): seq contiguity, content hashes, "
        "links, the chain head, that every attempt has events, and that each head kept earlier (--known-head, "
        "--known-heads, the furthest an earlier run verified) is still on the chain. Exit 1 on the first break."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", default=[], help="a tenant's slug (repeat for several)")
        parser.add_argument(
            "--no-save", action="store_true", help="do not store the result for the dashboard's chain badge"
        )
        parser.add_argument(
            "--incremental",
            action="store_true",
            help="start from the heads the last walk verified and read only what was appended since (they must "
            "still be on the chain); the full walk, the default, also reads every older event again",
        )
        parser.add_argument(
            "--archive",
            type=Path,
            metavar="DIR",
            help="where archive_events wrote the archived partitions: read them and walk archive and live as one "
            "chain per tenant (without it, each chain starts where the archive ends it)",
        )
        parser.add_argument(
            "--known-head",
            action="append",
            default=[],
            metavar="TENANT:SEQ:HASH",
            help="a head kept earlier: the chain must still reach it, with that hash (repeatable)",
        )
        parser.add_argument(
            "--known-heads",
            action="append",
            default=[],
            type=Path,
            metavar="FILE",
            help="the heads in FILE: an export (CSV or NDJSON), backup_ledger's output, or TENANT:SEQ:HASH lines",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        slugs: list[str] = options["tenant"]
        tenants = list(Tenant.objects.order_by("slug"))
        if slugs:
            known = {t.slug for t in tenants}
            unknown = [slug for slug in slugs if slug not in known]
            if unknown:
                raise CommandError(f"no such tenant: {', '.join(unknown)}")
            tenants = [t for t in tenants if t.slug in slugs]
        kept: dict[str, list[audit.KnownHead]] = {}
        try:
            pairs = [audit.parse_known_head(text) for text in options["known_head"]]
            for path in options["known_heads"]:
                pairs += audit.read_known_heads(path)
        except audit.KnownHeadError as exc:
            raise CommandError(str(exc)) from None
        slugs_known = {t.slug for t in Tenant.objects.all()}
        for slug, head in pairs:
            if slug not in slugs_known:
                raise CommandError(f"a known head names no tenant of this ledger: {slug}")
            kept.setdefault(slug, []).append(head)
        try:
            with Progress("chains walked", total=len(tenants), write=self.stdout.write) as bar:
                results = audit.verify(
                    tenants,
                    save=not options["no_save"],
                    known=kept,
                    incremental=options["incremental"],
                    archive_dir=options["archive"],
                    walked=lambda _result: bar.advance(),
                )
        except ArchiveError as exc:
            raise CommandError(str(exc), returncode=1) from None
        for result in results:
            style = self.style.SUCCESS if result.ok else self.style.ERROR
            self.stdout.write(style(result.describe()) + f" [{result.duration_ms} ms]")
        broken = [r for r in results if not r.ok]
        if broken:
            raise CommandError(f"{len(broken)} of {len(results)} chains do not verify", returncode=1)
        self.stdout.write(f"{len(results)} chain{'s' if len(results) != 1 else ''} verified")

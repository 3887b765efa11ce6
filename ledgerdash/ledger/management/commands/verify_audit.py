"""Walk every tenant's event chain and report the first break, with the event named."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import audit
from ledgerdash.ledger.models import Tenant


class Command(BaseCommand):
    help = (
        "Verify the hash-chained event log of each tenant (all by default): seq contiguity, content hashes, "
        "links, the chain head, and that every attempt has events. Exit 1 on the first break."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", default=[], help="a tenant's slug (repeat for several)")
        parser.add_argument(
            "--no-save", action="store_true", help="do not store the result for the dashboard's chain badge"
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
        results = audit.verify(tenants, save=not options["no_save"])
        for result in results:
            style = self.style.SUCCESS if result.ok else self.style.ERROR
            self.stdout.write(style(result.describe()) + f" [{result.duration_ms} ms]")
        broken = [r for r in results if not r.ok]
        if broken:
            raise CommandError(f"{len(broken)} of {len(results)} chains do not verify", returncode=1)
        self.stdout.write(f"{len(results)} chain{'s' if len(results) != 1 else ''} verified")

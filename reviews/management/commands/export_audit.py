"""Export attempts with their events, with the queues' filters, as CSV or NDJSON."""

from __future__ import annotations

import getpass
import sys
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import State, Tenant
from ledgerdash.ops.progress import Progress
from reviews import exports
from reviews.queries import ListQuery


def _moment(text: str) -> datetime:
    value = parse_datetime(text)
    if value is None:
        raise CommandError(f"{text!r} is not a date and time (use ISO 8601, e.g. 2026-01-31T00:00:00Z)")
    if value.tzinfo is None:
        raise CommandError(f"{text!r} has no time zone; add Z or an offset")
    return value


class Command(BaseCommand):
    help = (
        "Stream attempts with their events (one row per event, chain order) to FILE or stdout, with the "
        "queues' filters. Without filters a tenant's export is full: every event up to the chain head. "
        "Recorded as an audit event in each exported tenant's chain."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=exports.FORMATS, default="csv")
        parser.add_argument("--tenant", action="append", required=True, help="a tenant's slug (repeat for several)")
        parser.add_argument("--state", choices=State.values)
        parser.add_argument("--tool", help="a tool name")
        parser.add_argument("--owner", help="a username, or 'unassigned'")
        parser.add_argument("--since", type=_moment, help="attempts created at or after (ISO 8601)")
        parser.add_argument("--until", type=_moment, help="attempts created before (ISO 8601)")
        parser.add_argument(
            "--links", action="store_true", help="write filtered-out events as link rows (walkable to the head)"
        )
        parser.add_argument("--out", required=True, help="a file, or - for stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        slugs: list[str] = options["tenant"]
        tenants = list(Tenant.objects.filter(slug__in=slugs).order_by("slug"))
        unknown = sorted(set(slugs) - {t.slug for t in tenants})
        if unknown:
            raise CommandError(f"no such tenant: {', '.join(unknown)}")
        owner, owner_user = options["owner"] or "anyone", None
        if owner not in ("anyone", "unassigned"):
            owner_user = get_user_model().objects.filter(username=owner).first()
            if owner_user is None:
                raise CommandError(f"no such user: {owner}")
            owner = "me"  # the filter's "me" is whoever owner_user is
        filters = {name: str(options[name]) for name in ("state", "tool", "owner", "since", "until") if options[name]}
        query = ListQuery(
            tenant_ids=tuple(t.pk for t in tenants),
            state=options["state"] or "",
            tool=options["tool"] or "",
            owner=owner,
            since=options["since"],
            until=options["until"],
        )
        request = exports.ExportRequest(
            tenants=tenants,
            format=options["format"],
            actor=Actor.system(f"manage.py export_audit ({getpass.getuser()})"),
            query=query if filters else None,
            owner_user=owner_user,
            links=options["links"],
            filters={"tenant": ",".join(slugs), **filters},
        )
        if options["out"] == "-":
            for text in exports.stream(request):
                sys.stdout.write(text)
            sys.stdout.flush()
            return
        with (
            open(options["out"], "w", encoding="utf-8", newline="") as out,
            Progress("exporting (batches written)", total=None, write=self.stderr.write) as bar,
        ):
            for text in exports.stream(request):
                out.write(text)
                bar.advance()
        self.stderr.write(f"exported to {options['out']}")

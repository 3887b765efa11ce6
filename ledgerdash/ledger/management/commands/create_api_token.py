"""Issue an ingest API token for a tenant and print it, once.

    manage.py create_api_token --tenant acme --name "billing agent"
    manage.py create_api_token --tenant acme --name reporter --scope attempts:read --days 30

The token alone goes to standard output (``TOKEN=$(manage.py create_api_token …)``);
what it is goes to standard error. The ledger keeps only its hash.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ledgerdash.ledger.errors import InvalidField
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import AGENT_SCOPES, Tenant, TokenScope
from ledgerdash.ledger.tokens import DEFAULT_LIFETIME, token_create


class Command(BaseCommand):
    help = "Issue an API token for a tenant; prints it once (only its hash is kept)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--name", required=True, help="what the token is for, e.g. the agent that holds it")
        parser.add_argument(
            "--scope",
            action="append",
            choices=TokenScope.values,
            help="repeat for several; default: an agent's (attempts:read and attempts:write). "
            "approvals:decide is a person's token (--person), alone or with attempts:read",
        )
        parser.add_argument(
            "--person", help="the username an approvals:decide token acts for (an approver or admin of the tenant)"
        )
        lifetime = parser.add_mutually_exclusive_group()
        lifetime.add_argument(
            "--days", type=int, default=DEFAULT_LIFETIME.days, help="days until it expires (default %(default)s)"
        )
        lifetime.add_argument("--no-expiry", action="store_true", help="never expires (prefer rotating tokens)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = Tenant.objects.get(slug=options["tenant"])
        except Tenant.DoesNotExist:
            raise CommandError(f"no tenant {options['tenant']!r}") from None
        if options["days"] < 1:
            raise CommandError("--days must be 1 or more")
        expires_at = None if options["no_expiry"] else timezone.now() + timedelta(days=options["days"])
        person = None
        if options["person"]:
            person = get_user_model().objects.filter(username=options["person"]).first()
            if person is None:
                raise CommandError(f"no person {options['person']!r}")
        try:
            token, raw = token_create(
                tenant=tenant,
                name=options["name"],
                scopes=options["scope"] or AGENT_SCOPES,
                expires_at=expires_at,
                actor=Actor.system("manage.py create_api_token"),
                person=person,
            )
        except InvalidField as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(
            f"API token {token.prefix} ({token.name}) for {tenant.slug}, scopes {token.scopes}, "
            + (f"acting for {person.get_username()}, " if person is not None else "")
            + f"{'never expires' if expires_at is None else f'expires {expires_at:%Y-%m-%d %H:%M} UTC'}. "
            "It is shown only now:"
        )
        self.stdout.write(raw)

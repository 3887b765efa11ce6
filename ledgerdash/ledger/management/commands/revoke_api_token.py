"""Revoke an ingest API token by its public prefix (the part after ``ldk_``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken
from ledgerdash.ledger.tokens import token_revoke


class Command(BaseCommand):
    help = "Revoke an API token by its prefix; requests with it answer 401 from now on."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix", help="the token's prefix, as listed in the admin (e.g. 3f9a0c1b2d4e)")

    def handle(self, *args: Any, **options: Any) -> None:
        prefix = options["prefix"].removeprefix("ldk_").split("_", 1)[0]
        try:
            token = ApiToken.objects.get(prefix=prefix)
        except ApiToken.DoesNotExist:
            raise CommandError(f"no API token with prefix {prefix!r}") from None
        already = token.revoked_at is not None
        token_revoke(token=token, actor=Actor.system("manage.py revoke_api_token"))
        self.stdout.write(f"API token {token.prefix} ({token.name}) {'was already' if already else 'is now'} revoked")

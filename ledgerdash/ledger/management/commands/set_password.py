"""``manage.py set_password USER``: give a person a password without a prompt.

For scripted set-ups (``changepassword`` asks at a terminal): the password
comes from an environment variable or from standard input, never from the
command line (which other users of the host can read in the process list).
It must pass the site's password validators, as a password set in the
dashboard does.

    LEDGERDASH_PASSWORD=… python manage.py set_password alice --from-env LEDGERDASH_PASSWORD
    printf '%s\\n' "$PASSWORD" | python manage.py set_password alice --stdin
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Set a person's password from an environment variable or standard input (no prompt)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--from-env", metavar="VARIABLE", help="read the password from this environment variable")
        source.add_argument("--stdin", action="store_true", help="read the password from standard input's first line")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        try:
            user = users._default_manager.get_by_natural_key(options["username"])
        except users.DoesNotExist:
            raise CommandError(f"no person named {options['username']!r}") from None
        if options["from_env"]:
            password = os.environ.get(options["from_env"], "")
            if not password:
                raise CommandError(f"the environment variable {options['from_env']} is not set or empty")
        else:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("no password on standard input")
        try:
            password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("the password was refused: " + " ".join(exc.messages)) from None
        user.set_password(password)
        user.save(update_fields=["password"])
        self.stdout.write(f"{user.get_username()}: password set")

"""Print (or apply) the SQL that splits the database into an owner role and a runtime role."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from ledgerdash.ledger import dbroles


class Command(BaseCommand):
    help = (
        "Print the SQL that makes OWNER own the database and its tables (it runs migrations) and gives "
        "RUNTIME (the app's connection) only row privileges: no DDL, no TRUNCATE, no UPDATE/DELETE on "
        "events, default privileges for future tables and sequences. --apply runs it on this "
        "connection (a superuser, or the owner without --create-roles). Run it again after every migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--owner", required=True, help="the role that owns the tables and runs migrations")
        parser.add_argument("--runtime", required=True, help="the role the app connects as")
        parser.add_argument("--database", help="the database (default: the configured one)")
        parser.add_argument(
            "--create-roles", action="store_true", help="also create the roles if missing (needs a superuser)"
        )
        parser.add_argument("--apply", action="store_true", help="run the statements instead of printing them")

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql" and options["apply"]:
            raise CommandError("database roles are PostgreSQL's; SQLite has no roles (protect the file instead)")
        owner, runtime = options["owner"], options["runtime"]
        if owner == runtime:
            raise CommandError("the owner and the runtime role must be two roles")
        database = options["database"] or str(connection.settings_dict["NAME"])
        try:
            create = dbroles.create_role_statements(owner=owner, runtime=runtime) if options["create_roles"] else []
            grants = dbroles.grant_statements(owner=owner, runtime=runtime, database=database)
        except dbroles.RoleNameError as exc:
            raise CommandError(str(exc)) from None
        if not options["apply"]:
            self.stdout.write(
                dbroles.script(owner=owner, runtime=runtime, database=database, create_roles=options["create_roles"])
            )
            return
        if options["database"] and options["database"] != connection.settings_dict["NAME"]:
            raise CommandError("--apply runs on the configured database; point DATABASE_URL at it")
        if not options["create_roles"]:
            with connection.cursor() as cursor:
                cursor.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [[owner, runtime]])
                found = {row[0] for row in cursor.fetchall()}
            missing = [role for role in (owner, runtime) if role not in found]
            if missing:
                raise CommandError(
                    f"no role {' or '.join(missing)} on this server: create it first as a superuser "
                    "(docs/security.md, Deploying: database roles), or name the roles you made "
                    "(--owner/--runtime; deploy/migrate reads DB_OWNER_ROLE and DB_RUNTIME_ROLE)"
                )
        with transaction.atomic(), connection.cursor() as cursor:  # all or nothing
            for statement in [*create, *grants]:
                cursor.execute(statement)
        self.stdout.write(f"{database}: owned by {owner}; {runtime} has row privileges only")

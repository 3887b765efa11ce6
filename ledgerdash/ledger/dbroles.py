"""Two PostgreSQL roles: an owner that runs migrations, and a runtime role the app connects as.

The app needs to read and write rows; it never needs to change the schema.
A role that owns the tables can ``ALTER TABLE … DISABLE TRIGGER`` and then
edit history, so the app must not connect as one:

- the **owner** owns the database, its schema objects and every table; it
  runs ``manage.py migrate`` (and restores, and this command), nothing else;
- the **runtime** role can connect, use the schema, and SELECT, INSERT,
  UPDATE and DELETE rows, with no UPDATE or DELETE on the events, the
  providers' ids and the tools' retention history, no DELETE on attempts
  and chain heads, and no TRUNCATE, REFERENCES or TRIGGER on anything.
  It owns nothing, so it can neither alter a table nor switch a trigger
  off.

Default privileges make the owner's future tables and sequences usable by
the runtime role as soon as a migration creates them. The statements are
idempotent: run them again after every ``migrate`` (they also take over
tables an earlier deployment created as another role, and re-apply the
protected tables' revocations, which a new table of that kind needs).
"""

from __future__ import annotations

import re

from django.conf import settings

#: Rows the app adds but never changes or removes (history; a provider's id and the side effect it is the
#: outcome of; what a tool's retention said from when).
APPEND_ONLY = ("ledger_attemptevent", "ledger_providerid", "ledger_toolretention")
#: Rows the app changes but never removes.
NEVER_DELETED = ("ledger_attempt", "ledger_chainhead", "ledger_incident")
#: Rows only the owner writes (archive_events and restore_events run as the owner); the app reads them.
READ_ONLY = ("ledger_eventarchive",)

_TAKE_OWNERSHIP = """DO $$ DECLARE item record; BEGIN
  FOR item IN
    SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END AS kind, c.oid::regclass::text AS name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
      AND c.relowner <> 'OWNER_NAME'::regrole
      AND NOT (c.relkind = 'S' AND EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
               AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
  LOOP
    EXECUTE format('ALTER %s %s OWNER TO %I', item.kind, item.name, 'OWNER_NAME');
  END LOOP;
  FOR item IN
    SELECT p.oid::regprocedure::text AS name FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public' AND p.proowner <> 'OWNER_NAME'::regrole
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO %I', item.name, 'OWNER_NAME');
  END LOOP;
END $$"""

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class RoleNameError(ValueError):
    pass


def identifier(name: str) -> str:
    """``name`` quoted for SQL; only plain lower-case names, so the SQL printed is the SQL run."""
    if not _NAME.fullmatch(name):
        raise RoleNameError(
            f"{name!r} is not a plain PostgreSQL name (lower-case letters, digits and _, at most 63, "
            "not starting with a digit)"
        )
    return f'"{name}"'


def create_role_statements(*, owner: str, runtime: str) -> list[str]:
    """The two roles, created if missing (needs a superuser or CREATEROLE); passwords are set apart."""
    statements = []
    for name, inherit in ((owner, "INHERIT"), (runtime, "NOINHERIT")):
        quoted = identifier(name)
        statements.append(
            "DO $$ BEGIN\n"
            f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN\n"
            f"    CREATE ROLE {quoted} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS {inherit};\n"
            "  END IF;\n"
            "END $$"
        )
        statements.append(
            f"ALTER ROLE {quoted} NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        )  # an existing role of that name gets no more than it needs
    # The app's timeouts as the runtime role's own: behind a pooler in
    # transaction mode the app cannot send them when it connects
    # (DATABASE_TRANSACTION_POOLER); elsewhere what it sends overrides them.
    statement_ms, lock_ms = settings.DATABASE_TIMEOUTS_MS
    statements.append(f"ALTER ROLE {identifier(runtime)} SET statement_timeout = {int(statement_ms)}")
    statements.append(f"ALTER ROLE {identifier(runtime)} SET lock_timeout = {int(lock_ms)}")
    return statements


def grant_statements(*, owner: str, runtime: str, database: str) -> list[str]:
    """Ownership and privileges in ``database`` (run connected to it, as a superuser or the owner)."""
    o, r, db = identifier(owner), identifier(runtime), identifier(database)
    statements = [
        f"ALTER DATABASE {db} OWNER TO {o}",
        f"REVOKE ALL ON DATABASE {db} FROM PUBLIC",
        f"GRANT CONNECT, TEMPORARY ON DATABASE {db} TO {r}",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
        f"GRANT USAGE, CREATE ON SCHEMA public TO {o}",
        f"GRANT USAGE ON SCHEMA public TO {r}",
        # Tables, views, sequences nobody's column owns, and functions that
        # another role created (an earlier deployment migrating as a
        # superuser) become the owner's: the runtime role must own nothing.
        _TAKE_OWNERSHIP.replace("OWNER_NAME", owner),  # a plain name: identifier() checked it
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {r}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {r}",
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {r}",
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {r}",
    ]
    # Guarded, so the statements also run before the first migrate.
    revoked = [(t, "UPDATE, DELETE") for t in APPEND_ONLY] + [(t, "DELETE") for t in NEVER_DELETED]
    revoked += [(t, "INSERT, UPDATE, DELETE") for t in READ_ONLY]
    for table, privileges in revoked:
        statements.append(
            f"DO $$ BEGIN IF to_regclass('public.{table}') IS NOT NULL THEN "
            f"REVOKE {privileges} ON {table} FROM {r}; END IF; END $$"
        )
    # The events' partitions (PostgreSQL keeps them by id range): the app
    # reaches their rows through the partitioned table, whose privileges are
    # the ones checked; on a partition itself it may read (pg_dump does), no more.
    # (to_regclass: nothing to do before the first migrate)
    partitions = "SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('public.ledger_attemptevent')"
    statements.append(
        f"DO $$ DECLARE part oid; BEGIN FOR part IN {partitions} "
        f"LOOP EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON %s FROM {r}', part::regclass); END LOOP; END $$"
    )
    return statements


def script(*, owner: str, runtime: str, database: str, create_roles: bool) -> str:
    """The whole SQL script, for a person to read or feed to psql."""
    parts = ["-- ledgerdash database roles: owner (migrations) and runtime (the app)"]
    if create_roles:
        parts.append("-- as a superuser, connected to any database:")
        parts += [s + ";" for s in create_role_statements(owner=owner, runtime=runtime)]
    parts.append(f"-- as a superuser or {owner}, connected to {database}:")
    parts += [s + ";" for s in grant_statements(owner=owner, runtime=runtime, database=database)]
    return "\n".join(parts) + "\n"

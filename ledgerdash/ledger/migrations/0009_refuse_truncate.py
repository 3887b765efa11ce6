"""PostgreSQL refuses TRUNCATE on the tables the ledger must never lose rows from.

The append-only triggers (0002) fire for each row an UPDATE or DELETE
touches; TRUNCATE touches no rows one by one, so it removed every event
without firing them (``TRUNCATE ledger_attemptevent CASCADE``, or Django's
``flush``, which truncates every table). A statement-level BEFORE TRUNCATE
trigger on the events, the attempts and the chain heads refuses it, whoever
asks, and also when the table is reached through another table's
``TRUNCATE … CASCADE``.

There is no escape hatch (no session setting that lets a TRUNCATE through):
a role that may switch the trigger off (the tables' owner, a superuser)
could drop it as well; the runtime role the app connects as cannot do
either (``manage.py db_roles``). The test suite gets its clean slate from a
fresh copy of a template database instead (``tests/database_roles.py``).

SQLite has no TRUNCATE: its ``DELETE FROM`` without a WHERE clause runs the
row triggers, so 0002's DELETE trigger already refuses it there.
"""

from django.db import migrations

#: The tables whose rows are history: events, the attempts they describe, and
#: each tenant's chain head (a lost head would let a shortened chain verify), and
#: the incidents people must settle.
PROTECTED = ("ledger_attemptevent", "ledger_attempt", "ledger_chainhead", "ledger_incident")

PG_FORWARD = [
    """
CREATE OR REPLACE FUNCTION ledger_refuse_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger never loses rows: TRUNCATE refused on %', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;
"""
] + [
    f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_truncate();"
    for table in PROTECTED
]
PG_REVERSE = [f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};" for table in PROTECTED] + [
    "DROP FUNCTION IF EXISTS ledger_refuse_truncate();"
]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_FORWARD:
            schema_editor.execute(statement, params=None)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_REVERSE:
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0008_evidence_and_incidents")]
    operations = [migrations.RunPython(forward, reverse)]

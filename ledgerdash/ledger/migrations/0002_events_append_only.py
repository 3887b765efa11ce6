"""The database itself refuses to change or remove ledger events.

The hash chain detects tampering after the fact; these triggers stop the
application (or a careless maintenance query) from doing it in the first
place. Both raise an integrity error naming the refused operation.
"""

from django.db import migrations

PG_FORWARD = """
CREATE OR REPLACE FUNCTION ledger_refuse_event_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger events are append-only: % refused on %', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER ledger_attemptevent_append_only
    BEFORE UPDATE OR DELETE ON ledger_attemptevent
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_event_change();
"""
PG_REVERSE = """
DROP TRIGGER IF EXISTS ledger_attemptevent_append_only ON ledger_attemptevent;
DROP FUNCTION IF EXISTS ledger_refuse_event_change();
"""
SQLITE_FORWARD = [
    """CREATE TRIGGER ledger_attemptevent_no_update BEFORE UPDATE ON ledger_attemptevent
       BEGIN SELECT RAISE(ABORT, 'ledger events are append-only: UPDATE refused on ledger_attemptevent'); END""",
    """CREATE TRIGGER ledger_attemptevent_no_delete BEFORE DELETE ON ledger_attemptevent
       BEGIN SELECT RAISE(ABORT, 'ledger events are append-only: DELETE refused on ledger_attemptevent'); END""",
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_attemptevent_no_update",
    "DROP TRIGGER IF EXISTS ledger_attemptevent_no_delete",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_FORWARD, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)
    else:
        raise RuntimeError(f"ledgerdash supports PostgreSQL and SQLite, not {vendor}")


def reverse(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_REVERSE)
    elif vendor == "sqlite":
        for statement in SQLITE_REVERSE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(forward, reverse)]

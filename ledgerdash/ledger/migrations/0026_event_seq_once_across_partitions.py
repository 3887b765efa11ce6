"""A tenant's seq is given to one event, across every partition of the events.

Each partition keeps (tenant, seq) unique for its own rows (0024); the ledger
only ever appends under the chain head it moves, which only moves forward.
A row written some other way (an INSERT naming a seq an older partition
already holds) would otherwise land beside the one already there. This
trigger refuses it, as the table-wide unique constraint did before the
events were partitioned: before each event is inserted it looks for the
tenant's seq in every partition (one probe of each partition's unique index).

SQLite keeps one table, with its unique constraint.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION ledger_event_seq_once() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM ledger_attemptevent WHERE tenant_id = NEW.tenant_id AND seq = NEW.seq) THEN
        RAISE EXCEPTION 'tenant % already has an event at seq %', NEW.tenant_id, NEW.seq
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER ledger_attemptevent_seq_once BEFORE INSERT ON ledger_attemptevent
    FOR EACH ROW EXECUTE FUNCTION ledger_event_seq_once();
"""
REVERSE = """
DROP TRIGGER IF EXISTS ledger_attemptevent_seq_once ON ledger_attemptevent;
DROP FUNCTION IF EXISTS ledger_event_seq_once();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REVERSE, params=None)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0025_event_archive")]
    operations = [migrations.RunPython(forward, reverse)]

"""PostgreSQL keeps the events in partitions, by ranges of their ids.

The events only grow. One table of a billion rows makes every index deeper
and every maintenance job (vacuum, a rebuilt index, moving old history out)
a job on the whole of it. Partitions keep each piece a size of its own, and
let the oldest, settled and verified pieces leave the database whole
(``manage.py archive_events``).

**Why ranges of ids, not of time.** PostgreSQL wants the partition key in
every unique index of a partitioned table: the events' primary key is their
id, so the id is the key that keeps it. Ids only grow, so each partition
holds one stretch of time all the same (``manage.py event_partitions``
prints each one's first and last event's time). ``created_at`` comes from
the ledger's clock, which a drill or a simulation sets where it likes; an id
never goes back.

**What takes the place of the unique (tenant, seq).** It cannot span the
partitions any more; each partition has it for its own rows. Across them a
seq is never handed out twice because each comes from the chain head it
moves, under that head's row lock, and a head only moves forward: a trigger
here refuses an update that would move a chain head's seq back (or leave it
where it is), whoever asks.

What this migration does, in one transaction, on the table as it is (its
rows stay where they are):

- the table becomes the first partition, ``ledger_attemptevent_0``, for ids
  below a round bound past the highest id given out so far; an empty
  partition takes every id from there on (the *tail*), so a write never
  finds no partition, even when nobody made partitions ahead;
- the id's sequence (an identity column's, which a partitioned table cannot
  have on PostgreSQL 15) becomes a plain sequence that the partitioned
  table's id column draws from, continuing where it was;
- the primary key, the indexes, the foreign keys, the checks and the
  append-only row trigger are the partitioned table's and reach every
  partition; ``TRUNCATE`` is refused on the partitioned table and on each
  partition (a statement trigger on one does not fire for the other).

SQLite keeps one table: it is the embedded, one-machine ledger.

This migration is not reversed: going back means copying every event into a
plain table, which is a restore from a backup, not a migration.
"""

from django.db import migrations

PARENT = "ledger_attemptevent"
FIRST = "ledger_attemptevent_0"
#: ids per partition: the first bound is the next multiple of it.
SIZE = 10_000_000

FK = "FOREIGN KEY ({column}) REFERENCES {table}(id) DEFERRABLE INITIALLY DEFERRED"

CHAIN_HEAD_FORWARD = """
CREATE OR REPLACE FUNCTION ledger_chain_head_forward() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.seq <= OLD.seq THEN
        RAISE EXCEPTION 'a chain head only moves forward: tenant % chain % from seq % to %',
            OLD.tenant_id, OLD.stripe, OLD.seq, NEW.seq
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER ledger_chainhead_forward BEFORE UPDATE OF seq, hash ON ledger_chainhead
    FOR EACH ROW EXECUTE FUNCTION ledger_chain_head_forward();
"""


def partition_statements(name: str, low: str, high: str) -> list[str]:
    """A new partition of the events for ids ``low`` to ``high`` (a number,
    or MINVALUE/MAXVALUE), with what every partition has of its own: the
    unique (tenant, seq) for its rows, and TRUNCATE refused. Privileges:
    reading, for the roles that may (``pg_dump`` reads each partition); no
    change of rows but its owner's (the app reaches the rows through the
    partitioned table, whose privileges are the ones checked)."""
    return [f"CREATE TABLE {name} PARTITION OF {PARENT} FOR VALUES FROM ({low}) TO ({high})", *own_statements(name)]


def own_statements(name: str) -> list[str]:
    """What a partition has of its own, which it does not take from the
    partitioned table: its unique (tenant, seq), TRUNCATE refused, its privileges."""
    return [
        f"CREATE UNIQUE INDEX {name}_seq ON {name} (tenant_id, seq)",
        f"CREATE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {name} "
        "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_truncate()",
        revoke_statement(name),
    ]


def revoke_statement(name: str) -> str:
    """Every privilege on ``name`` but reading taken from every role but its
    owner (and from PUBLIC): the default privileges give a new table's rows
    to the runtime role, which needs to change none on a partition."""
    changes = "INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER"
    return f"""DO $$ DECLARE grantee text; BEGIN
  REVOKE ALL ON {name} FROM PUBLIC;
  FOR grantee IN
    SELECT DISTINCT a.grantee::regrole::text FROM pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = '{name}'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
  LOOP
    EXECUTE format('REVOKE {changes} ON {name} FROM %s', grantee);
  END LOOP;
END $$"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {PARENT} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"SELECT pg_get_serial_sequence('{PARENT}', 'id')")
        (identity,) = cursor.fetchone()
        cursor.execute(f"SELECT last_value, is_called FROM {identity}")
        last_value, is_called = cursor.fetchone()
        cursor.execute(f"SELECT coalesce(max(id), 0) FROM {PARENT}")
        (top,) = cursor.fetchone()
    top = max(top, last_value if is_called else last_value - 1)
    bound = (top // SIZE + 1) * SIZE
    statements = [
        f"ALTER TABLE {PARENT} RENAME TO {FIRST}",
        f"DROP TRIGGER ledger_attemptevent_append_only ON {FIRST}",
        f"ALTER TRIGGER ledger_attemptevent_no_truncate ON {FIRST} RENAME TO {FIRST}_no_truncate",
        # Free the names the partitioned table's own take; its primary key
        # and indexes then adopt these, and its foreign keys these.
        f"ALTER TABLE {FIRST} RENAME CONSTRAINT ledger_attemptevent_pkey TO {FIRST}_pkey",
        f"ALTER TABLE {FIRST} RENAME CONSTRAINT ledger_event_unique_seq TO {FIRST}_seq",
        f"ALTER INDEX ledger_event_attempt RENAME TO {FIRST}_attempt",
        f"ALTER INDEX ledger_attemptevent_actor_user_id_4b068042 RENAME TO {FIRST}_actor_user",
        f"ALTER TABLE {FIRST} ALTER COLUMN id DROP IDENTITY",
        f"CREATE TABLE {PARENT} (LIKE {FIRST} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id)",
        f"CREATE SEQUENCE {PARENT}_id_seq AS bigint OWNED BY {PARENT}.id",
        f"SELECT setval('{PARENT}_id_seq', {max(top, 1)}, {'true' if top else 'false'})",
        f"ALTER TABLE {PARENT} ALTER COLUMN id SET DEFAULT nextval('{PARENT}_id_seq')",
        # Validated once, so the attach need not scan the rows again.
        f"ALTER TABLE {FIRST} ADD CONSTRAINT {FIRST}_bound CHECK (id < {bound})",
        f"ALTER TABLE {PARENT} ATTACH PARTITION {FIRST} FOR VALUES FROM (MINVALUE) TO ({bound})",
        f"ALTER TABLE {FIRST} DROP CONSTRAINT {FIRST}_bound",
        f"ALTER TABLE {PARENT} ADD CONSTRAINT ledger_attemptevent_pkey PRIMARY KEY (id)",
        f"CREATE INDEX ledger_event_attempt ON {PARENT} (attempt_id, seq)",
        f"CREATE INDEX ledger_attemptevent_actor_user_id_4b068042 ON {PARENT} (actor_user_id)",
        f"ALTER TABLE {PARENT} ADD CONSTRAINT ledger_attemptevent_actor_user_id_4b068042_fk_auth_user_id "
        + FK.format(column="actor_user_id", table="auth_user"),
        f"ALTER TABLE {PARENT} ADD CONSTRAINT ledger_attemptevent_attempt_id_7b07cd19_fk_ledger_attempt_id "
        + FK.format(column="attempt_id", table="ledger_attempt"),
        f"ALTER TABLE {PARENT} ADD CONSTRAINT ledger_attemptevent_tenant_id_32606293_fk_ledger_tenant_id "
        + FK.format(column="tenant_id", table="ledger_tenant"),
        f"CREATE TRIGGER ledger_attemptevent_append_only BEFORE UPDATE OR DELETE ON {PARENT} "
        "FOR EACH ROW EXECUTE FUNCTION ledger_refuse_event_change()",
        f"CREATE TRIGGER ledger_attemptevent_no_truncate BEFORE TRUNCATE ON {PARENT} "
        "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_truncate()",
        revoke_statement(FIRST),
        *partition_statements(f"{PARENT}_{bound}", str(bound), "MAXVALUE"),
        CHAIN_HEAD_FORWARD,
    ]
    for statement in statements:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0023_tool_preset_lookup_lag")]
    operations = [migrations.RunPython(forward)]

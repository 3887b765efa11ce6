"""A provider's id is recorded as the outcome of one side effect only.

``ledger_providerid`` holds, for each (tenant, tool, provider request id),
the idempotency key of the side effect that named it first, and that
attempt. Triggers on ``ledger_attempt`` keep it: when an attempt's row is
inserted or updated with a provider request id (the ORM's statements and
the store's one-statement SQL alike), the id is added; an attempt at
another key naming an id the table already holds is refused with an
integrity error named ``ledger_providerid_one_side_effect`` (the ledger
raises RequestIdTaken for it). Attempts at one key share the id freely (a
linked retry that Stripe answers by replaying the key).

PostgreSQL: the unique primary key decides between two transactions naming
one id at once: the second waits for the first to commit, then sees its
row and is refused (or, if the first rolled back, takes the id).
SQLite has one writer at a time.

The backfill gives each id to the attempt that named it first (by
``created_at``, then id). Attempts at other keys that already name the same
id are left as they are, history being history, and listed on the
migration's output, each with the attempt that holds the id: one of each
pair names an effect that is not its own, and a person should look at both
(the ledger refuses any new such pair from here on). On PostgreSQL the
attempts' table is locked for writes while the table is filled and the
triggers made, so no id is recorded between the two.
"""

import sys

import django.db.models.deletion
from django.db import migrations, models

REFUSAL = "ledger_providerid_one_side_effect"

BACKFILL = """
INSERT INTO ledger_providerid (tenant_id, tool_name, provider_request_id, idempotency_key, attempt_id)
SELECT tenant_id, tool_name, provider_request_id, idempotency_key, id FROM (
    SELECT tenant_id, tool_name, provider_request_id, idempotency_key, id,
           ROW_NUMBER() OVER (PARTITION BY tenant_id, tool_name, provider_request_id ORDER BY created_at, id) AS n
    FROM ledger_attempt WHERE provider_request_id <> ''
) named WHERE n = 1
"""
CONFLICTS = """
SELECT a.id, a.tenant_id, a.tool_name, a.provider_request_id, a.idempotency_key, p.attempt_id, p.idempotency_key
FROM ledger_attempt a JOIN ledger_providerid p
  ON p.tenant_id = a.tenant_id AND p.tool_name = a.tool_name AND p.provider_request_id = a.provider_request_id
WHERE a.idempotency_key <> p.idempotency_key
ORDER BY a.id
"""

PG_FORWARD = f"""
CREATE OR REPLACE FUNCTION ledger_provider_id_one_side_effect() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    held_key varchar;
    held_by bigint;
BEGIN
    INSERT INTO ledger_providerid (tenant_id, tool_name, provider_request_id, idempotency_key, attempt_id)
    VALUES (NEW.tenant_id, NEW.tool_name, NEW.provider_request_id, NEW.idempotency_key, NEW.id)
    ON CONFLICT (tenant_id, tool_name, provider_request_id) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- Another row holds the id (committed: the insert waited for its transaction). A statement of its own
    -- reads it as committed now.
    SELECT idempotency_key, attempt_id INTO held_key, held_by FROM ledger_providerid
    WHERE tenant_id = NEW.tenant_id AND tool_name = NEW.tool_name AND provider_request_id = NEW.provider_request_id;
    IF held_key IS DISTINCT FROM NEW.idempotency_key THEN
        RAISE EXCEPTION 'provider request % of % is recorded on attempt % (key %), another side effect: attempt % cannot name it too',
            NEW.provider_request_id, NEW.tool_name, held_by, held_key, NEW.id
            USING ERRCODE = 'unique_violation', CONSTRAINT = '{REFUSAL}', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER ledger_attempt_provider_id_inserted AFTER INSERT ON ledger_attempt
    FOR EACH ROW WHEN (NEW.provider_request_id <> '')
    EXECUTE FUNCTION ledger_provider_id_one_side_effect();
CREATE TRIGGER ledger_attempt_provider_id_changed
    AFTER UPDATE OF provider_request_id, idempotency_key, tool_name, tenant_id ON ledger_attempt
    FOR EACH ROW WHEN (NEW.provider_request_id <> '' AND (NEW.provider_request_id, NEW.idempotency_key,
        NEW.tool_name, NEW.tenant_id) IS DISTINCT FROM (OLD.provider_request_id, OLD.idempotency_key,
        OLD.tool_name, OLD.tenant_id))
    EXECUTE FUNCTION ledger_provider_id_one_side_effect();
CREATE TRIGGER ledger_providerid_no_truncate BEFORE TRUNCATE ON ledger_providerid
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_truncate();
"""
PG_REVERSE = """
DROP TRIGGER IF EXISTS ledger_providerid_no_truncate ON ledger_providerid;
DROP TRIGGER IF EXISTS ledger_attempt_provider_id_changed ON ledger_attempt;
DROP TRIGGER IF EXISTS ledger_attempt_provider_id_inserted ON ledger_attempt;
DROP FUNCTION IF EXISTS ledger_provider_id_one_side_effect();
"""

#: The body both SQLite triggers share: refuse another key's id, else add the id once.
_SQLITE_BODY = f"""
BEGIN
    SELECT RAISE(ABORT, '{REFUSAL}: the provider request id is recorded on an attempt at another side effect')
    WHERE EXISTS (
        SELECT 1 FROM ledger_providerid WHERE tenant_id = NEW.tenant_id AND tool_name = NEW.tool_name
        AND provider_request_id = NEW.provider_request_id AND idempotency_key <> NEW.idempotency_key
    );
    INSERT INTO ledger_providerid (tenant_id, tool_name, provider_request_id, idempotency_key, attempt_id)
    SELECT NEW.tenant_id, NEW.tool_name, NEW.provider_request_id, NEW.idempotency_key, NEW.id
    WHERE NOT EXISTS (
        SELECT 1 FROM ledger_providerid WHERE tenant_id = NEW.tenant_id AND tool_name = NEW.tool_name
        AND provider_request_id = NEW.provider_request_id
    );
END"""
SQLITE_FORWARD = [
    "CREATE TRIGGER ledger_attempt_provider_id_inserted AFTER INSERT ON ledger_attempt "
    "WHEN NEW.provider_request_id <> ''" + _SQLITE_BODY,
    "CREATE TRIGGER ledger_attempt_provider_id_changed "
    "AFTER UPDATE OF provider_request_id, idempotency_key, tool_name, tenant_id ON ledger_attempt "
    "WHEN NEW.provider_request_id <> '' AND (NEW.provider_request_id IS NOT OLD.provider_request_id "
    "OR NEW.idempotency_key IS NOT OLD.idempotency_key OR NEW.tool_name IS NOT OLD.tool_name "
    "OR NEW.tenant_id IS NOT OLD.tenant_id)" + _SQLITE_BODY,
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_attempt_provider_id_changed",
    "DROP TRIGGER IF EXISTS ledger_attempt_provider_id_inserted",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        raise RuntimeError(f"ledgerdash supports PostgreSQL and SQLite, not {vendor}")
    with schema_editor.connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("LOCK TABLE ledger_attempt IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(BACKFILL)
        cursor.execute(CONFLICTS)
        conflicts = cursor.fetchall()
    for attempt_id, tenant_id, tool, request_id, key, holder_id, holder_key in conflicts:
        sys.stdout.write(
            f"\n  attempt #{attempt_id} (tenant {tenant_id}, key {key!r}) names provider request {request_id!r} "
            f"of {tool}, which attempt #{holder_id} (key {holder_key!r}) named first: left as it is; one of "
            "the two names an effect that is not its own, look at both"
        )
    if conflicts:
        sys.stdout.write("\n")
    if vendor == "postgresql":
        schema_editor.execute(PG_FORWARD, params=None)
    else:
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def reverse(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REVERSE, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_REVERSE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0027_approval_binding_and_retries_not_sent"),
    ]

    operations = [
        migrations.CreateModel(
            name="ProviderId",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "tenant",
                        "tool_name",
                        "provider_request_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("tool_name", models.CharField(max_length=255)),
                ("provider_request_id", models.CharField(max_length=255)),
                ("idempotency_key", models.CharField(max_length=255)),
                (
                    "attempt",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="ledger.attempt",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="ledger.tenant",
                    ),
                ),
            ],
        ),
        migrations.RunPython(forward, reverse),
    ]

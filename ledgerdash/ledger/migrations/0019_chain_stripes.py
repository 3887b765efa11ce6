"""A tenant's events may be kept in several hash chains ("stripes").

``Tenant.chain_stripes`` says how many (1 for every tenant until changed);
``ChainHead`` gets a row per chain, its primary key (tenant, stripe). Every
existing head becomes stripe 0 of its tenant, with its seq and hash as they
were: a tenant with one chain is stored exactly as before, and every
existing event keeps its place and hashes. ``ChainCheck`` keeps the furthest
verified head of each chain (``reached_heads``) instead of one.

Django cannot move a table to a composite primary key, so the schema change
is written out per database (the model state follows it).

A tenant's number of chains is fixed once it has events (the seqs it
numbered say which chain each event is in): a trigger refuses the change,
whoever asks. (A later migration that makes Django rebuild the tenant table
on SQLite must create the trigger again.)
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

POSTGRES_FORWARD = [
    'ALTER TABLE "ledger_chainhead" ADD COLUMN "stripe" smallint NOT NULL DEFAULT 0 CHECK ("stripe" >= 0)',
    'ALTER TABLE "ledger_chainhead" ALTER COLUMN "stripe" DROP DEFAULT',
    'ALTER TABLE "ledger_chainhead" DROP CONSTRAINT "ledger_chainhead_pkey"',
    'ALTER TABLE "ledger_chainhead" ADD CONSTRAINT "ledger_chainhead_pkey" PRIMARY KEY ("tenant_id", "stripe")',
]
POSTGRES_REVERSE = [
    # Only a ledger whose tenants all keep one chain can go back.
    'ALTER TABLE "ledger_chainhead" DROP CONSTRAINT "ledger_chainhead_pkey"',
    'ALTER TABLE "ledger_chainhead" ADD CONSTRAINT "ledger_chainhead_pkey" PRIMARY KEY ("tenant_id")',
    'ALTER TABLE "ledger_chainhead" DROP COLUMN "stripe"',
]
FIXED_MESSAGE = "a tenant's number of chains is fixed once it has events"
POSTGRES_FIXED = [
    f"""
CREATE OR REPLACE FUNCTION ledger_tenant_stripes_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.chain_stripes <> OLD.chain_stripes
       AND EXISTS (SELECT 1 FROM ledger_chainhead WHERE tenant_id = OLD.id) THEN
        RAISE EXCEPTION '{FIXED_MESSAGE.replace("'", "''")}' USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END
$$;
""",
    "CREATE TRIGGER ledger_tenant_stripes_fixed BEFORE UPDATE OF chain_stripes ON ledger_tenant "
    "FOR EACH ROW EXECUTE FUNCTION ledger_tenant_stripes_fixed();",
]
POSTGRES_FIXED_REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_tenant_stripes_fixed ON ledger_tenant;",
    "DROP FUNCTION IF EXISTS ledger_tenant_stripes_fixed();",
]
SQLITE_FIXED = [
    "CREATE TRIGGER ledger_tenant_stripes_fixed BEFORE UPDATE OF chain_stripes ON ledger_tenant "
    "FOR EACH ROW WHEN NEW.chain_stripes <> OLD.chain_stripes "
    "AND EXISTS (SELECT 1 FROM ledger_chainhead WHERE tenant_id = OLD.id) "
    f"BEGIN SELECT RAISE(ABORT, '{FIXED_MESSAGE.replace("'", "''")}'); END"
]
SQLITE_FIXED_REVERSE = ["DROP TRIGGER IF EXISTS ledger_tenant_stripes_fixed"]
SQLITE_FORWARD = [
    'CREATE TABLE "ledger_chainhead__striped" ('
    '"tenant_id" bigint NOT NULL REFERENCES "ledger_tenant" ("id") DEFERRABLE INITIALLY DEFERRED, '
    '"stripe" smallint unsigned NOT NULL CHECK ("stripe" >= 0), '
    '"seq" bigint unsigned NOT NULL CHECK ("seq" >= 0), '
    '"hash" varchar(64) NOT NULL, '
    'PRIMARY KEY ("tenant_id", "stripe"))',
    'INSERT INTO "ledger_chainhead__striped" ("tenant_id", "stripe", "seq", "hash") '
    'SELECT "tenant_id", 0, "seq", "hash" FROM "ledger_chainhead"',
    'DROP TABLE "ledger_chainhead"',
    'ALTER TABLE "ledger_chainhead__striped" RENAME TO "ledger_chainhead"',
]
SQLITE_REVERSE = [
    'CREATE TABLE "ledger_chainhead__one" ('
    '"tenant_id" bigint NOT NULL PRIMARY KEY REFERENCES "ledger_tenant" ("id") DEFERRABLE INITIALLY DEFERRED, '
    '"seq" bigint unsigned NOT NULL CHECK ("seq" >= 0), "hash" varchar(64) NOT NULL)',
    'INSERT INTO "ledger_chainhead__one" ("tenant_id", "seq", "hash") '
    'SELECT "tenant_id", "seq", "hash" FROM "ledger_chainhead" WHERE "stripe" = 0',
    'DROP TABLE "ledger_chainhead"',
    'ALTER TABLE "ledger_chainhead__one" RENAME TO "ledger_chainhead"',
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for statement in statements_by_vendor[schema_editor.connection.vendor]:
            schema_editor.execute(statement, params=None)

    return run


def heads_forward(apps, schema_editor):
    ChainCheck = apps.get_model("ledger", "ChainCheck")
    for check in ChainCheck.objects.filter(reached_seq__gt=0):
        check.reached_heads = [[check.reached_seq, check.reached_hash]]
        check.save(update_fields=["reached_heads"])


def heads_reverse(apps, schema_editor):
    ChainCheck = apps.get_model("ledger", "ChainCheck")
    for check in ChainCheck.objects.exclude(reached_heads=[]):
        seq, digest = max(check.reached_heads)
        check.reached_seq, check.reached_hash = seq, digest
        check.save(update_fields=["reached_seq", "reached_hash"])


class Migration(migrations.Migration):
    dependencies = [("ledger", "0018_attempt_db_defaults")]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="chain_stripes",
            field=models.PositiveSmallIntegerField(
                db_default=1,
                default=1,
                help_text="How many hash chains the tenant's events are kept in. One chain records one event at a "
                "time; give a tenant whose agents record many calls at once several (8 on a 2-core server). Chosen "
                "when the tenant is made: it cannot change afterwards.",
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(32),
                ],
            ),
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=models.Q(("chain_stripes__gte", 1), ("chain_stripes__lte", 32)),
                name="ledger_tenant_chain_stripes",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(
                    _run({"postgresql": POSTGRES_FORWARD, "sqlite": SQLITE_FORWARD}),
                    _run({"postgresql": POSTGRES_REVERSE, "sqlite": SQLITE_REVERSE}),
                )
            ],
            state_operations=[
                migrations.AddField(
                    model_name="chainhead",
                    name="stripe",
                    field=models.PositiveSmallIntegerField(default=0),
                ),
                migrations.AddField(
                    model_name="chainhead",
                    name="pk",
                    field=models.CompositePrimaryKey(
                        "tenant", "stripe", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                migrations.AlterField(
                    model_name="chainhead",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="chain_heads",
                        to="ledger.tenant",
                    ),
                ),
            ],
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRES_FIXED, "sqlite": SQLITE_FIXED}),
            _run({"postgresql": POSTGRES_FIXED_REVERSE, "sqlite": SQLITE_FIXED_REVERSE}),
        ),
        migrations.AddField(
            model_name="chaincheck",
            name="reached_heads",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(heads_forward, heads_reverse),
        migrations.RemoveField(model_name="chaincheck", name="reached_hash"),
        migrations.RemoveField(model_name="chaincheck", name="reached_seq"),
    ]

"""Where archived partitions of the events went (PostgreSQL); TRUNCATE refused on it as on the ledger's other history."""

from django.db import migrations, models

TABLE = "ledger_eventarchive"


def refuse_truncate(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE} "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_truncate()",
            params=None,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0024_events_partitioned"),
    ]

    operations = [
        migrations.CreateModel(
            name="EventArchive",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=63)),
                ("low", models.BigIntegerField(blank=True, null=True)),
                ("high", models.BigIntegerField()),
                ("file", models.CharField(max_length=255)),
                ("sha256", models.CharField(max_length=64)),
                ("events", models.PositiveBigIntegerField()),
                ("first_at", models.DateTimeField(blank=True, null=True)),
                ("last_at", models.DateTimeField(blank=True, null=True)),
                ("chains", models.JSONField(default=list)),
                ("archived_at", models.DateTimeField()),
                ("restored_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["high"],
            },
        ),
        migrations.RunPython(refuse_truncate, migrations.RunPython.noop),
    ]

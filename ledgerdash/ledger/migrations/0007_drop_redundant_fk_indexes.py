"""Drop the single-column indexes of three foreign keys that composite
indexes already lead with: ``attempt.tenant_id`` (every attempt index starts
with the tenant), ``attemptevent.tenant_id`` (``UNIQUE (tenant_id, seq)``)
and ``attemptevent.attempt_id`` (``(attempt_id, seq)``). Each is one index
write less per attempt or event; the event's are inside the tenant's
chain-head lock.

The indexes are dropped by name, found by introspection, rather than by
``AlterField``: on SQLite that would rebuild both tables, and a rebuilt
event table loses the triggers that refuse UPDATE and DELETE.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

FIELDS = (("ledger_attempt", "tenant_id"), ("ledger_attemptevent", "tenant_id"), ("ledger_attemptevent", "attempt_id"))


def _single_column_index(schema_editor: Any, table: str, column: str) -> str | None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    for name, info in sorted(constraints.items()):
        if info["index"] and not info["unique"] and not info["primary_key"] and info["columns"] == [column]:
            return name
    return None


def drop_indexes(apps: Any, schema_editor: Any) -> None:
    for table, column in FIELDS:
        name = _single_column_index(schema_editor, table, column)
        if name is not None:
            schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


def create_indexes(apps: Any, schema_editor: Any) -> None:
    for table, column in FIELDS:
        if _single_column_index(schema_editor, table, column) is None:
            name = schema_editor.quote_name(f"{table}_{column}_idx")
            schema_editor.execute(
                f"CREATE INDEX {name} ON {schema_editor.quote_name(table)} ({schema_editor.quote_name(column)})"
            )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0006_chain_checks"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="ledger.tenant",
                    ),
                ),
                migrations.AlterField(
                    model_name="attemptevent",
                    name="attempt",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="events",
                        to="ledger.attempt",
                    ),
                ),
                migrations.AlterField(
                    model_name="attemptevent",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="events",
                        to="ledger.tenant",
                    ),
                ),
            ],
        ),
    ]

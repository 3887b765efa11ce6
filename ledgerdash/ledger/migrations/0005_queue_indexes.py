"""Indexes for the dashboard's queues and search (reviews.queries).

Every list page is a keyset range scan within one tenant, ordered by
(created_at, id): by state (the existing ledger_attempt_queue), by owner
with or without a state ("mine"), unassigned stuck work, or over all
states (search). The owner indexes hold only owned rows (work that was
ever stuck), so they stay a small part of a large ledger.
Search by task id, provider request id and args-hash prefix gets an index
each.

On PostgreSQL the indexes are built CONCURRENTLY, so agents keep writing to
a large ledger while this runs (hence a non-atomic migration). SQLite builds
them the ordinary way.
"""

from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0004_api_tokens"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(fields=["tenant", "-created_at", "-id"], name="ledger_attempt_recent"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(owner__isnull=False),
                fields=["tenant", "owner", "state", "-created_at", "-id"],
                name="ledger_attempt_owner_queue",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(owner__isnull=False),
                fields=["tenant", "owner", "-created_at", "-id"],
                name="ledger_attempt_owner_recent",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(owner__isnull=True, state__in=["UNKNOWN", "MANUAL_REVIEW"]),
                fields=["tenant", "state", "-created_at", "-id"],
                name="ledger_attempt_unassigned",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(fields=["tenant", "task_id"], name="ledger_attempt_task"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(fields=["tenant", "provider_request_id"], name="ledger_attempt_request_id"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="attempt",
            index=models.Index(
                fields=["args_hash"], name="ledger_attempt_args_hash", opclasses=["varchar_pattern_ops"]
            ),
        ),
    ]

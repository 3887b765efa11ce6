"""A dispatcher's late report that the provider acted, kept on the attempt.

The send rule and approvals weigh it for every attempt at the same side
effect; read from the late report's event alone, it would be forgotten once
the event's partition is archived. Existing late reports are copied over.

SQLite cannot add a column that is not null in place: Django makes the
attempts' table again, and the table's triggers go with the old one. The
provider-id triggers (0028) are made again after it, and again when the
column is taken away.
"""

import importlib

from django.db import migrations, models

_provider_ids = importlib.import_module("ledgerdash.ledger.migrations.0028_provider_id_one_side_effect")

#: What a late report says when the provider acted (rules.ACTED_REPORTS, as of this migration).
ACTED = ("confirmed", "request_id")


def keep_late_receipts(apps, schema_editor):
    Attempt = apps.get_model("ledger", "Attempt")
    AttemptEvent = apps.get_model("ledger", "AttemptEvent")
    heard = {}
    late = AttemptEvent.objects.filter(kind="late_report", attempt_id__isnull=False).order_by("id")
    for attempt_id, details in late.values_list("attempt_id", "details").iterator():
        report = (details or {}).get("report") or {}
        if report.get("outcome") in ACTED:
            receipt = report.get("provider_request_id") or report.get("result_ref") or "a receipt"
            heard.setdefault(attempt_id, str(receipt)[:1000])
    for attempt_id, receipt in heard.items():
        Attempt.objects.filter(pk=attempt_id, late_receipt="").update(late_receipt=receipt)


def provider_id_triggers_again(apps, schema_editor):
    """On SQLite, the provider-id triggers on a table just made again (a no-op elsewhere)."""
    if schema_editor.connection.vendor == "sqlite":
        for statement in (*_provider_ids.SQLITE_REVERSE, *_provider_ids.SQLITE_FORWARD):
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0028_provider_id_one_side_effect"),
    ]

    operations = [
        # (run backwards last: the table was made again without the column, and without its triggers)
        migrations.RunPython(migrations.RunPython.noop, provider_id_triggers_again),
        migrations.AddField(
            model_name="attempt",
            name="late_receipt",
            field=models.CharField(blank=True, db_default="", default="", max_length=1000),
        ),
        migrations.RunPython(provider_id_triggers_again, migrations.RunPython.noop),
        migrations.RunPython(keep_late_receipts, migrations.RunPython.noop),
    ]

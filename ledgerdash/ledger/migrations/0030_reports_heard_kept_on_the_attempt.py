"""What the attempt's dispatchers reported, kept on the attempt.

``reports_heard`` lets the same report sent again be known as a replay, and
``said_unknown_fence`` keeps a refusal from settling an attempt whose
dispatcher had said it could not tell whether its request landed. Both were
read from the attempt's events, which are forgotten once their partition is
archived. The dispatches that said "unknown" are copied over from the events
still in the database; a report sent again is still looked up among them.

SQLite makes the attempts' table again to add the columns (as in 0029): the
provider-id triggers are made again after it, and again when they are taken
away.
"""

import importlib

from django.db import migrations, models

_late_receipts = importlib.import_module("ledgerdash.ledger.migrations.0029_late_receipt_kept_on_the_attempt")


def keep_said_unknown(apps, schema_editor):
    """Each attempt's last dispatch whose dispatcher reported "unknown": on time (its move from
    DISPATCHED to UNKNOWN, one fence past the dispatch's) or late (the report in the event)."""
    AttemptEvent = apps.get_model("ledger", "AttemptEvent")
    Attempt = apps.get_model("ledger", "Attempt")
    said = {}
    events = AttemptEvent.objects.filter(actor_kind="agent", attempt_id__isnull=False).order_by("id")
    for attempt_id, from_state, to_state, fence, details in events.values_list(
        "attempt_id", "from_state", "to_state", "fence", "details"
    ).iterator():
        details = details or {}
        report = details.get("late_report") or details.get("report") or {}
        if report.get("outcome") == "unknown" and details.get("dispatch_fence"):
            said[attempt_id] = max(said.get(attempt_id, 0), int(details["dispatch_fence"]))
        elif (from_state, to_state) == ("DISPATCHED", "UNKNOWN") and not report and fence:
            said[attempt_id] = max(said.get(attempt_id, 0), int(fence) - 1)
    for attempt_id, fence in said.items():
        Attempt.objects.filter(pk=attempt_id).update(said_unknown_fence=fence)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0029_late_receipt_kept_on_the_attempt"),
    ]

    operations = [
        # (run backwards last: the table was made again without the columns, and without its triggers)
        migrations.RunPython(migrations.RunPython.noop, _late_receipts.provider_id_triggers_again),
        migrations.AddField(
            model_name="attempt",
            name="reports_heard",
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AddField(
            model_name="attempt",
            name="said_unknown_fence",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(_late_receipts.provider_id_triggers_again, migrations.RunPython.noop),
        migrations.RunPython(keep_said_unknown, migrations.RunPython.noop),
    ]

"""The outbox follows each of a tenant's chains: a rule's and an agent
channel's starting point, and the cursor, become a seq per chain. Every
tenant has kept one chain so far, so each becomes a list of one."""

from django.db import migrations, models


def forward(apps, schema_editor):
    for name in ("Channel", "Rule"):
        model = apps.get_model("notify", name)
        for row in model.objects.all():
            row.from_seqs = [row.from_seq]
            row.save(update_fields=["from_seqs"])
    Cursor = apps.get_model("notify", "Cursor")
    for cursor in Cursor.objects.all():
        cursor.positions = [cursor.seq]
        cursor.save(update_fields=["positions"])


def reverse(apps, schema_editor):
    for name in ("Channel", "Rule"):
        model = apps.get_model("notify", name)
        for row in model.objects.all():
            row.from_seq = min(row.from_seqs, default=0)
            row.save(update_fields=["from_seq"])
    Cursor = apps.get_model("notify", "Cursor")
    for cursor in Cursor.objects.all():
        cursor.seq = min(cursor.positions, default=0)
        cursor.save(update_fields=["seq"])


class Migration(migrations.Migration):
    dependencies = [("notify", "0001_notification_outbox")]

    operations = [
        migrations.AddField(model_name="channel", name="from_seqs", field=models.JSONField(default=list)),
        migrations.AddField(model_name="rule", name="from_seqs", field=models.JSONField(default=list)),
        migrations.AddField(model_name="cursor", name="positions", field=models.JSONField(default=list)),
        migrations.RunPython(forward, reverse),
        migrations.RemoveField(model_name="channel", name="from_seq"),
        migrations.RemoveField(model_name="rule", name="from_seq"),
        migrations.RemoveField(model_name="cursor", name="seq"),
    ]

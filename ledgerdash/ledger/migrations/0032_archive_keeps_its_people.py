"""The people an archive's events name, so none of them is deleted while it waits to be restored.

Archives made before it have none recorded: while one waits, anyone who
joined before its newest event is kept.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0031_tool_retention_history'),
    ]

    operations = [
        migrations.AddField(
            model_name='eventarchive',
            name='people',
            field=models.JSONField(blank=True, null=True),
        ),
    ]

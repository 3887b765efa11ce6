"""What each tool said its provider keeps, from when (``retention_days``).

Tools made before it have no rows: their current setting holds until the
first change, which writes what it replaced as holding from the start.
"""

from django.db import migrations, models

import ledgerdash.ledger.clock


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0030_reports_heard_kept_on_the_attempt'),
    ]

    operations = [
        migrations.CreateModel(
            name='ToolRetention',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tool_name', models.CharField(max_length=255)),
                ('days', models.PositiveIntegerField()),
                ('since', models.DateTimeField(default=ledgerdash.ledger.clock.now)),
            ],
            options={
                'ordering': ['tool_name', 'since', 'id'],
                'indexes': [models.Index(fields=['tool_name', 'since'], name='ledger_toolretention_since')],
            },
        ),
    ]

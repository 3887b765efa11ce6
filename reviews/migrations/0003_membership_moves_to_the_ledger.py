"""The dashboard lets go of memberships: the ledger holds them now (its 0011).
State only; the table and its rows stay where they are."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reviews", "0002_sso_identity"),
        ("ledger", "0011_membership_in_the_ledger"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="Membership")],
            database_operations=[],
        ),
    ]

"""Memberships and roles move into the ledger, which answers who may do what.

State only: the table stays ``reviews_membership`` with its constraints; the
dashboard's app lets go of the model in the same step (reviews 0003).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0010_chaincheck_reached_head"),
        ("reviews", "0002_sso_identity"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        (
                            "role",
                            models.CharField(
                                choices=[
                                    ("viewer", "viewer"),
                                    ("operator", "operator"),
                                    ("approver", "approver"),
                                    ("admin", "admin"),
                                ],
                                default="viewer",
                                max_length=16,
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="ledger.tenant"
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "reviews_membership",
                        "ordering": ["tenant", "user"],
                        "constraints": [
                            models.UniqueConstraint(fields=("user", "tenant"), name="reviews_membership_unique"),
                            models.CheckConstraint(
                                condition=models.Q(("role__in", ["viewer", "operator", "approver", "admin"])),
                                name="reviews_membership_role_valid",
                            ),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]

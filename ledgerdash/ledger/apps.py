from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledgerdash.ledger"
    label = "ledger"
    verbose_name = "Ledger"
    default_auto_field = "django.db.models.BigAutoField"

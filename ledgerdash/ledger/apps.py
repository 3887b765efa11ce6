from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledgerdash.ledger"
    label = "ledger"
    verbose_name = "Ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the hook that makes every configuration delete an event.
        from ledgerdash.ledger import configuration  # noqa: F401

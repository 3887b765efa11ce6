from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledgerdash.ledger"
    label = "ledger"
    verbose_name = "Ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported for what they connect: configuration, the hook that makes
        # every configuration delete an event; store, the check that refuses
        # an unknown name in LEDGER_FAST_PATHS_OFF; archive, the refusal to
        # delete a person archived events name.
        from ledgerdash.ledger import archive, configuration, store  # noqa: F401

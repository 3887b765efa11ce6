"""Django's PostgreSQL backend, with the store's connection check
(:mod:`ledgerdash.ledger.store.connection`) before Django's ``SELECT 1``.
With ``DATABASE_POOL`` the pool checks each connection it hands out itself
(psycopg_pool's ``check_connection``)."""

from __future__ import annotations

import time
from typing import Any

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    #: When a cursor was last made on the connection (monotonic seconds), or None.
    last_used: float | None = None

    def create_cursor(self, name: str | None = None) -> Any:
        self.last_used = time.monotonic()
        return super().create_cursor(name)

    def close_if_health_check_failed(self) -> None:
        # Imported here: the backend loads before the apps, the store after them.
        from ledgerdash.ledger.store.connection import usable_without_asking

        if (
            self.connection is not None
            and self.health_check_enabled  # type: ignore[attr-defined] # Django's, not in its stubs
            and not self.health_check_done  # type: ignore[has-type]
            and not self.pool
            and usable_without_asking(self.connection, self.last_used)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()

"""Django's PostgreSQL backend, with a health check that costs no round trip
when the connection was in use a moment ago.

With ``CONN_HEALTH_CHECKS`` Django tests a connection kept from an earlier
request before the request's first statement: ``SELECT 1``, a round trip to
the server in every request. An agent's tool call is two or three requests
in a row, each already one statement, so the check was a third of the round
trips an API request makes.

A session the server ended (a restart, ``pg_terminate_backend``, an idle
timeout, a crash) tells its client: the server's last message and its
closing of the socket arrive on the connection, which then has something to
read although no statement is running. So a connection last used less than
:data:`QUIET_WITHIN` seconds ago, idle, and with nothing to read is taken as
usable without asking the server; one with anything to read, or idle for
longer, gets Django's own ``SELECT 1``, and a dead one is replaced
before the request uses it.

What neither check can see is a session that ends after it: between the
check and the statement, where ``SELECT 1`` left the same gap. There the
statement fails, the request answers 503 (``ledger_unavailable``, nothing
changed) and the next request connects afresh.

With ``DATABASE_POOL`` the pool checks each connection it hands out itself
(psycopg_pool's ``check_connection``).
"""

from __future__ import annotations

import select
import time
from typing import Any

from django.db.backends.postgresql import base
from psycopg import pq

#: Seconds since its last request within which a quiet connection is used without a ``SELECT 1``.
QUIET_WITHIN = 1.0


class DatabaseWrapper(base.DatabaseWrapper):
    #: When a cursor was last made on the connection (monotonic seconds), or None.
    last_used: float | None = None

    def create_cursor(self, name: str | None = None) -> Any:
        self.last_used = time.monotonic()
        return super().create_cursor(name)

    def close_if_health_check_failed(self) -> None:
        if (
            self.connection is not None
            and self.health_check_enabled  # type: ignore[attr-defined] # Django's, not in its stubs
            and not self.health_check_done  # type: ignore[has-type]
            and not self.pool
            and self.last_used is not None
            and time.monotonic() - self.last_used < QUIET_WITHIN
            and _quiet(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()


def _quiet(connection: Any) -> bool:
    """Open, idle, and nothing from the server waiting to be read."""
    if connection.closed or connection.pgconn.status != pq.ConnStatus.OK:
        return False
    if connection.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([connection.pgconn.socket], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable

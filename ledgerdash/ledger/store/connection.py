"""The connection check that costs no round trip when the connection was in
use a moment ago (the PostgreSQL backend, :mod:`ledgerdash.db.postgresql.base`,
asks it before Django's own).

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

from psycopg import pq

from ledgerdash.ledger.store.switches import enabled

#: Seconds since its last request within which a quiet connection is used without a ``SELECT 1``.
QUIET_WITHIN = 1.0


def usable_without_asking(connection: Any, last_used: float | None) -> bool:
    """Whether the psycopg ``connection``, last used at ``last_used``
    (monotonic seconds), may be used without Django's ``SELECT 1``."""
    return (
        enabled("quiet_connection_check")
        and last_used is not None
        and time.monotonic() - last_used < QUIET_WITHIN
        and _quiet(connection)
    )


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

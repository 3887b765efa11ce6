"""Django's PostgreSQL backend, with a health check that costs no round trip
when the connection is quiet.

A connection kept between requests (``CONN_MAX_AGE``) is checked before a
request uses it again (``CONN_HEALTH_CHECKS``), so that after a server restart
or a terminated session the request connects afresh instead of failing.
Django's check is a ``SELECT 1``: one round trip to the server on every
request, about a tenth of an agent's request to the ingest API on loopback.

A server that ends a session tells the client: it sends the reason and
closes the socket (a restart, a crash, ``pg_terminate_backend``, a pooler
restarting), and each makes the idle connection's socket readable. An idle
connection whose socket has nothing to read, that libpq still holds as
good, outside any transaction and with no error since its last check, is
usable without asking the server: nothing was said on it since its last
answer. Anything else (something waiting on the socket: the server's
farewell, a notification, a parameter it reports; a connection in a
transaction or after an error) is asked with Django's ``SELECT 1``, as before.

What neither check can see is a peer that vanished without a word (a host
powered off, a network that drops packets): a ``SELECT 1`` would wait on it
as long as the request's own statement does, and both end with the
request's error, a 503 (:mod:`ledgerdash.ops.unavailable`).

A session the server ends while a request is on its way in is found by
that request's first statement instead, which answers 503 with
``Retry-After`` (the ``SELECT 1`` had the same gap, a round trip shorter);
the connection is then closed and the next request connects afresh.

It is one of the fast paths (``quiet_health_check`` in
:data:`ledgerdash.ledger.store.FAST_PATHS`): ``LEDGER_FAST_PATHS_OFF``
switches it off, and the fast-path benchmark measures what it gains.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq

__all__ = ["DatabaseWrapper"]


def quiet(fileno: int) -> bool:
    """Nothing to read on the socket now (no wait): the server has said nothing since its last answer."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        # Imported here: the backend is loaded before the apps may be, and the store's package reads models.
        from ledgerdash.ledger.store import enabled

        conn = self.connection
        if conn is None or conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
            return False
        if (
            enabled("quiet_health_check")
            and not self.errors_occurred
            and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            and quiet(conn.pgconn.socket)
        ):
            return True
        return bool(super().is_usable())

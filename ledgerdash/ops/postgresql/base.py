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
good, outside any transaction, with no error since, and found usable less
than :data:`QUIET_SECONDS` ago, is usable without asking the server:
nothing was said on it since its last answer. Anything else (something
waiting on the socket: the server's farewell, a notification, a parameter
it reports; a connection in a transaction, after an error, or quiet for
longer) is asked with Django's ``SELECT 1``, as before.

The time bound is for a peer that vanished without a word, whose address
answers again with a reset: a host that rebooted, an address moved to
another server. Its socket stays quiet; only a round trip finds it, and a
``SELECT 1`` then reconnects where the request's own statement would
answer 503. Such a change takes seconds; a connection serving agents is
used again within milliseconds, so the bound costs them nothing. A peer
that vanished and does not answer at all (a host powered off, a network
that drops packets) makes a ``SELECT 1`` wait as long as the request's own
statement would; both end with the request's error, a 503
(:mod:`ledgerdash.ops.unavailable`).

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
import time

from django.db.backends.postgresql import base
from psycopg import pq

__all__ = ["QUIET_SECONDS", "DatabaseWrapper"]

#: A connection found usable longer ago than this is asked ``SELECT 1``, quiet or not.
QUIET_SECONDS = 1.0
#: The clock the bound is read on (tests set it).
monotonic = time.monotonic


def quiet(fileno: int) -> bool:
    """Nothing to read on the socket now (no wait): the server has said nothing since its last answer."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


class DatabaseWrapper(base.DatabaseWrapper):
    #: When this connection was last found usable (:data:`monotonic`); None: never.
    usable_at: float | None = None

    def is_usable(self) -> bool:
        # Imported here: the backend is loaded before the apps may be, and the store's package reads models.
        from ledgerdash.ledger.store import enabled

        conn = self.connection
        if conn is None or conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
            return False
        now = monotonic()
        if (
            enabled("quiet_health_check")
            and not self.errors_occurred
            and self.usable_at is not None
            and now - self.usable_at < QUIET_SECONDS
            and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            and quiet(conn.pgconn.socket)
        ):
            self.usable_at = now
            return True
        usable = bool(super().is_usable())
        self.usable_at = now if usable else None
        return usable

    def connect(self) -> None:
        super().connect()
        self.usable_at = monotonic()  # a new connection has just answered the server's handshake

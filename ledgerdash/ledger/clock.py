"""The ledger's one clock, and its one source of jitter.

Every decision that depends on time (is a lease over, is a back-off due,
was a lookup made after the request could no longer land, is a key past
the provider's retention) reads :func:`now`. The times those decisions
compare are written by many hosts (web nodes, agents' processes,
reconcilers) into one database, so they are taken from one clock: the
database server's. Each process reads the server's clock
(``clock_timestamp()``) now and then and carries it between readings on
its own monotonic clock, which setting the host's wall clock does not
move; a host whose wall clock is minutes off decides as every other does.
On SQLite, whose processes all run on its one host, the time is that
host's clock.

How far :func:`now` may be from the server's clock: half the round trip
of the reading it carries (the server read its clock somewhere between
the question and the answer, and the middle is taken) plus :data:`DRIFT`
of the time since that reading (how far the host's monotonic clock may
run fast or slow). A reading is taken again every
``LEDGER_CLOCK_READ_SECONDS`` (30 by default), and replaces the one
carried only when it is the closer of the two; with the default, a
process's time is within 0.03 s plus half a round trip of the server's,
and two processes' times within twice that. A reading that cannot be
made (the database away) leaves the last one carried, and is tried again
a second later. A process that has never read the server's clock (its
database away since it started) uses its host's own, and tries the server
at every call: it cannot write what it decides until the database answers
either. The reading is made on the thread's own connection, past the
ORM's execute wrappers; inside the caller's transaction it is made in a
savepoint of its own, so a failure leaves that transaction as it was, and
behind a pooler in transaction mode it prepares nothing. The monotonic
clock is the host's, not the process's: a worker forked from a process
carries that process's reading on, and reads again on its own connection.

:func:`frozen_at` pins the time for the current thread (and anything the
thread runs) so a sequence of decisions sees one instant, and
:func:`driven_by` hands the whole process to another source of time (the
simulation's virtual clock, which every thread of it shares). Both win
over the server's clock.

Back-offs spread with random jitter, drawn from :func:`jitter`: the
process's own random numbers, or the simulation's seeded ones, so a
simulated run makes the same draws every time it is replayed.

The crash drill pins each recovery round to one instant: the round's second
pass then decides against the very time the first did, so "the second pass
changes nothing" holds however slowly a loaded machine runs between them.
Agents are never pinned: their timestamps are the real time of their work.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

log = logging.getLogger("ledgerdash.clock")

_pinned: ContextVar[datetime | None] = ContextVar("ledgerdash_clock", default=None)
#: The process's source of time and of jitter when something drives them (see :func:`driven_by`).
_source: Callable[[], datetime] | None = None
_random: random.Random | None = None

#: How fast or slow a host's monotonic clock may run against the server's: a
#: crystal is off by some 0.01%, and NTP slews a clock by at most 0.05%.
DRIFT = 0.001
#: Seconds after a reading that could not be made before the next is tried.
RETRY_SECONDS = 1.0
_SAVEPOINT = "ledgerdash_clock"


@dataclass(frozen=True, slots=True)
class Reading:
    """The database server's clock as this process read it."""

    #: What the server's clock said,
    server: datetime
    #: at this instant of the host's monotonic clock (the middle of the round trip);
    at: float
    #: and how long the question and its answer took, in seconds.
    round_trip: float

    def carried(self, instant: float) -> datetime:
        """The server's time at ``instant`` of the host's monotonic clock."""
        return self.server + timedelta(seconds=instant - self.at)

    def error(self, instant: float) -> float:
        """How far :meth:`carried` may be from the server's clock at ``instant``, in seconds."""
        return self.round_trip / 2 + DRIFT * abs(instant - self.at)


_reading: Reading | None = None
#: When (on the monotonic clock) the server's clock is read again.
_read_at = 0.0
_failing = False


def monotonic() -> float:
    """The clock a reading is carried on (tests set it)."""
    return time.monotonic()


def now() -> datetime:
    """The time decisions are made at: the pinned instant, else the driving
    source, else the database server's clock."""
    pinned = _pinned.get()
    if pinned is not None:
        return pinned
    return _source() if _source is not None else _database_time()


def _database_time() -> datetime:
    # The settings, not the connection: asking the thread's connection costs more than the rest.
    if "postgresql" not in str(settings.DATABASES["default"]["ENGINE"]):
        return timezone.now()
    instant, reading = monotonic(), _reading
    if reading is None or instant >= _read_at:
        reading = _read_again(reading)
        if reading is None:
            return timezone.now()
        instant = monotonic()
    return reading.carried(instant)


def _read_again(kept: Reading | None) -> Reading | None:
    """Read the server's clock; the reading to carry from now on."""
    global _reading, _read_at, _failing
    try:
        fresh = _ask_the_server()
    except Exception as exc:  # whatever keeps the server from answering, time goes on
        if not _failing:
            log.warning(
                "could not read the database server's clock (%s: %s); %s",
                type(exc).__name__,
                exc,
                "carrying the last reading" if kept is not None else "using this host's clock until it answers",
            )
        _failing = True
        _read_at = monotonic() + RETRY_SECONDS
        return kept
    if _failing:
        log.info("read the database server's clock again")
    _failing = False
    instant = monotonic()
    if kept is None or fresh.error(instant) <= kept.error(instant):
        _reading = kept = fresh
    _read_at = instant + settings.LEDGER_CLOCK_READ_SECONDS
    return kept


def _ask_the_server() -> Reading:
    """One reading of the server's clock, on this thread's connection. The
    driver's own cursor, so no execute wrapper takes it for a statement of
    the caller's (an attempt's copy lets only its change through)."""
    connection.ensure_connection()
    raw = connection.connection
    with raw.cursor() as cursor:
        inside = not raw.autocommit  # the caller's transaction is open
        if inside:
            cursor.execute(f"SAVEPOINT {_SAVEPOINT}", prepare=False)
        try:
            asked = monotonic()
            cursor.execute("SELECT clock_timestamp()", prepare=False)
            answered = monotonic()
            row = cursor.fetchone()
        except Exception:
            if inside:
                cursor.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", prepare=False)
            raise
        if inside:
            cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}", prepare=False)
    assert row is not None
    return Reading(row[0].astimezone(UTC), (asked + answered) / 2, answered - asked)


def forget() -> None:
    """Drop the reading carried (another database server is used from now on)."""
    global _reading, _read_at, _failing
    _reading, _read_at, _failing = None, 0.0, False


def jitter(low: float, high: float) -> float:
    """A random number between ``low`` and ``high`` to spread a back-off with."""
    return (_random or random).uniform(low, high)  # jitter, not security


@contextmanager
def frozen_at(instant: datetime) -> Iterator[datetime]:
    """Decide everything inside this block (in this thread) at ``instant``."""
    if timezone.is_naive(instant):
        raise ValueError("the ledger's clock is timezone-aware; pass an aware datetime")
    token = _pinned.set(instant)
    try:
        yield instant
    finally:
        _pinned.reset(token)


@contextmanager
def driven_by(source: Callable[[], datetime], chance: random.Random) -> Iterator[None]:
    """Take the time from ``source`` and the jitter from ``chance`` in every
    thread of the process, inside this block. One driver at a time."""
    global _source, _random
    if _source is not None:
        raise RuntimeError("the ledger's clock is already driven by another source")
    _source, _random = source, chance
    try:
        yield
    finally:
        _source, _random = None, None

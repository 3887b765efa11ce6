"""The events' partitions on PostgreSQL: what there is, and making them ahead.

The events are partitioned by ranges of their ids (why ids and not time:
``migrations/0024_events_partitioned``). Each range is ``size`` ids; the
partition that takes every id past the last range is the *tail*, so a write
always finds a partition. :func:`make_ahead` keeps ``ahead`` empty ranges
beyond the one being written, so the tail stays empty and the ranges stay
their size: run it as the owner (``manage.py event_partitions``, daily, say;
the systemd timer in ``deploy/systemd`` does), as ``migrate`` runs.

If nobody ran it for long enough, the writes reach the tail. Nothing is
refused; the next run closes the tail at the next round bound past the ids
given out (a scan of the tail's rows, with writes to the events waiting for
it) and goes on from there.

Nothing here runs on SQLite, which keeps one table.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

PARENT = "ledger_attemptevent"
SEQUENCE = f"{PARENT}_id_seq"
_created = importlib.import_module("ledgerdash.ledger.migrations.0024_events_partitioned")
#: Ids per partition unless a run says otherwise.
SIZE = _created.SIZE
own_statements = _created.own_statements

_BOUND = re.compile(r"FOR VALUES FROM \((?:'?(?P<low>-?\d+)'?|MINVALUE)\) TO \((?:'?(?P<high>-?\d+)'?|MAXVALUE)\)")


class PartitionsUnavailable(RuntimeError):
    """The database keeps its events in one table (SQLite)."""


@dataclass(frozen=True)
class Partition:
    name: str
    #: The first id it takes (None: from the lowest), and the first it does not (None: every id on: the tail).
    low: int | None
    high: int | None
    #: PostgreSQL's estimate, from its last ANALYZE (-1: never analyzed).
    rows: int
    bytes: int
    first_at: datetime | None
    last_at: datetime | None

    @property
    def tail(self) -> bool:
        return self.high is None

    def holds(self, event_id: int) -> bool:
        return (self.low is None or event_id >= self.low) and (self.high is None or event_id < self.high)

    def describe(self) -> str:
        low = "…" if self.low is None else f"{self.low:,}"
        high = "…" if self.high is None else f"{self.high:,}"
        if self.first_at is None or self.last_at is None:
            when = "empty"
        else:
            when = f"{self.first_at:%Y-%m-%d %H:%M} to {self.last_at:%Y-%m-%d %H:%M} UTC"
        rows = "?" if self.rows < 0 else f"~{self.rows:,}"
        return f"{self.name}: ids {low} to {high}, {rows} rows, {self.bytes / 2**20:,.1f} MiB, {when}"


def _require_postgres() -> None:
    if connection.vendor != "postgresql":
        raise PartitionsUnavailable(
            f"the events are partitioned on PostgreSQL; this database ({connection.vendor}) keeps one table"
        )


def partitions() -> list[Partition]:
    """The events' partitions, lowest ids first (each one's first and last
    event read by its primary key: two index probes)."""
    _require_postgres()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples::bigint, "
            "pg_total_relation_size(c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass",
            [PARENT],
        )
        found = []
        for name, bound, rows, size in cursor.fetchall():
            match = _BOUND.search(bound)
            if match is None:  # not a range partition of ours
                continue
            low, high = match["low"], match["high"]
            first_at, last_at = _ends(cursor, name)
            found.append(
                Partition(
                    name=name,
                    low=None if low is None else int(low),
                    high=None if high is None else int(high),
                    rows=rows,
                    bytes=size,
                    first_at=first_at,
                    last_at=last_at,
                )
            )
    return sorted(found, key=lambda p: -1 if p.low is None else p.low)


def _ends(cursor: Any, name: str) -> tuple[datetime | None, datetime | None]:
    cursor.execute(
        f'SELECT (SELECT created_at FROM "{name}" ORDER BY id LIMIT 1), '
        f'(SELECT created_at FROM "{name}" ORDER BY id DESC LIMIT 1)'
    )
    first_at, last_at = cursor.fetchone()
    return first_at, last_at


def ids_given_out() -> int:
    """The highest event id the sequence has handed out (0: none)."""
    _require_postgres()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT last_value, is_called FROM {SEQUENCE}")
        last_value, is_called = cursor.fetchone()
    return last_value if is_called else last_value - 1


def name_for(low: int) -> str:
    return f"{PARENT}_{low}"


def make_ahead(*, ahead: int = 2, size: int = SIZE) -> list[str]:
    """Make ranges of ``size`` ids until ``ahead`` empty ones lie past the
    one being written (the tail moves past them); what was done, one line
    each (nothing: there were enough). One transaction; a second run at the
    same time waits for it, then finds nothing to do."""
    _require_postgres()
    if ahead < 1 or size < 1:
        raise ValueError("ahead and size are at least 1")
    done: list[str] = []
    with transaction.atomic(), connection.cursor() as cursor:
        # The locks below make every reader and writer of the events wait:
        # give up after a while (and run again later) rather than hold them all.
        cursor.execute("SET LOCAL lock_timeout = '10s'")
        # Conflicts with itself (a second run waits), not with reads and writes.
        cursor.execute(f"LOCK TABLE {PARENT} IN SHARE UPDATE EXCLUSIVE MODE")
        current = partitions()
        tail = current[-1]
        if not tail.tail:
            raise RuntimeError(f"{tail.name} is the last partition of the events but takes ids only to {tail.high}")
        top = ids_given_out()
        writing = next(p for p in current if p.holds(max(top, 1)))
        if writing.tail:
            # Nobody made ranges ahead in time: writes reached the tail. Lock
            # the events (writes wait), then close the tail at the next round
            # bound past every id handed out, its rows checked once.
            cursor.execute(f"LOCK TABLE {PARENT} IN ACCESS EXCLUSIVE MODE")
            top = ids_given_out()
            assert tail.low is not None
            closed = tail.low + ((top - tail.low) // size + 1) * size
            cursor.execute(f"ALTER TABLE {PARENT} DETACH PARTITION {tail.name}")
            cursor.execute(
                f"ALTER TABLE {tail.name} ADD CONSTRAINT {tail.name}_bound CHECK (id >= {tail.low} AND id < {closed})"
            )
            cursor.execute(
                f"ALTER TABLE {PARENT} ATTACH PARTITION {tail.name} FOR VALUES FROM ({tail.low}) TO ({closed})"
            )
            cursor.execute(f"ALTER TABLE {tail.name} DROP CONSTRAINT {tail.name}_bound")
            done.append(f"closed {tail.name} at id {closed:,}: writes had reached it")
            start = closed
        else:
            assert writing.high is not None
            assert tail.low is not None
            wanted = writing.high + ahead * size
            if tail.low >= wanted:
                return done
            # The tail is empty (no id reached it): it is dropped and made
            # again past the new ranges. Writes wait for the lock this takes.
            cursor.execute(f"LOCK TABLE {PARENT} IN ACCESS EXCLUSIVE MODE")
            cursor.execute(f'SELECT EXISTS (SELECT FROM "{tail.name}")')
            if cursor.fetchone()[0]:
                raise RuntimeError(f"{tail.name} has rows although no id handed out reaches it: look before going on")
            cursor.execute(f"ALTER TABLE {PARENT} DETACH PARTITION {tail.name}")
            cursor.execute(f"DROP TABLE {tail.name}")
            start = tail.low
        writing_high = start if writing.tail else writing.high
        assert writing_high is not None
        end = max(writing_high + ahead * size, start)
        low = start
        while low < end:
            for statement in _created.partition_statements(name_for(low), str(low), str(low + size)):
                cursor.execute(statement)
            done.append(f"made {name_for(low)} for ids {low:,} to {low + size:,}")
            low += size
        for statement in _created.partition_statements(name_for(low), str(low), "MAXVALUE"):
            cursor.execute(statement)
        done.append(f"made {name_for(low)} for ids {low:,} on (the tail)")
    return done

"""Changing ledger events behind the application's back, as a database
superuser would: the append-only triggers are switched off for the
statement and on again, so the tests can check the chain catches it."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from django.db import connection

TABLE = "ledger_attemptevent"
_triggers = importlib.import_module("ledgerdash.ledger.migrations.0002_events_append_only")


@contextlib.contextmanager
def triggers_off(conn: Any = connection) -> Iterator[Any]:
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            # Inside the test's transaction (ALTER TABLE would wait for its
            # deferred foreign-key checks): triggers off for this session only.
            cursor.execute("SET session_replication_role = replica")
        else:
            for statement in _triggers.SQLITE_REVERSE:
                cursor.execute(statement)
        try:
            yield cursor
        finally:
            if conn.vendor == "postgresql":
                cursor.execute("SET session_replication_role = DEFAULT")
            else:
                for statement in _triggers.SQLITE_FORWARD:
                    cursor.execute(statement)


def edit(event_id: int, **values: Any) -> None:
    sets = ", ".join(f"{name} = %s" for name in values)
    with triggers_off() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET {sets} WHERE id = %s", [*values.values(), event_id])


def delete(*event_ids: int) -> None:
    with triggers_off() as cursor:
        for event_id in event_ids:
            cursor.execute(f"DELETE FROM {TABLE} WHERE id = %s", [event_id])


def swap(first_id: int, second_id: int) -> None:
    """Swap two events' places in the chain (their seq numbers)."""
    with triggers_off() as cursor:
        cursor.execute(f"SELECT id, seq FROM {TABLE} WHERE id IN (%s, %s)", [first_id, second_id])
        seqs = dict(cursor.fetchall())
        cursor.execute(f"UPDATE {TABLE} SET seq = %s WHERE id = %s", [10**15, first_id])
        cursor.execute(f"UPDATE {TABLE} SET seq = %s WHERE id = %s", [seqs[first_id], second_id])
        cursor.execute(f"UPDATE {TABLE} SET seq = %s WHERE id = %s", [seqs[second_id], first_id])

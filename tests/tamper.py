"""Changing ledger events behind the application's back, as a database
superuser would, so the tests can check the chain catches it.

On PostgreSQL the app connects as the runtime role, which can neither edit
events nor switch a trigger off; the tampering goes through a superuser
connection of its own (``tests.database_roles.admin_connect``) with the
triggers off for that session. That connection sees only committed rows, so
a test that tampers on PostgreSQL commits its ledger first: mark it
``@tamper.commits``. On SQLite the triggers are dropped and put back around
the statement, on the app's own connection.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.database_roles import admin_connect

TABLE = "ledger_attemptevent"
_triggers = importlib.import_module("ledgerdash.ledger.migrations.0002_events_append_only")

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith("postgres")
#: For a test that tampers: on PostgreSQL its rows must be committed for the superuser to see them.
commits = pytest.mark.django_db(transaction=ON_POSTGRES)


@contextlib.contextmanager
def triggers_off() -> Iterator[Any]:
    if connection.vendor == "postgresql":
        with admin_connect() as admin, admin.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")  # superuser only: no trigger fires
            yield cursor
        return
    with connection.cursor() as cursor:
        for statement in _triggers.SQLITE_REVERSE:
            cursor.execute(statement)
        try:
            yield cursor
        finally:
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


def execute(statement: str, params: list[Any] | None = None) -> None:
    """Any statement, with the triggers off (moving a chain head, emptying a table)."""
    with triggers_off() as cursor:
        cursor.execute(statement, params)


def cut_tail(tenant_id: int, keep: int) -> None:
    """Remove a tenant's events after seq ``keep`` and move its head back, so
    the shortened chain is consistent in itself."""
    with triggers_off() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE tenant_id = %s AND seq > %s", [tenant_id, keep])
        cursor.execute(f"SELECT hash FROM {TABLE} WHERE tenant_id = %s AND seq = %s", [tenant_id, keep])
        (digest,) = cursor.fetchone() if keep else ("0" * 64,)
        cursor.execute(
            "UPDATE ledger_chainhead SET seq = %s, hash = %s WHERE tenant_id = %s", [keep, digest, tenant_id]
        )

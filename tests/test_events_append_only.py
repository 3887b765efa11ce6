"""Events cannot be changed or removed through the app's connection: on SQLite
the triggers refuse it; on PostgreSQL the runtime role has no privilege to
try (and the triggers refuse even the tables' owner: test_database_protections)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from ledgerdash.ledger.models import AttemptEvent, Tenant
from tests.conftest import record


def _refusal() -> str:
    return "permission denied" if connection.vendor == "postgresql" else "append-only"


def test_the_orm_cannot_update_an_event(tenant_a: Tenant) -> None:
    record(tenant_a)
    with pytest.raises(DatabaseError, match=_refusal()), transaction.atomic():
        AttemptEvent.objects.filter(tenant=tenant_a).update(reason="rewritten")


def test_the_database_refuses_update_and_delete_of_events(tenant_a: Tenant) -> None:
    record(tenant_a)
    event = AttemptEvent.objects.filter(tenant=tenant_a, attempt__isnull=False).first()
    assert event is not None
    table = AttemptEvent._meta.db_table
    for statement in (
        f"UPDATE {table} SET reason = 'rewritten' WHERE id = %s",
        f"DELETE FROM {table} WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match=_refusal()), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [event.pk])
    event.refresh_from_db()
    assert event.reason == "intent recorded"


def test_sqlite_refuses_deleting_every_event_at_once(tenant_a: Tenant) -> None:
    """SQLite has no TRUNCATE; its unqualified DELETE runs the row trigger."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's form of emptying a table; PostgreSQL's TRUNCATE: test_database_protections")
    record(tenant_a)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {AttemptEvent._meta.db_table}")
    assert AttemptEvent.objects.filter(tenant=tenant_a).exists()


@pytest.mark.postgres
def test_postgres_has_the_triggers_installed(tenant_a: Tenant) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'ledger_attemptevent'::regclass AND NOT tgisinternal "
            "ORDER BY tgname"
        )
        assert [row[0] for row in cursor.fetchall()] == [
            "ledger_attemptevent_append_only",
            "ledger_attemptevent_no_truncate",
            "ledger_attemptevent_seq_once",
        ]

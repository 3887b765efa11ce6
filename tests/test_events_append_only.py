from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from ledgerdash.ledger.models import AttemptEvent, Tenant
from tests.conftest import record


def test_the_orm_cannot_update_an_event(tenant_a: Tenant) -> None:
    record(tenant_a)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
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
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [event.pk])
    event.refresh_from_db()
    assert event.reason == "intent recorded"


@pytest.mark.postgres
def test_postgres_has_the_trigger_installed(tenant_a: Tenant) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'ledger_attemptevent'::regclass AND NOT tgisinternal"
        )
        assert [row[0] for row in cursor.fetchall()] == ["ledger_attemptevent_append_only"]

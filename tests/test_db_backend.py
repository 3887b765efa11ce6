"""The PostgreSQL backend's health check (ledgerdash/db/postgresql/base.py):
no round trip for a connection in use a moment ago that the server has not
written to; Django's ``SELECT 1`` for one idle longer, or one with anything
to read; a session the server ended is replaced before a request uses it."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.postgresql import base as django_postgresql

from ledgerdash.db.postgresql import base
from ledgerdash.ledger.store.connection import QUIET_WITHIN

pytestmark = pytest.mark.postgres


@pytest.fixture
def kept(db: None) -> Iterator[Any]:
    """A connection of its own (outside the test's transaction), as a web
    worker keeps one between requests, with the health check's state reset
    as a new request finds it."""
    wrapper = connections.create_connection("default")
    assert isinstance(wrapper, base.DatabaseWrapper)
    try:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
        wrapper.health_check_done = False
        yield wrapper
    finally:
        wrapper.close()


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each SELECT 1 the health check sends."""
    sent: list[str] = []
    plain = django_postgresql.DatabaseWrapper.is_usable

    def is_usable(self: Any) -> bool:
        sent.append("SELECT 1")
        return plain(self)

    monkeypatch.setattr(django_postgresql.DatabaseWrapper, "is_usable", is_usable)
    return sent


def backend_pid(wrapper: Any) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_connection_used_a_moment_ago_is_taken_without_a_round_trip(kept: Any, round_trips: list[str]) -> None:
    pid = kept.connection.info.backend_pid
    kept.last_used = time.monotonic() + 60  # as if used just now, whatever the machine's speed
    kept.close_if_health_check_failed()
    assert round_trips == []
    assert kept.health_check_done
    assert backend_pid(kept) == pid


def test_a_connection_idle_for_longer_gets_a_select_1(kept: Any, round_trips: list[str]) -> None:
    pid = kept.connection.info.backend_pid
    kept.last_used = time.monotonic() - QUIET_WITHIN - 1
    kept.close_if_health_check_failed()
    assert round_trips == ["SELECT 1"]
    assert backend_pid(kept) == pid


def test_a_session_the_server_ended_is_replaced_before_use(kept: Any, round_trips: list[str]) -> None:
    pid = kept.connection.info.backend_pid
    sock = kept.connection.pgconn.socket
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    readable, _, _ = select.select([sock], [], [], 30)  # the server's last word reaches the client
    assert readable
    kept.last_used = time.monotonic() + 60
    kept.close_if_health_check_failed()
    assert round_trips == ["SELECT 1"]  # something to read: the server is asked, and the answer is no
    assert kept.connection is None
    assert backend_pid(kept) != pid  # the next statement connects afresh


def test_a_connection_in_a_transaction_is_not_taken_on_trust(kept: Any, round_trips: list[str]) -> None:
    kept.connection.execute("BEGIN")
    kept.last_used = time.monotonic() + 60
    kept.close_if_health_check_failed()
    assert round_trips == ["SELECT 1"]
    kept.connection.execute("ROLLBACK")

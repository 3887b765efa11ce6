"""The kept connection's health check (ledgerdash/ops/postgresql): no round
trip while the connection is quiet and was found usable a moment ago;
Django's ``SELECT 1`` whenever the server has said something, a transaction
is open, an error happened or the connection was quiet for longer; a session
the server ended is found dead and replaced. Time is the test's clock."""

from __future__ import annotations

import select
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction

from ledgerdash.ops.postgresql import base
from ledgerdash.ops.postgresql.base import QUIET_SECONDS, DatabaseWrapper
from tests.database_roles import admin_connect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The health check's clock, moved only by the test."""
    clock = Clock()
    monkeypatch.setattr(base, "monotonic", clock)
    return clock


@pytest.fixture
def cursors_opened() -> Iterator[list[int]]:
    """How many cursors the health check opened on the raw connection (Django's ``SELECT 1`` opens one)."""
    connection.ensure_connection()
    raw = connection.connection
    plain = raw.cursor
    opened: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return plain(*args, **kwargs)

    raw.cursor = counted
    try:
        yield opened
    finally:
        raw.cursor = plain


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_the_projects_backend_serves_postgresql() -> None:
    assert isinstance(connections["default"], DatabaseWrapper)
    assert connection.vendor == "postgresql"


def test_a_quiet_idle_connection_is_usable_without_asking_the_server(cursors_opened: list[int], clock: Clock) -> None:
    _backend_pid()
    connection.usable_at = clock.now
    cursors_opened.clear()
    clock.now += QUIET_SECONDS - 0.01
    assert connection.is_usable() is True
    clock.now += QUIET_SECONDS - 0.01  # each time it is found usable counts from then
    assert connection.is_usable() is True
    assert cursors_opened == []


def test_a_connection_quiet_for_longer_is_asked_with_select_1(cursors_opened: list[int], clock: Clock) -> None:
    _backend_pid()
    connection.usable_at = clock.now
    cursors_opened.clear()
    clock.now += QUIET_SECONDS
    assert connection.is_usable() is True
    assert cursors_opened == [1]
    assert connection.is_usable() is True  # found usable just now: quiet again
    assert cursors_opened == [1]


def test_a_new_connection_counts_as_found_usable_when_it_connects(clock: Clock) -> None:
    connection.close()
    connection.ensure_connection()
    assert connection.usable_at == clock.now


@pytest.mark.own_session  # behind a transaction pooler the server's session is the pooler's
def test_a_session_the_server_ended_is_found_dead_and_replaced(cursors_opened: list[int]) -> None:
    pid = _backend_pid()
    with admin_connect() as admin:
        # with a timeout, pg_terminate_backend returns once the session is gone (PostgreSQL 14+)
        ended = admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()
    assert ended == (True,)
    assert connection.is_usable() is False
    connection.health_check_done = False
    connection.close_if_health_check_failed()
    assert connection.connection is None
    assert _backend_pid() != pid  # the next statement connected afresh


@pytest.mark.own_session  # behind a transaction pooler the server's session is the pooler's
def test_a_socket_with_something_to_read_is_asked_with_select_1(cursors_opened: list[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("LISTEN ledgerdash_health_check_test")
    with admin_connect() as admin:
        admin.execute("NOTIFY ledgerdash_health_check_test")
    poller = select.poll()
    poller.register(connection.connection.pgconn.socket, select.POLLIN)
    assert poller.poll(10_000), "the notification never reached the socket"
    cursors_opened.clear()
    assert connection.is_usable() is True
    assert cursors_opened == [1]


def test_a_connection_in_a_transaction_is_asked_with_select_1(cursors_opened: list[int]) -> None:
    with transaction.atomic():
        _backend_pid()
        cursors_opened.clear()
        assert connection.is_usable() is True
        assert cursors_opened == [1]


def test_a_connection_after_an_error_is_asked_with_select_1(cursors_opened: list[int]) -> None:
    _backend_pid()
    connection.errors_occurred = True
    cursors_opened.clear()
    try:
        assert connection.is_usable() is True
        assert cursors_opened == [1]
    finally:
        connection.errors_occurred = False


def test_a_closed_connection_is_not_usable() -> None:
    connection.ensure_connection()
    connection.connection.close()
    assert connection.is_usable() is False
    connection.close()


def test_switched_off_every_kept_connection_is_asked_with_select_1(cursors_opened: list[int], settings: Any) -> None:
    settings.LEDGER_FAST_PATHS_OFF = frozenset({"quiet_health_check"})
    _backend_pid()
    cursors_opened.clear()
    assert connection.is_usable() is True
    assert cursors_opened == [1]

"""The kept connection's health check (``CONN_HEALTH_CHECKS``): a connection
kept from an earlier request is asked ``SELECT 1`` before the next one uses
it, and a session the server ended is found dead and replaced, so the
request connects afresh instead of failing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from tests.database_roles import admin_connect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


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


def test_a_closed_connection_is_not_usable() -> None:
    connection.ensure_connection()
    connection.connection.close()
    assert connection.is_usable() is False
    connection.close()


def test_a_kept_connection_is_asked_with_select_1_before_it_is_used_again(cursors_opened: list[int]) -> None:
    _backend_pid()
    cursors_opened.clear()
    assert connection.is_usable() is True
    assert cursors_opened == [1]
    connection.health_check_done = False  # what the start of a request does (close_old_connections)
    connection.close_if_health_check_failed()
    assert cursors_opened == [1, 1]
    assert connection.connection is not None

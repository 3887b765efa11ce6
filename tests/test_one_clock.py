"""The ledger's one clock: every process decides by the database server's
time, carried between readings on its monotonic clock, whatever its host's
wall clock says; SQLite's single host decides by its own; a pinned or
driven clock wins over both.

A host whose clock is off is this process with Django's time source moved
(``django.utils.timezone.now``, what the ledger used before); a process
starting afresh is this one with its reading forgotten.
"""

from __future__ import annotations

import email.utils
import os
import random
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, tzinfo

import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from ledgerdash.ledger import clock, recording
from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.providers import base as providers_base
from ledgerdash.ledger.reconciler import Reconciler
from tests.api_support import Api, issue_token
from tests.conftest import AGENT, record
from tests.tcp_proxy import TcpProxy

ON_POSTGRES = "postgresql" in str(settings.DATABASES["default"]["ENGINE"])
TEN_MINUTES = timedelta(minutes=10)


@pytest.fixture(autouse=True)
def _afresh() -> Iterator[None]:
    """Each test starts (and leaves) the process with no reading of the server's clock."""
    clock.forget()
    yield
    clock.forget()


def host_clock_off_by(monkeypatch: pytest.MonkeyPatch, offset: timedelta) -> None:
    """This host's wall clock runs ``offset`` from the true time (and this process starts afresh)."""
    true_time = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: true_time() + offset)
    clock.forget()


def stopped_monotonic(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """This host's monotonic clock stands still until the test moves it on (by the seconds given)."""
    at = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: at[0])

    def advance(seconds: float) -> None:
        at[0] += seconds

    return advance


def server_time() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (at,) = cursor.fetchone()
    return at.astimezone(UTC)


def between(value: datetime, low: datetime, high: datetime, slack: float = 1.0) -> bool:
    """Whether ``value`` lies between ``low`` and ``high``, give or take ``slack`` seconds (the
    clock's error is half a reading's round trip: milliseconds here; the hosts below are minutes off)."""
    return low - timedelta(seconds=slack) <= value <= high + timedelta(seconds=slack)


# --- PostgreSQL: the server's clock ------------------------------------------------------


@pytest.mark.postgres
def test_a_dispatch_from_a_host_whose_clock_is_behind_takes_its_lease_and_landing_time_from_the_server(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = record(tenant_a, "k-slow-host")
    host_clock_off_by(monkeypatch, -TEN_MINUTES)
    before = server_time()
    dispatched = recording.mark_dispatched(attempt, actor=AGENT)
    after = server_time()
    lease = timedelta(seconds=settings.LEDGER_DISPATCH_LEASE_SECONDS)
    assert dispatched.next_check_at is not None
    assert between(dispatched.next_check_at - lease, before, after)
    assert dispatched.lands_by == dispatched.next_check_at + timedelta(seconds=settings.LEDGER_MAX_REQUEST_SECONDS)
    assert dispatched.first_dispatched_at is not None
    assert between(dispatched.first_dispatched_at, before, after)


@pytest.mark.postgres
def test_a_reconciler_whose_host_clock_runs_ahead_leaves_a_running_lease_alone(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatched = recording.mark_dispatched(record(tenant_a, "k-fast-reconciler"), actor=AGENT)
    host_clock_off_by(monkeypatch, TEN_MINUTES)  # the reconciler's host: its own clock says the lease ended
    summary = Reconciler(label="reconciler-ahead").run_pass()
    assert summary.claimed == 0
    assert Attempt.objects.get(pk=dispatched.pk).state == State.DISPATCHED


@pytest.mark.postgres
def test_the_api_tells_an_agent_to_wait_for_the_lease_by_the_servers_time(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = Api(issue_token(tenant_a))
    attempt = api.record("k-retry-after")
    assert api.dispatch(attempt["id"]).status_code == 200
    host_clock_off_by(monkeypatch, -TEN_MINUTES)  # the web node that answers the second claim
    response = api.dispatch(attempt["id"])
    assert response.status_code == 409
    # At most the lease itself (60 s), not the lease plus the ten minutes the host is behind.
    assert 1 <= int(response["Retry-After"]) <= settings.LEDGER_DISPATCH_LEASE_SECONDS + 1


@pytest.mark.postgres
def test_a_providers_retry_after_date_is_counted_from_the_ledgers_clock(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    when = email.utils.format_datetime(server_time() + timedelta(seconds=120), usegmt=True)
    host_clock_off_by(monkeypatch, -TEN_MINUTES)

    class HostDatetime(datetime):  # the host's clock as the adapters read it themselves
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> HostDatetime:
            return super().now(tz) - TEN_MINUTES

    monkeypatch.setattr(providers_base, "datetime", HostDatetime)
    seconds = providers_base.retry_after_seconds(when)
    assert seconds is not None
    assert 100 <= seconds <= 120


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_clock_carries_a_reading_and_reads_the_server_again_after_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    advance = stopped_monotonic(monkeypatch)
    interval = settings.LEDGER_CLOCK_READ_SECONDS
    before = server_time()
    read = clock.now()
    assert between(read, before, server_time())

    advance(interval - 1)  # not due: carried on the monotonic clock, whatever the server's says now
    assert clock.now() == read + timedelta(seconds=interval - 1)

    advance(2)  # due: read again, and the server's clock has moved on only as far as real time has
    before = server_time()
    again = clock.now()
    assert between(again, before, server_time())
    assert again < read + timedelta(seconds=interval - 1)


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_database_that_goes_away_leaves_the_clock_carrying_its_last_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    advance = stopped_monotonic(monkeypatch)
    db = connection.settings_dict
    proxy = TcpProxy((str(db["HOST"] or "127.0.0.1"), int(db["PORT"] or 5432)))
    proxy.start()

    def through_the_proxy() -> list[datetime]:
        """A process whose connection to the server runs through the proxy, its own thread's."""
        connections["default"] = type(connections["default"])({**db, "HOST": "127.0.0.1", "PORT": proxy.port})
        try:
            times = [clock.now()]  # read through the proxy
            proxy.stop()
            advance(settings.LEDGER_CLOCK_READ_SECONDS + 1)
            times.append(clock.now())  # due, and the server is away: carried
            proxy.start()
            connection.close()  # as Django does with a connection that failed, before its next use
            advance(clock.RETRY_SECONDS)
            times.append(clock.now())
            return times
        finally:
            connection.close()

    try:
        with ThreadPoolExecutor(1) as thread:
            read, away, back = thread.submit(through_the_proxy).result(timeout=60)
    finally:
        proxy.stop()
    assert away == read + timedelta(seconds=settings.LEDGER_CLOCK_READ_SECONDS + 1)
    assert between(back, read, server_time())  # read again once the server answered: real time, not carried


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_process_that_never_reached_the_server_keeps_time_by_its_host_until_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    monkeypatch.setattr(timezone, "now", lambda: host)
    db = connection.settings_dict
    proxy = TcpProxy((str(db["HOST"] or "127.0.0.1"), int(db["PORT"] or 5432)))
    proxy.start()
    proxy.stop()  # its port is known, and nothing listens there

    def unreachable() -> datetime:
        connections["default"] = type(connections["default"])({**db, "HOST": "127.0.0.1", "PORT": proxy.port})
        try:
            return clock.now()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(unreachable).result(timeout=60) == host
    before = server_time()
    assert between(clock.now(), before, server_time())  # the next call reaches it


@pytest.mark.postgres
def test_a_pinned_or_driven_clock_wins_over_the_servers(db: None) -> None:
    pinned = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    with clock.frozen_at(pinned):
        assert clock.now() == pinned
    driven = datetime(2032, 6, 7, 8, 9, 10, tzinfo=UTC)
    with clock.driven_by(lambda: driven, random.Random(1)):
        assert clock.now() == driven
        with clock.frozen_at(pinned):
            assert clock.now() == pinned
    before = server_time()
    assert between(clock.now(), before, server_time())


@pytest.mark.postgres
def test_a_forked_worker_carries_its_parents_reading(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    clock.now()  # the parent reads the server's clock
    before = server_time()
    monkeypatch.setattr(timezone, "now", lambda: datetime(2031, 5, 6, tzinfo=UTC))  # no use to either
    readable, writable = os.pipe()
    with warnings.catch_warnings():
        # The test runner keeps threads of its own (gunicorn's master keeps none); the worker
        # below takes no lock any of them could hold.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the worker: it touches neither the parent's connection nor its host's clock
        code = 1
        try:
            os.write(writable, clock.now().isoformat().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(writable)
    said = os.read(readable, 100).decode()
    os.close(readable)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert between(datetime.fromisoformat(said), before, server_time())


# --- SQLite: one host, its clock ------------------------------------------------------------


@pytest.mark.skipif(ON_POSTGRES, reason="SQLite's processes share one host; this pass runs on PostgreSQL")
def test_on_sqlite_the_time_is_the_hosts(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    host = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    monkeypatch.setattr(timezone, "now", lambda: host)
    assert clock.now() == host

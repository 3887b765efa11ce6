"""Profile one agent's tool calls: ``python -m bench.profile [--calls N]``.

Runs the recording benchmark's ledgerdash agent in this process under
pyinstrument (``pip install -e '.[bench]'``) against a scratch database of
its own (named like the benchmark's: see bench/__main__.py), and prints
where the time goes, the SQL statements one call sends, the WAL the calls
write, and how a call's time splits between its statements and the Python
around them, beside the minimal peer's (the two alternating in this
process: each statement timed from the call into the driver to its return,
by a Django execute wrapper for the ledger and around psycopg's
``Connection.execute`` for the peer). Then the same agent's calls through
the ingest API's three requests, each handed to Django's WSGI handler in
this process (the request cycle gunicorn runs, without sockets), beside
the calls in process, alternating, and how a call through the API splits
between its statements, the connection's health checks (a ``SELECT 1``
before each request's first statement), and the Python of Django,
django-ninja and the ledger.

WAL is measured two ways around a loop of calls on this one connection:

- the server's WAL insert position before and after
  (``pg_current_wal_insert_lsn``): everything the whole server wrote
  meanwhile, this loop's records and commits and anything else (other
  sessions, autovacuum, checkpoints' full-page images); attributable to the
  loop only on an otherwise idle server, so the other active sessions are
  counted and printed beside it;
- with ``pg_walinspect`` (PostgreSQL 15 contrib; needs a superuser), only
  the records carrying the loop's own transaction ids (read from the
  ``xmin`` of the events it inserted): its inserts, updates, index entries,
  full-page images and commits, without records that carry no transaction
  id (on-access pruning, hint-bit images).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import Databases, say, setup_django

WAL_CALLS = 200


def _others_active(cursor: Any) -> int:
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'"
    )
    return int(cursor.fetchone()[0])


def measure_wal(call: Any, first: int) -> None:
    """Run WAL_CALLS calls and print the WAL they wrote, both ways."""
    from django.db import connection

    with connection.cursor() as cursor:
        others_before = _others_active(cursor)
        cursor.execute("SELECT pg_current_wal_insert_lsn(), coalesce(max(id), 0) FROM ledger_attemptevent")
        start_lsn, last_event = cursor.fetchone()
        for i in range(WAL_CALLS):
            call(first + i, False)
        cursor.execute("SELECT pg_current_wal_insert_lsn()")
        (end_lsn,) = cursor.fetchone()
        others_after = _others_active(cursor)
        cursor.execute("SELECT pg_wal_lsn_diff(%s, %s)", [end_lsn, start_lsn])
        (server_wide,) = cursor.fetchone()
        say(
            f"  WAL the whole server wrote during {WAL_CALLS} calls: {float(server_wide) / WAL_CALLS:,.0f} bytes"
            f" per call (other active sessions at start/end: {others_before}/{others_after}; their WAL is in"
            " this figure too)"
        )
        try:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except Exception as exc:  # any failure only means "not measured"
            say(f"  WAL of this loop's own transactions: not measured (pg_walinspect: {exc})")
            return
        # Each step is one transaction that inserted one event: the events' xmin are the loop's xids.
        cursor.execute("SELECT DISTINCT xmin::text FROM ledger_attemptevent WHERE id > %s", [last_event])
        ours = {str(xid) for (xid,) in cursor.fetchall()}
        cursor.execute(
            "SELECT count(*), coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0), "
            "count(*) FILTER (WHERE resource_manager = 'Transaction') "
            "FROM pg_get_wal_records_info(%s, %s) WHERE xid::text = ANY(%s)",
            [start_lsn, end_lsn, sorted(ours)],
        )
        records, total, fpi, commits = cursor.fetchone()
        say(
            f"  WAL of this loop's own {len(ours)} transactions: {float(total) / WAL_CALLS:,.0f} bytes per call"
            f" ({float(records) / WAL_CALLS:.1f} records, {float(commits) / WAL_CALLS:.1f} of them commits;"
            f" full-page images {float(fpi) / WAL_CALLS:,.0f} bytes)"
        )


def _timed[T](spent: dict[str, float], what: str, run: Callable[[], T]) -> T:
    """``run()``, its time added to ``spent[what]``."""
    began = time.perf_counter()
    try:
        return run()
    finally:
        spent[what] += time.perf_counter() - began


def _alternate(
    agents: dict[str, tuple[Any, Callable[[], contextlib.AbstractContextManager[Any]]]],
    *,
    rounds: int,
    calls: int,
    first: int,
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Each agent's ``calls`` calls in turn, round by round, inside the
    context its timing gives: each round's p50 per agent (ms), and each
    agent's time over all its calls (s)."""
    import statistics

    p50s: list[dict[str, float]] = []
    totals = dict.fromkeys(agents, 0.0)
    for round_no in range(rounds):
        p50 = {}
        for who, (call, timing) in agents.items():
            latencies = []
            with timing():
                for i in range(calls):
                    began = time.perf_counter()
                    call(first + round_no * calls + i, False)
                    latencies.append(time.perf_counter() - began)
            totals[who] += sum(latencies)
            p50[who] = statistics.median(latencies) * 1000
        p50s.append(p50)
    return p50s, totals


def _say_rounds(p50s: list[dict[str, float]], mine: tuple[str, str], other: tuple[str, str]) -> None:
    """One line per round: ``mine`` (its key and its name) beside ``other``, and their ratio."""
    (key, name), (other_key, other_name) = mine, other
    for round_no, p50 in enumerate(p50s):
        say(
            f"  round {round_no + 1}: {name} p50 {p50[key]:.2f} ms, {other_name} {p50[other_key]:.2f} ms:"
            f" {p50[key] / p50[other_key]:.2f}x"
        )


def compare_with_floor(ours: Any, floor: Any, *, rounds: int = 3, calls: int = 400) -> None:
    """Each agent's p50 per call, the two alternating round by round, and
    the mean time of a call inside its statements and outside them."""
    import psycopg
    from django.db import connection

    spent = {"ledgerdash": 0.0, "floor": 0.0}

    def ours_statement(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
        return _timed(spent, "ledgerdash", lambda: execute(sql, params, many, context))

    plain_execute = psycopg.Connection.execute

    def floor_statement(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _timed(spent, "floor", lambda: plain_execute(self, *args, **kwargs))

    @contextlib.contextmanager
    def floor_timing() -> Iterator[None]:
        psycopg.Connection.execute = floor_statement  # type: ignore[method-assign]
        try:
            yield
        finally:
            psycopg.Connection.execute = plain_execute  # type: ignore[method-assign]

    p50s, totals = _alternate(
        {"ledgerdash": (ours, lambda: connection.execute_wrapper(ours_statement)), "floor": (floor, floor_timing)},
        rounds=rounds,
        calls=calls,
        first=30_000_000,
    )
    _say_rounds(p50s, ("ledgerdash", "ledgerdash"), ("floor", "the minimal peer"))
    n = rounds * calls
    for who in ("ledgerdash", "floor"):
        inside, total = spent[who] / n * 1000, totals[who] / n * 1000
        name = "ledgerdash" if who == "ledgerdash" else "the minimal peer"
        say(f"  {name}: {total:.2f} ms a call, {inside:.2f} ms in its statements, {total - inside:.2f} ms outside them")


def wsgi_agent(token: str, run: str) -> Any:
    """One agent's tool call through the ingest API's three requests, each
    handed to Django's WSGI handler in this process: the request cycle as
    gunicorn runs it (request signals, so each request's connection health
    check; middleware; django-ninja; the ledger), without sockets or
    gunicorn. Returns ``call(i, spread)``."""
    import io
    import json

    from django.core.wsgi import get_wsgi_application

    from bench.peers import TOOL, tool_args

    app = get_wsgi_application()

    def request(path: str, body: dict[str, Any], expected: str) -> dict[str, Any]:
        data = json.dumps(body).encode()
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "127.0.0.1:8000", "REMOTE_ADDR": "127.0.0.1",
            "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(data), "wsgi.errors": sys.stderr,
            "CONTENT_LENGTH": str(len(data)), "CONTENT_TYPE": "application/json", "HTTP_ACCEPT": "application/json",
            "HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_LEDGERDASH_AGENT": "bench-profile",
        }  # fmt: skip
        status: list[str] = []

        def start_response(line: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(line)
            return lambda data: None

        answer = b"".join(app(environ, start_response))
        if not status[0].startswith(expected):
            raise RuntimeError(f"POST {path} answered {status[0]}: {answer[:300]!r}")
        return dict(json.loads(answer))

    def call(i: int, spread: bool) -> None:
        attempt = request(
            "/api/v1/attempts",
            {"task_id": "profile", "tool_name": TOOL, "idempotency_key": f"{run}-api:{i}", "args": tool_args(i)},
            "201",
        )
        attempt = request(f"/api/v1/attempts/{attempt['id']}/dispatch", {"fence": attempt["fence"]}, "200")
        body = {"outcome": "confirmed", "fence": attempt["fence"], "provider_request_id": f"req-{run}-{i}"}
        request(f"/api/v1/attempts/{attempt['id']}/outcome", body, "200")

    return call


def compare_api_in_process(ours: Any, api: Any, *, rounds: int = 3, calls: int = 200) -> None:
    """The same tool call in process and through the API's request cycle, alternating round by round:
    each one's p50, and where a call through the API spends its time."""
    from django.db import connection

    spent = {"statements": 0.0, "health checks": 0.0}
    checks_sent = [0]

    def statement(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
        return _timed(spent, "statements", lambda: execute(sql, params, many, context))

    plain_is_usable = connection.is_usable

    def is_usable() -> bool:  # the health check: a SELECT 1 sent past the execute wrappers
        checks_sent[0] += 1
        return bool(_timed(spent, "health checks", plain_is_usable))

    @contextlib.contextmanager
    def api_timing() -> Iterator[None]:
        connection.is_usable = is_usable  # type: ignore[method-assign]
        try:
            with connection.execute_wrapper(statement):
                yield
        finally:
            connection.is_usable = plain_is_usable  # type: ignore[method-assign]

    p50s, totals = _alternate(
        {"api": (api, api_timing), "in process": (ours, contextlib.nullcontext)},
        rounds=rounds,
        calls=calls,
        first=40_000_000,
    )
    _say_rounds(p50s, ("api", "the API"), ("in process", "in process"))
    n = rounds * calls
    total = totals["api"] / n * 1000
    per_call = {what: seconds / n * 1000 for what, seconds in spent.items()}
    rest = total - sum(per_call.values())
    say(
        f"  the API: {total:.2f} ms a call, {per_call['statements']:.2f} ms in its statements,"
        f" {per_call['health checks']:.2f} ms in the connection's health checks ({checks_sent[0]} SELECT 1"
        f" in {3 * n} requests), {rest:.2f} ms in Django, django-ninja and the ledger's Python"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.0002, help="pyinstrument's sampling interval")
    parser.add_argument(
        "--profile",
        choices=("in-process", "api"),
        default="in-process",
        help="whose calls pyinstrument profiles: the agent's in process, or the same through the API's requests",
    )
    args = parser.parse_args(argv)
    from bench.__main__ import DEFAULT_URL
    from bench.peers import ledgerdash_agent, minimal_agent
    from bench.recording import _prepare_tenants

    dbs = Databases(os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL), os.environ.get("BENCH_RUN_ID"))
    say(f"scratch databases {dbs.main}, {dbs.template}")
    try:
        dbs.prepare_template()
        setup_django(dbs.url_of(dbs.main))
        dbs.fresh_main()
        run_id = uuid.uuid4().hex[:8]
        from django.conf import settings

        tenants = _prepare_tenants(run_id)
        cfg = {
            "env": dict(os.environ),
            "tenants": tenants,
            "run": run_id,
            "database_url": dbs.url_of(dbs.main),
            "dispatch_lease_seconds": settings.LEDGER_DISPATCH_LEASE_SECONDS,
            "intent_lease_seconds": settings.LEDGER_INTENT_LEASE_SECONDS,
            "max_request_seconds": settings.LEDGER_MAX_REQUEST_SECONDS,
        }
        call = ledgerdash_agent(cfg, 0).call
        for i in range(50):
            call(i, False)
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured:
            call(10_000_000, False)
        say(f"one call sends {len(captured.captured_queries)} statements:")
        for query in captured.captured_queries:
            say(f"  {query['sql'][:150]}")
        kinds = Counter(q["sql"].split()[0] for q in captured.captured_queries)
        say(f"  by kind: {dict(kinds)}")
        measure_wal(call, 20_000_000)
        floor = minimal_agent(cfg, 0)
        for i in range(50):
            floor.call(i, False)
        dbs.analyze()  # the statistics a running deployment keeps (bench/common.py)
        say("\none agent's calls beside the minimal peer's, alternating:")
        compare_with_floor(call, floor.call)
        floor.release()
        from bench.recording import _tokens

        slug = tenants["ledgerdash"][0]
        api = wsgi_agent(_tokens([slug])[slug], run_id)
        for i in range(50):
            api(50_000_000 + i, False)
        say("\none agent's calls through the ingest API's request cycle in this process (no sockets), beside")
        say("the same calls in process, alternating:")
        compare_api_in_process(call, api)

        from pyinstrument import Profiler

        profiler = Profiler(interval=args.interval)
        began = time.perf_counter()
        profiled = api if args.profile == "api" else call
        with profiler:
            for i in range(args.calls):
                profiled(60_000_000 + i, False)
        elapsed = time.perf_counter() - began
        say(f"\n{args.calls} calls in {elapsed:.2f}s: {elapsed / args.calls * 1000:.2f} ms per call")
        say(profiler.output_text(unicode=False, color=False, show_all=False))
    finally:
        dbs.drop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())

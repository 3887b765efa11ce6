"""The ledger grown large against the same ledger nearly empty.

``python -m bench --only growth`` (``make bench-growth``). One database,
measured twice with the same work:

1. **empty**: 500 tenants (``GROWTH_TENANTS``), each with its policy and
   chain; 5,000 UNKNOWN attempts over them (the queue people read), 400
   effects waiting at the sandbox provider for the reconciler to find;
2. **grown**: then ``GROWTH_EVENTS`` events (default 50 million) in settled
   attempts (three events each: recorded, dispatched, confirmed) are loaded
   with COPY, spread over the same tenants, each tenant's chain continued
   from its head with real links and content hashes (a sample of rows is
   checked against the ledger's own canonical form as they are made), in
   partitions of 10 million ids made ahead by ``event_partitions``; then
   VACUUM ANALYZE, as autovacuum would leave it.

Each side measures, in this order:

- a tool call in process (record, dispatch, confirm: three commits), p50
  over 300 calls on one tenant, after a warm-up;
- the same call over HTTP (gunicorn as deployed, the Python client), p50;
- the UNKNOWN queue's p95 (first page, one tenant, "mine"), through gunicorn;
- an attempt's page, p50, through gunicorn;
- ``verify_audit --incremental`` over every tenant, after the calls above
  appended to the chains (the grown side's earlier walk is taken to have
  reached the loaded heads: a full walk of 50 million events is not what
  this measures);
- a reconciler pass over 200 UNKNOWN attempts due now whose effects the
  sandbox provider has (each one looked up and confirmed).

Beside them: WAL written per in-process call (``pg_current_wal_lsn`` around
the calls) and the events' size on disk per million (tables and indexes).
The goal for each figure is the grown side within 1.1x of the empty side's.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.common import GUNICORN_PORT, Target, median, percentile, ratio, say, start_gunicorn, table
from bench.loader import ATTEMPT_COLUMNS, EVENT_COLUMNS, bulk_load, copy_rows, reserve_ids
from bench.queue import _session_cookie
from bench.reconciler import TOOL as RECONCILED_TOOL
from bench.reconciler import _args as reconciled_args
from bench.reconciler import _fill_sandbox, _start_sandbox
from ledgerdash.processes import stop_group

TOOL = "growth_send"
GOAL = 1.1
EMPTY_ARGS_HASH = hashlib.sha256(b"{}").hexdigest()
UNKNOWN = 5000


@dataclass(frozen=True)
class Work:
    """What each side measures: due attempts reconciled, calls in process
    and over HTTP, reads of each page."""

    reconciled: int = 200
    calls: int = 300
    http_calls: int = 200
    page_reads: int = 60


#: A quick run's (a smoke pass: that it all runs, not its figures).
QUICK = Work(reconciled=40, calls=60, http_calls=40, page_reads=10)
#: Up to this many events loaded, the run also walks every chain whole after the load.
VERIFY_WHOLE_UP_TO = 1_000_000
EVENTS_PER_ATTEMPT = 3
#: The moves of a settled attempt, and of one whose answer was lost.
SETTLED = (("", "INTENT_RECORDED"), ("INTENT_RECORDED", "DISPATCHED"), ("DISPATCHED", "OUTCOME_CONFIRMED"))
LOST = (("", "INTENT_RECORDED"), ("INTENT_RECORDED", "DISPATCHED"), ("DISPATCHED", "UNKNOWN"))


def _sizes(quick: bool) -> tuple[int, int]:
    """Events to load and tenants (``GROWTH_EVENTS``, ``GROWTH_TENANTS``);
    a quick run also does less of each measured step (:data:`QUICK`)."""
    events = int(os.environ.get("GROWTH_EVENTS", 30_000 if quick else 50_000_000))
    tenants = int(os.environ.get("GROWTH_TENANTS", 10 if quick else 500))
    return events, tenants


def _prepare(ctx: Any, tenants: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from bench.common import SANDBOX_PORT
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Membership, Tenant, TokenScope, Tool
    from ledgerdash.ledger.policies import policy_publish
    from ledgerdash.ledger.tokens import token_create
    from ledgerdash.sandbox import http_adapter_config

    ctx.dbs.fresh_main()
    operator = get_user_model().objects.create_user("growth-operator")
    config = http_adapter_config(f"http://127.0.0.1:{SANDBOX_PORT}")
    Tool.objects.create(name=TOOL, config=config, idempotent=True)
    Tool.objects.create(name=RECONCILED_TOOL, config=config, idempotent=True, key_retention_seconds=86400)
    made = []
    for n in range(tenants):
        tenant = Tenant.objects.create(slug=f"g{n:03d}", name=f"Growth {n:03d}", default_owner=operator)
        tools = {TOOL: ["email:send"], RECONCILED_TOOL: ["email:send"]}
        policy_publish(tenant=tenant, tools=tools, actor=Actor.system("bench"))
        Membership.objects.create(user=operator, tenant=tenant, role="operator")
        made.append(tenant)
    _, token = token_create(tenant=made[0], name="growth agent", scopes=[TokenScope.WRITE], actor=Actor.system("bench"))
    url = ctx.dbs.url_of(ctx.dbs.main)
    with psycopg.connect(url, autocommit=True) as conn:
        first = reserve_ids(conn, "ledger_attempt", UNKNOWN)
        now = datetime.now(UTC)

        def unknown() -> Iterator[tuple[Any, ...]]:
            for i in range(UNKNOWN):
                tenant = made[i % len(made)]
                created = now - timedelta(seconds=UNKNOWN - i)
                key = f"queue:{i}"
                yield (
                    first + i, tenant.pk, f"task-{i}", TOOL, key, key, "{}", EMPTY_ARGS_HASH,
                    "UNKNOWN", 1, "email:send", 2, 1, 1, "", "", 0, "", "", "no response",
                    operator.pk if i % 5 == 0 else None, created + timedelta(days=400), created, created, created,
                )  # fmt: skip

        copy_rows(conn, "ledger_attempt", ATTEMPT_COLUMNS, unknown())
        chains = Chains(url)
        first_event = reserve_ids(conn, "ledger_attemptevent", UNKNOWN * len(LOST))
        lost = (
            row
            for i in range(UNKNOWN)
            for row in chains.events(made[i % len(made)].pk, first + i, LOST, now - timedelta(seconds=UNKNOWN - i))
        )
        copy_rows(conn, "ledger_attemptevent", ("id", *EVENT_COLUMNS), _with_ids(lost, first_event))
        chains.save(conn)
    from ledgerdash.ledger import audit

    assert all(r.ok for r in audit.verify(made)), "the empty ledger's chains verify before it is measured"
    return {"operator": operator, "tenants": made, "token": token, "url": url}


def _due(prepared: dict[str, Any], side: int, work: Work) -> None:
    """``work.reconciled`` UNKNOWN attempts of the first tenant, due now, whose
    effects the sandbox holds (keys ``recover:<i>``: a block of its own per side)."""
    from ledgerdash.ledger.canonical import normalize_args

    tenant = prepared["tenants"][0]
    now = datetime.now(UTC)
    with psycopg.connect(prepared["url"], autocommit=True) as conn:
        first = reserve_ids(conn, "ledger_attempt", work.reconciled)

        def rows() -> Iterator[tuple[Any, ...]]:
            for n in range(work.reconciled):
                i = side * work.reconciled + n
                normalized, args_hash = normalize_args(reconciled_args(i))
                key = f"recover:{i}"
                yield (
                    first + n, tenant.pk, f"task-r{i}", RECONCILED_TOOL, key, key, json.dumps(normalized), args_hash,
                    "UNKNOWN", 1, "email:send", 2, 1, 1, "", "", 0, "", "", "the response was lost", None,
                    now - timedelta(seconds=60), now - timedelta(minutes=5), now - timedelta(minutes=5),
                    now - timedelta(minutes=5),
                )  # fmt: skip

        copy_rows(conn, "ledger_attempt", ATTEMPT_COLUMNS, rows())


# --- the load -------------------------------------------------------------------------


def _canonical(tenant_id: int, attempt_id: int, move: tuple[str, str], created: str) -> str:
    """An event's hashed fields in the ledger's canonical JSON (RFC 8785:
    keys sorted, no spaces), for one move of a bulk-loaded attempt."""
    fence = 0 if move[0] == "" else 1
    return (
        '{"actor_kind":"agent","actor_label":"bulk","actor_user_id":null,'
        f'"attempt_id":{attempt_id},"created_at":"{created}","details":{{}},"fence":{fence},'
        f'"from_state":"{move[0]}","kind":"transition","reason":"","tenant_id":{tenant_id},"to_state":"{move[1]}"}}'
    )


def _checked_canonical(tenant_id: int, attempt_id: int, move: tuple[str, str]) -> None:
    """The hand-made canonical form is the ledger's own for this event."""
    from types import SimpleNamespace

    from ledgerdash.ledger import chain
    from ledgerdash.ledger.canonical import canonical_bytes

    created = datetime(2026, 1, 1, tzinfo=UTC)
    event = SimpleNamespace(
        tenant_id=tenant_id, attempt_id=attempt_id, kind="transition", actor_kind="agent", actor_user_id=None,
        actor_label="bulk", from_state=move[0], to_state=move[1], fence=0 if move[0] == "" else 1, reason="",
        details={}, created_at=created,
    )  # fmt: skip
    mine = _canonical(tenant_id, attempt_id, move, chain.timestamp(created)).encode()
    assert canonical_bytes(chain.event_content(event)) == mine, "the bulk events' canonical form drifted"


class Chains:
    """Each tenant's chain end, continued by bulk-loaded events."""

    def __init__(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute("SELECT tenant_id, seq, hash FROM ledger_chainhead").fetchall()
        self.heads = {tenant_id: [seq, digest] for tenant_id, seq, digest in rows}

    def events(
        self, tenant_id: int, attempt_id: int, moves: tuple[tuple[str, str], ...], created: datetime
    ) -> Iterator[tuple[Any, ...]]:
        """The attempt's events (without ids), linked to the chain's end, which moves on."""
        sha = hashlib.sha256
        head = self.heads[tenant_id]
        when = created.isoformat(timespec="microseconds")
        for move in moves:
            content = sha(_canonical(tenant_id, attempt_id, move, when).encode()).hexdigest()
            linked = sha(bytes.fromhex(head[1]) + bytes.fromhex(content)).hexdigest()
            head[0] += 1
            yield (
                tenant_id, head[0], attempt_id, "transition", "agent", None, "bulk", move[0], move[1],
                0 if move[0] == "" else 1, "", "{}", when, content, head[1], linked,
            )  # fmt: skip
            head[1] = linked

    def save(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            for tenant_id, (seq, digest) in self.heads.items():
                conn.execute(
                    "UPDATE ledger_chainhead SET seq = %s, hash = %s WHERE tenant_id = %s", [seq, digest, tenant_id]
                )


def _load(prepared: dict[str, Any], events: int) -> dict[str, Any]:
    """``events`` events in settled attempts, spread over the tenants, each
    chain continued from its head; the heads and the walks' furthest heads
    moved to the new ends."""
    from ledgerdash.ledger import partitions
    from ledgerdash.ledger.models import ChainCheck

    tenants = prepared["tenants"]
    attempts = events // EVENTS_PER_ATTEMPT
    started = time.monotonic()
    chains = Chains(prepared["url"])
    with psycopg.connect(prepared["url"], autocommit=True) as conn:
        first_attempt = reserve_ids(conn, "ledger_attempt", attempts)
        first_event = reserve_ids(conn, "ledger_attemptevent", attempts * EVENTS_PER_ATTEMPT)
    # Ranges for every id the load takes, as the owner's daily run would have made them.
    made = partitions.make_ahead(ahead=(attempts * EVENTS_PER_ATTEMPT) // partitions.SIZE + 2)
    start = datetime.now(UTC) - timedelta(days=400)
    for move in SETTLED + LOST:
        _checked_canonical(tenants[0].pk, first_attempt, move)

    def attempt_rows() -> Iterator[tuple[Any, ...]]:
        for i in range(attempts):
            tenant = tenants[i % len(tenants)]
            created = start + timedelta(seconds=i)
            key = f"bulk:{i}"
            yield (
                first_attempt + i, tenant.pk, f"task-b{i // 10}", TOOL, key, key, "{}", EMPTY_ARGS_HASH,
                "OUTCOME_CONFIRMED", 1, "email:send", 2, 1, 1, f"req-{i}", "", 0, "", "", "", None, None,
                created, created, created,
            )  # fmt: skip

    def event_rows() -> Iterator[tuple[Any, ...]]:
        for i in range(attempts):
            yield from chains.events(
                tenants[i % len(tenants)].pk, first_attempt + i, SETTLED, start + timedelta(seconds=i)
            )

    with psycopg.connect(prepared["url"], autocommit=True) as conn:
        loaded_attempts = bulk_load(conn, "ledger_attempt", ATTEMPT_COLUMNS, attempt_rows())
        say(f"growth: {loaded_attempts['rows']:,} attempts loaded in {loaded_attempts['copy_s']} s")
        loaded_events = bulk_load(
            conn, "ledger_attemptevent", ("id", *EVENT_COLUMNS), _with_ids(event_rows(), first_event)
        )
        say(
            f"growth: {loaded_events['rows']:,} events loaded in {loaded_events['copy_s']} s "
            f"({loaded_events['rows_per_s']:,}/s)"
        )
        chains.save(conn)
        invalid = conn.execute(
            "SELECT string_agg(i.indexrelid::regclass::text, ', ') FROM pg_index i JOIN pg_inherits p "
            "ON i.indrelid IN (p.inhrelid, p.inhparent) WHERE p.inhparent = 'ledger_attemptevent'::regclass "
            "AND NOT i.indisvalid"
        ).fetchone()
        assert invalid is not None
        assert invalid[0] is None, f"indexes left unbuilt by the load: {invalid[0]}"
    heads = chains.heads
    # The earlier walk reached the loaded ends (a full walk of them is not measured here).
    for tenant_id, (seq, digest) in heads.items():
        ChainCheck.objects.update_or_create(
            tenant_id=tenant_id,
            defaults={
                "checked_at": datetime.now(UTC), "ok": True, "verified_seq": seq, "events": seq,
                "reached_heads": [[seq, digest]], "reached_at": datetime.now(UTC),
            },
        )  # fmt: skip
    whole = None
    if events <= VERIFY_WHOLE_UP_TO:
        from ledgerdash.ledger import audit

        results = audit.verify(tenants, save=False)
        whole = all(r.ok for r in results)
        assert whole, [r.describe() for r in results if not r.ok][:3]
    return {
        "verified_whole": whole,
        "attempts": loaded_attempts,
        "events": loaded_events,
        "partitions_made": len(made),
        "seconds": round(time.monotonic() - started, 1),
    }


def _with_ids(rows: Iterator[tuple[Any, ...]], first: int) -> Iterator[tuple[Any, ...]]:
    for n, row in enumerate(rows):
        yield (first + n, *row)


# --- the measurements -----------------------------------------------------------------


def _in_process_calls(prepared: dict[str, Any], label: str, work: Work) -> tuple[list[float], int]:
    from django.db import connection

    from ledgerdash.ledger import recording
    from ledgerdash.ledger.events import Actor

    tenant = prepared["tenants"][0]
    actor = Actor.agent("growth-agent")

    def call(i: int) -> None:
        recorded = recording.record_intent(
            tenant=tenant, task_id="growth", tool_name=TOOL, idempotency_key=f"{label}:{i}", args={"n": i}, actor=actor
        )
        attempt = recording.mark_dispatched(recorded.attempt, actor=actor)
        recording.confirm(attempt, provider_request_id=f"req-{label}-{i}", actor=actor)

    for i in range(30):
        call(-1 - i)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()")
        (before,) = cursor.fetchone()
    latencies = []
    for i in range(work.calls):
        began = time.perf_counter()
        call(i)
        latencies.append((time.perf_counter() - began) * 1000)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [before])
        (wal,) = cursor.fetchone()
    return latencies, int(wal) // work.calls


def _http_calls(prepared: dict[str, Any], label: str, work: Work) -> list[float]:
    from ledgerdash_client import LedgerClient

    client = LedgerClient(f"http://127.0.0.1:{GUNICORN_PORT}", prepared["token"], agent="growth-http")

    def call(i: int) -> None:
        recorded = client.record_intent(
            task_id="growth", tool_name=TOOL, idempotency_key=f"h{label}:{i}", args={"n": i}
        )
        attempt = client.dispatch(recorded.attempt.id, fence=recorded.attempt.fence)
        client.confirm(attempt.id, fence=attempt.fence, provider_request_id=f"req-h{label}-{i}")

    for i in range(20):
        call(-1 - i)
    latencies = []
    for i in range(work.http_calls):
        began = time.perf_counter()
        call(i)
        latencies.append((time.perf_counter() - began) * 1000)
    return latencies


def _reads(paths: list[str], cookie: str, work: Work) -> list[float]:
    opener = urllib.request.build_opener()
    opener.addheaders = [("Cookie", cookie)]
    latencies = []
    for path in paths * 3:  # one warm-up round, not timed
        opener.open(f"http://127.0.0.1:{GUNICORN_PORT}{path}", timeout=30).read()
    for _ in range(work.page_reads):
        for path in paths:
            began = time.perf_counter()
            with opener.open(f"http://127.0.0.1:{GUNICORN_PORT}{path}", timeout=30) as response:
                response.read()
                assert response.status == 200, path
            latencies.append((time.perf_counter() - began) * 1000)
    return latencies


def _measure(prepared: dict[str, Any], side: str, index: int, work: Work) -> dict[str, Any]:
    from ledgerdash.ledger import audit
    from ledgerdash.ledger.models import Attempt
    from ledgerdash.ledger.reconciler import Reconciler

    calls, wal = _in_process_calls(prepared, side, work)
    http = _http_calls(prepared, side, work)
    cookie = _session_cookie(prepared["operator"])
    tenant = prepared["tenants"][3]
    queue = _reads(
        ["/queues/unknown/", f"/queues/unknown/?tenant={tenant.slug}", "/queues/unknown/?owner=me"], cookie, work
    )
    attempt = Attempt.objects.filter(tenant=prepared["tenants"][0], idempotency_key=f"{side}:0").get()
    page = _reads([f"/attempts/{attempt.pk}/"], cookie, work)
    began = time.perf_counter()
    results = audit.verify(prepared["tenants"], incremental=True)
    verify_ms = (time.perf_counter() - began) * 1000
    assert all(r.ok for r in results), [r.describe() for r in results if not r.ok][:3]
    _due(prepared, index, work)
    summary = Reconciler(label=f"growth-{side}", batch_size=50).run_pass()
    assert summary.claimed == work.reconciled, f"the pass claimed {summary.claimed} of {work.reconciled}"
    return {
        "in process p50 ms": median(calls),
        "HTTP p50 ms": median(http),
        "queue p95 ms": percentile(queue, 95),
        "attempt page p50 ms": median(page),
        "incremental verify ms": verify_ms,
        "reconciler pass ms": summary.seconds * 1000,
        "WAL bytes per call": wal,
    }


def _events_on_disk(url: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits "
            "WHERE inhparent = 'ledger_attemptevent'::regclass"
        ).fetchone()
        (count,) = conn.execute("SELECT count(*) FROM ledger_attemptevent").fetchone() or (0,)
    assert row is not None
    return int(row[0]), int(count)


def run(ctx: Any) -> dict[str, Any]:
    from django.db import connections

    events, tenants = _sizes(ctx.quick)
    work = QUICK if ctx.quick else Work()
    prepared = _prepare(ctx, tenants)
    with tempfile.TemporaryDirectory(prefix="ledgerdash-growth-") as scratch:
        sandbox_db = Path(scratch) / "sandbox.sqlite3"
        _fill_sandbox(sandbox_db, 2 * work.reconciled)
        sandbox = _start_sandbox(sandbox_db)
        connections.close_all()
        server = start_gunicorn(prepared["url"], workers=2)
        try:
            say(f"growth: measuring the empty ledger ({tenants} tenants, {UNKNOWN} UNKNOWN attempts)")
            empty = _measure(prepared, "empty", 0, work)
            load = _load(prepared, events)
            connections.close_all()
            say(f"growth: measuring the grown ledger ({load['events']['rows']:,} more events)")
            grown = _measure(prepared, "grown", 1, work)
        finally:
            stop_group(server, timeout=20)
            stop_group(sandbox, timeout=10)
    disk, total = _events_on_disk(prepared["url"])
    rows = [
        [name, round(empty[name], 1), round(grown[name], 1), round(ratio(grown[name], empty[name]), 2)]
        for name in empty
    ]
    targets = [
        Target("growth", f"{name} grown / empty", ratio(grown[name], empty[name]), GOAL, "<=", "x")
        for name in empty
        if name != "WAL bytes per call"
    ]
    per_million = disk / max(total / 1e6, 1e-9)
    notes = [
        f"{total:,} events on disk: {disk / 2**30:.1f} GiB with their indexes, "
        f"{per_million / 2**20:.0f} MiB per million",
        f"WAL per in-process call (three commits): {empty['WAL bytes per call']:,} bytes empty, "
        f"{grown['WAL bytes per call']:,} grown",
        f"load: {load['seconds']} s ({load['events']['rows_per_s']:,} events/s by COPY, {load['partitions_made']} "
        "partition steps made ahead)",
    ]
    return {
        "table": table(["figure", "empty", "grown", "grown / empty"], rows),
        "targets": targets,
        "notes": notes,
        "empty": empty,
        "grown": grown,
        "load": load,
        "events_bytes": disk,
        "events": total,
    }

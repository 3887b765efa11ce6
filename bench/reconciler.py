"""Benchmark 3: recovery throughput, one worker against two.

5,000 UNKNOWN attempts fall due at once (bulk-loaded; the effects they
name were performed at the sandbox provider, whose response was lost).
The sandbox runs as a real HTTP service with 20 ms of added latency per
request. ``manage.py reconcile --once`` runs in 1, then 2, worker processes
over a fresh copy of the ledger each time; each worker claims batches with
SKIP LOCKED, looks each attempt up at the provider and confirms it.

Reported: attempts/s (first decision to last, from the events), each
worker's time per attempt (the gap between its consecutive decisions),
the scaling ratio, and double claims counted from the events: attempts
decided more than once, or by more than one worker.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    PYTHON,
    ROOT,
    SANDBOX_PORT,
    Target,
    django_env,
    median,
    percentile,
    ratio,
    say,
    table,
)
from bench.loader import ATTEMPT_COLUMNS, bulk_load, reserve_ids
from ledgerdash.processes import stop_group

TOOL = "bench_send"
LATENCY_MS = 20


def _args(i: int) -> dict[str, Any]:
    return {"invoice": f"INV-{i}", "to": "ap@example.com", "amount_cents": 1000 + i % 977}


def _fill_sandbox(path: Path, total: int) -> None:
    """The effects the lost responses were about, written into the sandbox's
    own store before it starts (as if it had performed them)."""
    import rfc8785

    from ledgerdash.sandbox.server import SCHEMA

    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    now = time.time()
    rows = []
    for i in range(total):
        payload = _args(i)
        rows.append(
            (TOOL, f"recover:{i}", json.dumps(payload), hashlib.sha256(rfc8785.dumps(payload)).hexdigest(), now)
        )
    db.executemany("INSERT INTO effects (tool, key, payload, payload_hash, created_at) VALUES (?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()


def _start_sandbox(path: Path) -> subprocess.Popen[bytes]:
    cmd = [
        PYTHON,
        "-m",
        "ledgerdash.sandbox",
        "--port",
        str(SANDBOX_PORT),
        "--db",
        str(path),
        "--key-retention",
        "86400",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{SANDBOX_PORT}"
    for _ in range(150):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    request = urllib.request.Request(
        f"{url}/faults/{TOOL}", data=json.dumps({"latency_ms": LATENCY_MS}).encode(), method="PUT"
    )
    urllib.request.urlopen(request, timeout=5).close()
    return proc


def _prepare_ledger(ctx: Any, total: int) -> None:
    """A fresh ledger: a tenant, its policy, the tool at the sandbox, and
    ``total`` UNKNOWN attempts due now."""
    from django.contrib.auth import get_user_model

    from ledgerdash.ledger.canonical import normalize_args
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant, Tool
    from ledgerdash.ledger.policies import policy_publish
    from ledgerdash.sandbox import http_adapter_config

    ctx.dbs.fresh_main()
    owner = get_user_model().objects.create_user("bench-oncall")
    tenant = Tenant.objects.create(slug="recovery", name="Recovery", default_owner=owner)
    policy_publish(tenant=tenant, tools={TOOL: ["email:send"]}, actor=Actor.system("bench"))
    Tool.objects.create(
        name=TOOL,
        config=http_adapter_config(f"http://127.0.0.1:{SANDBOX_PORT}"),
        idempotent=True,
        key_retention_seconds=86400,
    )
    now = datetime.now(UTC)
    with psycopg.connect(ctx.dbs.url_of(ctx.dbs.main), autocommit=True) as conn:
        first_id = reserve_ids(conn, "ledger_attempt", total)

        def rows() -> Any:
            for i in range(total):
                normalized, args_hash = normalize_args(_args(i))
                key = f"recover:{i}"
                yield (
                    first_id + i, tenant.pk, f"task-{i // 10}", TOOL, key, key, json.dumps(normalized), args_hash,
                    "UNKNOWN", 1, "email:send", 2, 1, 1, "", "", 0, "", "",
                    "tool raised TimeoutError: the response was lost", owner.pk, now - timedelta(seconds=60),
                    now - timedelta(minutes=5), now - timedelta(minutes=5), now - timedelta(minutes=5),
                )  # fmt: skip

        bulk_load(conn, "ledger_attempt", ATTEMPT_COLUMNS, rows())


def _one_run(ctx: Any, workers: int, total: int, batch: int) -> dict[str, Any]:
    _prepare_ledger(ctx, total)
    env = django_env(ctx.dbs.url_of(ctx.dbs.main))
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                PYTHON,
                str(ROOT / "manage.py"),
                "reconcile",
                "--once",
                "--batch-size",
                str(batch),
                "--label",
                f"bench-worker-{n}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for n in range(workers)
    ]
    outputs = [proc.communicate(timeout=3600)[0].decode(errors="replace") for proc in procs]
    wall = time.monotonic() - began
    with psycopg.connect(ctx.dbs.url_of(ctx.dbs.main)) as conn:
        states: dict[str, int] = dict(
            conn.execute("SELECT state, count(*) FROM ledger_attempt GROUP BY state").fetchall()
        )
        decided = conn.execute(
            """
            SELECT count(*), count(DISTINCT attempt_id), extract(epoch FROM max(created_at) - min(created_at))
            FROM ledger_attemptevent WHERE actor_kind = 'reconciler' AND kind = 'transition'
            """
        ).fetchone()
        double = conn.execute(
            """
            SELECT count(*) FROM (
                SELECT attempt_id FROM ledger_attemptevent WHERE actor_kind = 'reconciler' AND kind = 'transition'
                GROUP BY attempt_id HAVING count(*) > 1 OR count(DISTINCT actor_label) > 1
            ) AS twice
            """
        ).fetchone()
        gaps = [
            float(gap)
            for (gap,) in conn.execute(
                """
                SELECT extract(epoch FROM created_at - lag(created_at) OVER (PARTITION BY actor_label ORDER BY seq))
                FROM ledger_attemptevent WHERE actor_kind = 'reconciler' AND kind = 'transition'
                """
            ).fetchall()
            if gap is not None
        ]
        per_worker: dict[str, int] = dict(
            conn.execute(
                "SELECT actor_label, count(*) FROM ledger_attemptevent WHERE actor_kind = 'reconciler' "
                "AND kind = 'transition' GROUP BY actor_label"
            ).fetchall()
        )
    assert decided is not None
    assert double is not None
    events, attempts, span = int(decided[0]), int(decided[1]), float(decided[2] or 0.0)
    return {
        "workers": workers,
        "attempts": total,
        "confirmed": int(states.get("OUTCOME_CONFIRMED", 0)),
        "states": states,
        "decisions": events,
        "attempts_decided": attempts,
        "double_claims": int(double[0]),
        "per_worker": per_worker,
        "attempts_per_s": attempts / span if span > 0 else float("nan"),
        "wall_s": wall,
        "wall_attempts_per_s": attempts / wall,
        "p50_ms": percentile(gaps, 50) * 1000,
        "p99_ms": percentile(gaps, 99) * 1000,
        "exit_codes": [proc.returncode for proc in procs],
        "summaries": [out.strip().splitlines()[-1] if out.strip() else "" for out in outputs],
    }


def run(ctx: Any) -> dict[str, Any]:
    quick = ctx.quick
    # 5,000: a worker alone takes two minutes over them, long enough for a
    # steady rate, short enough for the whole run to stay within 15 minutes.
    total = 150 if quick else 5_000
    rounds = 2 if quick else 1
    # The command's default batch; the smoke run's is smaller so that its few
    # attempts still split evenly between two workers.
    batch = 10 if quick else 50
    say(f"reconciler: {total:,} due UNKNOWN attempts, sandbox latency {LATENCY_MS} ms, 1 vs 2 workers, {rounds} rounds")
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="ledgerdash-bench-") as tmp:
        store = Path(tmp) / "sandbox.sqlite3"
        _fill_sandbox(store, total)
        sandbox = _start_sandbox(store)
        try:
            for round_no in range(rounds):
                for workers in (1, 2) if round_no % 2 == 0 else (2, 1):
                    result = _one_run(ctx, workers, total, batch)
                    runs[workers].append(result)
                    say(
                        f"  {workers} worker(s): {result['attempts_per_s']:.1f} attempts/s, "
                        f"{result['confirmed']}/{total} confirmed, double claims {result['double_claims']}"
                    )
        finally:
            stop_group(sandbox, timeout=20)
    return _summarize(runs, total, batch)


def _summarize(runs: dict[int, list[dict[str, Any]]], total: int, batch: int) -> dict[str, Any]:
    figures = {}
    for workers, results in runs.items():
        figures[workers] = {
            "attempts_per_s": median(r["attempts_per_s"] for r in results),
            "wall_attempts_per_s": median(r["wall_attempts_per_s"] for r in results),
            "p50_ms": median(r["p50_ms"] for r in results),
            "p99_ms": median(r["p99_ms"] for r in results),
            "confirmed": min(r["confirmed"] for r in results),
            "double_claims": sum(r["double_claims"] for r in results),
            "runs": results,
        }
    scaling = ratio(figures[2]["attempts_per_s"], figures[1]["attempts_per_s"])
    double = figures[1]["double_claims"] + figures[2]["double_claims"]
    rows = [
        [
            f"{workers} worker{'s' if workers > 1 else ''}",
            f["attempts_per_s"],
            f["wall_attempts_per_s"],
            f["p50_ms"],
            f["p99_ms"],
            f"{f['confirmed']}/{total}",
            f["double_claims"],
        ]
        for workers, f in figures.items()
    ]
    rows.append(["2 workers / 1", scaling, "", "", "", "", ""])
    text = table(
        ["workers", "attempts/s", "with start-up", "p50 ms/attempt", "p99 ms/attempt", "confirmed", "double claims"],
        rows,
    )
    confirmed_all = float(min(f["confirmed"] for f in figures.values()))
    targets = [
        Target("reconciler", "scaling 1 -> 2 workers", scaling, 1.7, ">=", "x"),
        Target("reconciler", "double claims (from events)", float(double), 0.0, "<=", ""),
        Target("reconciler", "attempts confirmed in every run", confirmed_all, float(total), ">=", ""),
    ]
    return {
        "attempts": total,
        "latency_ms": LATENCY_MS,
        "batch_size": batch,
        "figures": {str(k): v for k, v in figures.items()},
        "scaling": scaling,
        "table": text,
        "targets": targets,
    }

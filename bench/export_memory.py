"""Peak memory of `manage.py export_audit` at growing ledger sizes (PostgreSQL).

    .venv/bin/python -m bench.export_memory                       # 50,000 and 1,000,000 events
    .venv/bin/python -m bench.export_memory --sizes 10000,200000 --format ndjson

Creates a scratch database of its own (``--database``, default
``ledgerdash_bench_export_<time>_<random>``, new for every run; a name that
already exists is refused, never dropped; the database it created is
dropped at the end unless ``--keep``), migrates it, and for each size tops
the ledger up to that many events with one INSERT … SELECT over
generate_series (one tenant, five events per attempt), then runs the export
as a child process that reports its own peak resident set size (``VmHWM``,
read by that process as it exits: see bench/peak.py). Flat means the peak
does not grow with the number of rows.

The loaded events carry placeholder hashes, not a valid chain: computing
real ones would mean hashing a million rows in order before measuring, and
the export reads and writes the hash columns the same whether or not they
verify. (The export's verifiability is tested on real chains in
tests/test_exports.py.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PYTHON, ROOT, django_env

EVENTS_PER_ATTEMPT = 5

ATTEMPTS = """
INSERT INTO ledger_attempt (
    tenant_id, task_id, tool_name, idempotency_key, provider_key, args, args_hash, state, policy_version,
    credential_scope, fence, dispatch_count, check_count, provider_request_id, result_ref, last_error,
    last_lookup, last_note, created_at, updated_at
)
SELECT %(tenant)s, 'task-' || (i / 10), 'send_email', 'bench-' || i, 'bench-' || i,
       jsonb_build_object('to', 'user' || i || '@example.com', 'invoice', i), md5(i::text) || md5((i + 1)::text),
       'OUTCOME_CONFIRMED', 1, 'email:send', 3, 1, 0, 'req-' || i, '', '', '', 'bench', now(), now()
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
"""
EVENTS = """
INSERT INTO ledger_attemptevent (
    tenant_id, seq, attempt_id, kind, actor_kind, actor_label, from_state, to_state, fence, reason, details,
    created_at, content_hash, prev_hash, hash
)
SELECT %(tenant)s, s, a.id, 'transition', 'agent', 'bench-agent', '', 'DISPATCHED', s %% 5,
       'bench event ' || s, jsonb_build_object('n', s, 'lookup', 'found'), now(),
       md5(s::text) || md5((s + 1)::text), md5((s - 1)::text) || md5(s::text), md5(s::text) || md5((s + 2)::text)
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS s
JOIN ledger_attempt a ON a.tenant_id = %(tenant)s
 AND a.idempotency_key = 'bench-' || ((s - %(first)s) / 5 + %(first_attempt)s)
"""


def load(cursor: Any, tenant_id: int, want: int) -> None:
    """Top the tenant's chain up to ``want`` events after its current head
    (which includes the audit events earlier exports appended)."""
    cursor.execute("SELECT coalesce(max(seq), 0), count(DISTINCT attempt_id) FROM ledger_attemptevent")
    head, attempts = cursor.fetchone()
    first_attempt, adding = attempts + 1, (want - head) // EVENTS_PER_ATTEMPT * EVENTS_PER_ATTEMPT
    if adding <= 0:
        return
    last_attempt = attempts + adding // EVENTS_PER_ATTEMPT
    cursor.execute(ATTEMPTS, {"tenant": tenant_id, "first": first_attempt, "last": last_attempt})
    params = {"tenant": tenant_id, "first": head + 1, "last": head + adding, "first_attempt": first_attempt}
    cursor.execute(EVENTS, params)
    cursor.execute(
        # A hex hash: the export appends its own audit event after the head.
        "INSERT INTO ledger_chainhead (tenant_id, stripe, seq, hash) "
        "VALUES (%(t)s, 0, %(n)s, md5(%(n)s::text) || md5('x')) "
        "ON CONFLICT (tenant_id, stripe) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash",
        {"t": tenant_id, "n": head + adding},
    )


def measure_export(database_url: str, tenant: str, fmt: str, out: str) -> dict[str, float]:
    """Run ``manage.py export_audit`` in a child process: its own peak RSS
    (MiB), the seconds it took, and the bytes it wrote."""
    with tempfile.TemporaryDirectory(prefix="ledgerdash-peak-") as scratch:
        peak_file = Path(scratch) / "peak"
        started = time.monotonic()
        command = ["manage.py", "export_audit", "--tenant", tenant, "--format", fmt, "--out", out]
        result = subprocess.run(
            [PYTHON, "-m", "bench.peak", str(peak_file), *command],
            cwd=ROOT,
            env=django_env(database_url),
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.monotonic() - started
        if result.returncode != 0:
            raise RuntimeError(f"export failed ({result.returncode}): {result.stderr[-2000:]}")
        peak = float(peak_file.read_text(encoding="ascii"))
    return {"peak_rss_mib": peak, "seconds": seconds, "bytes": os.path.getsize(out)}


def main() -> int:
    import psycopg

    from bench.common import DatabaseExists, new_run_id

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50000,1000000", help="event counts, comma-separated, ascending")
    parser.add_argument("--format", default="csv", choices=["csv", "ndjson"])
    parser.add_argument("--server", default="postgres://postgres@127.0.0.1:5432", help="a PostgreSQL server URL")
    parser.add_argument(
        "--database",
        default=f"ledgerdash_bench_export_{new_run_id()}",
        help="the scratch database's name (default: new for every run); it must not exist yet",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    sizes = [int(n) // EVENTS_PER_ATTEMPT * EVENTS_PER_ATTEMPT for n in args.sizes.split(",")]
    url = f"{args.server}/{args.database}"
    with psycopg.connect(f"{args.server}/postgres", autocommit=True) as admin:
        try:
            admin.execute(f'CREATE DATABASE "{args.database}"')
        except psycopg.errors.DuplicateDatabase:
            raise DatabaseExists(f"database {args.database} already exists: it is left alone; name another") from None
    print(f"scratch database {args.database}", flush=True)
    try:
        subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=django_env(url), check=True)
        with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute(
                "INSERT INTO ledger_tenant (slug, name, is_active, created_at) "
                "VALUES ('bench', 'Bench', true, now()) RETURNING id"
            )
            row = cursor.fetchone()
            assert row is not None
            tenant_id = row[0]
            print(f"{'events':>10} {'load s':>8} {'export s':>9} {'rows/s':>8} {'MiB out':>8} {'peak RSS MiB':>13}")
            for size in sizes:
                started = time.monotonic()
                load(cursor, tenant_id, size)
                cursor.execute("VACUUM ANALYZE ledger_attempt")
                cursor.execute("VACUUM ANALYZE ledger_attemptevent")
                loaded = time.monotonic() - started
                with tempfile.TemporaryDirectory() as scratch:
                    m = measure_export(url, "bench", args.format, str(Path(scratch) / f"export.{args.format}"))
                print(
                    f"{size:>10,} {loaded:>8.1f} {m['seconds']:>9.1f} {size / m['seconds']:>8,.0f} "
                    f"{m['bytes'] / 2**20:>8.1f} {m['peak_rss_mib']:>13.1f}",
                    flush=True,
                )
    finally:
        if not args.keep:
            with psycopg.connect(f"{args.server}/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())

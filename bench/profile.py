"""Profile one agent's tool calls: ``python -m bench.profile [--calls N]``.

Runs the recording benchmark's ledgerdash agent in this process under
pyinstrument (``pip install -e '.[bench]'``) against a scratch database,
and prints where the time goes, the SQL statements one call sends and the
WAL one call writes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections import Counter

from bench.common import Databases, say, setup_django


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.0002, help="pyinstrument's sampling interval")
    args = parser.parse_args(argv)
    from bench.__main__ import DEFAULT_URL
    from bench.recording import _ledgerdash_agent, _prepare_tenants

    dbs = Databases(os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    dbs.prepare_template()
    setup_django(dbs.url_of(dbs.main))
    try:
        dbs.fresh_main()
        run_id = uuid.uuid4().hex[:8]
        cfg = {"env": dict(os.environ), "tenants": _prepare_tenants(run_id), "run": run_id}
        call = _ledgerdash_agent(cfg, 0)
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

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_insert_lsn()")
            (start_lsn,) = cursor.fetchone()
            for i in range(200):
                call(20_000_000 + i, False)
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [start_lsn])
            (wal_bytes,) = cursor.fetchone()
        say(f"  WAL written per call: {float(wal_bytes) / 200:,.0f} bytes (200 calls)")

        from pyinstrument import Profiler

        profiler = Profiler(interval=args.interval)
        began = time.perf_counter()
        with profiler:
            for i in range(args.calls):
                call(100 + i, False)
        elapsed = time.perf_counter() - began
        say(f"\n{args.calls} calls in {elapsed:.2f}s: {elapsed / args.calls * 1000:.2f} ms per call")
        say(profiler.output_text(unicode=False, color=False, show_all=False))
    finally:
        dbs.drop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())

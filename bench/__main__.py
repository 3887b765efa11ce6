"""Run the benchmarks: ``python -m bench [--quick] [--only NAME,...]``.

Needs PostgreSQL (``BENCH_DATABASE_URL``, default
postgres://postgres@127.0.0.1:5432/ledgerdash_bench: the server, and the
prefix of the run's database names). The run creates scratch databases of
its own, named for the run (``<prefix>_<run id>``, plus ``_tpl`` and
``_dbos``; the run id is the start time and 16 random bits unless
``--run-id`` or ``BENCH_RUN_ID`` names it), refuses names that exist, and
drops only what it created, at the end. It prints a table per benchmark,
the verdict on every target, and writes everything to
bench/results/<time>.json (and bench/results/latest-<mode>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import ROOT, Databases, Target, median, say, setup_django
from ledgerdash.ops.progress import Progress

BENCHMARKS = ("recording", "fastpaths", "queue", "reconciler", "export", "notify")
#: Run only when named (--only): the growth benchmark loads 50 million events (an hour here).
ON_REQUEST = ("growth",)
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/ledgerdash_bench"


@dataclass
class Context:
    dbs: Databases
    quick: bool
    results_dir: Path


def machine_facts(dbs: Databases) -> dict[str, Any]:
    memory_gib = math.nan
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {
        "host": platform.node(),
        "nproc": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in load],
        "postgresql": dbs.server_facts(),
    }


def machine_speed(benchmarks: dict[str, Any], cores: int) -> list[str]:
    """How fast this machine ran, from figures whose code stays the same from
    run to run: what to weigh one run's times against another's by."""
    lines = []
    figures = benchmarks.get("recording", {}).get("figures", {})
    for peer in ("minimal psycopg", "HTTP floor"):
        f = figures.get(f"{peer}@1", {})
        if "calls_per_s" in f:
            lines.append(
                f"{peer} at 1 agent: {f['calls_per_s']:.0f} calls/s ({f['calls_per_s'] / cores:.0f} per core),"
                f" p50 {f['p50_ms']:.2f} ms"
            )
    page = benchmarks.get("queue", {}).get("long_history", {}).get("figures", {}).get("attempt page")
    if page:
        lines.append(
            f"the attempt page with its long history: p50 {page['p50_ms']:.1f} ms, p95 {page['p95_ms']:.1f} ms"
        )
    copy = benchmarks.get("export", {}).get("figures", {}).get("copy", {})
    if "rows_per_s" in copy:
        lines.append(f"COPY of the events to CSV: {copy['rows_per_s']:,.0f} rows/s")
    without = benchmarks.get("notify", {}).get("ms_without")
    if without:
        lines.append(f"a tool call in process without notification rules: {median(without):.2f} ms")
    return lines


def _clean(value: Any) -> Any:
    """NaN is not JSON: write null instead."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Target):
        return _clean(value.as_dict())
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, short rounds (3 to 6 minutes)")
    parser.add_argument(
        "--only",
        default=",".join(BENCHMARKS),
        help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all of them), or {','.join(ON_REQUEST)}",
    )
    parser.add_argument("--json", type=Path, help="where to write the results (default: bench/results/<time>.json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases (to look at them)")
    parser.add_argument(
        "--run-id",
        default=os.environ.get("BENCH_RUN_ID"),
        help="name the run's databases <prefix>_<RUN_ID> (default: the start time and 16 random bits)",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(chosen) - set(BENCHMARKS) - set(ON_REQUEST)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")

    try:
        dbs = Databases(os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL), args.run_id)
    except ValueError as exc:
        parser.error(str(exc))
    results_dir = ROOT / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(dbs),
        "benchmarks": {},
    }
    pg = report["machine"]["postgresql"]
    say(
        f"ledgerdash benchmarks ({report['mode']}) on {report['machine']['nproc']} cores, "
        f"{report['machine']['memory_gib']} GiB, PostgreSQL {pg['server_version']}, "
        f"synchronous_commit={pg['synchronous_commit']}, load {report['machine']['load_average_at_start']}"
    )
    say(f"run {dbs.run_id}: scratch databases {dbs.main}, {dbs.template}, {dbs.dbos}")
    report["run_id"] = dbs.run_id
    report["databases"] = [dbs.main, dbs.template, dbs.dbos]
    ctx = Context(dbs=dbs, quick=args.quick, results_dir=results_dir)
    targets: list[Target] = []
    try:
        dbs.prepare_template()
        setup_django(dbs.url_of(dbs.main))
        with Progress("benchmarks", total=len(chosen), capture_prints=True) as bar:
            for name in chosen:
                say(f"\n=== {name}")
                began = time.monotonic()
                module = __import__(f"bench.{name}", fromlist=["run"])
                result = module.run(ctx)
                result["seconds"] = round(time.monotonic() - began, 1)
                # Other work on the machine moves every figure: say how busy it was.
                result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
                report["benchmarks"][name] = result
                if "explain" in result:
                    say(f"query plans (EXPLAIN ANALYZE):\n{result['explain']}\n")
                say(result["table"])
                for target in result.get("targets", []):
                    say(target.line())
                    targets.append(target)
                for note in result.get("notes", []):
                    say(f"note: {note}")
                say(f"({name}: {result['seconds']:.0f}s, load average at the end {result['load_average_at_end']})")
                bar.advance()
    finally:
        if args.keep:
            say(f"kept the scratch databases: {', '.join(dbs.created)}")
        else:
            dbs.drop_all()
    report["seconds"] = round(time.monotonic() - started, 1)
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["targets"] = targets
    say("\n=== targets")
    for target in targets:
        if not target.future:
            say(target.line())
    if any(target.future for target in targets):
        say("\n=== future targets (not yet expected to be met: the gap to close)")
        for target in targets:
            if target.future:
                say(target.line())
    report["machine"]["speed"] = machine_speed(report["benchmarks"], report["machine"]["nproc"])
    if report["machine"]["speed"]:
        say("\n=== the machine's speed in this run (control figures: the same work in every run)")
        for line in report["machine"]["speed"]:
            say(f"- {line}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.json or results_dir / f"{stamp}-{report['mode']}.json"
    text = json.dumps(_clean(report), indent=2, default=str)
    out.write_text(text + "\n", encoding="utf-8")
    (results_dir / f"latest-{report['mode']}.json").write_text(text + "\n", encoding="utf-8")
    ended = report["machine"]["load_average_at_end"]
    say(f"\nwrote {out} in {report['seconds']:.0f}s (load average at the end {ended})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

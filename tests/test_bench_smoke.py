"""`make bench-quick` as a smoke test: the benchmarks run end to end and
report sane figures. It never judges the figures' speed (CI machines
differ); only that each benchmark ran and produced positive, finite
numbers under the keys docs/benchmarks.md and the JSON's readers rely on, and that
a run keeps to databases of its own (a test run and a benchmark run on the
same server must never drop each other's).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.common import DatabaseExists, Databases
from tests.bench_runs import bench_url, run_bench
from tests.live import free_port

pytestmark = [pytest.mark.postgres, pytest.mark.bench, pytest.mark.slow, pytest.mark.timeout(900)]


def _existing(dbs: Databases, names: list[str]) -> list[str]:
    with dbs.admin() as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", [names]).fetchall()
    return sorted(str(name) for (name,) in rows)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    result = run_bench(
        ["bench", "--quick", "--json", str(out)],
        timeout=800,
        BENCH_GUNICORN_PORT=str(free_port()),
        BENCH_SANDBOX_PORT=str(free_port()),
    )
    assert "=== targets" in result.stdout
    return dict(json.loads(Path(out).read_text()))


def test_it_describes_the_machine(report: dict[str, Any]) -> None:
    assert report["mode"] == "quick"
    machine = report["machine"]
    assert machine["nproc"] >= 1
    assert machine["postgresql"]["synchronous_commit"]
    assert set(report["benchmarks"]) == {"recording", "fastpaths", "queue", "reconciler", "export", "notify"}


def test_the_run_drops_its_own_databases_and_no_others(report: dict[str, Any]) -> None:
    dbs = Databases(bench_url())
    names = report["databases"]
    assert all(name.startswith(dbs.main.removesuffix(dbs.run_id)) for name in names)
    assert report["run_id"] in names[0]
    assert _existing(dbs, names) == []


def test_it_refuses_a_database_it_did_not_create_and_leaves_it_alone() -> None:
    taken = Databases(bench_url())
    with taken.admin() as conn:
        conn.execute(f'CREATE DATABASE "{taken.template}"')
    try:
        again = Databases(bench_url(), taken.run_id)
        with pytest.raises(DatabaseExists, match="left alone"):
            again.prepare_template()
        again.drop_all()
        assert _existing(taken, [taken.template]) == [taken.template]
    finally:
        with taken.admin() as conn:
            conn.execute(f'DROP DATABASE "{taken.template}"')


def test_two_runs_never_share_a_database_name() -> None:
    first, second = Databases(bench_url()), Databases(bench_url())
    assert {first.main, first.template, first.dbos}.isdisjoint({second.main, second.template, second.dbos})


def test_it_refuses_names_postgresql_would_cut_short() -> None:
    with pytest.raises(ValueError, match="at most 63 bytes"):
        Databases("postgres://postgres@127.0.0.1/" + "x" * 50)


def test_recording_reports_every_peer_at_its_levels(report: dict[str, Any]) -> None:
    recording = report["benchmarks"]["recording"]
    figures = recording["figures"]
    assert recording["floor"] == "minimal psycopg"
    levels = {
        "ledgerdash": ("1", "8", "8, 8 tenants"),
        "minimal psycopg": ("1", "8", "8, 8 tenants"),
        "naive psycopg": ("1", "8", "8, 8 tenants"),
        "ledgerdash HTTP": ("1", "8"),
        "HTTP floor": ("1", "8"),
        "HTTP floor 2-commit": ("1", "8"),
        "minimal psycopg 8 stripes": ("8", "8, 8 tenants"),
        "ledgerdash 8 stripes": ("8", "8, 8 tenants"),
    }
    for peer, labels in levels.items():
        for agents in labels:
            f = figures[f"{peer}@{agents}"]
            assert f["errors"] == 0, (peer, agents, f["first_error"])
            for key in ("calls_per_s", "calls_per_s_per_core", "p50_ms", "p99_ms"):
                assert _positive(f[key]), (peer, agents, key, f[key])
            assert f["p50_ms"] <= f["p99_ms"]
    for agents in (1, 8):  # DBOS runs, or says exactly why it cannot
        f = figures[f"DBOS@{agents}"]
        assert _positive(f.get("calls_per_s")) or f.get("unavailable")
    assert 0 < recording["connections_max"] <= 50
    # What a request costs that needs no database, stated beside each HTTP target.
    assert _positive(recording["no_op_request_ms"])
    # Each HTTP path stated against the HTTP floor at 1 and 8 agents, with where its time goes.
    http = [t for t in recording["targets"] if t["name"].startswith("HTTP")]
    assert len(http) == 4
    assert all("against in process: the floor" in t["detail"] for t in http), http


def test_fastpaths_reports_each_fast_paths_gain_on_its_path(report: dict[str, Any]) -> None:
    from ledgerdash.ledger.store import FAST_PATHS

    fast = report["benchmarks"]["fastpaths"]
    assert set(fast["gain_pct"]) == set(FAST_PATHS)
    for key, calls in fast["calls"].items():
        assert calls > 0, key
        assert _positive(fast["p50_ms"][key]), key
    assert {t["name"].split(":")[0] for t in fast["targets"]} == set(FAST_PATHS)


def test_queue_reports_both_sides_of_each_view(report: dict[str, Any]) -> None:
    queue = report["benchmarks"]["queue"]
    assert queue["states"]["UNKNOWN"] > 0
    assert "Index" in queue["explain"]
    for view in ("first page", "deep page", "tenant + owner"):
        for who in ("ours", "admin", "admin paging"):
            f = queue["figures"][view][who]
            assert f["errors"] == 0, (view, who)
            assert f["requests"] >= 1, (view, who)  # percentiles are over all rounds' requests
            for key in ("req_per_s", "p50_ms", "p95_ms", "p99_ms"):
                assert _positive(f[key]), (view, who, key, f[key])
            assert f["p50_ms"] <= f["p95_ms"] <= f["p99_ms"]


def test_reconciler_settles_everything_once(report: dict[str, Any]) -> None:
    bench = report["benchmarks"]["reconciler"]
    for workers in ("1", "2"):
        f = bench["figures"][workers]
        assert f["confirmed"] == bench["attempts"]
        assert f["double_claims"] == 0
        assert _positive(f["attempts_per_s"])
    assert _positive(bench["scaling"])


def test_export_measures_copy_and_says_whether_the_export_ran(report: dict[str, Any]) -> None:
    figures = report["benchmarks"]["export"]["figures"]
    assert figures["copy"]["rows"] >= report["benchmarks"]["export"]["events"]
    assert _positive(figures["copy"]["rows_per_s"])
    assert _positive(figures["copy"]["peak_rss_mib"])
    export = figures["export"]
    assert export.get("unavailable") or (_positive(export["rows_per_s"]) and _positive(export["peak_rss_mib"]))


def test_every_target_has_a_verdict(report: dict[str, Any]) -> None:
    assert report["targets"]
    for target in report["targets"]:
        assert {"benchmark", "name", "limit", "op", "met", "future"} <= set(target)
        assert isinstance(target["met"], bool)


def test_notify_reports_the_overhead_and_the_delivery_rates(report: dict[str, Any]) -> None:
    notify = report["benchmarks"]["notify"]
    assert math.isfinite(notify["overhead"])
    assert all(_positive(x) for x in notify["ms_without"] + notify["ms_with"])
    assert _positive(notify["collected_per_s"])
    assert _positive(notify["sent_per_s"])
    assert notify["received"] >= notify["deliveries"]

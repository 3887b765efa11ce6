"""`make bench-quick` as a smoke test: the benchmarks run end to end and
report sane figures. It never judges the figures' speed (CI machines
differ); only that each benchmark ran and produced positive, finite
numbers under the keys the README and the JSON's readers rely on.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.database_roles import admin_url
from tests.live import PYTHON, ROOT, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]


def _bench_url() -> str:
    """A scratch database name of this test run's own, on the test server, as the superuser
    (the benchmarks create and drop their databases)."""
    return admin_url(f"{settings.DATABASES['default']['NAME']}_bench".removeprefix("test_"))


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_") and k != "DATABASE_URL"}
    env.update(
        BENCH_DATABASE_URL=_bench_url(),
        BENCH_GUNICORN_PORT=str(free_port()),
        BENCH_SANDBOX_PORT=str(free_port()),
    )
    result = subprocess.run(
        [PYTHON, "-m", "bench", "--quick", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "=== targets" in result.stdout
    return dict(json.loads(Path(out).read_text()))


def test_it_describes_the_machine(report: dict[str, Any]) -> None:
    assert report["mode"] == "quick"
    machine = report["machine"]
    assert machine["nproc"] >= 1
    assert machine["postgresql"]["synchronous_commit"]
    assert set(report["benchmarks"]) == {"recording", "queue", "reconciler", "export"}


def test_recording_reports_every_peer_at_both_levels(report: dict[str, Any]) -> None:
    figures = report["benchmarks"]["recording"]["figures"]
    for peer in ("ledgerdash", "raw psycopg"):
        for agents in (1, 8):
            f = figures[f"{peer}@{agents}"]
            assert f["errors"] == 0
            for key in ("calls_per_s", "p50_ms", "p99_ms"):
                assert _positive(f[key]), (peer, agents, key, f[key])
            assert f["p50_ms"] <= f["p99_ms"]
    for agents in (1, 8):  # DBOS runs, or says exactly why it cannot
        f = figures[f"DBOS@{agents}"]
        assert _positive(f.get("calls_per_s")) or f.get("unavailable")


def test_queue_reports_both_sides_of_each_view(report: dict[str, Any]) -> None:
    queue = report["benchmarks"]["queue"]
    assert queue["states"]["UNKNOWN"] > 0
    assert "Index" in queue["explain"]
    for view in ("first page", "deep page", "tenant + owner"):
        for who in ("ours", "admin"):
            f = queue["figures"][view][who]
            assert f["errors"] == 0, (view, who)
            for key in ("req_per_s", "p50_ms", "p95_ms", "p99_ms"):
                assert _positive(f[key]), (view, who, key, f[key])


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
    assert _positive(figures["copy"]["peak_rss_mb"])
    export = figures["export"]
    assert export.get("unavailable") or (_positive(export["rows_per_s"]) and _positive(export["peak_rss_mb"]))


def test_every_target_has_a_verdict(report: dict[str, Any]) -> None:
    assert report["targets"]
    for target in report["targets"]:
        assert {"benchmark", "name", "limit", "op", "met"} <= set(target)
        assert isinstance(target["met"], bool)

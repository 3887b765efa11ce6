"""The growth benchmark as a smoke test: a small ledger grown by a few
thousand events runs every step on both sides, its loaded chains verify
whole (the bulk events' hashes are the ledger's own), and it reports the
figures docs/scale.md reads. It never judges their speed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.bench_runs import run_bench
from tests.live import free_port

pytestmark = [pytest.mark.postgres, pytest.mark.bench, pytest.mark.slow, pytest.mark.timeout(600)]

FIGURES = (
    "in process p50 ms",
    "HTTP p50 ms",
    "queue p95 ms",
    "attempt page p50 ms",
    "incremental verify ms",
    "reconciler pass ms",
    "WAL bytes per call",
)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_the_grown_ledger_is_measured_beside_the_empty_one(tmp_path: Path) -> None:
    out = tmp_path / "growth.json"
    result = run_bench(
        ["bench", "--quick", "--only", "growth", "--json", str(out)],
        timeout=500,
        GROWTH_EVENTS="6000",
        GROWTH_TENANTS="4",
        BENCH_GUNICORN_PORT=str(free_port()),
        BENCH_SANDBOX_PORT=str(free_port()),
    )
    growth: dict[str, Any] = json.loads(out.read_text())["benchmarks"]["growth"]
    assert growth["load"]["verified_whole"] is True
    assert growth["load"]["events"]["rows"] == 6000
    for side in ("empty", "grown"):
        for figure in FIGURES:
            assert _positive(growth[side][figure]), (side, figure)
    assert growth["events_bytes"] > 0
    names = [target["name"] for target in growth["targets"]]
    assert "incremental verify ms grown / empty" in names
    assert "[MET] growth:" in result.stdout or "[MISSED] growth:" in result.stdout

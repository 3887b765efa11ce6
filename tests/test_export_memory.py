"""The export's memory stays flat as the ledger grows: the exporting
process's own peak RSS at 50,000 events is that at 10,000.

The million-event figure comes from bench/export_memory.py (docs/benchmarks.md has
it); this is the same measurement at sizes a test run can afford, with the
same bulk loader (placeholder hashes: see the bench's docstring). The peak
is the exporting process's own (``VmHWM``, read by that process as it
exits), never its parent's: this test runner is far larger than an export.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from bench import export_memory
from ledgerdash.ledger.drill.runner import database_url
from ledgerdash.ledger.models import Tenant

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


#: Allowance for allocator noise between two runs of the same process.
SLACK_MIB = 8.0


def test_the_exports_peak_memory_does_not_grow_with_the_ledger(tmp_path: Path) -> None:
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    peaks = {}
    for size in (10_000, 50_000):
        with connection.cursor() as cursor:
            export_memory.load(cursor, tenant.pk, size)
        out = tmp_path / f"export-{size}.csv"
        measured = export_memory.measure_export(database_url(), "bench", "csv", str(out))
        rows = out.read_text(encoding="utf-8").count("\n")
        assert rows >= size - export_memory.EVENTS_PER_ATTEMPT  # every event was written (loads come in fives)
        peaks[size] = measured["peak_rss_mib"]
    print(f"peak RSS of the exporting process: {peaks}")
    assert peaks[50_000] <= peaks[10_000] + SLACK_MIB, peaks


def test_the_measured_peak_is_the_exporting_processs_own(tmp_path: Path) -> None:
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    with connection.cursor() as cursor:
        export_memory.load(cursor, tenant.pk, 1_000)
    # This process now holds 400 MiB more than any export needs; a figure
    # inherited from the parent (ru_maxrss across fork and exec) would show it.
    ballast = b"x" * (400 * 2**20)
    measured = export_memory.measure_export(database_url(), "bench", "csv", str(tmp_path / "export.csv"))
    assert len(ballast) == 400 * 2**20
    assert 0 < measured["peak_rss_mib"] < 300, measured

"""The export's memory stays flat as the ledger grows: the exporting
process's peak RSS at 50,000 events is that at 10,000.

The million-event figure comes from bench/export_memory.py (the README has
it); this is the same measurement at sizes a test run can afford, with the
same bulk loader (placeholder hashes: see the bench's docstring).
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

"""What the reconciler workers report about themselves, for metrics and alerts.

Each ``manage.py reconcile`` process keeps running totals in memory and
writes them to its own :class:`ReconcilerWorker` row after every pass: one
small UPDATE per pass, never on an attempt's row or in its transaction.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from django.db.models import Max

from ledgerdash.ledger import clock
from ledgerdash.ledger.models import ReconcilerWorker
from ledgerdash.ledger.reconciler import PassSummary


class WorkerTotals:
    """One worker's totals since it started."""

    def __init__(self, label: str, *, started_at: datetime | None = None) -> None:
        self.label = label
        self.started_at = started_at or clock.now()
        self.passes = 0
        self.claimed = 0
        self.errors = 0
        self.decisions: Counter[str] = Counter()

    def record(self, summary: PassSummary) -> None:
        """Add a finished pass and write the totals (raises the database's error when it is down)."""
        self.passes += 1
        self.claimed += summary.claimed
        self.errors += summary.errors
        self.decisions.update(summary.decisions)
        ReconcilerWorker.objects.update_or_create(
            label=self.label,
            defaults={
                "started_at": self.started_at,
                "last_pass_at": clock.now(),
                "passes": self.passes,
                "claimed": self.claimed,
                "errors": self.errors,
                "decisions": dict(self.decisions),
            },
        )


def last_pass() -> datetime | None:
    """When any reconciler worker last completed a pass (None: never)."""
    return ReconcilerWorker.objects.aggregate(last=Max("last_pass_at"))["last"]

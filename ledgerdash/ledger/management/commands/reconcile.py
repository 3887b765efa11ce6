"""Run the reconciler: ``--once`` for one pass, otherwise a loop until SIGTERM.

Run as many as you like, on as many hosts as you like, against one
PostgreSQL database: claims use SKIP LOCKED, so workers share the due
attempts without waiting on each other or deciding one twice.

The loop survives database trouble (:mod:`ledgerdash.workloop`); claims a
broken pass held fall due again after ``LEDGER_RECONCILER_CLAIM_SECONDS``.

Exit codes: 0 when the pass (or the loop) ended cleanly; 1 when a ``--once``
pass hit errors on some attempts (they are retried when their claim
expires) or could not reach the database; 2 on bad arguments.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ledgerdash.ledger.reconciler import PassSummary, Reconciler, worker_label
from ledgerdash.ledger.workers import WorkerTotals
from ledgerdash.workloop import WorkerCommand


class Command(WorkerCommand[PassSummary]):
    help = "Reconcile in-flight attempts against their providers (one pass with --once, else a loop)."
    item = "attempt"
    name = "reconcile"
    doing = "reconciling"
    log = logging.getLogger("ledgerdash.reconciler")

    def default_label(self) -> str:
        return worker_label()

    def start(self, label: str, options: dict[str, Any], stop: threading.Event) -> None:
        self._reconciler = Reconciler(label=label, batch_size=options["batch_size"], stop=stop)
        self._totals = WorkerTotals(label)

    def run_pass(self, label: str, options: dict[str, Any], stop: threading.Event) -> PassSummary:
        summary = self._reconciler.run_pass()
        self._totals.record(summary)
        return summary

    def worth_logging(self, summary: PassSummary) -> bool:
        return bool(summary.claimed)

    def failed(self, summary: PassSummary) -> bool:
        return bool(summary.errors)

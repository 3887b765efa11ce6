"""Run the notification worker: ``--once`` for one pass, otherwise a loop until SIGTERM.

Each pass turns new events and due conditions into deliveries (the outbox)
and sends what is due, with retries and back-off. Run several, on several
hosts, against one PostgreSQL database: claims use SKIP LOCKED.

The loop survives database trouble (:mod:`ledgerdash.workloop`);
deliveries a broken pass had claimed fall due again after their lease.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ledgerdash.notify.worker import PassSummary, run_pass, worker_label
from ledgerdash.workloop import WorkerCommand


class Command(WorkerCommand[PassSummary]):
    help = "Send notifications from the outbox (one pass with --once, else a loop)."
    item = "delivery"
    name = "notify"
    doing = "sending notifications"
    log = logging.getLogger("ledgerdash.notify")

    def default_label(self) -> str:
        return worker_label()

    def run_pass(self, label: str, options: dict[str, Any], stop: threading.Event) -> PassSummary:
        return run_pass(worker=label, batch_size=options["batch_size"], stop=stop)

    def worth_logging(self, summary: PassSummary) -> bool:
        return bool(summary.collected or summary.sent or summary.failed or summary.dead)

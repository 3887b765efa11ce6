"""Run the reconciler: ``--once`` for one pass, otherwise a loop until SIGTERM.

Run as many as you like, on as many hosts as you like, against one
PostgreSQL database: claims use SKIP LOCKED, so workers share the due
attempts without waiting on each other or deciding one twice.

Exit codes: 0 when the pass (or the loop) ended cleanly; 1 when a ``--once``
pass hit errors on some attempts (they are retried when their claim
expires); 2 on bad arguments.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from ledgerdash.ledger.reconciler import Reconciler, worker_label

log = logging.getLogger("ledgerdash.reconciler")


class Command(BaseCommand):
    help = "Reconcile in-flight attempts against their providers (one pass with --once, else a loop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one pass over what is due now, then exit")
        parser.add_argument("--batch-size", type=int, default=50, help="attempts claimed per batch (default 50)")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between passes (default 2)")
        parser.add_argument("--label", default=None, help="worker name in events (default reconciler@host:pid)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1 or options["interval"] <= 0:
            raise CommandError("--batch-size must be at least 1 and --interval positive")
        stop = threading.Event()
        label = options["label"] or worker_label()

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("%s: %s received, stopping after the current attempt", label, signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        reconciler = Reconciler(label=label, batch_size=options["batch_size"], stop=stop)
        if options["once"]:
            summary = reconciler.run_pass()
            self.stdout.write(summary.line())
            if summary.errors:
                raise SystemExit(1)
            return
        log.info("%s: reconciling every %.1fs until stopped", label, options["interval"])
        while not stop.is_set():
            close_old_connections()
            summary = reconciler.run_pass()
            if summary.claimed:
                log.info("%s", summary.line())
            stop.wait(options["interval"])
        log.info("%s: stopped", label)

"""Run the reconciler: ``--once`` for one pass, otherwise a loop until SIGTERM.

Run as many as you like, on as many hosts as you like, against one
PostgreSQL database: claims use SKIP LOCKED, so workers share the due
attempts without waiting on each other or deciding one twice.

The loop survives database trouble: a pass that loses its connection (a
server restart, a failover, a terminated session, "too many clients") is
logged, the connection is closed, and the loop tries again after a back-off
that doubles up to ``--max-backoff`` seconds, until the database answers.
Claims the broken pass held fall due again after
``LEDGER_RECONCILER_CLAIM_SECONDS``.

Exit codes: 0 when the pass (or the loop) ended cleanly; 1 when a ``--once``
pass hit errors on some attempts (they are retried when their claim
expires) or could not reach the database; 2 on bad arguments.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections, connections

from ledgerdash.ledger.reconciler import Reconciler, worker_label

log = logging.getLogger("ledgerdash.reconciler")


class Command(BaseCommand):
    help = "Reconcile in-flight attempts against their providers (one pass with --once, else a loop)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one pass over what is due now, then exit")
        parser.add_argument("--batch-size", type=int, default=50, help="attempts claimed per batch (default 50)")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between passes (default 2)")
        parser.add_argument("--label", default=None, help="worker name in events (default reconciler@host:pid)")
        parser.add_argument(
            "--max-backoff",
            type=float,
            default=30.0,
            help="longest wait between attempts to reach a database that is down (default 30 s)",
        )

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
            try:
                summary = reconciler.run_pass()
            except DatabaseError as exc:
                self.stderr.write(f"reconcile pass stopped: the database is unavailable ({exc})")
                raise SystemExit(1) from None
            self.stdout.write(summary.line())
            if summary.errors:
                raise SystemExit(1)
            return
        log.info("%s: reconciling every %.1fs until stopped", label, options["interval"])
        failures = 0
        while not stop.is_set():
            close_old_connections()
            try:
                summary = reconciler.run_pass()
            except DatabaseError as exc:
                failures += 1
                # The connection may be half-dead: drop it, so the next pass connects afresh.
                connections.close_all()
                wait = min(options["max_backoff"], options["interval"] * 2 ** min(failures, 16))
                log.warning(
                    "%s: the database is unavailable (%s); trying again in %.1fs (failure %d in a row)",
                    label,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    wait,
                    failures,
                )
                stop.wait(wait)
                continue
            if failures:
                log.info("%s: the database answers again after %d failed passes", label, failures)
                failures = 0
            if summary.claimed:
                log.info("%s", summary.line())
            stop.wait(options["interval"])
        log.info("%s: stopped", label)

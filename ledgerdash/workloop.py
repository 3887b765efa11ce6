"""The loop every background worker runs (``manage.py reconcile``,
``manage.py notify``): ``--once`` for one pass, otherwise a pass every
``--interval`` seconds until SIGTERM or SIGINT, finishing the item in hand.

The loop survives database trouble: a pass that loses its connection (a
server restart, a failover, a terminated session, "too many clients") is
logged, every connection is closed so the next pass connects afresh, and
the loop tries again after a back-off that doubles up to ``--max-backoff``
seconds, until the database answers. Meanwhile it asks the database every
second whether it answers and takes writes (what ``/readyz`` asks), and
cuts the back-off short as soon as it does: after a failover the work
resumes within a second or two of the new primary taking writes, not a
back-off later. What the broken pass had claimed falls due again after its
claim's lease.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any, Protocol

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections, connections

from ledgerdash.ops import health
from ledgerdash.ops.logs import LoggedChecks

#: Seconds between two questions to a database that is away, while a back-off runs.
PROBE_SECONDS = 1.0


class Waiter(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


def wait_for_database(stop: Waiter, seconds: float, answers: Callable[[], bool], every: float = PROBE_SECONDS) -> bool:
    """Wait up to ``seconds``, asking ``answers`` every ``every`` seconds; True as soon as it says the
    database answers again, False when the wait ran out (or ``stop`` was set)."""
    left = seconds
    while left > 0 and not stop.is_set():
        step = min(every, left)
        stop.wait(step)
        left -= step
        if not stop.is_set() and answers():
            return True
    return False


def database_answers() -> bool:
    """Whether the database answers and takes writes, on a fresh connection (kept for the next pass
    when it does)."""
    connections.close_all()
    return health.database_problem() is None


class Summary(Protocol):
    def line(self) -> str: ...


class WorkerCommand[S: Summary](LoggedChecks, BaseCommand):
    """A worker command: subclasses say what one pass does and when it is worth a log line."""

    #: What the worker handles, for messages ("attempt", "delivery").
    item = "item"
    #: Its name in the default label and in messages ("reconciler", "notify").
    name = "worker"
    #: What it does, for its log ("reconciling", "sending notifications").
    doing = "running a pass"
    log = logging.getLogger("ledgerdash")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="run one pass over what is due now, then exit")
        parser.add_argument("--batch-size", type=int, default=50, help=f"{self.item}s claimed per batch (default 50)")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between passes (default 2)")
        parser.add_argument("--label", default=None, help=f"worker name (default {self.name}@host:pid)")
        parser.add_argument(
            "--max-backoff",
            type=float,
            default=30.0,
            help="longest wait between attempts to reach a database that is down (default 30 s)",
        )

    def default_label(self) -> str:
        raise NotImplementedError

    def start(self, label: str, options: dict[str, Any], stop: threading.Event) -> None:
        """Called once, before the first pass."""

    def run_pass(self, label: str, options: dict[str, Any], stop: threading.Event) -> S:
        """One pass; raises the database's error when it cannot reach it."""
        raise NotImplementedError

    def worth_logging(self, summary: S) -> bool:
        return True

    def failed(self, summary: S) -> bool:
        """Whether a ``--once`` pass should exit 1 (some items hit errors)."""
        return False

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1 or options["interval"] <= 0:
            raise CommandError("--batch-size must be at least 1 and --interval positive")
        stop = threading.Event()
        label = options["label"] or self.default_label()

        def on_signal(signum: int, _frame: Any) -> None:
            self.log.info(
                "%s: %s received, stopping after the current %s", label, signal.Signals(signum).name, self.item
            )
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start(label, options, stop)
        if options["once"]:
            try:
                summary = self.run_pass(label, options, stop)
            except DatabaseError as exc:
                self.stderr.write(f"{self.name} pass stopped: the database is unavailable ({exc})")
                raise SystemExit(1) from None
            self.stdout.write(summary.line())
            if self.failed(summary):
                raise SystemExit(1)
            return
        self.log.info("%s: %s every %.1fs until stopped", label, self.doing, options["interval"])
        failures = 0
        while not stop.is_set():
            close_old_connections()
            try:
                summary = self.run_pass(label, options, stop)
            except DatabaseError as exc:
                failures += 1
                # The connection may be half-dead: drop it, so the next pass connects afresh.
                connections.close_all()
                wait = min(options["max_backoff"], options["interval"] * 2 ** min(failures, 16))
                self.log.warning(
                    "%s: the database is unavailable (%s); trying again in %.1fs (failure %d in a row)",
                    label,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    wait,
                    failures,
                )
                if wait_for_database(stop, wait, database_answers):
                    self.log.info("%s: the database answers again; resuming before the back-off ran out", label)
                continue
            if failures:
                self.log.info("%s: the database answers again after %d failed passes", label, failures)
                failures = 0
            if self.worth_logging(summary):
                self.log.info("%s: %s", label, summary.line())
            stop.wait(options["interval"])
        self.log.info("%s: stopped", label)

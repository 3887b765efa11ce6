"""Running a range of seeds: in this process, or spread over worker processes (``--jobs``).

A worker is a fork of the run's process, so whatever that process changed
before the run (a hole put back, as ``tests/sim_holes.py`` does) holds in
every worker too. Each builds scratch databases of its own, named after the
run's process and its own (``ledgerdash_sim_<run pid>_<worker pid>_…``),
and drops them when it ends, also when the run is stopped with SIGTERM.

Seeds are handed out one at a time, lowest first, and the outcomes put back
in seed order. A seed's history depends on nothing but the seed (each run
starts from a fresh copy of the same template), so a run reports the same
whatever the number of workers: the same digests, the same failing seeds,
the same reproductions.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast

from django.db import connections

from ledgerdash.ledger.simulation import runner, scenario
from ledgerdash.ledger.simulation.database import ScratchDatabases

#: Seconds a worker told to stop is given to drop its databases before it is killed.
STOP_SECONDS = 60.0


class WorkerFailed(RuntimeError):
    """A worker met an error outside any run's history, or went away."""


class Batch(Protocol):
    def __enter__(self) -> Batch: ...

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None: ...

    def run(
        self,
        seeds: Sequence[int],
        *,
        stop_on_failure: bool,
        each: Callable[[runner.Outcome], None],
        keep: Path | None,
    ) -> tuple[list[runner.Outcome], str]:
        """Every seed's outcome, in seed order (with ``stop_on_failure``: up to the first failing seed),
        each passed to ``each`` as it comes in; and where the first failing seed's database is kept,
        when ``keep`` asks for it ("" when nothing failed)."""
        ...

    def shrink(self, failures: Sequence[runner.Outcome]) -> dict[int, runner.Reproduction]:
        """A reproduction of each of ``failures``, by seed."""
        ...


def start(database: str | None, *, steps: int, faults: Sequence[str], jobs: int) -> Batch:
    if jobs > 1:
        return Workers(database, steps=steps, faults=faults, jobs=jobs)
    return InProcess(database, steps=steps, faults=faults)


class InProcess:
    """Every seed in this process, one after another."""

    def __init__(self, database: str | None, *, steps: int, faults: Sequence[str]) -> None:
        self.databases = ScratchDatabases(database, prepare=scenario.build_world)
        self.steps = steps
        self.faults = tuple(faults)

    def __enter__(self) -> InProcess:
        self.databases.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.databases.__exit__(kind, error, trace)

    def run(
        self,
        seeds: Sequence[int],
        *,
        stop_on_failure: bool,
        each: Callable[[runner.Outcome], None],
        keep: Path | None,
    ) -> tuple[list[runner.Outcome], str]:
        outcomes: list[runner.Outcome] = []
        kept = ""
        for seed in seeds:
            outcome = runner.run_seed(self.databases, seed, steps=self.steps, faults=self.faults)
            if not outcome.ok and keep is not None and not kept:
                # Now, before the next seed's copy takes its place.
                kept = self.databases.keep(keep)
            each(outcome)
            outcomes.append(_slim(outcome))
            if stop_on_failure and not outcome.ok:
                break
        return outcomes, kept

    def shrink(self, failures: Sequence[runner.Outcome]) -> dict[int, runner.Reproduction]:
        return {failed.seed: runner.shrink(self.databases, failed) for failed in failures}


def _slim(outcome: runner.Outcome) -> runner.Outcome:
    """A passing seed's history is not kept past its digest: a long run holds only the failures'."""
    if outcome.ok:
        outcome.trace = []
    return outcome


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    ready: bool = False
    task: tuple[str, Any] | None = None


class Workers:
    """Seeds spread over ``jobs`` worker processes."""

    def __init__(self, database: str | None, *, steps: int, faults: Sequence[str], jobs: int) -> None:
        self.database = database
        self.steps = steps
        self.faults = tuple(faults)
        self.jobs = jobs
        self.workers: list[_Worker] = []

    def __enter__(self) -> Workers:
        # Fork, not spawn: a worker must run the very code this process runs, patches included.
        context = multiprocessing.get_context("fork")
        # A worker must not share this process's database connections (closing its copy would end ours).
        connections.close_all()
        try:
            for n in range(self.jobs):
                ours, theirs = context.Pipe()
                inherited = [worker.conn for worker in self.workers]
                process = context.Process(
                    target=_work, args=(theirs, ours, inherited, self.database, os.getpid()), name=f"sim-worker-{n}"
                )
                process.start()
                theirs.close()
                self.workers.append(_Worker(process, ours))
        except BaseException:
            self._stop(now=True)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop(now=error is not None)

    def _stop(self, *, now: bool) -> None:
        """Stop every worker and wait for it to drop its databases: asked to when done, with SIGTERM
        when the run is stopped or failed (a worker mid-run unwinds it)."""
        for worker in self.workers:
            if now:
                worker.process.terminate()
            else:
                with contextlib.suppress(OSError):  # gone already
                    worker.conn.send(None)
        for worker in self.workers:
            worker.process.join(STOP_SECONDS)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()

    def _dispatch(self, tasks: Sequence[tuple[str, Any]], received: Callable[[tuple[str, Any], Any], bool]) -> None:
        """Hand ``tasks`` out in order, one at a time to each worker that is free; ``received`` is given
        each task and its result as they come back, and answers whether to hand out more."""
        pending = deque(tasks)
        going = True
        by_conn = {worker.conn: worker for worker in self.workers}
        while True:
            for worker in self.workers:
                if going and pending and worker.ready and worker.task is None:
                    worker.task = pending.popleft()
                    worker.conn.send(worker.task)
            busy = [worker.conn for worker in self.workers if worker.task is not None]
            if not busy and not (going and pending):
                return
            starting = [worker.conn for worker in self.workers if not worker.ready]
            for conn in wait(busy + starting):
                worker = by_conn[cast(Connection, conn)]
                try:
                    kind, result = worker.conn.recv()
                except EOFError:
                    worker.process.join(STOP_SECONDS)
                    raise WorkerFailed(
                        f"worker {worker.process.pid} stopped (exit code {worker.process.exitcode})"
                    ) from None
                if kind == "error":
                    raise WorkerFailed(f"worker {worker.process.pid} failed:\n{result}")
                if kind == "ready":
                    worker.ready = True
                    continue
                task, worker.task = worker.task, None
                assert task is not None
                going = received(task, result) and going

    def run(
        self,
        seeds: Sequence[int],
        *,
        stop_on_failure: bool,
        each: Callable[[runner.Outcome], None],
        keep: Path | None,
    ) -> tuple[list[runner.Outcome], str]:
        outcomes: dict[int, runner.Outcome] = {}
        failing: list[int] = []

        def received(task: tuple[str, Any], outcome: runner.Outcome) -> bool:
            # Past the lowest failing seed, with stop_on_failure, a seed is not reported: one
            # process would never have run it. (Seeds below it were all handed out before it.)
            if failing and stop_on_failure and outcome.seed > min(failing):
                return False
            outcomes[outcome.seed] = outcome
            if not outcome.ok:
                failing.append(outcome.seed)
            each(outcome)
            return not (stop_on_failure and failing)

        self._dispatch([("seed", (seed, self.steps, self.faults)) for seed in seeds], received)
        last = min(failing) if failing and stop_on_failure else None
        found = [outcomes[seed] for seed in seeds if seed in outcomes and (last is None or seed <= last)]
        failures = [outcome for outcome in found if not outcome.ok]
        kept = ""
        if keep is not None and failures:
            # Its database went with the next seed's copy: the same seed is run again to keep it.
            def took(task: tuple[str, Any], where: str) -> bool:
                nonlocal kept
                kept = where
                return True

            self._dispatch([("keep", (failures[0], keep))], took)
        return found, kept

    def shrink(self, failures: Sequence[runner.Outcome]) -> dict[int, runner.Reproduction]:
        found: dict[int, runner.Reproduction] = {}

        def received(task: tuple[str, Any], reproduction: runner.Reproduction) -> bool:
            found[reproduction.seed] = reproduction
            return True

        self._dispatch([("shrink", failed) for failed in failures], received)
        return found


def _work(conn: Connection, ours: Connection, inherited: list[Connection], database: str | None, owner: int) -> None:
    """A worker: scratch databases of its own, then each task it is handed, until told to stop or the
    run's process is gone."""
    # Only the run's own ends of the pipes are closed here: then, once the run's process is gone,
    # reading the next task ends in EOFError instead of waiting for ever.
    for conn_of_run in [ours, *inherited]:
        conn_of_run.close()
    # Ctrl-C reaches every process of the terminal's group: the run's process stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with ScratchDatabases(database, prepare=scenario.build_world, owner=owner) as databases:
            conn.send(("ready", None))
            while (task := conn.recv()) is not None:
                kind, what = task
                conn.send((kind, _do(databases, kind, what)))
    except EOFError:
        pass
    except Exception:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))


def _do(databases: ScratchDatabases, kind: str, what: Any) -> Any:
    if kind == "seed":
        seed, steps, faults = what
        return _slim(runner.run_seed(databases, seed, steps=steps, faults=faults))
    if kind == "shrink":
        return runner.shrink(databases, what)
    if kind == "keep":
        failed, destination = what
        runner.run_seed(databases, failed.seed, steps=failed.steps, faults=failed.faults)
        return databases.keep(destination)
    raise ValueError(f"no such task: {kind}")

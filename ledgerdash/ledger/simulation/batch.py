"""Running a range of seeds, lowest first, and shrinking the failing ones.

Every seed runs, whatever the ones before it found (unless the run stops at
the first failing one), so a long run tells of every hole it meets. A
passing seed's history is kept only as its digest and what it covered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from ledgerdash.ledger.simulation import runner, scenario
from ledgerdash.ledger.simulation.database import ScratchDatabases


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
        """Every seed's outcome, in seed order (with ``stop_on_failure``: up to the first failing seed),
        each passed to ``each`` as it comes in; and where the first failing seed's database is kept,
        when ``keep`` asks for it ("" when nothing failed)."""
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
        """A reproduction of each of ``failures``, by seed."""
        return {failed.seed: runner.shrink(self.databases, failed) for failed in failures}


def _slim(outcome: runner.Outcome) -> runner.Outcome:
    """A passing seed's history is not kept past its digest: a long run holds only the failures'."""
    if outcome.ok:
        outcome.trace = []
    return outcome

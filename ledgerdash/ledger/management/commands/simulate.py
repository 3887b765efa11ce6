"""``manage.py simulate``: explore the protocol's interleavings in a
deterministic simulation (see :mod:`ledgerdash.ledger.simulation`).

    python manage.py simulate                        # seeds 1 to 200, every fault, on SQLite
    python manage.py simulate --seeds 100000         # the long run before a release
    python manage.py simulate --seed 4711 --steps 90 --faults crash,pause   # replay one seed
    python manage.py simulate --database postgres://postgres@127.0.0.1/postgres

Exit code 0 only if every seed held every invariant; a failing seed is
printed with the shortest reproduction found and the command that replays it.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger.simulation import invariants, runner, scenario
from ledgerdash.ledger.simulation.database import ScratchDatabases


class Command(BaseCommand):
    help = (
        "Run the ledger's real code against simulated agents, providers, reconcilers and people, on a virtual "
        "clock, under seeded faults; check the protocol's invariants after every step."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seeds", type=int, default=200, help="how many seeds to run (default 200)")
        parser.add_argument("--first-seed", type=int, default=1, help="the first seed of the range (default 1)")
        parser.add_argument(
            "--seed", type=int, default=None, help="run this one seed (a replay), and print its history"
        )
        parser.add_argument("--steps", type=int, default=300, help="steps with faults on, per seed (default 300)")
        parser.add_argument(
            "--faults",
            default="all",
            help=f"the fault kinds to inject, comma-separated, 'all' or 'none' ({', '.join(runner.FAULTS)})",
        )
        parser.add_argument(
            "--database", default=None, help="a PostgreSQL server's URL (default: SQLite files of the run's own)"
        )
        parser.add_argument("--json-out", type=Path, default=None, help="also write the results here")
        parser.add_argument("--no-shrink", action="store_true", help="report a failing seed without shrinking it")
        parser.add_argument(
            "--keep", type=Path, default=None, help="keep a failing seed's database (SQLite: this file)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Stopped with SIGTERM (a CI timeout, systemd, kill), unwind as on an exit, so the run's
        # scratch databases and folders are removed rather than left on a shared server.
        signal.signal(signal.SIGTERM, _stop)
        if options["verbosity"] < 3:
            logging.getLogger("ledgerdash").setLevel(logging.WARNING)
        faults = self._faults(options["faults"])
        steps = options["steps"]
        if steps < 1:
            raise CommandError("--steps must be at least 1")
        if options["seed"] is not None:
            seeds = [options["seed"]]
        else:
            if options["seeds"] < 1:
                raise CommandError("--seeds must be at least 1")
            seeds = list(range(options["first_seed"], options["first_seed"] + options["seeds"]))
        database = options["database"]
        where = "PostgreSQL" if database else "SQLite"
        self.stdout.write(
            f"simulation: {len(seeds)} seed(s) from {seeds[0]}, {steps} steps each with faults "
            f"({', '.join(faults) or 'none'}), on {where}"
        )
        started = time.monotonic()
        results: list[runner.Outcome] = []
        failure: runner.Outcome | None = None
        reproduction: runner.Reproduction | None = None
        kept = ""
        with ScratchDatabases(database, prepare=scenario.build_world) as databases:
            for seed in seeds:
                outcome = runner.run_seed(databases, seed, steps=steps, faults=faults)
                results.append(outcome)
                if options["seed"] is not None:
                    self._history(outcome)
                if not outcome.ok:
                    failure = outcome
                    if options["keep"] is not None:
                        kept = databases.keep(options["keep"])
                    if options["seed"] is None and not options["no_shrink"]:
                        reproduction = runner.shrink(databases, outcome)
                    break
                if len(results) % 50 == 0 and len(seeds) > 50:
                    self.stdout.write(f"  {len(results)} seeds passed ({time.monotonic() - started:.0f} s)")
        seconds = time.monotonic() - started
        summary = self._summary(results, seconds)
        for line in summary["lines"]:
            self.stdout.write(line)
        if options["json_out"] is not None:
            options["json_out"].write_text(
                json.dumps(self._report(results, failure, reproduction, database, summary), indent=2, sort_keys=True)
            )
        if failure is not None:
            self._failed(failure, reproduction, database, kept, options["seed"] is not None)
            raise CommandError(f"seed {failure.seed} broke an invariant")

    def _faults(self, given: str) -> list[str]:
        if given == "all":
            return sorted(runner.FAULTS)
        if given == "none":
            return []
        kinds = sorted({kind.strip() for kind in given.split(",") if kind.strip()})
        unknown = [kind for kind in kinds if kind not in runner.FAULTS]
        if unknown:
            raise CommandError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(runner.FAULTS)}")
        return kinds

    def _history(self, outcome: runner.Outcome) -> None:
        self.stdout.write(f"seed {outcome.seed}: {outcome.steps_run} steps, history digest {outcome.digest}")
        for line in outcome.trace:
            self.stdout.write(f"  {line}")

    def _summary(self, results: list[runner.Outcome], seconds: float) -> dict[str, Any]:
        moves: Counter[tuple[str, str, str]] = Counter()
        states: Counter[str] = Counter()
        injected: Counter[str] = Counter()
        decisions: Counter[str] = Counter()
        for outcome in results:
            moves.update(outcome.moves)
            states.update(outcome.states)
            injected.update(outcome.injected)
            decisions.update(outcome.decisions)
        steps = sum(o.steps_run for o in results)
        failed = sum(1 for o in results if not o.ok)
        legal = runner.legal_moves()
        unreached = [m for m in legal if moves[m] == 0]
        quiet = [kind for kind in runner.FAULTS if injected[kind] == 0]
        lines = [
            f"{len(results)} seed(s), {failed} failed; {steps} steps in {seconds:.1f} s "
            f"({steps / seconds if seconds else 0:.0f} steps/s)",
            "moves reached (from -> to, by whom: times):",
        ]
        for move in legal:
            origin = move[0] or "(created)"
            lines.append(f"  {origin:>17} -> {move[1]:<17} {move[2]:<10} {moves[move]}")
        lines.append(f"legal moves not reached: {', '.join(self._move(m) for m in unreached) or 'none'}")
        lines.append("states reached: " + ", ".join(f"{s} {n}" for s, n in sorted(states.items())))
        lines.append("faults injected: " + ", ".join(f"{k} {injected[k]}" for k in runner.FAULTS))
        lines.append(f"fault kinds not injected: {', '.join(quiet) or 'none'}")
        lines.append("people's decisions: " + ", ".join(f"{k} {n}" for k, n in sorted(decisions.items())))
        return {
            "lines": lines,
            "steps": steps,
            "seconds": seconds,
            "unreached": [list(m) for m in unreached],
            "quiet": quiet,
            "moves": {self._move(m): n for m, n in sorted(moves.items())},
            "faults": dict(sorted(injected.items())),
        }

    @staticmethod
    def _move(move: tuple[str, str, str]) -> str:
        return f"{move[0] or '(created)'}->{move[1]} by {move[2]}"

    def _report(
        self,
        results: list[runner.Outcome],
        failure: runner.Outcome | None,
        reproduction: runner.Reproduction | None,
        database: str | None,
        summary: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "seeds": [o.seed for o in results],
            "digests": {str(o.seed): o.digest for o in results},
            "failed": None
            if failure is None
            else {
                "seed": failure.seed,
                "steps": failure.steps,
                "digest": failure.digest,
                "after_faults_stopped": failure.settling,
                "violations": [
                    {"invariant": v.invariant, "step": v.step, "detail": v.detail} for v in failure.violations
                ],
                "reproduction": None
                if reproduction is None
                else {
                    "steps": reproduction.steps,
                    "faults": list(reproduction.faults),
                    "tries": reproduction.tries,
                    "digest": reproduction.digest,
                    "command": reproduction.command(database),
                },
            },
            "steps": summary["steps"],
            "seconds": summary["seconds"],
            "unreached_moves": summary["unreached"],
            "faults_not_injected": summary["quiet"],
            "moves": summary["moves"],
            "faults": summary["faults"],
        }

    def _failed(
        self,
        failure: runner.Outcome,
        reproduction: runner.Reproduction | None,
        database: str | None,
        kept: str,
        replaying: bool,
    ) -> None:
        write = self.stderr.write
        write(f"seed {failure.seed} FAILED (history digest {failure.digest}):")
        for violation in failure.violations:
            write(f"  {violation.line()}")
        if not replaying:
            write("its history's last steps:")
            for line in failure.trace[-40:]:
                write(f"  {line}")
        if reproduction is not None:
            write(
                f"shortest reproduction found ({reproduction.tries} runs): {reproduction.steps} steps, faults "
                f"{', '.join(reproduction.faults) or 'none'}, history digest {reproduction.digest}"
            )
            write(f"replay: {reproduction.command(database)}")
        else:
            write(f"replay: {runner.Reproduction.of(failure).command(database)}")
        if kept:
            write(f"its database is kept: {kept}")
        write(f"invariants: {', '.join(f'{k} {v}' for k, v in invariants.INVARIANTS.items())}")


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)

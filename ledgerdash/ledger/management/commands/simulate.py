"""``manage.py simulate``: explore the protocol's interleavings in a
deterministic simulation (see :mod:`ledgerdash.ledger.simulation`).

    python manage.py simulate                        # seeds 1 to 200, every fault, on SQLite
    python manage.py simulate --seeds 10000 --jobs 2    # the long run before a release, on two processes
    python manage.py simulate --seed 4711 --steps 90 --faults crash,pause   # replay one seed
    python manage.py simulate --database postgres://postgres@127.0.0.1/postgres
    python manage.py simulate --seed-list 7,23,45 --reach-all   # a few seeds that must reach every move

Exit code 0 only if every seed held every invariant (and, with
``--reach-all``, the run reached every legal move and fault kind). The
summary names a few of the run's seeds that reached everything it reached
(``make test`` runs such a set from the default run's seeds). A run goes on past a
failing seed (unless ``--stop-on-failure``) and ends with every failing one:
its broken invariants, its history's last steps, and the command that
replays it (shrunk to the shortest reproduction found, for the first few).
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

from ledgerdash.ledger.simulation import batch, invariants, runner
from ledgerdash.ops.progress import Progress

#: Failing seeds shrunk by default, the lowest first: each takes up to a dozen more runs, and a run that
#: found many holes is better told about all of them soon than about a few of them shortest.
SHRINK_FIRST = 3


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
        parser.add_argument(
            "--seed-list",
            default=None,
            help="run these seeds, comma-separated (instead of a range), e.g. the covering ones a summary names",
        )
        parser.add_argument(
            "--reach-all",
            action="store_true",
            help="fail unless the run reaches every legal move and injects every fault kind",
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
        parser.add_argument(
            "--jobs", type=int, default=1, help="spread the seeds over this many processes (default 1); same results"
        )
        parser.add_argument(
            "--stop-on-failure",
            action="store_true",
            help="stop at the first failing seed (default: run every seed, and report every failing one at the end)",
        )
        parser.add_argument("--no-shrink", action="store_true", help="report failing seeds without shrinking them")
        parser.add_argument(
            "--shrink-first",
            type=int,
            default=SHRINK_FIRST,
            help=f"shrink this many failing seeds, the lowest (default {SHRINK_FIRST}); the others are reported "
            "with the replay line they ran with",
        )
        parser.add_argument(
            "--keep", type=Path, default=None, help="keep the first failing seed's database (SQLite: this file)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        vendor = "postgresql" if options["database"] else "sqlite"
        faults = self._faults(options["faults"], vendor)
        steps = options["steps"]
        if steps < 1:
            raise CommandError("--steps must be at least 1")
        if options["seed"] is not None:
            seeds = [options["seed"]]
        elif options["seed_list"] is not None:
            seeds = self._seed_list(options["seed_list"])
        else:
            if options["seeds"] < 1:
                raise CommandError("--seeds must be at least 1")
            seeds = list(range(options["first_seed"], options["first_seed"] + options["seeds"]))
        jobs = options["jobs"]
        if jobs < 1:
            raise CommandError("--jobs must be at least 1")
        jobs = min(jobs, len(seeds))
        # Stopped with SIGTERM (a CI timeout, systemd, kill), unwind as on an exit, so the run's
        # scratch databases and folders are removed rather than left on a shared server.
        signal.signal(signal.SIGTERM, _stop)
        if options["verbosity"] < 3:
            logging.getLogger("ledgerdash").setLevel(logging.WARNING)
        replaying = options["seed"] is not None
        database = options["database"]
        where = "PostgreSQL" if database else "SQLite"
        which = f"({','.join(map(str, seeds))})" if options["seed_list"] is not None else f"from {seeds[0]}"
        self.stdout.write(
            f"simulation: {len(seeds)} seed(s) {which}, {steps} steps each with faults "
            f"({', '.join(faults) or 'none'}), on {where}" + (f", {jobs} processes" if jobs > 1 else "")
        )
        if options["shrink_first"] < 0:
            raise CommandError("--shrink-first must be 0 or more")
        started = time.monotonic()
        tally = Counter[str]()

        bar = Progress("seeds", total=len(seeds), write=self.stdout.write)

        def each(outcome: runner.Outcome) -> None:
            tally["run"] += 1
            tally["failed"] += not outcome.ok
            bar.advance()
            if replaying:
                self._history(outcome)
            elif not outcome.ok:
                first = outcome.violations[0]
                when = "after faults stopped" if outcome.settling else "with faults on"
                bar.say(
                    f"  seed {outcome.seed} failed: {first.invariant} at step {first.step}, {when} "
                    "(reported at the end)"
                )
            if tally["run"] % 50 == 0 and len(seeds) > 50 and not bar.drawn:
                run, failed = tally["run"], tally["failed"]
                so_far = f"{run} seeds run, {failed} failed" if failed else f"{run} seeds passed"
                bar.say(f"  {so_far} ({time.monotonic() - started:.0f} s)")

        with bar, batch.start(database, steps=steps, faults=faults, jobs=jobs) as runs:
            try:
                results, kept = runs.run(
                    seeds, stop_on_failure=options["stop_on_failure"], each=each, keep=options["keep"]
                )
                failures = [outcome for outcome in results if not outcome.ok]
                shrinking = [] if replaying or options["no_shrink"] else failures[: options["shrink_first"]]
                reproductions = runs.shrink(shrinking)
            except batch.WorkerFailed as exc:
                raise CommandError(str(exc)) from exc
        seconds = time.monotonic() - started
        summary = self._summary(results, seconds, vendor)
        for line in summary["lines"]:
            self.stdout.write(line)
        # The line each failure's replay is printed with: its shortest reproduction, or the seed as it ran.
        replays = {failed.seed: reproductions.get(failed.seed) or runner.Reproduction.of(failed) for failed in failures}
        if options["json_out"] is not None:
            report = self._report(results, failures, reproductions, replays, database, summary, jobs)
            options["json_out"].write_text(json.dumps(report, indent=2, sort_keys=True))
        if failures:
            for n, failed in enumerate(failures):
                self._failed(failed, reproductions.get(failed.seed), replays[failed.seed], database, replaying)
                if n == 0 and kept:
                    self.stderr.write(f"its database is kept: {kept}")
            self._failures_end(failures, reproductions, shrinking)
            seeds_failed = ", ".join(str(failed.seed) for failed in failures)
            raise CommandError(f"{len(failures)} seed(s) broke an invariant: {seeds_failed}")
        if options["reach_all"] and (summary["unreached"] or summary["quiet"]):
            raise CommandError(
                "the run did not reach everything it must (--reach-all): see 'legal moves not reached' and "
                "'fault kinds not injected' above"
            )

    @staticmethod
    def _seed_list(given: str) -> list[int]:
        try:
            seeds = [int(part) for part in given.split(",") if part.strip()]
        except ValueError:
            raise CommandError(f"--seed-list takes seeds separated by commas, e.g. 7,23,45 (not {given!r})") from None
        if not seeds:
            raise CommandError("--seed-list names no seed")
        if len(set(seeds)) != len(seeds):
            raise CommandError("--seed-list names a seed twice")
        return sorted(seeds)

    def _faults(self, given: str, vendor: str) -> list[str]:
        possible = runner.faults_for(vendor)
        if given == "all":
            return sorted(possible)
        if given == "none":
            return []
        kinds = sorted({kind.strip() for kind in given.split(",") if kind.strip()})
        unknown = [kind for kind in kinds if kind not in runner.FAULTS]
        if unknown:
            raise CommandError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(runner.FAULTS)}")
        elsewhere = [kind for kind in kinds if kind not in possible]
        if elsewhere:
            raise CommandError(f"{', '.join(elsewhere)}: injected on PostgreSQL only (--database postgres://…)")
        return kinds

    def _history(self, outcome: runner.Outcome) -> None:
        self.stdout.write(f"seed {outcome.seed}: {outcome.steps_run} steps, history digest {outcome.digest}")
        for line in outcome.trace:
            self.stdout.write(f"  {line}")

    def _summary(self, results: list[runner.Outcome], seconds: float, vendor: str) -> dict[str, Any]:
        moves: Counter[tuple[str, str, str]] = Counter()
        states: Counter[str] = Counter()
        injected: Counter[str] = Counter()
        decisions: Counter[str] = Counter()
        afterwards: Counter[str] = Counter()
        for outcome in results:
            moves.update(outcome.moves)
            states.update(outcome.states)
            injected.update(outcome.injected)
            decisions.update(outcome.decisions)
            afterwards.update(outcome.afterwards)
        steps = sum(o.steps_run for o in results)
        failed = sum(1 for o in results if not o.ok)
        legal = runner.legal_moves()
        unreached = [m for m in legal if moves[m] == 0]
        kinds = runner.faults_for(vendor)
        quiet = [kind for kind in kinds if injected[kind] == 0]
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
        lines.append("faults injected: " + ", ".join(f"{k} {injected[k]}" for k in kinds))
        lines.append(f"fault kinds not injected: {', '.join(quiet) or 'none'}")
        lines.append("people's decisions: " + ", ".join(f"{k} {n}" for k, n in sorted(decisions.items())))
        lines.append(
            "effects the providers' modes changed after they were made: "
            + (", ".join(f"{k} {n}" for k, n in sorted(afterwards.items())) or "none")
        )
        cover = runner.covering(results)
        if len(results) > 1:
            lines.append(
                f"seeds that together reach every move and fault kind this run reached: {','.join(map(str, cover))}"
            )
        return {
            "lines": lines,
            "steps": steps,
            "seconds": seconds,
            "unreached": [list(m) for m in unreached],
            "quiet": quiet,
            "moves": {self._move(m): n for m, n in sorted(moves.items())},
            "faults": dict(sorted(injected.items())),
            "afterwards": dict(sorted(afterwards.items())),
            "covering_seeds": cover,
        }

    @staticmethod
    def _move(move: tuple[str, str, str]) -> str:
        return f"{move[0] or '(created)'}->{move[1]} by {move[2]}"

    def _report(
        self,
        results: list[runner.Outcome],
        failures: list[runner.Outcome],
        reproductions: dict[int, runner.Reproduction],
        replays: dict[int, runner.Reproduction],
        database: str | None,
        summary: dict[str, Any],
        jobs: int,
    ) -> dict[str, Any]:
        return {
            "seeds": [o.seed for o in results],
            "digests": {str(o.seed): o.digest for o in results},
            "jobs": jobs,
            "failed_seeds": [failed.seed for failed in failures],
            "failures": [self._failure(failed, reproductions, replays, database) for failed in failures],
            "steps": summary["steps"],
            "seconds": summary["seconds"],
            "unreached_moves": summary["unreached"],
            "faults_not_injected": summary["quiet"],
            "moves": summary["moves"],
            "faults": summary["faults"],
            "afterwards": summary["afterwards"],
            "covering_seeds": summary["covering_seeds"],
        }

    @staticmethod
    def _failure(
        failed: runner.Outcome,
        reproductions: dict[int, runner.Reproduction],
        replays: dict[int, runner.Reproduction],
        database: str | None,
    ) -> dict[str, Any]:
        shrunk = reproductions.get(failed.seed)
        return {
            "seed": failed.seed,
            "steps": failed.steps,
            "faults": list(failed.faults),
            "digest": failed.digest,
            "after_faults_stopped": failed.settling,
            "violations": [{"invariant": v.invariant, "step": v.step, "detail": v.detail} for v in failed.violations],
            # the command printed: the shortest reproduction when shrunk, else the seed as it ran
            "replay": replays[failed.seed].command(database),
            "reproduction": None
            if shrunk is None
            else {"steps": shrunk.steps, "faults": list(shrunk.faults), "tries": shrunk.tries, "digest": shrunk.digest},
        }

    def _failed(
        self,
        failure: runner.Outcome,
        reproduction: runner.Reproduction | None,
        replay: runner.Reproduction,
        database: str | None,
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
        write(f"replay: {replay.command(database)}")

    def _failures_end(
        self,
        failures: list[runner.Outcome],
        reproductions: dict[int, runner.Reproduction],
        shrinking: list[runner.Outcome],
    ) -> None:
        write = self.stderr.write
        if len(failures) > 1:
            write(f"{len(failures)} seeds failed: {', '.join(str(failed.seed) for failed in failures)}")
        unshrunk = [failed.seed for failed in failures if failed.seed not in reproductions]
        if reproductions and unshrunk:
            write(
                f"shrunk: the lowest {len(shrinking)} failing seed(s) only ({', '.join(map(str, reproductions))}); "
                f"the others' replay lines are the seeds as they ran (shrink one: --first-seed {unshrunk[0]} --seeds 1)"
            )
        write(f"invariants: {', '.join(f'{k} {v}' for k, v in invariants.INVARIANTS.items())}")


def _stop(signum: int, frame: Any) -> None:
    # Once: a second SIGTERM (a whole process group signalled, then each worker by the run) must not
    # cut short the unwinding that drops the scratch databases.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)

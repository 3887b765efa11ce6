"""Running simulated histories: one seed, and the shortest reproduction of
a failing one (a range of seeds is :mod:`.batch`'s).

A run: a fresh copy of the template database, a world whose clock and
random numbers come from the seed, the providers, the actors the seed
drew, then ``steps`` steps with faults on, each followed by the invariants;
then faults stop, agents finish, and recovery runs until nothing is in
flight (or the run gives up: that is a failure too); then the final
invariants. The history (every step, and the event chain's heads) is
digested: the same seed gives the same digest, on any machine.
"""

from __future__ import annotations

import hashlib
import logging
import random
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection

from ledgerdash.ledger import clock
from ledgerdash.ledger.models import IN_FLIGHT_STATES, Attempt, AttemptEvent, ChainHead
from ledgerdash.ledger.moves import CREATE_MOVES, LEGAL_MOVES
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.ledger.simulation import actors, people, scenario
from ledgerdash.ledger.simulation.database import ScratchDatabases
from ledgerdash.ledger.simulation.invariants import Checker, Violation
from ledgerdash.ledger.simulation.provider import Faults, Network, Provider, _running
from ledgerdash.ledger.simulation.world import KILL, Actor, Hung, World

log = logging.getLogger("ledgerdash.simulation")

#: Every kind of fault a run can inject (``--faults``), and what it does.
FAULTS = {
    "crash": "an agent or reconciler is killed at any yield point, then restarts",
    "pause": "an agent or reconciler stops for a while (past its lease), then goes on where it was",
    "lost_answer": "the provider's answer never arrives, the connection is reset, or the request is lost on the way",
    "repeat": "a report is sent twice, a call made again, a task run by two workers at once",
    "reword": "an agent restarted after a crash calls again with other arguments under the same key",
    "lookup_down": "a lookup is slow or the provider answers it with 503",
    "late_act": "the provider acts late in its processing window",
    "refuse": "the provider refuses a request before acting, or for good",
    "policy": "a policy author changes tools, scopes, approval conditions, tools' timing, the tenant's state",
    "leave": "a person loses their membership or account for a while, whatever they are deciding",
    "skew": "a host's clock is off from the database server's by more than the provider-clock margin",
    "archive": "the oldest partitions of the events are archived while attempts at the same side effects still "
    "move (PostgreSQL only: SQLite keeps one table)",
}
#: Fault kinds drawn from the hosts' random numbers, not the run's (see :meth:`Run._draw_host_clocks`).
HOST_FAULTS = frozenset({"skew"})
#: Fault kinds only a run on PostgreSQL injects, drawn from random numbers of their own: a seed runs
#: the same history on SQLite whether they are asked for or not.
POSTGRESQL_FAULTS = frozenset({"archive"})


def faults_for(vendor: str) -> list[str]:
    """The fault kinds a run on ``vendor`` ("sqlite", "postgresql") can inject."""
    return [kind for kind in FAULTS if vendor == "postgresql" or kind not in POSTGRESQL_FAULTS]


#: Steps the settling phase may take before a run is called stuck.
SETTLE_STEPS = 4000


@dataclass
class Outcome:
    """What one run found."""

    seed: int
    steps: int
    #: the fault kinds asked for (each run switches on most of them: its trace says which)
    faults: tuple[str, ...]
    violations: list[Violation]
    trace: list[str]
    digest: str
    seconds: float
    steps_run: int
    #: Whether faults had stopped by its end: a failing run's failure came in the settling phase (or at its end).
    settling: bool = False
    moves: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    states: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    #: What befell providers' effects after they were made (changed, vanished), as their modes allow.
    afterwards: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations

    def breaks(self, invariant: str) -> bool:
        return any(v.invariant == invariant for v in self.violations)


class Run:
    """One simulated history, under way."""

    def __init__(self, seed: int, steps: int, faults: Iterable[str]) -> None:
        self.seed = seed
        self.steps = steps
        self.requested = frozenset(faults)
        self.world = World(seed)
        # Each seed switches on most of the kinds asked for, not always all:
        # histories with fewer kinds of fault reach combinations all of them
        # at once would crowd out. (A draw for every kind, asked or not, so
        # leaving one out does not change the others' draws.)
        own = HOST_FAULTS | POSTGRESQL_FAULTS
        draws = {kind: self.world.rng.random() for kind in FAULTS if kind not in own}
        # The hosts' clocks draw from random numbers of their own, so drawing them moves none of
        # the run's other draws: a seed runs the same history whatever clocks its hosts keep.
        self.hosts_rng = random.Random(f"{seed}:hosts")  # noqa: S311 - a simulation's choices, not secrets
        draws.update((kind, self.hosts_rng.random()) for kind in sorted(HOST_FAULTS))
        # So does the archiver (PostgreSQL only).
        self.archive_rng = random.Random(f"{seed}:archive")  # noqa: S311
        draws.update((kind, self.archive_rng.random()) for kind in sorted(POSTGRESQL_FAULTS))
        possible = set(faults_for(connection.vendor))
        self.enabled = frozenset(kind for kind in self.requested & possible if draws[kind] < 0.75)
        self.provider_faults = Faults(self.world, self.enabled)
        self.network = Network(self.world)
        self.truth = actors.Truth()
        self.settling = False
        self.plan = scenario.draw_plan(self.world)
        self.trace: list[str] = []
        self.checker: Checker | None = None
        #: Agents busy before reporting on an attempt until a retry of it is approved, by the attempt's id.
        self.awaiting_retry: dict[int, Actor] = {}
        #: The policy author, and the tool an agent backing off from a refusal woke it for.
        self.author: Actor | None = None
        self.author_called: str | None = None
        #: Where the archiver writes the partitions it archives (``archive`` on): the final check walks
        #: them with the events left in the database, as ``verify_audit --archive`` does.
        self.archive_folder: tempfile.TemporaryDirectory[str] | None = None

    @property
    def archive_dir(self) -> Path | None:
        return Path(self.archive_folder.name) if self.archive_folder is not None else None

    def faults_on(self, kind: str) -> bool:
        return not self.settling and kind in self.enabled

    # --- the actors -------------------------------------------------------------------------

    def _on_resume(self, actor: Actor) -> str | float | None:
        rng = self.world.rng
        if self.settling:
            return None
        if self.faults_on("crash") and rng.random() < (0.03 if actor.kind == "agent" else 0.01):
            self.truth.fault("crash")
            return KILL
        if self.faults_on("pause") and rng.random() < 0.02:
            self.truth.fault("pause")
            return rng.choice([5.0, 30.0, 130.0, 600.0])
        return None

    def spawn_agent(self, state: actors.AgentState, after: float = 0.0) -> None:
        state.incarnation += 1

        def restart() -> None:
            state.reword = self.faults_on("reword") and self.world.rng.random() < 0.4
            self.spawn_agent(state, after=self.world.rng.uniform(1, 120))

        self.world.spawn(
            f"{state.name}#{state.incarnation}", "agent", state.body, after=after, killable=True, on_killed=restart
        )

    def spawn_reconciler(self, n: int, incarnation: int = 1, after: float = 0.0) -> None:
        name = f"reconciler-{n}#{incarnation}"

        def restart() -> None:
            self.spawn_reconciler(n, incarnation + 1, after=self.world.rng.uniform(1, 60))

        self.world.spawn(
            name, "reconciler", actors.reconciler_body(self, name), after=after, killable=True, on_killed=restart
        )

    def start(self) -> None:
        world, rng = self.world, self.world.rng
        for name, traits in sorted(scenario.PROVIDERS.items()):
            self.network.providers[name] = Provider(name, traits, world, self.provider_faults)
        scenario.apply_timings(self.plan)
        self.truth.authority.append((0, dict(scenario.SCOPES), {}, True))
        states = [
            actors.AgentState(self, f"agent-{n}", list(tasks), stepwise=rng.random() < 0.4)
            for n, tasks in enumerate(self.plan.agents)
        ]
        if "repeat" in self.enabled and rng.random() < 0.5:
            # The same worker message delivered twice: two processes run one task.
            self.truth.fault("repeat")
            states.append(actors.AgentState(self, "agent-twin", [states[0].tasks[0]]))
        self._draw_host_clocks(
            [state.name for state in states]
            + [f"reconciler-{n}" for n in range(self.plan.reconcilers)]
            + [*scenario.OPERATORS[1:], *scenario.APPROVERS, "policy-author"]
        )
        for state in states:
            self.spawn_agent(state, after=rng.uniform(0, 20))
        # Recovery starts at once, or (some seeds) only minutes in: agents retry on their own meanwhile.
        late_start = rng.random() < 0.3
        for n in range(self.plan.reconcilers):
            self.spawn_reconciler(n, after=rng.uniform(60, 600) if late_start else rng.uniform(0, 5))
        for name in scenario.OPERATORS[1:]:
            world.spawn(name, "person", people.operator_body(self, name), after=rng.uniform(0, 60))
        for name in scenario.APPROVERS:
            world.spawn(name, "person", people.approver_body(self, name), after=rng.uniform(0, 60))
        if "policy" in self.enabled:
            self.author = world.spawn("policy-author", "author", people.author_body(self), after=rng.uniform(0, 60))
        if "leave" in self.enabled:
            world.spawn("administrator", "person", people.admin_body(self), after=rng.uniform(30, 300))
        if "archive" in self.enabled:
            self.archive_folder = tempfile.TemporaryDirectory(prefix="ledgerdash-sim-archive-")
            after = self.archive_rng.uniform(60, 300)
            world.spawn("archiver", "job", people.archiver_body(self), after=after)
        world.on_resume = self._on_resume
        self.trace.append(f"{'':>5} seed {self.seed}: faults on: {', '.join(sorted(self.enabled)) or 'none'}")
        clocks = ", ".join(f"{host} {offset:+.1f} s" for host, offset in sorted(world.host_offsets.items()))
        self.trace.append(f"{'':>5} hosts' clocks against the database server's: {clocks}")

    def _draw_host_clocks(self, hosts: list[str]) -> None:
        """Each host's clock: off from the database server's within the provider-clock margin,
        and with ``skew`` on, some past it, behind or ahead."""
        rng, margin = self.hosts_rng, float(settings.LEDGER_PROVIDER_CLOCK_SKEW_SECONDS)
        for host in hosts:
            offset = rng.uniform(-margin, margin)
            if "skew" in self.enabled and rng.random() < 0.3:
                self.truth.fault("skew")
                offset = rng.choice([-1, 1]) * rng.uniform(margin + 1, 4 * margin + 60)
            self.world.host_offsets[host] = round(offset, 1)

    # --- running -----------------------------------------------------------------------------

    def _step(self, checker: Checker) -> list[Violation]:
        did = self.world.run_one()
        for actor in self.world.actors:
            if actor.error is not None:
                error, actor.error = actor.error, None
                detail = "".join(traceback.format_exception(error)).strip().splitlines()
                return [
                    Violation("I14", self.world.step, f"{actor.name} met {detail[-1]} ({' | '.join(detail[-6:-1])})")
                ]
        if did:
            self.trace.append(f"{self.world.step:>5} {self.world.now:%H:%M:%S.%f} {did}")
        return checker.after_step()  # (it adds what the ledger recorded to the trace)

    def _settled(self) -> bool:
        agents_done = all(a.finished for a in self.world.actors if a.kind == "agent")
        return agents_done and not Attempt.objects.filter(state__in=list(IN_FLIGHT_STATES)).exists()

    def execute(self) -> list[Violation]:
        checker = self.checker = Checker(self)
        self.start()
        found: list[Violation] = []
        stop_actors = True
        try:
            while self.world.step < self.steps and not self.world.idle and not found:
                found = self._step(checker)
            if found:
                return found
            self.settling = True
            self.provider_faults.enabled.clear()
            self.trace.append(f"{self.world.step:>5} {self.world.now:%H:%M:%S.%f} -- faults stop; settling --")
            limit = self.world.step + SETTLE_STEPS
            while not self._settled() and self.world.step < limit and not self.world.idle and not found:
                found = self._step(checker)
            if found:
                return found
            found = checker.at_end()
            if not found:
                found = self._recovery_again()
            return found
        except Hung as exc:
            return [Violation("I14", self.world.step, str(exc))]
        except (SystemExit, KeyboardInterrupt):
            # Stopped from outside (SIGTERM, Ctrl-C): no actor is resumed to wind down, which could wait
            # on one for the watchdog's two minutes; their threads are daemons and end with the process.
            stop_actors = False
            raise
        finally:
            if stop_actors:
                self.world.stop()

    def _recovery_again(self) -> list[Violation]:
        """Recovery run twice more at one instant writes nothing."""
        before = AttemptEvent.objects.count()
        with clock.frozen_at(self.world.now):
            for n in (1, 2):
                Reconciler(label=f"final-check-{n}").run_pass()
        written = AttemptEvent.objects.count() - before
        if written:
            return [
                Violation("I10", self.world.step, f"recovery run again after everything settled wrote {written} events")
            ]
        return []

    def digest(self) -> str:
        heads = list(
            ChainHead.objects.order_by("tenant_id", "stripe").values_list("tenant_id", "stripe", "seq", "hash")
        )
        effects = [
            (e.provider, e.key, e.request, e.at.isoformat()) for p in self.network.providers.values() for e in p.effects
        ]
        blob = "\n".join([*self.trace, repr(heads), repr(effects)])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def coverage(self, outcome: Outcome) -> None:
        # As the checker read them, step by step: some may have been archived since.
        moves = self.checker.moves if self.checker is not None else Counter()
        for (from_state, to_state, actor_kind), times in moves.items():
            outcome.moves[(from_state, to_state, actor_kind)] += times
            outcome.states[to_state] += times
        outcome.injected.update(self.truth.faults)
        outcome.injected.update(self.provider_faults.counts)
        outcome.decisions.update(self.truth.decisions)
        outcome.afterwards.update(e.fate for p in self.network.providers.values() for e in p.effects if e.fate)


def run_seed(databases: ScratchDatabases, seed: int, *, steps: int, faults: Iterable[str]) -> Outcome:
    """One run of ``seed`` on a fresh copy of the template."""
    databases.fresh()
    started = time.monotonic()
    run = Run(seed, steps, faults)
    _running.append(run.network)
    try:
        with clock.driven_by(run.world.ledger_now, run.world.rng):
            violations = run.execute()
            outcome = Outcome(
                seed=seed,
                steps=steps,
                faults=tuple(sorted(run.requested)),
                violations=violations,
                trace=run.trace,
                digest=run.digest(),
                seconds=time.monotonic() - started,
                steps_run=run.world.step,
                settling=run.settling,
            )
            run.coverage(outcome)
    finally:
        _running.remove(run.network)
        connection.close()
        if run.archive_folder is not None:
            run.archive_folder.cleanup()
    return outcome


@dataclass
class Reproduction:
    """A (seed, steps, faults) that was run and broke ``invariant``: replayed, it runs the same history."""

    seed: int
    steps: int
    faults: tuple[str, ...]
    invariant: str
    #: the runs shrinking took (0: the failing run as it was)
    tries: int
    #: the history digest of the run it reproduces
    digest: str

    @classmethod
    def of(cls, outcome: Outcome, invariant: str = "", tries: int = 0) -> Reproduction:
        """``outcome`` as it ran, breaking ``invariant`` (by default its first broken one)."""
        invariant = invariant or outcome.violations[0].invariant
        return cls(outcome.seed, outcome.steps, outcome.faults, invariant, tries, outcome.digest)

    def command(self, database: str | None) -> str:
        parts = ["python manage.py simulate", f"--seed {self.seed}", f"--steps {self.steps}"]
        parts.append(f"--faults {','.join(self.faults) or 'none'}")
        if database:
            parts.append(f"--database {database}")
        return " ".join(parts)


def shrink(databases: ScratchDatabases, failed: Outcome, *, budget: int = 12) -> Reproduction:
    """The shortest reproduction of ``failed`` found within ``budget`` runs: the same seed cut at its
    failing step, then with each fault kind left out while it still fails the same way.

    What it returns is always a candidate that was run and broke the same invariant (``failed`` itself
    when nothing shorter did): steps are never raised past what that candidate ran with, since more
    steps with faults on is another history. A failure that came after faults stopped keeps its steps:
    cut short, faults would stop elsewhere, and the settling phase would be another one."""
    invariant = failed.violations[0].invariant
    tries = 0

    def again(steps: int, faults: tuple[str, ...]) -> Outcome | None:
        nonlocal tries
        tries += 1
        outcome = run_seed(databases, failed.seed, steps=steps, faults=faults)
        return outcome if outcome.breaks(invariant) else None

    def cut(outcome: Outcome) -> Outcome:
        step = min(v.step for v in outcome.violations if v.invariant == invariant)
        if outcome.settling or step >= outcome.steps or tries >= budget:
            return outcome
        return again(step, outcome.faults) or outcome

    best = cut(failed)
    for kind in failed.faults:
        if tries >= budget:
            break
        fewer = again(best.steps, tuple(f for f in best.faults if f != kind))
        if fewer is not None:
            best = cut(fewer)
    return Reproduction.of(best, invariant, tries)


def legal_moves() -> list[tuple[str, str, str]]:
    """Every (from, to, actor) the state machine allows, creations included."""
    moves = [(str(f), str(t), str(a)) for (f, t), actors_ in LEGAL_MOVES.items() for a in sorted(actors_)]
    moves += [("", str(state), str(a)) for state, actors_ in CREATE_MOVES.items() for a in sorted(actors_)]
    return sorted(moves)


def covering(outcomes: Iterable[Outcome]) -> list[int]:
    """Few seeds among ``outcomes`` that together reach every legal move and fault kind the whole run
    reached: the seed that adds most of what is still missing, again and again (the lowest seed on a tie)."""
    legal = set(legal_moves())
    each: dict[int, set[tuple[str, ...]]] = {
        outcome.seed: {m for m in outcome.moves if m in legal}
        | {("fault", kind) for kind, n in outcome.injected.items() if n}
        for outcome in outcomes
    }
    missing = set().union(*each.values())
    chosen: list[int] = []
    while missing:
        seed = max(sorted(each), key=lambda s: len(each[s] & missing))
        chosen.append(seed)
        missing -= each[seed]
    return sorted(chosen)

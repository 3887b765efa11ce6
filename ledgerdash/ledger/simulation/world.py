"""The simulation's world: one virtual clock, one seeded scheduler, and the
actors it runs one at a time.

The virtual clock (:attr:`World.now`) is the database server's. Each actor
runs on a host of its own whose clock is off from it (:meth:`World.host_now`);
the ledger's code in every actor decides by the server's clock
(:meth:`World.ledger_now`), as the ledger's one clock gives it to every
process whatever its host's own says.

Every actor (an agent process, a reconciler, a person, a policy author) is a
thread running the ledger's real code, with a database connection of its
own. Only one of them runs at any moment: the scheduler hands it the baton,
and it hands the baton back at its next *yield point* (a network round trip,
a pause, a checkpoint between two ledger steps). Which actor runs next is the
scheduler's choice alone: the earliest wake-up on the virtual clock, ties
broken by the seeded random numbers. So the same seed makes the same
interleaving, whatever the machine's load, and time passes only when the
scheduler moves the clock to the next wake-up.

An actor is never paused inside a database transaction (yield points are
between ledger steps, and the ledger's steps never leave one open), so no
actor ever waits on a lock another holds. Killing an actor (as SIGKILL would)
means it never runs again past its current yield point: :class:`Killed` is
raised there and nothing after it reaches the ledger.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

#: Where every run's clock starts.
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
#: Seconds the scheduler waits for an actor to hand the baton back before it
#: calls the run hung (an actor blocked on something outside the simulation),
#: counted in slices of the process's running time: a slice the process spent
#: stopped (SIGSTOP) or starved counts as twice its length, not as the hours
#: it may have been, so the verdict does not depend on what the machine did.
WATCHDOG_SECONDS = 120.0
WATCHDOG_SLICE = 0.25


#: What :attr:`World.on_resume` answers to kill the actor there.
KILL = "kill"


class Killed(BaseException):
    """Raised in an actor at the yield point where it was killed. A
    ``BaseException``: the ledger's best-effort handlers (which catch
    ``Exception``) must not get to run a step after the kill."""


class Hung(Exception):
    """An actor did not hand the baton back."""


@dataclass
class Actor:
    """One thread of the simulation: an agent process, a reconciler, a person."""

    world: World
    name: str
    kind: str
    body: Callable[[Actor], None]
    #: Whether the scheduler may kill or pause it (processes can die; people's moves are atomic).
    killable: bool = False
    #: Called (by the scheduler, outside the actor) once the actor was killed: its restart, if any.
    on_killed: Callable[[], None] | None = None
    killed: bool = False
    finished: bool = False
    #: Bumped by each wake-up: an earlier wake-up still on the queue is stale.
    token: int = 0
    #: Paused (stopped, as a frozen process is) until then: nothing wakes it earlier.
    frozen_until: datetime | None = None
    error: BaseException | None = None
    #: What the actor is doing (its last yield point), for the trace.
    doing: str = "starting"
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        """The host it runs on: its name without the incarnation (a restart runs on the same host)."""
        return self.name.partition("#")[0]

    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name=f"sim-{self.name}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.go.acquire()
        try:
            if not self.killed:
                self.body(self)
        except Killed:
            pass
        except BaseException as exc:  # a failure the run reports
            self.error = exc
        finally:
            self.finished = True
            try:
                connection.close()
            finally:
                self.world._baton.release()


class World:
    """The clock, the scheduler and the random numbers of one run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)  # noqa: S311 - a simulation's choices, not secrets
        #: What befalls providers' effects after they were made, drawn apart from :attr:`rng`: a seed's
        #: other choices stay what they were, and only what these fates change of its history changes.
        self.fates = random.Random(f"{seed}:afterwards")  # noqa: S311
        self.now = EPOCH
        self.step = 0
        self._queue: list[tuple[datetime, float, int, Any]] = []
        self._order = itertools.count()
        self._baton = threading.Semaphore(0)
        self.current: Actor | None = None
        self.actors: list[Actor] = []
        #: What each actor waits on now, by name (an answer that comes after its sender gave up wakes nobody).
        self.waiting: dict[str, Any] = {}
        #: Numbers what actors do in the order they do it (several things happen at one instant).
        self.happened = itertools.count(1)
        #: Decides, each time a killable actor is about to resume, whether a
        #: fault hits it first: :data:`KILL`, a pause in seconds, or None.
        self.on_resume: Callable[[Actor], str | float | None] | None = None
        #: How far each host's clock is from the database server's (:attr:`now`), in seconds.
        self.host_offsets: dict[str, float] = {}

    # --- scheduling --------------------------------------------------------------------

    def _push(self, when: datetime, item: Any) -> None:
        heapq.heappush(self._queue, (when, self.rng.random(), next(self._order), item))

    def _push_actor(self, when: datetime, actor: Actor) -> None:
        actor.token += 1
        self._push(when, (actor, actor.token))

    def spawn(
        self,
        name: str,
        kind: str,
        body: Callable[[Actor], None],
        *,
        after: float = 0.0,
        killable: bool = False,
        on_killed: Callable[[], None] | None = None,
    ) -> Actor:
        actor = Actor(self, name, kind, body, killable=killable, on_killed=on_killed)
        self.actors.append(actor)
        actor.start()
        self._push_actor(self.now + timedelta(seconds=after), actor)
        return actor

    def at(self, seconds: float, event: Callable[[], None]) -> None:
        """Run ``event`` (in the scheduler, not an actor) ``seconds`` from now."""
        self._push(self.now + timedelta(seconds=max(0.0, seconds)), event)

    def reschedule(self, actor: Actor, seconds: float) -> None:
        """Put ``actor``, popped but not resumed, back ``seconds`` from now: a
        pause, as of a frozen process (nothing wakes it before it is over)."""
        actor.frozen_until = self.now + timedelta(seconds=seconds)
        self._push_actor(actor.frozen_until, actor)

    def wake(self, actor: Actor) -> None:
        """Wake ``actor`` now, before the end of its sleep (what it waited for
        arrived); a paused actor when its pause is over."""
        if not actor.finished:
            frozen = actor.frozen_until
            self._push_actor(frozen if frozen is not None and frozen > self.now else self.now, actor)

    # --- the clocks ------------------------------------------------------------------------

    def ledger_now(self) -> datetime:
        """The time the ledger's code decides by, in any actor: the database server's."""
        return self.now

    def host_now(self) -> datetime:
        """The running actor's host's own clock (outside any actor, the server's)."""
        actor = self.current
        offset = self.host_offsets.get(actor.host, 0.0) if actor is not None else 0.0
        return self.now + timedelta(seconds=offset)

    # --- what actors call ------------------------------------------------------------------

    def sleep(self, seconds: float, doing: str = "") -> None:
        """The current actor waits ``seconds`` of virtual time; others run meanwhile."""
        actor = self.current
        if actor is None or threading.current_thread() is not actor.thread:
            raise RuntimeError("only the running actor may sleep")
        if doing:
            actor.doing = doing
        self._push_actor(self.now + timedelta(seconds=max(0.0, seconds)), actor)
        self._baton.release()
        actor.go.acquire()
        if actor.killed:
            raise Killed

    def checkpoint(self, doing: str) -> None:
        """A point where anything may happen first: another actor, a fault."""
        self.sleep(0.0, doing)

    # --- running -----------------------------------------------------------------------

    def _drop_stale(self) -> None:
        """Drop wake-ups of actors woken earlier since, or gone."""
        while self._queue:
            item = self._queue[0][3]
            if not isinstance(item, tuple):
                return
            actor, token = item
            if not actor.finished and token == actor.token:
                return
            heapq.heappop(self._queue)

    @property
    def idle(self) -> bool:
        self._drop_stale()
        return not self._queue

    def next_at(self) -> datetime | None:
        self._drop_stale()
        return self._queue[0][0] if self._queue else None

    def run_one(self) -> str:
        """Run the next thing on the queue; what it was, for the trace."""
        self._drop_stale()
        when, _tie, _n, item = heapq.heappop(self._queue)
        self.now = max(self.now, when)
        self.step += 1
        if not isinstance(item, tuple):
            item()
            return str(getattr(item, "label", "an event"))
        actor, _token = item
        verdict = self.on_resume(actor) if self.on_resume is not None and actor.killable else None
        if verdict == KILL:
            actor.killed = True
            doing = actor.doing
            self._resume(actor)
            if actor.on_killed is not None:
                actor.on_killed()
            return f"{actor.name} KILLED while {doing}"
        if isinstance(verdict, float):
            self.reschedule(actor, verdict)
            return f"{actor.name} PAUSED for {verdict:.1f} s while {actor.doing}"
        self._resume(actor)
        return f"{actor.name}: {actor.doing}"

    def _resume(self, actor: Actor) -> None:
        self.current = actor
        actor.go.release()
        waited = 0.0
        while True:
            began = time.monotonic()
            if self._baton.acquire(timeout=WATCHDOG_SLICE):
                break
            waited += min(time.monotonic() - began, 2 * WATCHDOG_SLICE)
            if waited >= WATCHDOG_SECONDS:
                raise Hung(
                    f"{actor.name} did not hand the baton back within {WATCHDOG_SECONDS:g} s of running time "
                    f"while {actor.doing}"
                )
        self.current = None

    def stop(self) -> None:
        """Kill every actor still alive, so their threads end."""
        for actor in self.actors:
            if not actor.finished:
                actor.killed = True
        for actor in self.actors:
            if not actor.finished and actor.thread is not None and actor.thread.is_alive():
                self._resume(actor)
        self._queue.clear()
        for actor in self.actors:
            if actor.thread is not None:
                actor.thread.join(timeout=10)

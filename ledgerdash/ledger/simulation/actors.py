"""The simulation's actors, each running the ledger's real code:

- agents call their tools through the recording wrapper
  (:func:`ledgerdash_client.toolcalls.wrap`), whose every step is a point where
  they may be killed or paused; a killed agent restarts and re-runs its
  task, sometimes with other arguments under the same key;
- reconcilers run :class:`~ledgerdash.ledger.reconciler.Reconciler` passes,
  and may be killed or paused in the middle of one.

:class:`Truth` is what the simulation knows that the ledger may not. The
people and the policy author are :mod:`.people`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ledgerdash.ledger import clock, moves, recording
from ledgerdash.ledger.errors import (
    AttemptBlocked,
    AwaitingApproval,
    IdempotencyConflict,
    LedgerError,
    NothingHappened,
    PermanentFailure,
    RetryPending,
    SideEffectInFlight,
)
from ledgerdash.ledger.events import Actor as LedgerActor
from ledgerdash.ledger.gateway import checks
from ledgerdash.ledger.gateway.config import ToolConfig
from ledgerdash.ledger.models import Attempt, State, Tenant, Tool
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.ledger.simulation import provider as net
from ledgerdash.ledger.simulation.scenario import (
    ALIKE_KEY,
    PROVIDERS,
    TENANT,
    Task,
    arguments,
)
from ledgerdash.ledger.simulation.world import Actor, Killed, World
from ledgerdash_client import toolcalls

if TYPE_CHECKING:
    from ledgerdash.ledger.simulation.runner import Run

S = State


@dataclass
class ReportMade:
    """One outcome report a dispatcher made, and what the ledger did with it."""

    attempt_id: int
    fence: int
    outcome: str
    at: datetime
    sender: str
    answer: str  # applied, late, replayed, or the error's code
    #: Where it falls among everything actors did (``World.happened``).
    order: int = 0


@dataclass(frozen=True)
class ApprovalGiven:
    """An approver let an attempt through: when, under which approval
    rules (what the policy author had published then), and whether they
    accepted a risk with a reason."""

    attempt_id: int
    step: int
    order: int
    approvals: dict[str, str]
    with_reason: bool


@dataclass
class Absence:
    """A person without their membership or account, from the first event
    after ``since`` (the newest event when it was taken away) to ``until``
    (the newest when it was given back; None: not yet)."""

    user_id: int
    name: str
    since: int
    how: str
    until: int | None = None

    def covers(self, event_id: int) -> bool:
        return event_id > self.since and (self.until is None or event_id <= self.until)


@dataclass
class Truth:
    """What the simulation knows that the ledger may not: every report made,
    every policy published, every decision people took, every fault injected."""

    reports: list[ReportMade] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    #: (step, tools, approvals, active) of every authority the tenant had, newest last.
    authority: list[tuple[int, dict[str, list[str]], dict[str, str], bool]] = field(default_factory=list)
    decisions: dict[str, int] = field(default_factory=dict)
    #: Every approval people gave, in order.
    approvals: list[ApprovalGiven] = field(default_factory=list)
    #: Every time a person was without their membership or account.
    absences: list[Absence] = field(default_factory=list)

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def decided(self, what: str) -> None:
        self.decisions[what] = self.decisions.get(what, 0) + 1


# --- agents ------------------------------------------------------------------------------------


class SimSession(recording._InProcess):
    """The wrapper's way to the ledger for one simulated agent: the real
    steps, with a yield point before and after each (where the agent may
    be killed or paused) and a record of every report it makes."""

    def __init__(self, context: recording.TaskContext, agent: AgentState) -> None:
        super().__init__(context)
        self.agent = agent

    def _point(self, doing: str) -> None:
        self.agent.alive()
        self.agent.world.checkpoint(doing)

    def record_intent(self, **kwargs: Any) -> tuple[Attempt, bool]:
        self._point(f"recording the intent for {kwargs['idempotency_key']}")
        attempt, claimed = super().record_intent(**kwargs)
        if claimed:
            self.agent.lease_end = attempt.next_check_at
        self._point(f"recorded the intent for {kwargs['idempotency_key']}")
        return attempt, claimed

    def dispatch(self, attempt: Attempt) -> Attempt:
        self._point(f"claiming #{attempt.pk}")
        claimed = super().dispatch(attempt)
        self.agent.lease_end = claimed.next_check_at
        self._point(f"claimed #{attempt.pk}")
        return claimed

    def heartbeat_interval(self, attempt: Attempt) -> float:
        return 0.0  # the tool beats by itself, on the virtual clock

    def heartbeat(self, attempt: Attempt, fence: int) -> Attempt:
        self.agent.alive()
        beaten = super().heartbeat(attempt, fence)
        if beaten.state == S.DISPATCHED and beaten.dispatch_fence == fence:
            self.agent.lease_end = beaten.next_check_at
        return beaten

    def record_request_id(self, attempt: Attempt, request_id: str, fence: int) -> Attempt:
        self.agent.alive()
        try:
            recorded = super().record_request_id(attempt, request_id, fence)
        except LedgerError as exc:
            self.agent.report(attempt, fence, "request_id", exc.code)
            raise
        self.agent.report(attempt, fence, "request_id", "applied")
        return recorded

    def _report(self, attempt: Attempt, fence: int, outcome: str, step: Callable[[], Any]) -> Any:
        world = self.agent.world
        if self.agent.run.faults_on("pause") and world.rng.random() < 0.15:
            # Busy elsewhere before it reports: its lease may run out meanwhile.
            self.agent.run.truth.fault("pause")
            chance = world.rng.random()
            if chance < 0.6:
                self._busy_until_a_retry_is_approved(attempt)
            elif chance < 0.8:
                self._busy_until_the_reconciler_looks(attempt)
            else:
                busy = world.rng.choice([world.rng.uniform(0, 60), world.rng.uniform(60, 300)])
                world.sleep(busy, f"busy before reporting #{attempt.pk}")
        self._point(f"reporting #{attempt.pk} {outcome}")
        answer = "applied"
        try:
            result = step()
        except LedgerError as exc:
            self.agent.report(attempt, fence, outcome, exc.code)
            raise
        if isinstance(result, moves.Report):
            answer = "replayed" if result.replayed else "late" if result.late else "applied"
        self.agent.report(attempt, fence, outcome, answer)
        if self.agent.run.faults_on("repeat") and self.agent.world.rng.random() < 0.1:
            # The answer was lost on the way back: the same report is sent again.
            self.agent.run.truth.fault("repeat")
            self._point(f"reporting #{attempt.pk} {outcome} again")
            try:
                again = step()
            except LedgerError as exc:
                self.agent.report(attempt, fence, outcome, exc.code)
                raise
            self.agent.report(attempt, fence, outcome, "replayed" if again.replayed else "applied-again")
        self._point(f"reported #{attempt.pk} {outcome}")
        return result

    def _busy_until_a_retry_is_approved(self, attempt: Attempt) -> None:
        """Busy until a person approved a retry of ``attempt`` (or for up to
        half an hour): its report then arrives after the approval and
        before the retry leaves, the moment a late receipt matters most."""
        world = self.agent.world
        provider = self.agent.run.network.providers.get(attempt.tool_name)
        if provider is not None and "lookup_down" in provider.faults.enabled:
            # The same outage that holds its answer back takes the provider's lookups down meanwhile:
            # the ledger cannot find what happened, and a person may let a retry out.
            provider.lookups_down_until = world.now + timedelta(seconds=world.rng.uniform(300, 900))
        if Attempt.objects.filter(parent_id=attempt.pk, approved_at__isnull=False).exists():
            return
        awaiting = self.agent.run.awaiting_retry
        if self.agent.actor is not None:
            awaiting[attempt.pk] = self.agent.actor  # an approver who lets a retry of it out wakes it
        try:
            world.sleep(
                world.rng.uniform(300, 1800), f"busy before reporting #{attempt.pk}, until a retry of it is let out"
            )
        finally:
            awaiting.pop(attempt.pk, None)

    def _busy_until_the_reconciler_looks(self, attempt: Attempt) -> None:
        """Busy past its lease until the reconciler has taken ``attempt`` over (or for twenty
        seconds more): its report then arrives while the reconciler looks it up at the provider,
        and, in an outage that also takes the provider's lookups down for a minute or two, while
        it waits to look again."""
        world = self.agent.world
        lease_left = max(0.0, (self.agent.lease_end - world.now).total_seconds()) if self.agent.lease_end else 0.0
        provider = self.agent.run.network.providers.get(attempt.tool_name)
        if provider is not None and "lookup_down" in provider.faults.enabled:
            provider.lookups_down_until = world.now + timedelta(seconds=lease_left + world.rng.uniform(60, 120))
        world.sleep(lease_left, f"busy before reporting #{attempt.pk}")
        for _ in range(40):
            if not Attempt.objects.filter(pk=attempt.pk, state=S.DISPATCHED).exists():
                return
            world.sleep(0.5, f"busy before reporting #{attempt.pk}")

    def confirm(
        self, attempt: Attempt, *, fence: int, provider_request_id: str, result_ref: str, result: Any, storable: bool
    ) -> Any:
        return self._report(
            attempt,
            fence,
            "confirmed",
            lambda: recording.report_outcome(
                attempt,
                outcome="confirmed",
                provider_request_id=provider_request_id,
                result_ref=result_ref,
                result=result,
                result_source="tool" if storable else "",
                fence=fence,
                actor=self.context.actor,
            ),
        )

    def fail(self, attempt: Attempt, *, fence: int, reason: str, retryable: bool) -> Any:
        outcome = "failed_retryable" if retryable else "failed"
        return self._report(
            attempt,
            fence,
            outcome,
            lambda: recording.report_outcome(
                attempt, outcome=outcome, reason=reason, fence=fence, actor=self.context.actor
            ),
        )

    def mark_unknown(self, attempt: Attempt, *, fence: int, reason: str) -> Any:
        return self._report(
            attempt,
            fence,
            "unknown",
            lambda: recording.report_outcome(
                attempt, outcome="unknown", reason=reason, fence=fence, actor=self.context.actor
            ),
        )


@dataclass
class AgentState:
    """One agent process (and the ones it restarts as): its tasks and where it is in them."""

    run: Run
    name: str
    tasks: list[Task]
    incarnation: int = 0
    task_index: int = 0
    lease_end: datetime | None = None
    actor: Actor | None = None
    #: Re-running after a crash: the call in flight may come back with other arguments.
    reword: bool = False
    #: Drives the ledger's steps itself, as a client of the ingest API does, with a provider SDK
    #: that sends a refused request again at once, with the same key.
    stepwise: bool = False

    @property
    def world(self) -> World:
        return self.run.world

    def alive(self) -> None:
        if self.actor is not None and self.actor.killed:
            raise Killed

    def report(self, attempt: Attempt, fence: int, outcome: str, answer: str) -> None:
        self.run.truth.reports.append(
            ReportMade(
                attempt.pk,
                fence,
                outcome,
                self.world.now,
                f"{self.name}#{self.incarnation}",
                answer,
                next(self.world.happened),
            )
        )

    # --- the tool the wrapper runs --------------------------------------------------------

    def tool(self, name: str, key: str = "{tool}:{ref}") -> Callable[..., Any]:
        world, run = self.world, self.run

        def send(call: toolcalls.ToolCall, *, ref: str, amount_cents: int, tool: str) -> Any:
            rng = world.rng
            attempt = call.attempt
            timing = Tool.objects.filter(name=name).values_list("dispatch_lease_seconds", flat=True).get()
            lease = float(timing or 60.0)
            # Prepare before sending: most at once, some for long, beating the lease as they go.
            prepare = rng.choice([0.0, 0.0, rng.uniform(0, lease / 2), rng.uniform(lease, 2.5 * lease)])
            while prepare > 0:
                step = min(prepare, lease / 3)
                world.sleep(step, f"preparing #{attempt.pk}")
                prepare -= step
                if prepare > 0:
                    call.heartbeat()
            self.alive()
            # Within its lease by the clock its process decides by (the ledger's).
            licensed = self.lease_end is not None and clock.now() <= self.lease_end
            if not licensed and rng.random() < 0.5:
                # A careful tool checks its lease before the request leaves.
                raise NothingHappened("not sent: the dispatch lease ran out before the request left")
            provider = run.network.providers[name]
            wait = checks.timeout_for(
                ToolConfig(timeout=run.plan.timings[name].configured_timeout), checks.max_request_seconds(name)
            )
            keep_receipt = rng.random() > 0.05  # a tool that forgets its receipt leaves the outcome unknown
            sent = net.call(
                world,
                provider,
                key=call.key,
                args=call.args,
                attempt_id=attempt.pk,
                fence=call.fence,
                licensed=licensed,
                wait=wait,
                on_request_id=call.record_request_id if keep_receipt else None,
                beat=call.heartbeat,
                beat_every=lease / 3,
            )
            return sent.response

        return toolcalls.wrap(send, name=name, key=key, scope=None, session=self._session)

    def _session(self) -> SimSession:
        assert self.session is not None, "a tool is called inside a task"
        return self.session

    def _actor(self) -> LedgerActor:
        return self._session().context.actor

    # --- the process -------------------------------------------------------------------------

    session: SimSession | None = None

    def body(self, actor: Actor) -> None:
        self.actor = actor
        tenant = Tenant.objects.get(slug=TENANT)
        tools = {name: self.tool(name) for name in sorted(PROVIDERS)}
        alike = {name: self.tool(name, ALIKE_KEY) for name in sorted(PROVIDERS)}
        if self.stepwise:
            tools = {name: self._stepwise(name) for name in sorted(PROVIDERS)}
            alike = {name: self._stepwise(name, ALIKE_KEY) for name in sorted(PROVIDERS)}
        while self.task_index < len(self.tasks):
            task = self.tasks[self.task_index]
            context = recording.TaskContext(
                tenant=tenant, task_id=task.task_id, actor=LedgerActor.agent(f"{self.name}#{self.incarnation}")
            )
            self.session = SimSession(context, self)
            for call in task.calls:
                args = arguments(call)
                if self.reword and self.world.rng.random() < 0.5:
                    self.run.truth.fault("reword")
                    args = {**args, "amount_cents": args["amount_cents"] + 1}
                self._call((alike if call.alike else tools)[call.tool], args)
            self.reword = False
            self.task_index += 1
            self.world.sleep(self.world.rng.uniform(0, 30), "between tasks")

    def _stepwise(self, name: str, key: str = "{tool}:{ref}") -> Callable[..., Any]:
        """The tool ``name`` called step by step: record, claim, send, report
        each answer as it comes; a refusal before acting from an idempotent
        provider is sent again at once with the same key (as Stripe's SDK does),
        and the later, stronger word reported with the same fence."""
        world, run = self.world, self.run

        def call(**args: Any) -> Any:
            session = self._session()
            actor = session.context.actor
            world.checkpoint(f"recording the intent for {args['tool']}:{args['ref']}")
            recorded = recording.record_intent(
                tenant=session.context.tenant,
                task_id=session.context.task_id,
                tool_name=name,
                idempotency_key=key.format(**args),
                args=args,
                actor=actor,
                claim=True,
            )
            attempt = recorded.attempt
            if not recorded.claimed:
                if attempt.state == S.OUTCOME_CONFIRMED:
                    return recording.replay(attempt)
                recording.refuse_unless_dispatchable(attempt)
                world.checkpoint(f"claiming #{attempt.pk}")
                attempt = recording.mark_dispatched(attempt, actor=actor)
            self.lease_end = attempt.next_check_at
            fence = attempt.fence
            lease = float(Tool.objects.filter(name=name).values_list("dispatch_lease_seconds", flat=True).get() or 60.0)
            world.checkpoint(f"claimed #{attempt.pk}")
            provider = run.network.providers[name]
            wait = checks.timeout_for(
                ToolConfig(timeout=run.plan.timings[name].configured_timeout), checks.max_request_seconds(name)
            )
            for sdk_try in (1, 2):
                self.alive()
                try:
                    sent = net.call(
                        world,
                        provider,
                        key=attempt.provider_key,
                        args=attempt.args,
                        attempt_id=attempt.pk,
                        fence=fence,
                        licensed=self.lease_end is not None and clock.now() <= self.lease_end,
                        wait=wait,
                        beat=lambda: session.heartbeat(attempt, fence),
                        beat_every=lease / 3,
                    )
                except NothingHappened as exc:
                    session.fail(attempt, fence=fence, reason=str(exc), retryable=True)
                    if sdk_try == 1 and provider.traits.idempotent:
                        # It reported: the ledger no longer counts on it; its SDK's resend is its own.
                        self.lease_end = None
                        continue
                    raise
                except PermanentFailure as exc:
                    session.fail(attempt, fence=fence, reason=str(exc), retryable=False)
                    if sdk_try == 1 and run.faults_on("repeat") and world.rng.random() < 0.6:
                        # An SDK that tries a declined request once more after its caller reported the
                        # refusal: the ledger settled the attempt on that word, which this send may undo.
                        run.truth.fault("repeat")
                        self.lease_end = None
                        continue
                    raise
                except (TimeoutError, ConnectionResetError) as exc:
                    session.mark_unknown(attempt, fence=fence, reason=f"{type(exc).__name__}: {exc}")
                    if sdk_try == 1 and provider.traits.idempotent and world.rng.random() < 0.7:
                        self.lease_end = None  # as above: a resend after its report is its SDK's own
                        continue
                    raise
                session.confirm(
                    attempt,
                    fence=fence,
                    provider_request_id=sent.request_id,
                    result_ref="",
                    result=sent.response,
                    storable=True,
                )
                return sent.response
            return None

        return call

    def _call(self, tool: Callable[..., Any], args: dict[str, Any]) -> None:
        """Call one tool until it is done, refused for good, or tried four times."""
        for _try in range(4):
            self.lease_end = None
            if not self._try(tool, args):
                return

    def _try(self, tool: Callable[..., Any], args: dict[str, Any]) -> bool:
        """One call and what the agent makes of its answer; whether to call again."""
        rng = self.world.rng
        try:
            tool(**args)
        except Killed:
            raise
        except Exception as exc:
            self.run.trace.append(f"{'':>22}{self.name}#{self.incarnation} was told {type(exc).__name__}: {exc}"[:300])
            return self._handle(exc)
        if self.run.faults_on("repeat") and rng.random() < 0.2:
            self.run.truth.fault("repeat")
            return True  # the same call again: it must replay, never send
        return False

    def _handle(self, exc: Exception) -> bool:
        world, rng = self.world, self.world.rng
        if isinstance(exc, IdempotencyConflict):
            linked = exc.attempt
            parent = Attempt.objects.filter(pk=linked.parent_id).first() if linked and linked.parent_id else None
            if parent is not None and parent.state == S.INTENT_RECORDED and rng.random() < 0.7:
                # Reworded after a crash before dispatch: give the unsent original up.
                world.checkpoint(f"abandoning #{parent.pk}")
                with contextlib.suppress(LedgerError):  # it moved on meanwhile
                    recording.abandon(parent, reason="re-ran with other arguments", actor=self._actor())
            return False
        if isinstance(exc, AwaitingApproval):
            world.sleep(rng.uniform(30, 900), "waiting for an approver")
            return True
        if isinstance(exc, SideEffectInFlight):
            # A request of the side effect may still land: call again once it cannot.
            wait = (exc.due - world.now).total_seconds() if exc.due is not None else rng.uniform(5, 120)
            world.sleep(max(0.0, wait) + 0.001, "waiting for the side effect's requests to land")
            return True
        if isinstance(exc, RetryPending) and exc.attempt is not None and exc.attempt.next_check_at is not None:
            author, tool = self.run.author, getattr(exc.attempt, "tool_name", None)
            if author is not None and tool and self.run.faults_on("policy") and rng.random() < 0.3:
                # The policy changes between the refusal and the call sent again (the author is woken).
                self.run.author_called = str(tool)
                world.wake(author)
            # Call again the moment its back-off is over (racing the reconciler to it).
            world.sleep(max(0.0, (exc.attempt.next_check_at - world.now).total_seconds()) + 0.001, "backing off")
            return True
        if isinstance(exc, AttemptBlocked):
            if exc.code in (
                "attempt_failed",
                "approval_rejected",
                "already_happened",
                "attempt_superseded",
                "result_unavailable",
            ):
                return False
            world.sleep(rng.uniform(5, 600), f"waiting: {exc.code}")
            return True
        if isinstance(exc, NothingHappened):
            world.sleep(rng.uniform(0.5, 10), "after a refusal before acting")
            return True
        if isinstance(exc, PermanentFailure | TimeoutError | ConnectionResetError):
            world.sleep(rng.uniform(1, 120), "after the provider's answer")
            return True
        if isinstance(exc, LedgerError):
            return False  # refused (authority changed, not allowed): the agent gives up the call
        raise exc


# --- reconcilers -----------------------------------------------------------------------------


def reconciler_body(run: Run, name: str) -> Callable[[Actor], None]:
    def body(actor: Actor) -> None:
        world = run.world
        reconciler = Reconciler(label=name, batch_size=world.rng.choice([1, 3, 50]))
        while True:
            reconciler.run_pass()
            if run.settling:
                due = (
                    Attempt.objects.filter(next_check_at__isnull=False, state__in=list(moves.base.IN_FLIGHT_STATES))
                    .order_by("next_check_at")
                    .values_list("next_check_at", flat=True)
                    .first()
                )
                if due is None:
                    world.sleep(60.0, "nothing due")
                else:
                    world.sleep(max(0.5, (due - world.now).total_seconds() + 0.01), "until the next attempt is due")
            else:
                world.sleep(world.rng.uniform(1.0, 20.0), "between passes")

    return body

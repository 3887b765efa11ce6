"""The protocol's invariants (``docs/protocol.md``), held against the
providers' record and the ledger after every step of a simulated run, and
once more at its end.

These checks share no code with the rules they check, and no excuse with
them: the authority a dispatch needed is worked out here from what the
policy author published, the approval condition evaluated with JMESPath
directly; whether an effect happened is what the simulated provider
recorded; what the ledger knew when a request left is the events it had
committed by then (each request notes the newest one), and what people
decided is what the simulated people did. No field the ledger writes about
its own judgement (a reason to accept a risk, an approval's version)
excuses anything.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jmespath

from ledgerdash.ledger import audit, rules
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    FailedBecause,
    Incident,
    State,
    Tenant,
)
from ledgerdash.ledger.simulation.provider import Effect, Request
from ledgerdash.ledger.simulation.scenario import TENANT

if TYPE_CHECKING:
    from ledgerdash.ledger.simulation.runner import Run

S = State

#: Every invariant, by the number docs/protocol.md gives it.
INVARIANTS = {
    "I1": "no side effect is performed twice",
    "I2": "every effect the provider performed is known to the ledger",
    "I3": "nothing is settled as not happened without grounds",
    "I4": "a proof that an original did not happen is true",
    "I5": "nothing is confirmed without the provider's effect or a person's word, nor one effect on two side effects",
    "I6": "every attempt settles once faults stop",
    "I7": "the operator sees the arguments' hash and the provider's request id",
    "I8": "a retry never widens credentials or crosses a tenant",
    "I9": "work waiting on facts or people has an owner",
    "I10": "recovery run again changes nothing",
    "I11": "every dispatch is made under the tenant's current authority",
    "I12": "a dispatcher's report is never dropped",
    "I13": "the hash chain is whole",
    "I14": "nothing fails unexpectedly",
    "I15": "a person's decision is made only while they hold their membership and account",
}


@dataclass(frozen=True)
class Violation:
    invariant: str
    step: int
    detail: str

    def line(self) -> str:
        return f"{self.invariant} ({INVARIANTS[self.invariant]}) broken at step {self.step}: {self.detail}"


class Checker:
    """Checks one run's invariants; keeps what it has seen of the event log."""

    def __init__(self, run: Run) -> None:
        self.run = run
        # (what the template holds is not this run's history)
        self.last_id = AttemptEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
        self.reports_seen = 0
        self.seen: tuple[int, ...] = ()
        self.tenant_id = Tenant.objects.filter(slug=TENANT).values_list("pk", flat=True).get()
        #: attempt id -> the first event by which the ledger recorded that it acted (:func:`says_it_acted`).
        self.acted_at: dict[int, int] = {}
        #: attempt id -> who moved it to OUTCOME_CONFIRMED last, as read (the event may be archived since).
        self.confirmed_by: dict[int, str] = {}
        #: every transition read: (from, to, actor kind) -> times (the run's coverage).
        self.moves: Counter[tuple[str, str, str]] = Counter()

    # --- the ground truth ------------------------------------------------------------------

    def effects(self) -> list[Effect]:
        return [e for p in self.run.network.providers.values() for e in p.effects]

    def requests(self) -> list[Request]:
        return [r for p in self.run.network.providers.values() for r in p.requests]

    # --- after every step ------------------------------------------------------------------

    def after_step(self) -> list[Violation]:
        """The invariants, whenever the step changed what they look at: the
        ledger (every change of an attempt's state or owner is an event),
        the providers' record, or the reports made."""
        step = self.run.world.step
        # By id, not seq: the tenant keeps two chains, whose seqs interleave
        # (one actor runs at a time, so ids follow the order of the commits).
        newest = (
            AttemptEvent.objects.filter(tenant_id=self.tenant_id).order_by("-id").values_list("id", flat=True).first()
        ) or 0
        seen = (newest, len(self.effects()), len(self.requests()), len(self.run.truth.reports))
        if seen == self.seen:
            return []
        self.seen = seen
        found: list[Violation] = []
        attempts = {a.pk: a for a in Attempt.objects.filter(tenant_id=self.tenant_id).order_by("id")}
        every = list(AttemptEvent.objects.filter(tenant_id=self.tenant_id, id__gt=self.last_id).order_by("id"))
        events = [e for e in every if e.attempt_id is not None]
        self.last_id = newest
        for event in every:
            change = f"{event.from_state or 'new'}->{event.to_state}" if event.kind == "transition" else event.kind
            about = f"#{event.attempt_id} " if event.attempt_id else ""
            self.run.trace.append(f"{'':>22}ledger: {about}{change} by {event.actor_label}: {event.reason[:160]}")
        for attempt in attempts.values():
            if attempt.state in OWNED_STATES and attempt.owner_id is None:
                found.append(Violation("I9", step, f"#{attempt.pk} is {attempt.state} with nobody owning it"))
        for event in events:
            if event.kind == "transition":
                self.moves[(event.from_state or "", event.to_state, event.actor_kind)] += 1
                if event.to_state == S.OUTCOME_CONFIRMED and event.attempt_id is not None:
                    self.confirmed_by[event.attempt_id] = event.actor_kind
            if says_it_acted(event):
                assert event.attempt_id is not None
                self.acted_at.setdefault(event.attempt_id, event.pk)
        for event in events:
            found += self._dispatch_authorized(event, attempts, step)
            found += self._proof_true(event, attempts, step)
            found += self._decided_by_a_member(event, step)
        found += self._proofs_on_show(attempts, step)
        found += self._confirmed_with_evidence(attempts, step)
        found += self._no_effect_twice(attempts, step)
        found += self._failed_with_grounds(attempts, step)
        found += self._reports_kept(step)
        return found

    def _dispatch_authorized(self, event: AttemptEvent, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        """The policy in force when the call was dispatched allowed it, and
        held it for an approver only where one let it through under a policy
        that held it by the same rule (an approval given under a version no
        stricter for this call)."""
        if event.kind != "transition" or event.to_state != S.DISPATCHED:
            return []
        assert event.attempt_id is not None
        attempt = attempts[event.attempt_id]
        _at, tools, approvals, active = self.run.truth.authority[-1]
        problem = ""
        if not active:
            problem = "the tenant was deactivated"
        elif attempt.tool_name not in tools:
            problem = f"the current policy does not allow {attempt.tool_name}"
        elif not attempt.scopes <= set(tools[attempt.tool_name]):
            problem = f"scopes {sorted(attempt.scopes)} are wider than the current policy's {tools[attempt.tool_name]}"
        else:
            rule = _hold(approvals, attempt.tool_name, attempt.args)
            if rule is not None:
                given = [a for a in self.run.truth.approvals if a.attempt_id == attempt.pk]
                last = given[-1] if given else None
                if last is None:
                    problem = f"the current policy holds {attempt.tool_name} ({rule or 'every call'}), unapproved"
                elif _hold(last.approvals, attempt.tool_name, attempt.args) != rule:
                    then = _hold(last.approvals, attempt.tool_name, attempt.args)
                    problem = (
                        f"the current policy holds {attempt.tool_name} ({rule or 'every call'}), and its approval "
                        f"at step {last.step} was given under a policy that "
                        + ("did not hold it" if then is None else f"held it by another rule ({then or 'every call'})")
                    )
        if not problem:
            return []
        return [Violation("I11", step, f"#{attempt.pk} was dispatched although {problem} (by {event.actor_label})")]

    def _decided_by_a_member(self, event: AttemptEvent, step: int) -> list[Violation]:
        """A person's decision (any event they made) falls in no stretch
        during which the administrator had taken their membership or account
        away, by the simulation's own record of when it did."""
        if event.actor_user_id is None or event.kind == "approval_refused":
            return []  # (a refusal the ledger records is no decision taken)
        for absence in self.run.truth.absences:
            if absence.user_id == event.actor_user_id and absence.covers(event.pk):
                return [
                    Violation(
                        "I15",
                        step,
                        f"{absence.name} decided on #{event.attempt_id} ({event.kind} {event.to_state}: "
                        f"{event.reason[:80]}) while {absence.how}",
                    )
                ]
        return []

    def _proof_true(self, event: AttemptEvent, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        """An approval that needed no reason rested on the proof that the
        side effect has not happened: no attempt at it (but the retry) may
        have performed it, and none sent within its lease can still."""
        details = event.details or {}
        standing = details.get("original_standing") or {}
        if event.kind != "transition" or event.to_state != S.INTENT_RECORDED or not standing.get("proof"):
            return []
        assert event.attempt_id is not None
        retry = attempts[event.attempt_id]
        chain = {a.pk for a in attempts.values() if a.idempotency_key == retry.idempotency_key} - {retry.pk}
        # (a request its dispatcher sent after its lease ran out is outside the promise: see I1)
        acted = [r for r in self.requests() if r.attempt_id in chain and r.effect is not None and r.licensed]
        pending = [
            r for r in self.requests() if r.attempt_id in chain and r.licensed and r.outcome in ("in flight", "pending")
        ]
        if not acted and not pending:
            return []
        what = (
            f"request {acted[0].n} of #{acted[0].attempt_id} acted at the provider"
            if acted
            else f"request {pending[0].n} of #{pending[0].attempt_id} (sent within its lease) could still act"
        )
        return [
            Violation(
                "I4",
                step,
                f"approving #{retry.pk} rested on the proof that its side effect did not happen "
                f"({standing['proof']}), but {what}",
            )
        ]

    def _proofs_on_show(self, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        """What the ledger shows an approver about an attempt under review
        (``rules.original_standing``, on the approvals page) is true: when it
        says the attempt cannot have happened, the provider has no effect of
        it and none of its requests sent within its lease can still act."""
        found = []
        for attempt in attempts.values():
            if attempt.state != S.MANUAL_REVIEW or attempt.dispatch_count == 0:
                continue
            standing = rules.original_standing(attempt, now=self.run.world.now)
            if not standing.proof:
                continue
            mine = [r for r in self.requests() if r.attempt_id == attempt.pk and r.licensed]
            acted = [r for r in mine if r.effect is not None]
            pending = [r for r in mine if r.outcome in ("in flight", "pending")]
            if acted or pending:
                what = f"its request {acted[0].n} acted" if acted else f"its request {pending[0].n} can still act"
                found.append(
                    Violation(
                        "I4",
                        step,
                        f"the ledger shows proof that #{attempt.pk} did not happen ({standing.proof}), but {what}",
                    )
                )
        return found

    def _confirmed_with_evidence(self, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        """Nothing is confirmed without the provider's effect (or a person's
        word), and no provider effect is recorded as the outcome of two side
        effects (attempts at one side effect may share it)."""
        found = []
        sides: dict[tuple[str, str], set[str]] = {}
        for attempt in attempts.values():
            if attempt.provider_request_id:
                sides.setdefault((attempt.tool_name, attempt.provider_request_id), set()).add(attempt.idempotency_key)
        for (tool, request_id), keys_of in sorted(sides.items()):
            if len(keys_of) > 1:
                found.append(
                    Violation(
                        "I5",
                        step,
                        f"{tool}'s effect {request_id} is recorded as the outcome of {len(keys_of)} side effects "
                        f"({', '.join(sorted(keys_of))})",
                    )
                )
        keys = {(e.provider, e.key) for e in self.effects()}
        for attempt in attempts.values():
            if attempt.state != S.OUTCOME_CONFIRMED or (attempt.tool_name, attempt.provider_key) in keys:
                continue
            by = self.confirmed_by.get(attempt.pk)
            if by != "user":
                found.append(
                    Violation("I5", step, f"#{attempt.pk} was confirmed by the {by}, but the provider has no effect")
                )
        return found

    def _chains(self, attempts: dict[int, Attempt]) -> dict[str, list[Attempt]]:
        chains: dict[str, list[Attempt]] = {}
        for attempt in attempts.values():
            chains.setdefault(attempt.idempotency_key, []).append(attempt)
        return chains

    def _no_effect_twice(self, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        """Effects per side effect, from the providers' logs: a second one is
        excused only when its request was a late send (C2 broken), or when
        a person had accepted the risk (an approver let an attempt of it
        out with a reason, as the simulated approver did) and, when the
        request left, the ledger had recorded nothing saying the side
        effect happened (its committed events then, :func:`says_it_acted`)."""
        found = []
        effects = self.effects()
        requests = {r.n: r for r in self.requests()}
        for key, chain in self._chains(attempts).items():
            provider_keys = {(a.tool_name, a.provider_key) for a in chain}
            landed = sorted((e for e in effects if (e.provider, e.key) in provider_keys), key=lambda e: (e.at, e.n))
            if len(landed) < 2:
                continue
            ids = {a.pk for a in chain}
            for n, effect in enumerate(landed[1:], start=1):
                request = requests[effect.request]
                if not request.licensed:
                    continue  # outside the promise: a dispatcher sent after its lease (and it is not the ledger's send)
                knew = sorted(a for a in ids if self.acted_at.get(a, request.ledger_seen + 1) <= request.ledger_seen)
                if not knew and not any(requests[e.request].licensed for e in landed[:n]):
                    # Each earlier effect came of a late send (C2 broken) the ledger had heard nothing of when
                    # this request left: the same excuse, whichever of the two requests left first.
                    continue
                risked = any(
                    a.attempt_id in ids and a.with_reason and a.order < request.order for a in self.run.truth.approvals
                )
                if risked and not knew:
                    continue  # a person accepted the risk, and the ledger knew of nothing that had happened
                why = (
                    f"the ledger had recorded that #{knew[0]} acted before request {request.n} left"
                    if knew
                    else "no person accepted that risk"
                )
                found.append(
                    Violation(
                        "I1",
                        step,
                        f"the side effect {key!r} happened {len(landed)} times at the provider (requests "
                        f"{', '.join(str(e.request) for e in landed)}; attempts "
                        f"{', '.join(f'#{a.pk} {a.state}' for a in chain)}): {why}",
                    )
                )
                break
        return found

    def _failed_with_grounds(self, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        found = []
        requests = self.requests()
        for attempt in attempts.values():
            if attempt.state != S.FAILED:
                continue
            sent = [r for r in requests if r.attempt_id == attempt.pk]
            if attempt.failed_because in (
                FailedBecause.ABANDONED,
                FailedBecause.REJECTED,
                FailedBecause.ALREADY_HAPPENED,
            ):
                if sent or attempt.dispatch_count:
                    found.append(
                        Violation("I3", step, f"#{attempt.pk} failed as never sent, but request {sent[0].n} was sent")
                        if sent
                        else Violation("I3", step, f"#{attempt.pk} failed as never sent, but it was dispatched")
                    )
            elif attempt.failed_because == FailedBecause.PROVIDER:
                # (a request its dispatcher sent after its lease, or after it reported, is outside the promise)
                last = [r for r in sent if r.fence == attempt.dispatch_fence and r.licensed]
                if any(r.effect is not None and r.outcome == "acted" for r in last):
                    found.append(
                        Violation(
                            "I3",
                            step,
                            f"#{attempt.pk} failed on the provider's word, but its last dispatch acted "
                            f"(request {next(r.n for r in last if r.effect is not None)})",
                        )
                    )
        return found

    def _reports_kept(self, step: int) -> list[Violation]:
        found = []
        reports = self.run.truth.reports
        for report in reports[self.reports_seen :]:
            if report.answer not in ("applied", "late", "replayed", "applied-again"):
                found.append(
                    Violation(
                        "I12",
                        step,
                        f"{report.sender}'s report ({report.outcome}) on #{report.attempt_id} with fence "
                        f"{report.fence} was refused: {report.answer}",
                    )
                )
            elif report.answer == "applied-again":
                found.append(
                    Violation(
                        "I10",
                        step,
                        f"{report.sender}'s report ({report.outcome}) on #{report.attempt_id}, sent twice, was "
                        "applied twice",
                    )
                )
        self.reports_seen = len(reports)
        return found

    # --- at the end --------------------------------------------------------------------------

    def at_end(self) -> list[Violation]:
        step = self.run.world.step
        found: list[Violation] = []
        attempts = {a.pk: a for a in Attempt.objects.filter(tenant_id=self.tenant_id).order_by("id")}
        for attempt in attempts.values():
            if attempt.state in IN_FLIGHT_STATES:
                found.append(
                    Violation(
                        "I6", step, f"#{attempt.pk} is still {attempt.state} after faults stopped: {attempt.last_note}"
                    )
                )
            if attempt.args_hash != normalize_args(attempt.args)[1]:
                found.append(Violation("I7", step, f"#{attempt.pk}'s arguments hash is not the hash of its arguments"))
            if attempt.state == S.OUTCOME_CONFIRMED and not (attempt.provider_request_id or attempt.result_ref):
                found.append(Violation("I7", step, f"#{attempt.pk} is confirmed with no request id or reference"))
            if attempt.parent_id is not None:
                parent = attempts[attempt.parent_id]
                if not attempt.scopes <= parent.scopes or attempt.tenant_id != parent.tenant_id:
                    found.append(Violation("I8", step, f"linked retry #{attempt.pk} is wider than #{parent.pk}"))
        found += self._every_effect_known(attempts, step)
        tenant = Tenant.objects.get(pk=self.tenant_id)
        # (archive and database walked as one chain, where partitions were archived)
        [verdict] = audit.verify([tenant], save=False, archive_dir=self.run.archive_dir)
        if not verdict.ok:
            found.append(Violation("I13", step, f"verify_audit: {verdict.broken}"))
        return found

    def _every_effect_known(self, attempts: dict[int, Attempt], step: int) -> list[Violation]:
        found = []
        incidents: set[int | None] = set(
            Incident.objects.filter(tenant_id=self.tenant_id).values_list("attempt_id", flat=True)
        )
        chains = self._chains(attempts)
        by_provider_key = {(a.tool_name, a.provider_key): a.idempotency_key for a in attempts.values()}
        requests = {r.n: r for r in self.requests()}
        for effect in self.effects():
            request = requests[effect.request]
            if not request.licensed and not self._heard_after(request):
                continue  # sent after its dispatcher's lease, and never reported: the ledger cannot know
            key = by_provider_key.get((effect.provider, effect.key))
            chain = chains.get(key or "", [])
            if any(_knows(a, incidents) for a in chain):
                continue
            states = ", ".join(f"#{a.pk} {a.state} ({a.failed_because or '-'})" for a in chain) or "no attempt"
            found.append(
                Violation(
                    "I2",
                    step,
                    f"the provider performed request {effect.request} ({effect.provider} {effect.key}), "
                    f"but the ledger has {states}",
                )
            )
        return found

    def _heard_after(self, request: Request) -> bool:
        """Whether the sender of ``request`` reported on its attempt after sending it."""
        return any(
            r.sender == request.sender and r.attempt_id == request.attempt_id and r.order > request.order
            for r in self.run.truth.reports
        )

    def summary(self) -> dict[str, Any]:
        return {"effects": len(self.effects()), "requests": len(self.requests())}


def _knows(attempt: Attempt, incidents: set[int | None]) -> bool:
    """Whether ``attempt`` holds the ledger's knowledge that its effect may
    have happened: confirmed, in front of a person, settled by a person, or
    named by an incident."""
    if attempt.pk in incidents or attempt.state in (S.OUTCOME_CONFIRMED, S.MANUAL_REVIEW, S.RECONCILED):
        return True
    return attempt.state == S.FAILED and attempt.failed_because == FailedBecause.PERSON


def says_it_acted(event: AttemptEvent) -> bool:
    """Whether ``event`` records that its attempt's side effect happened: a
    confirmation, a provider's request id, a dispatcher's late report of
    either, or a lookup that found an effect under its key."""
    details = event.details or {}
    if event.kind == "request_id":
        return True
    if event.kind == "late_report":
        return (details.get("report") or {}).get("outcome") in ("confirmed", "request_id")
    if event.kind != "transition":
        return False
    if event.to_state == S.OUTCOME_CONFIRMED:
        return True
    lookup = details.get("lookup") or {}
    return isinstance(lookup, dict) and lookup.get("status") in ("found", "mismatch")


def _hold(approvals: dict[str, str], tool_name: str, args: Any) -> str | None:
    """The rule by which a policy's ``approvals`` hold a call ("": every
    call; None: not held): a condition holds unless it yields false."""
    if tool_name not in approvals:
        return None
    condition = approvals[tool_name] or ""
    if not condition:
        return ""
    try:
        decided = jmespath.search(condition, args)
    except (jmespath.exceptions.JMESPathError, TypeError, ValueError):
        return condition
    return None if decided is False else condition

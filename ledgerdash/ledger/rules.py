# Over 600 lines because: it answers every "may this happen now, and why not?" for moves, pages and the API.
"""The ledger's answers to "may this happen now, and why not?".

Moves, the dashboard and the API ask these questions; none of them
re-derives the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db.models import Q

from ledgerdash.ledger import clock, landing, tenancy
from ledgerdash.ledger.authority import hold_of, standing_of
from ledgerdash.ledger.errors import (
    IllegalTransition,
    IncidentError,
    LedgerError,
    OwnershipError,
    RoleRequired,
    SelfApproval,
)
from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    FailedBecause,
    Incident,
    Role,
    State,
)
from ledgerdash.ledger.providers.base import LookupStatus
from ledgerdash.ledger.providers.registry import lookup_lag_for
from ledgerdash.ledger.tenancy import Person

S = State


@dataclass(frozen=True)
class OriginalStanding:
    """Whether a retry of ``original`` could perform its side effect a second
    time: the ledger's one answer, used by approvals, the dashboard and the API.

    ``blocked``: no approval at all yet (the original may still be sent, or
    was already superseded). ``risk``: a retry could duplicate it; an
    approver may accept that only with a recorded reason. ``proof``: why a
    retry cannot duplicate it, from the facts alone.
    """

    blocked: str | None = None
    risk: str | None = None
    proof: str | None = None


def when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def original_standing(original: Attempt, *, now: datetime | None = None) -> OriginalStanding:
    """Only the provider's word (or never having sent it) proves an original
    did not happen: a definitive refusal, or a "not found" asked after the
    request could no longer land (:mod:`ledgerdash.ledger.landing`, the one
    rule the reconciler follows too). A person's "failed" is a claim."""
    now = now or clock.now()
    if original.state in IN_FLIGHT_STATES:
        return OriginalStanding(
            blocked=f"the original #{original.pk} is {original.state} and may yet be sent (by its agent or the "
            "reconciler): settle it first"
        )
    if original.state == S.RECONCILED:
        return OriginalStanding(blocked=f"the original #{original.pk} was already superseded by an approved retry")
    return _by_the_facts(original, now, f"the original #{original.pk}")


def _by_the_facts(attempt: Attempt, now: datetime, name: str) -> OriginalStanding:
    """Whether ``attempt`` (settled, or waiting on people: nothing sends it
    any more) may have performed its side effect, by the provider's word."""
    if attempt.state == S.OUTCOME_CONFIRMED:
        return OriginalStanding(risk=f"{name} happened (confirmed): a retry performs it a second time")
    if attempt.dispatch_count == 0:
        return OriginalStanding(proof=f"{name} was never sent")
    if landing.could_still_land(attempt, now):
        assert attempt.lands_by is not None
        return OriginalStanding(
            risk=f"{name}'s request may still land at the provider until {when(attempt.lands_by)} (its dispatcher "
            "is still waiting on it)"
        )
    if attempt.state == S.FAILED and attempt.failed_because == FailedBecause.PROVIDER:
        return OriginalStanding(proof=f"the provider refused {name}: it did not act")
    if attempt.last_lookup == "not_found" and attempt.last_lookup_at is not None:
        lag = lookup_lag_for(attempt.tool_name)
        if landing.not_found_is_evidence(attempt, lag):
            return OriginalStanding(
                proof=f"the provider did not have {name} at {when(attempt.last_lookup_at)}, after its request could "
                "no longer land" + (f" and its lookup's lag ({lag:g} s) had passed" if lag else "")
            )
        shows_by = landing.shows_by(attempt, lag)
        assert shows_by is not None  # else the lookup would be evidence
        if lag and not landing.could_still_land(attempt, attempt.last_lookup_at):
            return OriginalStanding(
                risk=f"the provider's last lookup of {name} (not found, {when(attempt.last_lookup_at)}) was asked "
                f"within its lookup's lag ({lag:g} s, until {when(shows_by)}): a search index may not show it yet, "
                "so it is not evidence"
            )
        return OriginalStanding(
            risk=f"the provider's last lookup of {name} (not found, {when(attempt.last_lookup_at)}) was asked "
            f"before its request could no longer land ({when(attempt.lands_by or shows_by)}): not evidence"
        )
    if attempt.last_lookup == LookupStatus.NOT_EVIDENCE:
        return OriginalStanding(
            risk=f"the provider's last lookup saw nothing of {name}, but the call may lie where that lookup cannot "
            "see (its details name where): not evidence that it did not happen"
        )
    if attempt.state == S.FAILED and attempt.failed_because == FailedBecause.PERSON:
        return OriginalStanding(
            risk=f"{name} was marked failed by a person, not by the provider: a claim, not evidence that it did not "
            "happen"
        )
    said = attempt.last_lookup.replace("_", " ") if attempt.last_lookup else "no lookup yet"
    return OriginalStanding(risk=f"the provider has not said {name} did not happen (last lookup: {said})")


def side_effect_standing(
    retry: Attempt, original: Attempt, *, chain: Sequence[Attempt] | None = None, now: datetime | None = None
) -> OriginalStanding:
    """Whether sending ``retry`` could perform its side effect a second
    time: its original's standing, and that of every other attempt at the
    same side effect (``chain``: the key's attempts; read when not given).

    Any attempt at the side effect known to have acted blocks it outright
    (what :func:`send_verdict` would refuse at dispatch). A linked retry of
    a linked attempt that was never sent still performs the side effect its
    key names: if the first attempt at it happened, the retry duplicates
    it, whatever its own parent's standing. So every other
    attempt of the key that was sent must be proven not to have happened
    too, and one that may yet be sent blocks the approval like the original.
    """
    now = now or clock.now()
    others = (
        list(chain)
        if chain is not None
        else list(
            Attempt.objects.filter(tenant_id=retry.tenant_id, idempotency_key=retry.idempotency_key).order_by("id")
        )
    )
    acted = what_happened([each for each in others if each.pk != retry.pk])
    if acted is not None:
        # The send rule would never let it out: approving it would decide nothing.
        return OriginalStanding(
            blocked=f"{acted[0]}: the side effect happened, and a retry under its key is never sent (a new side "
            "effect needs a key of its own)"
        )
    if original.state == S.RECONCILED and superseded_by(original, retry):
        # Approved once and held again since: its original is weighed by the facts, as it was then.
        standing = _by_the_facts(original, now, f"the original #{original.pk}")
    else:
        standing = original_standing(original, now=now)
    if standing.blocked:
        return standing
    risks = [standing.risk] if standing.risk else []
    proofs = [standing.proof] if standing.proof else []
    for other in others:
        if other.pk in (retry.pk, original.pk):
            continue
        name = f"#{other.pk} (another attempt at the same side effect)"
        if other.state in IN_FLIGHT_STATES:
            return OriginalStanding(blocked=f"{name} is {other.state} and may yet be sent: settle it first")
        if other.dispatch_count == 0:
            continue  # never sent, and nothing will send it now
        found = _by_the_facts(other, now, name)
        if found.risk:
            risks.append(found.risk)
        elif found.proof:
            proofs.append(found.proof)
    if risks:
        return OriginalStanding(risk="; ".join(risks))
    return OriginalStanding(proof="; ".join(proofs))


@dataclass(frozen=True)
class SendVerdict:
    """Whether a request of an attempt may leave now, given everything the
    ledger has recorded about its side effect (:func:`send_verdict`).

    ``happened``: another attempt at the same side effect acted (what says
    so, in words; ``by`` names it): the request must never leave.
    ``waits``: a request of the side effect may still be on its way, or
    another attempt at it may yet be sent: not now (``until``: when the
    ledger can tell, where it knows; None: once that attempt settles)."""

    happened: str = ""
    by: int | None = None
    waits: str = ""
    until: datetime | None = None

    def __bool__(self) -> bool:
        return not (self.happened or self.waits)


SEND = SendVerdict()

#: What a late report says when it says the provider acted.
ACTED_REPORTS = ("confirmed", "request_id")


def late_receipt(report: dict[str, Any]) -> str:
    """The receipt a dispatcher's late report names when it says the provider
    acted (its request id, else its result reference); "" when it does not
    say so. Kept on the attempt (``Attempt.late_receipt``)."""
    if report.get("outcome") not in ACTED_REPORTS:
        return ""
    return str(report.get("provider_request_id") or report.get("result_ref") or "a receipt")[:1000]


def what_happened(attempts: Sequence[Attempt]) -> tuple[str, int] | None:
    """The first of ``attempts`` the ledger knows acted, and what says so:
    confirmed, a receipt recorded, a dispatcher's late report of one, or a
    lookup that found an effect under its key; None when none did."""
    for each in attempts:
        if each.state == S.OUTCOME_CONFIRMED:
            what = f"#{each.pk} is confirmed" + (
                f" (provider request {each.provider_request_id})" if each.provider_request_id else ""
            )
        elif each.provider_request_id:
            what = f"#{each.pk} has a receipt from the provider (request {each.provider_request_id})"
        elif each.late_receipt:
            what = f"#{each.pk}'s dispatcher reported late that the provider acted ({each.late_receipt})"
        elif each.last_lookup in ("found", "mismatch"):
            what = f"the provider's lookup found an effect of #{each.pk} ({each.last_lookup})"
        else:
            continue
        return what, each.pk
    return None


def send_verdict(
    attempt: Attempt, *, chain: Sequence[Attempt] | None = None, now: datetime | None = None
) -> SendVerdict:
    """May a request of ``attempt`` leave now? The one question every path
    that sends asks (the agent's dispatch, the reconciler's resend, a linked
    retry, the MCP gateway), under the row locks of the side effect's
    attempts (``chain``: the key's attempts as locked; read when not given).

    Not when another attempt at the same side effect acted (confirmed, a
    receipt recorded, a dispatcher's late report of one, a lookup that
    found an effect under its key): whatever an approver let through
    earlier, facts that arrived since win. Not yet while any request of the
    side effect (this attempt's earlier ones included) may still land, or
    another attempt at it may yet be sent.

    A first call's first dispatch asks nothing more: nothing else at its key
    can have been sent (a linked attempt is approved only once every
    attempt at the key has settled, and a settled first call is never
    dispatched again)."""
    if attempt.parent_id is None and attempt.dispatch_count == 0:
        return SEND
    now = now or clock.now()
    if chain is None:
        chain = list(
            Attempt.objects.filter(tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key).order_by("id")
        )
    others = [other for other in chain if other.pk != attempt.pk]
    acted = what_happened(others)
    if acted is not None:
        what, by = acted
        return SendVerdict(happened=f"{what}: the side effect happened", by=by)
    for other in others:
        if other.state in IN_FLIGHT_STATES:
            return SendVerdict(waits=f"#{other.pk} (the same side effect) is {other.state} and may yet be sent")
    landing_until = max(
        (each.lands_by for each in chain if landing.could_still_land(each, now) and each.lands_by is not None),
        default=None,
    )
    if landing_until is not None:
        return SendVerdict(
            waits=f"a request of this side effect may still land at the provider until {when(landing_until)}",
            until=landing_until,
        )
    return SEND


def superseded_by(original: Attempt, retry: Attempt) -> bool:
    """Whether ``original`` was superseded by the approval of ``retry`` itself."""
    return AttemptEvent.objects.filter(
        attempt_id=original.pk, kind=EventKind.TRANSITION, to_state=S.RECONCILED, details__retry_id=retry.pk
    ).exists()


def awaiting_approval(attempt: Attempt) -> bool:
    """Never sent and waiting on an approver: a linked attempt under review,
    or a first call its policy requires approval for. Only an approver lets
    it go out (approve) or stops it (reject); there is nothing at the
    provider to look up or verify."""
    if attempt.state != S.MANUAL_REVIEW or attempt.dispatch_count != 0:
        return False
    return attempt.parent_id is not None or (held_first_call(attempt) and attempt.approved_at is None)


def held_first_call(attempt: Attempt) -> bool:
    """A first call (no linked attempt) its policy held for an approver when it was recorded."""
    return attempt.parent_id is None and bool(attempt.approval_required)


def recorded_awaiting_approval(attempt: Attempt, from_state: str, to_state: str) -> bool:
    """Whether a transition (``from_state`` -> ``to_state``) of ``attempt``
    is its recording, waiting for an approver: a linked attempt, or a first
    call held (:func:`awaiting_approval`, as it was when recorded)."""
    return (
        from_state == "" and to_state == S.MANUAL_REVIEW and (attempt.parent_id is not None or held_first_call(attempt))
    )


def awaiting_approval_filter(prefix: str = "") -> Q:
    """:func:`awaiting_approval` as a condition on attempts (``prefix``: the
    path to the attempt, e.g. ``"attempt__"``), for queues and counts."""

    def q(**lookups: Any) -> Q:
        return Q(**{prefix + name: value for name, value in lookups.items()})

    first_call = ~q(approval_required="") & q(approved_at__isnull=True)
    return q(state=S.MANUAL_REVIEW, dispatch_count=0) & (q(parent__isnull=False) | first_call)


def four_eyes_filter(user_id: int | None, prefix: str = "") -> Q:
    """Four eyes as a condition on attempts: those ``user_id`` may decide as
    far as asking goes (they did not request the retry, nor issue the token
    of the agent that made the call); :func:`approval_check` is the same rule
    for one attempt."""

    def q(**lookups: Any) -> Q:
        return Q(**{prefix + name: value for name, value in lookups.items()})

    return ~q(requested_by_id=user_id) | q(requested_by__isnull=True)


@dataclass(frozen=True)
class ApprovalCheck:
    """What the approval of a linked retry (or of a first call) would find
    now: ``authority`` (who approves, and under which policy: what no longer
    holds, in words) and the original's ``standing`` (None for a first call:
    there is no original that could have happened)."""

    authority: tuple[str, ...]
    standing: OriginalStanding | None
    policy_version_now: int | None
    #: The approver asked for it themselves (four eyes refuses it).
    own: bool = False
    #: The rule by which the current policy holds the call ("": every call;
    #: None: it does not): what an approval given now is bound to.
    hold_now: str | None = None

    def refusals(self, *, safe_because: str = "") -> list[str]:
        """Why the approval would be refused, given the approver's reason
        (if any) why approving over a risky original is safe."""
        refusals = list(self.authority)
        if self.standing is None:
            return refusals
        if self.standing.blocked:
            refusals.append(self.standing.blocked)
        elif self.standing.risk and not safe_because.strip():
            refusals.append(f"{self.standing.risk}; record why it is safe to approve anyway")
        return refusals


def approval_check(retry: Attempt, original: Attempt | None, approver: Person) -> ApprovalCheck:
    """Everything approving ``retry`` re-checks: the approver holds the
    approver role in the tenant and did not ask for the retry themselves;
    the retry is still authorized by the current policy, never wider than
    its original nor in another tenant; and neither the original nor any
    other attempt at the same side effect can have happened, by the
    provider's word (:func:`side_effect_standing`; or the approver says why
    approving is safe anyway; one that may yet be sent blocks whatever the
    reason). The move asks it again under row locks; the dashboard shows it
    beforehand. Without ``original`` (a first call waiting for approval)
    there is no original standing to weigh: the rest is the same."""
    authority: list[str] = []
    decide = moves_for(approver, retry).decide_retry
    if not decide and decide.because != Because.STATE:  # the role, or four eyes
        authority.append(decide.why_not)
    standing_now = standing_of(retry, original=original, approving=True)
    authority.extend(standing_now.changes)
    return ApprovalCheck(
        tuple(authority),
        side_effect_standing(retry, original) if original is not None else None,
        standing_now.policy.version if standing_now.policy else None,
        own=decide.because == Because.FOUR_EYES,
        hold_now=hold_of(standing_now.policy, retry.tool_name, retry.args) if standing_now.policy else None,
    )


def self_decision(attempt: Attempt) -> str:
    """Four eyes, in words: why the person who asked for it cannot decide it."""
    if attempt.parent_id is None:
        return "you triggered this call (its agent's token is yours); another approver must decide it"
    return "you requested this retry; another approver must decide it"


@dataclass(frozen=True)
class ApprovalVerdict:
    """What an approver would be told if they approved now, for a list of
    items awaiting approval: ``refusals`` (what refuses it whatever the
    approver says), else ``needs_reason`` (the risk the approver must say
    why it is safe to accept), else it would go through."""

    standing: OriginalStanding | None
    refusals: tuple[str, ...]
    needs_reason: str

    @property
    def word(self) -> str:
        if self.refusals:
            return "refused"
        return "needs a reason" if self.needs_reason else "approvable"

    @property
    def summary(self) -> str:
        if self.refusals:
            return "; ".join(self.refusals)
        if self.needs_reason:
            return f"{self.needs_reason}; approving needs a recorded reason why it is safe"
        return "approving would go through now"


def approval_verdict(attempt: Attempt, original: Attempt | None, approver: Person) -> ApprovalVerdict:
    """:func:`approval_check` for ``approver`` now, as a verdict a queue row
    shows. The move asks again, under locks, when the approver decides."""
    if attempt.parent_id is not None and original is None:
        return ApprovalVerdict(None, ("the original attempt of this linked retry is missing",), "")
    check = approval_check(attempt, original, approver)
    refusals = list(check.authority)
    standing = check.standing
    if standing is not None and standing.blocked:
        refusals.append(standing.blocked)
    risk = "" if refusals or standing is None else (standing.risk or "")
    return ApprovalVerdict(standing, tuple(refusals), risk)


class Because(StrEnum):
    """What kind of refusal a person's move meets: each is raised as its
    own error (:func:`require`)."""

    ROLE = "role"  # their role in the tenant (or none): RoleRequired
    FOUR_EYES = "four_eyes"  # they asked for it themselves: SelfApproval
    STATE = "state"  # the attempt is not where the move starts: IllegalTransition
    OWNERSHIP = "ownership"  # who owns it already rules the move out: OwnershipError


@dataclass(frozen=True)
class Allowed:
    """Whether a person may make one move now; ``why_not`` says why not,
    ``because`` what kind of refusal it is."""

    ok: bool
    why_not: str = ""
    because: Because | None = None

    def __bool__(self) -> bool:
        return self.ok

    def error(self, attempt: Attempt) -> LedgerError:
        """The refusal as the error a move raises."""
        assert not self.ok
        if self.because == Because.ROLE:
            return RoleRequired(self.why_not)
        if self.because == Because.FOUR_EYES:
            return SelfApproval(self.why_not, [self.why_not])
        if self.because == Because.OWNERSHIP:
            return OwnershipError(f"#{attempt.pk}: {self.why_not}")
        return IllegalTransition(f"#{attempt.pk}: {self.why_not}")


YES = Allowed(True)


def _state(ok: bool, why_not: str) -> Allowed:
    return YES if ok else Allowed(False, why_not, Because.STATE)


@dataclass(frozen=True)
class PeoplesMoves:
    """What a person may do to an attempt now, each with the reason when not.
    The moves ask again (:func:`require`) when the person decides."""

    read: Allowed
    claim: Allowed
    assign: Allowed
    unassign: Allowed
    comment: Allowed
    recheck: Allowed
    verify: Allowed
    mark_failed: Allowed
    request_retry: Allowed
    decide_retry: Allowed
    abandon: Allowed

    @property
    def operate(self) -> bool:
        return bool(self.comment)


#: Linked retries in these states keep their original from being retried again.
PENDING_RETRY_STATES = (S.MANUAL_REVIEW, S.INTENT_RECORDED, S.DISPATCHED)

#: The names of a person's moves (the fields of :class:`PeoplesMoves`).
MOVES = tuple(name for name in PeoplesMoves.__dataclass_fields__ if name != "read")


def moves_for(user: Person, attempt: Attempt, *, children: Sequence[Attempt] = ()) -> PeoplesMoves:
    """The moves ``user`` may make on ``attempt`` now (``children``: its linked
    retries, when the caller has read them), each refused first for the role
    (or membership), then for four eyes, then for the attempt's state."""
    membership = tenancy.role_in(user, attempt.tenant_id)
    # The tenant by name where the caller read it with the attempt (a page), else as "the tenant" (a move).
    tenant = attempt.tenant.slug if Attempt.tenant.is_cached(attempt) else "the tenant"
    not_operator = tenancy.refusal_by(user, membership, Role.OPERATOR, tenant=tenant)
    not_approver = tenancy.refusal_by(user, membership, Role.APPROVER, tenant=tenant)
    review = attempt.state == S.MANUAL_REVIEW
    awaiting = awaiting_approval(attempt)
    sent = attempt.dispatch_count > 0
    pending = next((c for c in children if c.state in PENDING_RETRY_STATES), None)
    never_sent = f"#{attempt.pk} was never sent: nothing at the provider to ask about"

    def operator_and(ok: bool, why_not: str, because: Because = Because.STATE) -> Allowed:
        if not_operator:
            return Allowed(False, not_operator, Because.ROLE)
        return YES if ok else Allowed(False, why_not, because)

    if not_approver:
        decide = Allowed(False, not_approver, Because.ROLE)
    elif awaiting and user is not None and user.pk == attempt.requested_by_id:
        decide = Allowed(False, self_decision(attempt), Because.FOUR_EYES)
    else:
        decide = _state(awaiting, f"it does not await approval (it is {attempt.state})")
    return PeoplesMoves(
        read=YES if membership is not None else Allowed(False, "you are not a member of this tenant", Because.ROLE),
        claim=operator_and(
            claimable(True, attempt.owner_id, getattr(user, "pk", None)), "you own it already", Because.OWNERSHIP
        ),
        assign=operator_and(True, ""),
        unassign=operator_and(
            attempt.owner_id is not None and attempt.state not in OWNED_STATES,
            f"{attempt.state} work must keep an owner" if attempt.owner_id else "nobody owns it",
            Because.OWNERSHIP,
        ),
        comment=operator_and(True, ""),
        recheck=operator_and(
            sent and attempt.state in (S.UNKNOWN, S.MANUAL_REVIEW),
            never_sent if not sent else "only UNKNOWN or MANUAL_REVIEW work is looked up again",
        ),
        verify=operator_and(sent and review, never_sent if not sent else "only work under review is verified"),
        mark_failed=operator_and(
            review and not awaiting,
            "what awaits approval is rejected by an approver" if awaiting else "only work under review",
        ),
        request_retry=operator_and(
            review and not awaiting and pending is None,
            f"linked retry #{pending.pk} is pending already"
            if pending is not None
            else "what awaits approval is approved or rejected, not retried"
            if awaiting
            else "only work under review can be retried",
        ),
        decide_retry=decide,
        abandon=operator_and(attempt.state == S.INTENT_RECORDED, "only an intent that was never sent"),
    )


def require(user: Person, attempt: Attempt, move: str) -> None:
    """Raise the refusal :func:`moves_for` gives ``user`` for ``move`` on
    ``attempt``: the one question every person's move asks, under the row
    lock, whatever path the decision came by (dashboard, bulk, API, a
    script). ``attempt`` is as the caller locked it; its pending linked
    retries are read here when the move needs them."""
    children: Sequence[Attempt] = ()
    if move == "request_retry":
        children = list(attempt.children.filter(state__in=PENDING_RETRY_STATES).order_by("id")[:1])
    allowed: Allowed = getattr(moves_for(user, attempt, children=children), move)
    if not allowed:
        raise allowed.error(attempt)


def may_own(owner: Person, attempt: Attempt) -> Allowed:
    """Whether ``owner`` may be given ``attempt``: owning work means acting
    on it, so they need the operator role in its tenant."""
    missing = tenancy.refusal(owner, attempt.tenant_id, Role.OPERATOR, tenant=attempt.tenant.slug)
    return Allowed(False, missing, Because.ROLE) if missing else YES


def claimable(operates: bool, owner_id: int | None, user_pk: int | None) -> bool:
    """Whether a person who operates the tenant (or not) may claim work
    owned by ``owner_id``: :func:`moves_for`'s claim rule, for a list that
    knows the roles of its page without asking per row."""
    return operates and owner_id != user_pk


@dataclass(frozen=True)
class IncidentMoves:
    """What a person may do to an incident now."""

    claim: Allowed
    assign: Allowed
    resolve: Allowed

    @property
    def operate(self) -> bool:
        return self.resolve.because != Because.ROLE


def incident_moves_for(user: Person, incident: Incident) -> IncidentMoves:
    """The moves ``user`` may make on ``incident``: operators of its tenant
    own and resolve open incidents."""
    missing = tenancy.refusal(user, incident.tenant_id, Role.OPERATOR)
    if missing:
        refused = Allowed(False, missing, Because.ROLE)
        return IncidentMoves(refused, refused, refused)
    is_open = incident.status == Incident.Status.OPEN
    closed = f"incident #{incident.pk} is already {incident.status}"
    return IncidentMoves(
        claim=_state(
            is_open and incident.owner_id != getattr(user, "pk", None), closed if not is_open else "you own it already"
        ),
        assign=_state(is_open, closed),
        resolve=_state(is_open, closed),
    )


def require_incident(user: Person, incident: Incident, move: str) -> None:
    """:func:`require` for an incident's moves (``claim`` or ``resolve``)."""
    allowed: Allowed = getattr(incident_moves_for(user, incident), move)
    if not allowed:
        raise RoleRequired(allowed.why_not) if allowed.because == Because.ROLE else IncidentError(allowed.why_not)

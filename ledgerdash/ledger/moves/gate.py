"""What the ledger knows, and what an approval was given under, gate every send.

A request leaves only if nothing recorded about its side effect says it
happened or could still happen (:func:`ledgerdash.ledger.rules.send_verdict`),
asked under the row locks of every attempt at the side effect by every path
that sends: the agent's dispatch, the reconciler's, a linked retry's, the
MCP gateway's (all of them claim through
:func:`ledgerdash.ledger.moves.agent.attempt_dispatch`). An approved call
the current policy holds by a rule its approval was not given under goes
back to the approvals queue (:func:`hold_again`)."""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from ledgerdash.ledger import clock, rules
from ledgerdash.ledger.authority import Authority, authority_of, standing_under
from ledgerdash.ledger.errors import AlreadyHappened, AttemptNotFound, AwaitingApproval, SideEffectInFlight
from ledgerdash.ledger.events import Actor, clean_text
from ledgerdash.ledger.models import Attempt, FailedBecause
from ledgerdash.ledger.moves.base import S, check_fence, move
from ledgerdash.ledger.moves.evidence import incident_opened, not_sent_incident
from ledgerdash.ledger.store import Guard


def dispatch_unless_known(
    attempt: Attempt, *, actor: Actor, fence: int | None, claim: Callable[[Authority, Guard | None], Attempt | None]
) -> Attempt:
    """The dispatch claim of an attempt that is not a first call's first
    send, made under the row locks of every attempt at its side effect, in
    the order every path locks them (by id), so that no report of another
    attempt's effect can commit between the question and the claim: the
    claim is made only if :func:`ledgerdash.ledger.rules.send_verdict`
    lets the request leave. When the side effect happened, the attempt is
    settled instead (:func:`not_sent`) and :class:`AlreadyHappened` says
    so; while a request may still land, nothing is written and
    :class:`SideEffectInFlight` says until when."""
    settled: Attempt | None = None
    with transaction.atomic():
        chain = list(
            Attempt.objects.select_for_update()
            .filter(tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key)
            .order_by("id")
        )
        current = next((each for each in chain if each.pk == attempt.pk), None)
        if current is None:
            raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=attempt.pk))
        verdict = rules.send_verdict(current, chain=chain)
        if verdict.happened:
            check_fence(attempt, fence)
            settled = not_sent(attempt, actor=actor, verdict=verdict)
        elif verdict:
            authority = authority_of(attempt.tenant_id, attempt.tool_name)
            if standing_under(attempt, authority).holds:
                claimed = claim(authority, None)
                assert claimed is not None
                return claimed
    if settled is not None:
        raise AlreadyHappened(AlreadyHappened.MESSAGE.format(attempt_id=attempt.pk, why=verdict.happened), settled)
    if verdict.waits:
        after = f"after {rules.when(verdict.until)}" if verdict.until else "once it has settled"
        raise SideEffectInFlight(
            SideEffectInFlight.MESSAGE.format(attempt_id=attempt.pk, why=verdict.waits, after=after),
            attempt,
            due=verdict.until,
        )
    # The authority changed: refused outside the locks, as any dispatch is (it is reviewed beside a linked attempt).
    claimed = claim(authority_of(attempt.tenant_id, attempt.tool_name), None)
    assert claimed is not None
    return claimed


def not_sent(attempt: Attempt, *, actor: Actor, verdict: rules.SendVerdict) -> Attempt:
    """Settle ``attempt``, which must not be sent because another attempt at
    its side effect acted (``verdict``), and open the incident that tells
    its people: one never sent fails as such (nothing of it can have
    happened, and what it was for did); one sent before goes to a person,
    who settles what its own earlier requests did."""
    assert verdict.by is not None
    never_sent = attempt.dispatch_count == 0
    reason = f"not sent: {verdict.happened}"
    now = clock.now()
    incident = not_sent_incident(attempt, verdict, now=now)
    opened = incident_opened(incident, actor, now)
    if never_sent:
        return move(
            attempt,
            to_state=S.FAILED,
            actor=actor,
            fence=None,
            reason=reason,
            updates={"last_error": clean_text(reason), "failed_because": FailedBecause.ALREADY_HAPPENED},
            details={"happened": verdict.happened, "acted": verdict.by, "incident_id": incident.pk},
            extra_events=[opened],
            now=now,
        )
    return move(
        attempt,
        to_state=S.MANUAL_REVIEW,
        actor=actor,
        fence=None,
        reason=f"{reason}; a person settles what its own earlier requests did",
        details={"happened": verdict.happened, "acted": verdict.by, "incident_id": incident.pk},
        extra_events=[opened],
        now=now,
    )


def hold_again(attempt: Attempt, *, actor: Actor, fence: int | None, why: str) -> None:
    """INTENT_RECORDED -> MANUAL_REVIEW, awaiting a fresh approval: an
    approver let this call through, but the current policy holds it by a
    rule the approval was not given under (``why``). Nothing was sent; the
    approval is undone (its event stays in the chain), and the approvals
    queue shows the reason. Raises :class:`AwaitingApproval`."""
    held = move(
        attempt,
        to_state=S.MANUAL_REVIEW,
        actor=actor,
        fence=fence,
        reason=f"held again for approval: {why}",
        updates={
            "approved_at": None,
            "approved_by_id": None,
            "approved_policy_version": None,
            "approved_hold": None,
            "approval_required": clean_text(why)[:1000],
            "next_check_at": None,
        },
        details={
            "held_again": why,
            "approved_by_id": attempt.approved_by_id,
            "approved_policy_version": attempt.approved_policy_version,
            "approved_hold": attempt.approved_hold,
        },
    )
    raise AwaitingApproval(AwaitingApproval.MESSAGE.format(attempt_id=held.pk, why=held.approval_required), held)

"""The approver's endpoints: what awaits approval, and a person's yes or no.

A token with the ``approvals:decide`` scope acts for one person (the token's
``person``; such a token never also writes, so the token that records a call
cannot approve it). Each request checks that the person is an approver (or
admin) of the token's tenant *now*, and the decision runs the same ledger
function as the dashboard's buttons (:func:`ledgerdash.ledger.moves.retry_approve`,
:func:`~ledgerdash.ledger.moves.retry_reject`), with every re-check it makes
under row locks: the current policy and tenant, never wider than the
original, four eyes (whoever requested the retry, or issued the token of the
agent that made the call, cannot approve it), and the original's standing by
the provider's word unless ``safe_because`` says why it is safe.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from ledgerdash.ledger import moves, rules, tenancy
from ledgerdash.ledger.api.attempts import READ_ERRORS, WRITE_ERRORS, AttemptId, _only_params, _whole
from ledgerdash.ledger.api.auth import DECIDE, BearerToken, token_of
from ledgerdash.ledger.api_schemas import ApprovalListOut, ApproveIn, AttemptOut, RejectIn
from ledgerdash.ledger.errors import RoleRequired
from ledgerdash.ledger.events import Actor, ActorKind
from ledgerdash.ledger.models import Attempt, Role

router = Router()


def _person_actor(request: HttpRequest) -> tuple[Any, Actor]:
    """The token's person, an approver of its tenant now, and the actor the events name."""
    token = token_of(request)
    person = token.person
    refused = "the token acts for nobody" if person is None else tenancy.refusal(person, token.tenant_id, Role.APPROVER)
    if refused:
        raise RoleRequired(f"API token {token.prefix} may not decide approvals now: {refused}")
    assert person is not None
    return person, Actor(ActorKind.USER, f"{person.get_username()} via token {token.prefix}", person.pk)


def _decision(request: HttpRequest, attempt_id: int) -> tuple[Attempt, Actor]:
    """The token's tenant's attempt a decision is about (another tenant's is a 404), and who decides."""
    _only_params(request)
    _, actor = _person_actor(request)
    return moves.get_attempt(attempt_id, tenant_id=token_of(request).tenant_id), actor


@router.get(
    "/approvals",
    auth=BearerToken(DECIDE),
    response={200: ApprovalListOut, **READ_ERRORS},
    operation_id="list_approvals",
    summary="What awaits approval in the token's tenant, oldest first, with what approving would meet now",
    description=(
        "Linked retries and first calls the policy held, each with the ledger's verdict for the token's person "
        "now (the decision checks again, under locks). 403 role_required: the person is not an approver or "
        "admin of the tenant (any more)."
    ),
)
def list_approvals(request: HttpRequest, limit: int = Query(50, ge=1, le=200)) -> dict[str, Any]:
    _only_params(request, frozenset({"limit"}))
    person, _ = _person_actor(request)
    rows = list(
        Attempt.objects.filter(rules.awaiting_approval_filter(), tenant_id=token_of(request).tenant_id)
        .select_related("owner")
        .order_by("id")[:limit]
    )
    originals = Attempt.objects.select_related("owner").in_bulk([a.parent_id for a in rows if a.parent_id])
    items = []
    for attempt in rows:
        original = originals.get(attempt.parent_id) if attempt.parent_id is not None else None
        verdict = rules.approval_verdict(attempt, original, person)
        items.append(
            {
                "attempt": attempt,
                "original": original,
                "verdict": verdict.word,
                "summary": verdict.summary,
                "needs_reason": verdict.needs_reason,
            }
        )
    return {"items": items}


@router.post(
    "/approvals/{attempt_id}/approve",
    auth=BearerToken(DECIDE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="approve",
    summary="Approve a linked retry, or a first call the policy held",
    description=(
        "MANUAL_REVIEW -> INTENT_RECORDED (a linked retry's original under review is superseded). 409 "
        "approval_refused (`changes` says what no longer holds; the refusal is recorded), self_approval, "
        "stale_fence (it moved since the list), illegal_transition (nothing to approve). 403 role_required."
    ),
)
def approve(request: HttpRequest, payload: ApproveIn, attempt_id: int = AttemptId) -> AttemptOut:
    attempt, actor = _decision(request, attempt_id)
    decided = moves.retry_approve(
        attempt=attempt,
        actor=actor,
        comment=payload.comment,
        safe_because=payload.safe_because,
        fence=payload.fence,
    )
    return _whole(decided)


@router.post(
    "/approvals/{attempt_id}/reject",
    auth=BearerToken(DECIDE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="reject",
    summary="Reject a linked retry, or a first call the policy held: it will not be sent",
    description=(
        "MANUAL_REVIEW -> FAILED for good, with the comment as the reason the agent is told "
        "(approval_rejected). 409 stale_fence, illegal_transition. 403 role_required."
    ),
)
def reject(request: HttpRequest, payload: RejectIn, attempt_id: int = AttemptId) -> AttemptOut:
    attempt, actor = _decision(request, attempt_id)
    return _whole(moves.retry_reject(attempt=attempt, actor=actor, comment=payload.comment, fence=payload.fence))

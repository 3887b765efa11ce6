"""People's decisions: ownership, comments, verifying or failing an attempt,
asking for a re-check, requesting, approving and rejecting linked retries.

Each locks the attempt, checks the version (fence) the person saw is still
the attempt's, and records who decided and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db import transaction

from ledgerdash.ledger import clock
from ledgerdash.ledger.authority import current_policy
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    AttemptNotFound,
    IllegalTransition,
    InvalidField,
    OwnershipError,
    RequestIdConflict,
    SelfApproval,
)
from ledgerdash.ledger.models import (
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    FailedBecause,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, append_events, clean_text
from ledgerdash.ledger.moves.agent import attempt_abandon_intent
from ledgerdash.ledger.moves.base import (
    S,
    check_move,
    get_attempt,
    locked_for_decision,
    move,
    only_from,
    required,
    validate_ref,
)
from ledgerdash.ledger.moves.create import create_retry_under
from ledgerdash.ledger.rules import approval_check


def attempt_assign(
    *, attempt: Attempt, owner: AbstractBaseUser | None, actor: Actor, reason: str = "", expected_owner_id: Any = ...
) -> Attempt:
    """Give an attempt to ``owner`` (None: unassign), recording who and why.

    ``expected_owner_id``: the owner the caller saw; if it changed meanwhile,
    refuse rather than silently take the item from someone else.
    """
    attempt_id = attempt.pk
    with transaction.atomic():
        attempt = get_attempt(attempt_id, lock=True)
        if expected_owner_id is not ... and attempt.owner_id != expected_owner_id:
            raise OwnershipError(f"attempt {attempt_id} is now owned by someone else; reload and try again")
        new_owner_id = owner.pk if owner is not None else None
        if attempt.owner_id == new_owner_id:
            return attempt
        if new_owner_id is None and attempt.state in OWNED_STATES:
            raise OwnershipError(f"attempt {attempt_id} is {attempt.state} and must keep an owner")
        previous = attempt.owner_id
        now = clock.now()
        Attempt.objects.filter(pk=attempt.pk).update(owner_id=new_owner_id, updated_at=now)
        attempt.owner_id = new_owner_id
        append_events(
            [
                EventDraft(
                    attempt.tenant_id,
                    attempt.pk,
                    EventKind.OWNER,
                    actor,
                    fence=attempt.fence,
                    reason=reason or ("claimed" if new_owner_id == actor.user_id else "assigned"),
                    details={"from_user_id": previous, "to_user_id": new_owner_id},
                )
            ],
            now=now,
        )
    return attempt


def attempt_comment(*, attempt: Attempt, actor: Actor, text: str) -> AttemptEvent:
    attempt_id = attempt.pk
    text = text.strip()
    if not text:
        raise InvalidField(InvalidField.EMPTY.format(field="comment"))
    with transaction.atomic():
        attempt = get_attempt(attempt_id)
        (event,) = append_events(
            [EventDraft(attempt.tenant_id, attempt.pk, EventKind.COMMENT, actor, fence=attempt.fence, reason=text)]
        )
    return event


def attempt_verify(
    *,
    attempt: Attempt,
    actor: Actor,
    evidence: str,
    provider_request_id: str = "",
    fence: int | None = None,
) -> Attempt:
    """MANUAL_REVIEW -> OUTCOME_CONFIRMED: an operator verified it at the provider."""
    attempt_id = attempt.pk
    evidence = required(evidence, "evidence")
    provider_request_id = validate_ref(provider_request_id.strip(), "provider_request_id", 255)
    with transaction.atomic():
        attempt = locked_for_decision(attempt_id, fence)
        _never_sent(attempt, "verify")
        updates: dict[str, Any] = {"result_ref": clean_text(evidence)[:1000]}
        if provider_request_id:
            if attempt.provider_request_id and attempt.provider_request_id != provider_request_id:
                raise RequestIdConflict(
                    RequestIdConflict.MESSAGE.format(
                        attempt_id=attempt_id, existing=attempt.provider_request_id, given=provider_request_id
                    )
                )
            updates["provider_request_id"] = provider_request_id
        return move(
            attempt,
            to_state=S.OUTCOME_CONFIRMED,
            actor=actor,
            fence=None,
            reason=f"verified at the provider by {actor.label}: {evidence}",
            updates=updates,
            details={"evidence": evidence, "provider_request_id": provider_request_id or attempt.provider_request_id},
        )


def attempt_mark_failed(
    *, attempt: Attempt, actor: Actor, reason: str, fence: int | None = None, kind: str = "marked failed"
) -> Attempt:
    """MANUAL_REVIEW -> FAILED: a person decided it did not happen (or must not).

    A person's "failed" is a claim with their reason, not the provider's
    word: approving a retry of an attempt failed this way still needs the
    approver's recorded reason, unless the attempt was never sent.
    """
    attempt_id = attempt.pk
    reason = required(reason, "reason")
    with transaction.atomic():
        attempt = locked_for_decision(attempt_id, fence)
        only_from(attempt, S.MANUAL_REVIEW, f"{kind} is decided")
        because = FailedBecause.REJECTED if attempt.dispatch_count == 0 else FailedBecause.PERSON
        return move(
            attempt,
            to_state=S.FAILED,
            actor=actor,
            fence=None,
            reason=f"{kind} by {actor.label}: {reason}",
            updates={"last_error": clean_text(reason), "failed_because": because},
            details={"comment": reason, "failed_because": because},
        )


def intent_abandon(*, attempt: Attempt, actor: Actor, reason: str, fence: int | None = None) -> Attempt:
    """An operator gives up an intent nobody sent (see :func:`attempt_abandon_intent`)."""
    attempt_id = attempt.pk
    reason = required(reason, "reason")
    with transaction.atomic():
        attempt = locked_for_decision(attempt_id, fence)
        return attempt_abandon_intent(attempt=attempt, fence=attempt.fence, actor=actor, reason=reason)


def attempt_recheck(*, attempt: Attempt, actor: Actor, reason: str = "") -> Attempt:
    """Ask the reconciler to look again now: MANUAL_REVIEW -> UNKNOWN (checks
    start over), or, for an UNKNOWN attempt, just make it due now."""
    attempt_id = attempt.pk
    now = clock.now()
    with transaction.atomic():
        attempt = get_attempt(attempt_id, lock=True)
        _never_sent(attempt, "look up")
        note = reason.strip() or "re-check requested"
        if attempt.state == S.UNKNOWN:
            Attempt.objects.filter(pk=attempt.pk).update(next_check_at=now, updated_at=now)
            attempt.next_check_at = now
            append_events(
                [EventDraft(attempt.tenant_id, attempt.pk, EventKind.RECHECK, actor, fence=attempt.fence, reason=note)],
                now=now,
            )
            return attempt
        return move(
            attempt,
            to_state=S.UNKNOWN,
            actor=actor,
            fence=None,
            reason=f"{note} (by {actor.label})",
            updates={"check_count": 0, "next_check_at": now},
            now=now,
        )


def retry_request(*, attempt: Attempt, actor: Actor, reason: str) -> Attempt:
    """An operator asks for a linked retry of an attempt under review, under
    the tenant's current policy. Someone else must approve it."""
    attempt_id = attempt.pk
    reason = required(reason, "reason")
    with transaction.atomic():
        original = get_attempt(attempt_id, lock=True)
        if original.state != S.MANUAL_REVIEW:
            raise IllegalTransition(f"only an attempt under review can be retried; #{attempt_id} is {original.state}")
        pending = original.children.filter(state__in=[S.MANUAL_REVIEW, S.INTENT_RECORDED, S.DISPATCHED]).first()
        if pending is not None:
            raise IllegalTransition(f"attempt #{attempt_id} already has a pending linked retry #{pending.pk}")
        policy = current_policy(original.tenant_id)
        allowed = policy.scopes_for(original.tool_name) if policy else None
        if policy is None or allowed is None:
            raise IllegalTransition(f"tool {original.tool_name} is not allowed by the tenant's current policy")
        return create_retry_under(
            policy,
            allowed,
            original=original,
            actor=actor,
            reason=f"retry requested by {actor.label}: {reason}",
            requested_by_id=actor.user_id,
        )


def _never_sent(attempt: Attempt, what: str) -> None:
    # A linked attempt nobody sent has nothing at the provider to look up or
    # verify; re-checking it would hand it to the reconciler unapproved.
    if attempt.state == S.MANUAL_REVIEW and attempt.dispatch_count == 0:
        raise IllegalTransition(
            f"#{attempt.pk} was never sent, so there is nothing to {what}; approve or reject it instead"
        )


def retry_approve(
    *,
    attempt: Attempt,
    actor: Actor,
    comment: str,
    safe_because: str = "",
    fence: int | None = None,
) -> Attempt:
    """Approve a linked retry: MANUAL_REVIEW -> INTENT_RECORDED, and its
    original (if under review) -> RECONCILED, superseded by it.

    Re-checks under row locks, in this transaction, everything
    :func:`~ledgerdash.ledger.rules.approval_check` asks (the approver's
    role now, four eyes, the current policy, never wider, and the original's
    standing by the provider's word unless ``safe_because`` says why it is
    safe). A refusal is recorded as an event and raised as
    :class:`ApprovalRefused`. A decision is single-use: a second approval
    finds it decided.
    """
    attempt_id = attempt.pk
    comment = required(comment, "comment")
    refusal: ApprovalRefused | None = None
    with transaction.atomic():
        peek = get_attempt(attempt_id)
        if peek.parent_id is None:
            raise IllegalTransition(f"attempt #{attempt_id} is not a linked retry")
        # Lock parent before child: every path locks the older row first.
        original = get_attempt(peek.parent_id, lock=True)
        retry = locked_for_decision(attempt_id, fence)
        check_move(retry, S.INTENT_RECORDED, actor)
        approver = get_user_model().objects.filter(pk=actor.user_id).first() if actor.user_id else None
        check = approval_check(retry, original, approver)
        standing = check.standing
        changes = check.refusals(safe_because=safe_because)
        if changes:
            error = SelfApproval if approver is not None and approver.pk == retry.requested_by_id else ApprovalRefused
            message = (
                SelfApproval.MESSAGE.format(user=actor.label)
                if error is SelfApproval
                else ApprovalRefused.MESSAGE.format(attempt_id=attempt_id, changes="; ".join(changes))
            )
            refusal = error(message, changes)
        if refusal is not None:
            append_events(
                [
                    EventDraft(
                        retry.tenant_id,
                        retry.pk,
                        EventKind.APPROVAL_REFUSED,
                        actor,
                        fence=retry.fence,
                        reason=str(refusal),
                        details={"changes": changes, "comment": comment},
                    )
                ]
            )
        else:
            now = clock.now()
            details = {
                "comment": comment,
                "original_id": original.pk,
                "original_state": original.state,
                "original_last_lookup": original.last_lookup,
                "original_standing": {"proof": standing.proof, "risk": standing.risk},
                "policy_version": retry.policy_version,
                "policy_version_now": check.policy_version_now,
            }
            if safe_because.strip():
                details["safe_because"] = safe_because.strip()
            if original.state == S.MANUAL_REVIEW:
                move(
                    original,
                    to_state=S.RECONCILED,
                    actor=actor,
                    fence=None,
                    reason=f"superseded by approved linked retry #{retry.pk}",
                    details={"retry_id": retry.pk, "comment": comment},
                    now=now,
                )
            return move(
                retry,
                to_state=S.INTENT_RECORDED,
                actor=actor,
                fence=None,
                reason=f"retry approved by {actor.label}: {comment}",
                updates={"approved_by_id": actor.user_id, "approved_at": now, "next_check_at": now},
                details=details,
                now=now,
            )
    assert refusal is not None
    raise refusal


def retry_reject(*, attempt: Attempt, actor: Actor, comment: str, fence: int | None = None) -> Attempt:
    """Reject a linked retry: MANUAL_REVIEW -> FAILED. The original stays as it is."""
    attempt_id = attempt.pk
    peek = get_attempt(attempt_id)
    if peek.parent_id is None:
        raise IllegalTransition(f"attempt #{attempt_id} is not a linked retry")
    return attempt_mark_failed(attempt=attempt, actor=actor, reason=comment, fence=fence, kind="retry rejected")


def attempts_assign(
    *,
    attempt_ids: Sequence[int],
    owner: AbstractBaseUser,
    actor: Actor,
    expected_owner_ids: Mapping[int, int | None],
    reason: str = "",
) -> list[Attempt]:
    """Give several attempts to ``owner`` at once: all of them, or none.

    ``expected_owner_ids`` maps each attempt to the owner the caller showed
    in its preview; if any of them changed meanwhile, nothing is written
    (the preview no longer says what would happen). Attempts ``owner``
    already holds are left as they are. Each change is its own event, with
    who, why, and the size of the batch.
    """
    ids = sorted(set(attempt_ids))
    missing_expectation = [pk for pk in ids if pk not in expected_owner_ids]
    if missing_expectation:
        raise OwnershipError(f"no previewed owner for attempts {missing_expectation}; preview the assignment first")
    with transaction.atomic():
        # One lock order (by id) for every writer that locks several attempts.
        attempts = list(Attempt.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
        found = {a.pk for a in attempts}
        for pk in ids:
            if pk not in found:
                raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=pk))
        changed = [a.pk for a in attempts if a.owner_id != expected_owner_ids[a.pk]]
        if changed:
            listed = ", ".join(f"#{pk}" for pk in changed)
            raise OwnershipError(
                f"the owner of {listed} changed since the preview; nothing was assigned, preview again"
            )
        moving = [a for a in attempts if a.owner_id != owner.pk]
        if not moving:
            return attempts
        now = clock.now()
        Attempt.objects.filter(pk__in=[a.pk for a in moving]).update(owner_id=owner.pk, updated_at=now)
        note = clean_text(reason.strip()) or f"assigned to {owner.get_username()}"
        events = []
        for attempt in moving:
            events.append(
                EventDraft(
                    attempt.tenant_id,
                    attempt.pk,
                    EventKind.OWNER,
                    actor,
                    fence=attempt.fence,
                    reason=note,
                    details={"from_user_id": attempt.owner_id, "to_user_id": owner.pk, "batch_size": len(moving)},
                )
            )
            attempt.owner_id = owner.pk
            attempt.updated_at = now
        append_events(events, now=now)
    return attempts

"""People's decisions: ownership, comments, verifying or failing an attempt,
asking for a re-check, requesting, approving and rejecting linked retries.

Each locks the attempt, checks the version (fence) the person saw is still
the attempt's, and records who decided and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from ledgerdash.ledger import clock
from ledgerdash.ledger.authority import authorize, current_policy
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    AttemptNotFound,
    InvalidField,
    OwnershipError,
    RequestIdConflict,
    SelfApproval,
    StaleFence,
)
from ledgerdash.ledger.models import (
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    FailedBecause,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, clean_text
from ledgerdash.ledger.moves.agent import attempt_abandon_intent
from ledgerdash.ledger.moves.base import (
    S,
    check_move,
    get_attempt,
    locked_for_decision,
    move,
    only_from,
    person_may,
    person_of,
    required,
    validate_ref,
)
from ledgerdash.ledger.moves.create import create_retry_under
from ledgerdash.ledger.rules import ApprovalCheck, Because, approval_check, may_own, moves_for
from ledgerdash.ledger.store import append_events


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
        new_owner_id = owner.pk if owner is not None else None
        person_may(actor, attempt, _ownership_move(actor, new_owner_id))
        if expected_owner_id is not ... and attempt.owner_id != expected_owner_id:
            raise OwnershipError(f"attempt {attempt_id} is now owned by someone else; reload and try again")
        if attempt.owner_id == new_owner_id:
            return attempt
        if new_owner_id is None and attempt.state in OWNED_STATES:
            raise OwnershipError(f"attempt {attempt_id} is {attempt.state} and must keep an owner")
        if owner is not None and not (allowed := may_own(owner, attempt)):
            raise OwnershipError(f"#{attempt_id} cannot be given to them: {allowed.why_not}")
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


def _ownership_move(actor: Actor, new_owner_id: int | None) -> str:
    if new_owner_id is None:
        return "unassign"
    return "claim" if new_owner_id == actor.user_id else "assign"


def attempt_comment(*, attempt: Attempt, actor: Actor, text: str) -> AttemptEvent:
    attempt_id = attempt.pk
    text = text.strip()
    if not text:
        raise InvalidField(InvalidField.EMPTY.format(field="comment"))
    with transaction.atomic():
        attempt = get_attempt(attempt_id)
        person_may(actor, attempt, "comment")
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
        person_may(actor, attempt, "verify")
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
    approver's recorded reason, unless the attempt was never sent. What
    awaits approval is not marked failed but rejected (:func:`retry_reject`,
    an approver's decision with four eyes).
    """
    return _failed_by_person(attempt, actor, reason, fence, kind, "mark_failed")


def _failed_by_person(attempt: Attempt, actor: Actor, reason: str, fence: int | None, kind: str, rule: str) -> Attempt:
    attempt_id = attempt.pk
    reason = required(reason, "reason")
    with transaction.atomic():
        attempt = locked_for_decision(attempt_id, fence)
        if actor.user_id is None:
            only_from(attempt, S.MANUAL_REVIEW, f"{kind} is decided")
        person_may(actor, attempt, rule)
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
        person_may(actor, attempt, "abandon")
        return attempt_abandon_intent(attempt=attempt, fence=attempt.fence, actor=actor, reason=reason)


def attempt_recheck(*, attempt: Attempt, actor: Actor, reason: str = "") -> Attempt:
    """Ask the reconciler to look again now: MANUAL_REVIEW -> UNKNOWN (checks
    start over), or, for an UNKNOWN attempt, just make it due now."""
    attempt_id = attempt.pk
    now = clock.now()
    with transaction.atomic():
        attempt = get_attempt(attempt_id, lock=True)
        person_may(actor, attempt, "recheck")
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
        person_may(actor, original, "request_retry")
        policy = current_policy(original.tenant_id)
        # The one authority check every call passes: the tenant active, a policy, the tool allowed.
        allowed = authorize(original.tenant, policy, original.tool_name)
        assert policy is not None  # authorize refuses a tenant without one
        return create_retry_under(
            policy,
            allowed,
            original=original,
            actor=actor,
            reason=f"retry requested by {actor.label}: {reason}",
            requested_by_id=actor.user_id,
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
        original: Attempt | None = None
        if peek.parent_id is not None:
            # Every attempt at the side effect, older rows first (as every path
            # locks them): the approval weighs them all (rules.side_effect_standing).
            list(
                Attempt.objects.select_for_update()
                .filter(tenant_id=peek.tenant_id, idempotency_key=peek.idempotency_key)
                .order_by("id")
                .values_list("pk", flat=True)
            )
            original = get_attempt(peek.parent_id, lock=True)
        retry = locked_for_decision(attempt_id, fence)
        approver = person_of(actor)
        decide = moves_for(approver, retry).decide_retry
        if not decide and decide.because == Because.STATE:
            # Only what awaits approval: a sent retry back under review is
            # settled as any sent attempt is, never approved a second time.
            raise decide.error(retry)
        check = approval_check(retry, original, approver)  # the role and four eyes, recorded when refused
        standing = check.standing
        changes = check.refusals(safe_because=safe_because)
        if changes:
            error = SelfApproval if check.own else ApprovalRefused
            message = (
                (SelfApproval.MESSAGE if original is not None else SelfApproval.FIRST_CALL).format(user=actor.label)
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
        elif original is None:
            check_move(retry, S.INTENT_RECORDED, actor)
            return _approve_first_call(retry, actor=actor, comment=comment, check=check)
        else:
            now = clock.now()
            details = {
                "comment": comment,
                "original_id": original.pk,
                "original_state": original.state,
                "original_last_lookup": original.last_lookup,
                "original_standing": {"proof": standing.proof, "risk": standing.risk} if standing else None,
                "policy_version": retry.policy_version,
                "policy_version_now": check.policy_version_now,
                "approved_hold": check.hold_now,
            }
            if safe_because.strip():
                details["safe_because"] = safe_because.strip()
            check_move(retry, S.INTENT_RECORDED, actor)
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
                updates={
                    "approved_by_id": actor.user_id,
                    "approved_at": now,
                    "approved_policy_version": check.policy_version_now,
                    "approved_hold": check.hold_now,
                    "next_check_at": now,
                },
                details=details,
                now=now,
            )
    assert refusal is not None
    raise refusal


def _approve_first_call(retry: Attempt, *, actor: Actor, comment: str, check: ApprovalCheck) -> Attempt:
    """A first call its policy held for approval may go out now:
    MANUAL_REVIEW -> INTENT_RECORDED. Its agent's next call for the same key
    and arguments dispatches it; an agent that does not come back within the
    intent lease leaves it to be abandoned (nothing was sent)."""
    now = clock.now()
    return move(
        retry,
        to_state=S.INTENT_RECORDED,
        actor=actor,
        fence=None,
        reason=f"approved by {actor.label}: {comment}",
        updates={
            "approved_by_id": actor.user_id,
            "approved_at": now,
            "approved_policy_version": check.policy_version_now,
            "approved_hold": check.hold_now,
            "next_check_at": now + timedelta(seconds=settings.LEDGER_INTENT_LEASE_SECONDS),
        },
        details={
            "comment": comment,
            "approval_required": retry.approval_required,
            "policy_version": retry.policy_version,
            "policy_version_now": check.policy_version_now,
            "approved_hold": check.hold_now,
        },
        now=now,
    )


def retry_reject(*, attempt: Attempt, actor: Actor, comment: str, fence: int | None = None) -> Attempt:
    """Reject a linked retry, or a first call awaiting approval:
    MANUAL_REVIEW -> FAILED, for good, with the approver's reason (the agent
    is told it). A rejected retry's original stays as it is."""
    kind = "retry rejected" if attempt.parent_id is not None else "rejected"
    return _failed_by_person(attempt, actor, comment, fence, kind, "decide_retry")


def _lock_all(ids: Sequence[int]) -> list[Attempt]:
    """Lock these attempts, in one order (by id) for every writer that locks
    several, so two batches never deadlock; every one must exist."""
    attempts = list(Attempt.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
    found = {a.pk for a in attempts}
    for pk in ids:
        if pk not in found:
            raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=pk))
    return attempts


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
        attempts = _lock_all(ids)
        changed = [a.pk for a in attempts if a.owner_id != expected_owner_ids[a.pk]]
        if changed:
            listed = ", ".join(f"#{pk}" for pk in changed)
            raise OwnershipError(
                f"the owner of {listed} changed since the preview; nothing was assigned, preview again"
            )
        moving = [a for a in attempts if a.owner_id != owner.pk]
        for attempt in moving:
            person_may(actor, attempt, _ownership_move(actor, owner.pk))
            if not (allowed := may_own(owner, attempt)):
                raise OwnershipError(f"#{attempt.pk} cannot be given to them: {allowed.why_not}")
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


#: The decisions that can be made on several attempts at once, and what each does.
BULK_DECISIONS = ("recheck", "fail", "reject")


def attempts_decide(
    *,
    decision: str,
    attempt_ids: Sequence[int],
    expected: Mapping[int, tuple[int, int | None]],
    actor: Actor,
    reason: str,
) -> list[Attempt]:
    """Make one decision on several attempts at once: all of them, or none.

    ``decision``: ``recheck`` (:func:`attempt_recheck`), ``fail``
    (:func:`attempt_mark_failed`, ``reason`` the evidence that it did not
    happen) or ``reject`` (:func:`retry_reject`: what awaits approval).
    ``expected`` maps each attempt to the (fence, owner) its preview showed;
    if any attempt moved on or changed hands since, nothing is done (the
    preview no longer says what would happen). Each attempt's move checks
    itself as it does alone, in the same transaction: one refusal undoes
    the batch. Each change is the move's own event, its reason naming the
    batch.
    """
    if decision not in BULK_DECISIONS:
        raise InvalidField(f"no such decision on several attempts: {decision!r}")
    reason = required(reason, "evidence" if decision == "fail" else "reason")
    ids = sorted(set(attempt_ids))
    if not ids:
        raise InvalidField("select some attempts first")
    missing = [pk for pk in ids if pk not in expected]
    if missing:
        raise StaleFence(f"no previewed version for attempts {missing}; preview the decision first")
    note = f"{reason} (one of {len(ids)} decided together)" if len(ids) > 1 else reason
    with transaction.atomic():
        attempts = _lock_all(ids)
        changed = [a.pk for a in attempts if (a.fence, a.owner_id) != tuple(expected[a.pk])]
        if changed:
            listed = ", ".join(f"#{pk}" for pk in changed)
            raise StaleFence(f"{listed} changed since the preview; nothing was done, preview again")
        done = []
        for attempt in attempts:
            if decision == "recheck":
                done.append(attempt_recheck(attempt=attempt, actor=actor, reason=note))
            elif decision == "fail":
                done.append(attempt_mark_failed(attempt=attempt, actor=actor, reason=note, fence=attempt.fence))
            else:
                done.append(retry_reject(attempt=attempt, actor=actor, comment=note, fence=attempt.fence))
    return done

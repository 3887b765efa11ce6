"""The dispatcher's moves (an agent, or the reconciler when it sends):
claim a dispatch, beat its heartbeat, record the provider's request id,
report the outcome, give up an intent never sent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Coalesce, Greatest

from ledgerdash.ledger import clock, landing, provider_ids, store
from ledgerdash.ledger.authority import Authority, authority_of, standing_under
from ledgerdash.ledger.errors import (
    AuthorizationChanged,
    ClaimLost,
    IllegalTransition,
    MissingEvidence,
    RequestIdConflict,
    RequestIdTaken,
    RetryPending,
    StaleFence,
)
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, clean_text
from ledgerdash.ledger.models import (
    ActorKind,
    Attempt,
    FailedBecause,
    ResultSource,
)
from ledgerdash.ledger.moves.base import (
    S,
    backoff,
    check_move,
    get_attempt,
    move,
    refuse_open_transaction,
    validate_ref,
)
from ledgerdash.ledger.moves.evidence import (
    Evidence,
    Outcome,
    Report,
    already_reported,
    dispatched_with,
    hearing,
    late_evidence,
    said_unknown,
    taken_id_evidence,
)
from ledgerdash.ledger.moves.gate import dispatch_unless_known, hold_again
from ledgerdash.ledger.moves.reconciler import attempt_escalate_for_retry
from ledgerdash.ledger.store import Guard, append_events


def attempt_dispatch(*, attempt: Attempt, actor: Actor, fence: int | None = None, reason: str = "") -> Attempt:
    """Claim the attempt for dispatch, committed BEFORE the request leaves.

    Re-checks the tenant's current authority first. When it no longer holds,
    the attempt is not reused: it goes to review beside a linked attempt
    under the current policy (scope never wider), and
    :class:`AuthorizationChanged` names that linked attempt. An agent may
    re-send a retryable failure only after its back-off (the reconciler
    sends it when its claim finds it due). The returned attempt's ``fence``
    is the token the dispatcher must present with the outcome; a concurrent
    claimer loses with :class:`ClaimLost`. The authority is the store's
    (:func:`ledgerdash.ledger.store.under_authority`): a refusal, and a
    claim lost, rest on the authority read now.
    """
    if actor.kind == ActorKind.AGENT:
        refuse_open_transaction("claiming a dispatch")
    check_move(attempt, S.DISPATCHED, actor)
    now = clock.now()
    if (
        actor.kind != ActorKind.RECONCILER
        and attempt.state == S.FAILED_RETRYABLE
        and attempt.next_check_at is not None
        and attempt.next_check_at > now
    ):
        raise RetryPending(RetryPending.MESSAGE.format(attempt_id=attempt.pk, due=attempt.next_check_at), attempt)

    def claim(authority: Authority, guard: Guard | None) -> Attempt | None:
        standing, timing = standing_under(attempt, authority), authority.timing
        if not standing.holds:
            if guard is not None:
                return None  # refused on what this process remembered: the authority read now decides
            if standing.held_again and not standing.changes and attempt.dispatch_count == 0:
                hold_again(attempt, actor=actor, fence=fence, why=standing.held_again)
            _refuse_changed_authority(attempt, actor=actor, fence=fence, changes=standing.refusals)
        try:
            return move(
                attempt,
                to_state=S.DISPATCHED,
                actor=actor,
                fence=fence,
                reason=reason
                or ("dispatched" if attempt.dispatch_count == 0 else "dispatched again with the same key"),
                updates={
                    "dispatch_fence": attempt.fence + 1,
                    "dispatch_count": attempt.dispatch_count + 1,
                    "check_count": 0,
                    "next_check_at": now + timedelta(seconds=timing.lease_seconds),
                    "lands_by": landing.while_silent(now, timing),
                    "first_dispatched_at": attempt.first_dispatched_at or now,
                },
                details={
                    "provider_key": attempt.provider_key,
                    "dispatch": attempt.dispatch_count + 1,
                    "policy_version": standing.policy.version if standing.policy else None,
                    "lease_seconds": timing.lease_seconds,
                    "max_request_seconds": timing.max_request_seconds,
                },
                now=now,
                stale_error=ClaimLost,
                guard=guard,
            )
        except ClaimLost:
            if guard is None:
                raise
            return None  # the claim was lost, or the authority changed: a fresh read tells which

    if attempt.parent_id is not None or attempt.dispatch_count > 0:
        # Something else at its key may have been sent: what the ledger knows of the side effect decides.
        return dispatch_unless_known(attempt, actor=actor, fence=fence, claim=claim)
    claimed = store.under_authority(attempt.tenant_id, attempt.tool_name, claim)
    assert claimed is not None  # without a guard, the claim is made or refused
    return claimed


def _refuse_changed_authority(attempt: Attempt, *, actor: Actor, fence: int | None, changes: Sequence[str]) -> None:
    """Don't reuse an attempt whose authority changed before it was sent:
    review it beside a linked attempt under the current policy, then say so."""
    original, linked = attempt_escalate_for_retry(
        attempt=attempt, actor=actor, fence=attempt.fence if fence is None else fence, changes=changes
    )
    follow = linked or original
    raise AuthorizationChanged(
        AuthorizationChanged.MESSAGE.format(attempt_id=attempt.pk, changes="; ".join(changes))
        + (
            f"; linked attempt #{linked.pk} under the current policy awaits approval"
            if linked is not None
            else "; it is under review"
        ),
        attempt=follow,
        original=original,
    )


def attempt_heartbeat(*, attempt: Attempt, fence: int, actor: Actor) -> Attempt:
    """The dispatcher's work is still running: extend its lease, and the
    time until which its request may still land (it may send until the new
    lease ends: :func:`ledgerdash.ledger.landing.while_silent`).

    Only the current dispatcher (the holder of the dispatch ``fence``) may
    beat. A beat never moves the fence, so the dispatcher's outcome report
    stays valid. When the lease already ran out (the reconciler took the
    attempt over) the beat still counts as evidence that the request may be
    in flight: ``lands_by`` moves on, so a "not found" at the provider is not
    taken as proof until the request could no longer land.
    """
    now = clock.now()
    timing = authority_of(attempt.tenant_id, attempt.tool_name).timing
    lands_by = landing.while_silent(now, timing)
    lease_end = now + timedelta(seconds=timing.lease_seconds)
    changed = Attempt.objects.filter(pk=attempt.pk, dispatch_fence=fence).update(
        lands_by=Greatest(Coalesce(F("lands_by"), Value(lands_by)), Value(lands_by)),
        last_heartbeat_at=now,
        next_check_at=Case(When(state=S.DISPATCHED, fence=fence, then=Value(lease_end)), default=F("next_check_at")),
    )
    fresh = get_attempt(attempt.pk)
    if changed != 1:
        raise StaleFence(
            f"attempt {attempt.pk} was dispatched again since (dispatch fence {fresh.dispatch_fence}, not {fence}); "
            "this dispatch is no longer the attempt's"
        )
    return fresh


def _late_report_allowed(attempt: Attempt, fence: int, actor: Actor) -> bool:
    """A late report (the lease expired and a reconciler claimed the attempt
    or moved it to UNKNOWN since) is evidence, not a conflict: accepted from
    the original dispatcher as long as nobody dispatched again since."""
    return (
        actor.kind == ActorKind.AGENT
        and attempt.state in (S.DISPATCHED, S.UNKNOWN)
        and attempt.dispatch_fence is not None
        and attempt.dispatch_fence == fence
    )


def _as_holder(
    attempt: Attempt, fence: int, actor: Actor, op: Callable[[Attempt], Attempt], evidence: Evidence
) -> Report:
    """Run ``op`` on the attempt as the holder of ``fence`` may act on it.

    Tries the caller's copy first (one compare-and-set, the common case);
    when that is stale, re-reads: the same report repeated is a replay;
    a late report from the original dispatcher is applied while the
    attempt is DISPATCHED or UNKNOWN, and otherwise (whatever the state,
    and from an earlier dispatch of an attempt sent again since) recorded as
    evidence: a dispatcher's report is never dropped. Anyone else is refused.
    """
    if attempt.fence == fence:
        try:
            return Report(op(attempt))
        except (StaleFence, IllegalTransition):
            pass  # the caller's copy is out of date: what the row says decides
    fresh = get_attempt(attempt.pk)
    if already_reported(fresh, fence, evidence):
        return Report(fresh, replayed=True)
    if fresh.fence == fence:
        return Report(op(fresh))
    if _late_report_allowed(fresh, fence, actor):
        try:
            return Report(op(fresh), late=True)
        except IllegalTransition:
            pass  # no move fits this report now: it is evidence all the same
    if actor.kind == ActorKind.AGENT and (fresh.dispatch_fence == fence or dispatched_with(fresh, fence)):
        return Report(late_evidence(fresh, fence=fence, actor=actor, evidence=evidence), late=True)
    raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=fresh.fence, given=fence))


def attempt_record_request_id(*, attempt: Attempt, fence: int, request_id: str, actor: Actor) -> Attempt:
    """Persist the provider's request id the moment it is known.

    Does not move the fence: the dispatcher goes on to report the outcome.
    An id the ledger recorded on another side effect is refused
    (:class:`RequestIdTaken`); an agent's is kept as evidence first.
    """
    try:
        return _record_request_id(attempt=attempt, fence=fence, request_id=request_id, actor=actor)
    except RequestIdTaken as taken:
        if actor.kind == ActorKind.AGENT:
            said = Evidence("request_id", provider_request_id=taken.request_id)
            taken_id_evidence(attempt, fence=fence, actor=actor, evidence=said, taken=taken)
        raise


def _record_request_id(*, attempt: Attempt, fence: int, request_id: str, actor: Actor) -> Attempt:
    request_id = validate_ref(request_id, "provider_request_id", 255)
    if not request_id or attempt.provider_request_id == request_id:
        return attempt

    def op(target: Attempt) -> Attempt:
        if target.state not in (S.DISPATCHED, S.UNKNOWN):
            raise IllegalTransition(
                f"attempt {target.pk} is {target.state}; a request id is recorded while it is dispatched"
            )
        if target.provider_request_id and target.provider_request_id != request_id:
            raise RequestIdConflict(
                RequestIdConflict.MESSAGE.format(
                    attempt_id=target.pk, existing=target.provider_request_id, given=request_id
                )
            )
        with provider_ids.named(target, request_id), transaction.atomic():
            changed = Attempt.objects.filter(
                pk=target.pk, state=target.state, fence=target.fence, provider_request_id=""
            ).update(provider_request_id=request_id, updated_at=clock.now())
            if changed != 1:
                raise StaleFence(StaleFence.MESSAGE.format(attempt_id=target.pk, current="?", given=fence))
            target.provider_request_id = request_id
            append_events(
                [
                    EventDraft(
                        target.tenant_id,
                        target.pk,
                        EventKind.REQUEST_ID,
                        actor,
                        fence=target.fence,
                        reason="provider request id recorded",
                        details={"provider_request_id": request_id},
                    )
                ]
            )
        return target

    if attempt.fence == fence:
        try:
            return op(attempt)  # the caller's copy, the common case
        except StaleFence:
            pass  # the attempt moved on since the caller read it
    fresh = get_attempt(attempt.pk)
    if fresh.provider_request_id == request_id:
        return fresh
    if fresh.fence == fence or _late_report_allowed(fresh, fence, actor):
        try:
            return op(fresh)
        except IllegalTransition:
            pass  # no longer dispatched or unknown: evidence all the same
    if actor.kind == ActorKind.AGENT and (fresh.dispatch_fence == fence or dispatched_with(fresh, fence)):
        # The attempt moved on; the request id is evidence all the same.
        return late_evidence(
            fresh, fence=fence, actor=actor, evidence=Evidence("request_id", provider_request_id=request_id)
        )
    raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=fresh.fence, given=fence))


def attempt_report(
    *,
    attempt: Attempt,
    fence: int,
    actor: Actor,
    outcome: str,
    provider_request_id: str = "",
    result_ref: str = "",
    result: Any = None,
    result_source: str = ResultSource.TOOL,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> Report:
    """The dispatcher (agent or reconciler) reports what the provider said.

    - ``confirmed``: DISPATCHED (or UNKNOWN) -> OUTCOME_CONFIRMED, on a
      durable receipt. "HTTP 200" is not a receipt: confirming needs a
      provider request id or a result reference an operator can check.
    - ``failed``: the provider refused definitively -> FAILED; nothing happened.
    - ``failed_retryable``: it rejected the request before acting ->
      FAILED_RETRYABLE; the same key may be sent again after a back-off.
    - ``unknown``: the dispatcher cannot tell -> UNKNOWN; the reconciler
      looks it up.

    The same report sent again (a retry after a lost answer) is a replay:
    nothing is written. A report from the original dispatcher about an
    attempt that has moved on is never dropped: it is recorded as evidence,
    settles an attempt still under review, and raises an incident when it
    contradicts how the attempt was settled (a duplicate when a retry of it
    went out too). A receipt naming a provider id the ledger recorded on
    another side effect is refused (:class:`RequestIdTaken`); an agent's is
    kept as evidence first, with an incident naming both attempts.
    """
    if actor.kind == ActorKind.AGENT:
        refuse_open_transaction("reporting an outcome")
    outcome = Outcome(outcome)
    provider_request_id = validate_ref(provider_request_id, "provider_request_id", 255)
    result_ref = validate_ref(result_ref, "result_ref", 1000)
    evidence = Evidence(outcome, provider_request_id, result_ref, reason)
    try:
        return _as_holder(
            attempt,
            fence,
            actor,
            lambda target: _apply_report(
                target,
                actor=actor,
                evidence=evidence,
                result=result,
                result_source=result_source,
                details=details,
                fence=fence,
            ),
            evidence,
        )
    except RequestIdTaken as taken:
        if actor.kind == ActorKind.AGENT:
            taken_id_evidence(attempt, fence=fence, actor=actor, evidence=evidence, taken=taken)
        raise


def _apply_report(
    target: Attempt,
    *,
    actor: Actor,
    evidence: Evidence,
    result: Any,
    result_source: str,
    details: dict[str, Any] | None,
    fence: int,
) -> Attempt:
    now = clock.now()
    late = target.fence != fence
    reason = evidence.reason
    if evidence.outcome == Outcome.CONFIRMED:
        check_move(target, S.OUTCOME_CONFIRMED, actor)
        request_id = evidence.provider_request_id or target.provider_request_id
        if not request_id and not evidence.result_ref:
            raise MissingEvidence(MissingEvidence.MESSAGE.format(attempt_id=target.pk))
        if (
            evidence.provider_request_id
            and target.provider_request_id
            and evidence.provider_request_id != target.provider_request_id
        ):
            raise RequestIdConflict(
                RequestIdConflict.MESSAGE.format(
                    attempt_id=target.pk, existing=target.provider_request_id, given=evidence.provider_request_id
                )
            )
        late = late or (target.state == S.UNKNOWN and actor.kind == ActorKind.AGENT)
        info = {**(details or {}), "provider_request_id": request_id, "result_ref": evidence.result_ref}
        if late:
            info.update(_as_late(evidence, fence))
        return move(
            target,
            to_state=S.OUTCOME_CONFIRMED,
            actor=actor,
            fence=None,
            reason=reason
            or ("late outcome report from the original dispatcher: confirmed" if late else "outcome confirmed"),
            updates={
                "provider_request_id": request_id,
                "result_ref": evidence.result_ref,
                "result": result,
                "result_source": result_source,
                "lands_by": now,
                **hearing(target, fence, evidence),
            },
            details=info,
            now=now,
        )
    if evidence.outcome == Outcome.UNKNOWN:
        if target.state == S.UNKNOWN and late:
            # The lease already said so; that the dispatcher was alive to say it is evidence.
            return late_evidence(target, fence=fence, actor=actor, evidence=evidence)
        # The dispatcher stopped waiting now: its request, if it left at all, left by now.
        timing = authority_of(target.tenant_id, target.tool_name).timing
        lands_by = landing.after_unknown(target.lands_by, now, timing, late=late)
        return move(
            target,
            to_state=S.UNKNOWN,
            actor=actor,
            fence=None,
            reason=reason,
            updates={
                "next_check_at": (details or {}).get("check_at") or now,
                "last_error": clean_text(reason),
                "lands_by": lands_by,
                **hearing(target, fence, evidence),
            },
            details=_as_late(evidence, fence) if late else None,
            now=now,
        )
    if target.state == S.UNKNOWN and said_unknown(target, target.dispatch_fence):
        # Its dispatcher said it could not tell; this refusal is of a later request of it.
        return late_evidence(target, fence=target.dispatch_fence or fence, actor=actor, evidence=evidence)
    if evidence.outcome == Outcome.FAILED_RETRYABLE:
        return move(
            target,
            to_state=S.FAILED_RETRYABLE,
            actor=actor,
            fence=None,
            reason=reason or "provider rejected the request before acting",
            updates={
                "next_check_at": now
                + max(backoff(target.dispatch_count), timedelta(seconds=(details or {}).get("retry_after") or 0)),
                "last_error": clean_text(reason),
                "lands_by": now,
                **hearing(target, fence, evidence),
            },
            details={**(details or {}), **(_as_late(evidence, fence) if late else {})} or None,
            now=now,
        )
    return move(
        target,
        to_state=S.FAILED,
        actor=actor,
        fence=None,
        reason=reason or "provider refused the request",
        updates={
            "last_error": clean_text(reason),
            "failed_because": FailedBecause.PROVIDER,
            "lands_by": now,
            **hearing(target, fence, evidence),
        },
        details=_as_late(evidence, fence) if late else None,
        now=now,
    )


def _as_late(evidence: Evidence, fence: int) -> dict[str, Any]:
    """What a move made on a late report records of it (so the same report sent again is known)."""
    return {"late_report": evidence.as_details(), "dispatch_fence": fence}


def attempt_confirm(
    *,
    attempt: Attempt,
    fence: int,
    actor: Actor,
    provider_request_id: str = "",
    result_ref: str = "",
    result: Any = None,
    result_source: str = ResultSource.TOOL,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> Attempt:
    """DISPATCHED (or UNKNOWN) -> OUTCOME_CONFIRMED, on a durable receipt (see :func:`attempt_report`)."""
    return attempt_report(
        attempt=attempt,
        fence=fence,
        actor=actor,
        outcome=Outcome.CONFIRMED,
        provider_request_id=provider_request_id,
        result_ref=result_ref,
        result=result,
        result_source=result_source,
        reason=reason,
        details=details,
    ).attempt


def attempt_fail(
    *,
    attempt: Attempt,
    fence: int,
    actor: Actor,
    reason: str,
    retryable: bool = False,
    not_before: float | None = None,
) -> Attempt:
    """The provider gave a definitive answer that nothing was done.

    ``retryable``: it rejected the request before acting, so the same key
    may be sent again after a back-off (FAILED_RETRYABLE), and no sooner
    than ``not_before`` seconds when the provider said so (``Retry-After``);
    otherwise FAILED.
    """
    return attempt_report(
        attempt=attempt,
        fence=fence,
        actor=actor,
        outcome=Outcome.FAILED_RETRYABLE if retryable else Outcome.FAILED,
        reason=reason,
        details={"retry_after": not_before} if retryable and not_before is not None else None,
    ).attempt


def attempt_mark_unknown(
    *, attempt: Attempt, fence: int, actor: Actor, reason: str, check_at: datetime | None = None
) -> Attempt:
    """DISPATCHED -> UNKNOWN: the dispatcher cannot tell whether it happened
    (timeout, lost response, crash). The reconciler takes it from here, at
    ``check_at`` (default: at once)."""
    return attempt_report(
        attempt=attempt,
        fence=fence,
        actor=actor,
        outcome=Outcome.UNKNOWN,
        reason=reason,
        details={"check_at": check_at} if check_at is not None else None,
    ).attempt


def attempt_abandon_intent(*, attempt: Attempt, fence: int, actor: Actor, reason: str = "") -> Attempt:
    """Give up an intent that was never sent: INTENT_RECORDED -> FAILED.

    The honest way out for an agent that re-runs its task with other
    arguments after a crash (its new call is a linked attempt awaiting
    approval, which the still-open original would block), and for an
    operator cleaning up: DISPATCHED is committed before any request leaves,
    so an attempt still in INTENT_RECORDED provably sent nothing.
    """
    if actor.kind == ActorKind.AGENT:
        refuse_open_transaction("abandoning an intent")
    if attempt.state != S.INTENT_RECORDED:
        raise IllegalTransition(
            f"attempt {attempt.pk} is {attempt.state}; only an intent that was never sent can be abandoned"
        )
    by = "its agent" if actor.kind == ActorKind.AGENT else actor.label
    note = clean_text(reason.strip()) if reason else ""
    return move(
        attempt,
        to_state=S.FAILED,
        actor=actor,
        fence=fence,
        reason=f"abandoned by {by} before it was sent" + (f": {note}" if note else "; nothing was sent"),
        updates={"last_error": "abandoned", "failed_because": FailedBecause.ABANDONED},
        details={"abandoned": True, "comment": note} if note else {"abandoned": True},
    )

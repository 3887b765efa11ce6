"""The state machine every move goes through.

:data:`LEGAL_MOVES` is the table of which actor may move an attempt from
which state to which; :func:`move` is the one compare-and-set on
``(id, state, fence)`` that writes a new state, always with its event. Nothing
else writes ``Attempt.state``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model

from ledgerdash.ledger import clock, rules, store
from ledgerdash.ledger.errors import (
    AttemptNotFound,
    IllegalTransition,
    InsideTransaction,
    InvalidField,
    RoleRequired,
    StaleFence,
)
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, clean_text
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    ActorKind,
    Attempt,
    OnCallShift,
    Role,
    State,
    Tenant,
)
from ledgerdash.ledger.store import Guard
from ledgerdash.ledger.tenancy import refusal

S = State
A, R, U = ActorKind.AGENT, ActorKind.RECONCILER, ActorKind.USER

#: (from, to) -> the kinds of actor that may make that move: the protocol's
#: table (docs/protocol.md), with the moves it implies: INTENT_RECORDED -> FAILED (an intent
#: abandoned past its lease: nothing was sent), UNKNOWN -> FAILED and
#: UNKNOWN -> FAILED_RETRYABLE (a late, definitive failure report from the
#: original dispatcher),
#: FAILED_RETRYABLE -> MANUAL_REVIEW (its retry needs review because the
#: authority changed), and the reconciler reporting the outcome of a
#: dispatch it made itself (DISPATCHED -> FAILED_RETRYABLE / FAILED).
LEGAL_MOVES: dict[tuple[str, str], frozenset[str]] = {
    (S.INTENT_RECORDED, S.DISPATCHED): frozenset({A, R}),
    # abandoned: past the intent lease (reconciler), or given up by its agent
    # or an operator; it was never sent, so it provably did nothing
    (S.INTENT_RECORDED, S.FAILED): frozenset({A, R, U}),
    # the authority changed before it was sent: a linked attempt awaits review
    (S.INTENT_RECORDED, S.MANUAL_REVIEW): frozenset({A, R}),
    (S.DISPATCHED, S.OUTCOME_CONFIRMED): frozenset({A, R}),
    (S.DISPATCHED, S.FAILED_RETRYABLE): frozenset({A, R}),
    (S.DISPATCHED, S.FAILED): frozenset({A, R}),
    (S.DISPATCHED, S.UNKNOWN): frozenset({A, R}),
    (S.FAILED_RETRYABLE, S.DISPATCHED): frozenset({A, R}),
    (S.FAILED_RETRYABLE, S.MANUAL_REVIEW): frozenset({A, R}),
    # the original dispatcher's later, stronger word: a receipt, or a refusal for good
    (S.FAILED_RETRYABLE, S.OUTCOME_CONFIRMED): frozenset({A}),
    (S.FAILED_RETRYABLE, S.FAILED): frozenset({A}),
    (S.UNKNOWN, S.OUTCOME_CONFIRMED): frozenset({A, R}),
    # the original dispatcher's late, definitive word: refused for good, or before acting
    (S.UNKNOWN, S.FAILED): frozenset({A}),
    (S.UNKNOWN, S.FAILED_RETRYABLE): frozenset({A}),
    (S.UNKNOWN, S.DISPATCHED): frozenset({R}),
    (S.UNKNOWN, S.UNKNOWN): frozenset({R}),
    (S.UNKNOWN, S.MANUAL_REVIEW): frozenset({R}),
    # people decide; the original dispatcher's late report is evidence too
    (S.MANUAL_REVIEW, S.OUTCOME_CONFIRMED): frozenset({U, A}),
    (S.MANUAL_REVIEW, S.FAILED): frozenset({U, A}),
    (S.MANUAL_REVIEW, S.RECONCILED): frozenset({U}),
    (S.MANUAL_REVIEW, S.INTENT_RECORDED): frozenset({U}),
    (S.MANUAL_REVIEW, S.UNKNOWN): frozenset({U}),
    # the one way out of a settled state: it failed on its dispatcher's word
    # that the provider refused it, and the same dispatcher now says it may
    # have happened (moves.evidence.rested_on_its_word)
    (S.FAILED, S.MANUAL_REVIEW): frozenset({A}),
}


#: States an attempt can be created in, and by whom: an agent's intent, or
#: a linked attempt that must be reviewed before anything is sent.
CREATE_MOVES: dict[str, frozenset[str]] = {
    S.INTENT_RECORDED: frozenset({A}),
    S.MANUAL_REVIEW: frozenset({A, R, U}),
}


def refuse_open_transaction(what: str) -> None:
    """Refuse to record an agent's step inside the caller's open transaction.

    The ledger's promise is that the intent and the dispatch claim are
    committed before the tool runs. Inside a caller's ``atomic()`` block they
    would be a savepoint: recovery could not see them while the tool runs,
    and the caller's rollback would erase them although the provider acted.
    """
    if not store.outside_any_transaction():
        raise InsideTransaction(InsideTransaction.MESSAGE.format(what=what))


def get_attempt(attempt_id: int, *, tenant_id: int | None = None, lock: bool = False) -> Attempt:
    """The attempt ``attempt_id`` (of ``tenant_id``, when given: another
    tenant's looks like none at all), or :class:`AttemptNotFound`.

    Without a lock, the store reads it (:func:`ledgerdash.ledger.store.read_attempt`)."""
    if lock:
        qs = Attempt.objects.select_for_update().filter(pk=attempt_id)
        found = qs.filter(tenant_id=tenant_id).first() if tenant_id is not None else qs.first()
    else:
        found = store.read_attempt(attempt_id, tenant_id)
    if found is None:
        raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=attempt_id))
    return found


def on_attempt(attempt_id: int, *, tenant_id: int, act: Callable[[Attempt], Attempt]) -> Attempt:
    """``act`` (a move) on the attempt ``attempt_id`` of ``tenant_id``, for a
    caller that names it by id: from the copy this process kept when it last
    wrote it, if that move is one change the row's version still allows
    (:func:`ledgerdash.ledger.store.from_copy`), else from the attempt read
    now (:class:`AttemptNotFound`: another tenant's looks like none at all).
    ``act`` may run twice; only the run whose answer is returned wrote
    anything. The caller keeps the attempt it returns for the next move on
    it (:func:`ledgerdash.ledger.store.remember`) once it is done with it."""
    done = store.from_copy(attempt_id, tenant_id, act)
    if done is None:
        done = act(get_attempt(attempt_id, tenant_id=tenant_id))
    return done


def check_move(attempt: Attempt, to_state: str, actor: Actor) -> None:
    allowed = LEGAL_MOVES.get((attempt.state, to_state), frozenset())
    if actor.kind not in allowed:
        raise IllegalTransition(
            IllegalTransition.MESSAGE.format(
                actor=actor.kind, attempt_id=attempt.pk, from_state=attempt.state, to_state=to_state
            )
        )


def check_fence(attempt: Attempt, fence: int | None) -> None:
    if fence is not None and fence != attempt.fence:
        raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=attempt.fence, given=fence))


def pick_owner(tenant_id: int, now: datetime) -> tuple[int | None, str]:
    """Whoever is on call for the tenant now, else its default owner."""
    shift_user = (
        OnCallShift.objects.filter(tenant_id=tenant_id, starts_at__lte=now, ends_at__gt=now)
        .order_by("-starts_at", "-id")
        .values_list("user_id", flat=True)
        .first()
    )
    if shift_user is not None:
        return shift_user, "on call"
    default = Tenant.objects.filter(pk=tenant_id).values_list("default_owner_id", flat=True).get()
    if default is not None:
        return default, "tenant default owner"
    return None, "nobody: the tenant has no default owner and nobody is on call"


def move(
    attempt: Attempt,
    *,
    to_state: str,
    actor: Actor,
    reason: str,
    fence: int | None,
    updates: dict[str, Any] | None = None,
    details: dict[str, Any] | None = None,
    now: datetime | None = None,
    stale_error: type[StaleFence] = StaleFence,
    extra_events: list[EventDraft] | None = None,
    guard: Guard | None = None,
) -> Attempt:
    """Compare-and-set ``attempt`` (as the caller read it) to ``to_state``.

    ``fence`` is the fence the caller holds; None means "the one I just read"
    (callers that lock the row first, or that act on a fresh read). ``guard``:
    a condition the one-statement change must also satisfy (it is only
    given where the move is one statement); when it does not hold, the move
    fails as a stale one would.
    """
    check_move(attempt, to_state, actor)
    check_fence(attempt, fence)
    now = now or clock.now()
    reason = clean_text(reason)
    details = dict(details or {})
    values: dict[str, Any] = {"state": to_state, "updated_at": now, "last_note": reason, **(updates or {})}
    if to_state in OWNED_STATES and attempt.owner_id is None and "owner_id" not in values:
        owner_id, source = pick_owner(attempt.tenant_id, now)
        values["owner_id"] = owner_id
        details["owner_assigned"] = {"user_id": owner_id, "by": source}
    if to_state not in IN_FLIGHT_STATES:
        values.setdefault("next_check_at", None)
    event = EventDraft(
        attempt.tenant_id,
        attempt.pk,
        EventKind.TRANSITION,
        actor,
        from_state=attempt.state,
        to_state=to_state,
        fence=attempt.fence + 1,
        reason=reason,
        details=details,
    )
    if not store.change(attempt, values, [event, *(extra_events or [])], now, guard=guard):
        raise_stale(attempt, stale_error)
    return moved(attempt, values)


def moved(attempt: Attempt, values: dict[str, Any]) -> Attempt:
    """The caller's copy of ``attempt`` as the compare-and-set left the row."""
    for key, value in values.items():
        setattr(attempt, key, value)
    attempt.fence += 1
    return attempt


def raise_stale(attempt: Attempt, stale_error: type[StaleFence]) -> None:
    current = Attempt.objects.filter(pk=attempt.pk).values_list("state", "fence").first()
    if current is None:
        raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=attempt.pk))
    state, current_fence = current
    raise stale_error(
        stale_error.MESSAGE.format(attempt_id=attempt.pk, current=current_fence, given=attempt.fence, state=state)
    )


def validate_ref(value: str, name: str, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidField(f"{name} must be a string")
    if len(value) > limit:
        raise InvalidField(InvalidField.TOO_LONG.format(field=name, length=len(value), limit=limit))
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidField(InvalidField.CONTROL.format(field=name))
    return value


def backoff(attempt_number: int, *, base: float = 5.0, cap: float = 3600.0) -> timedelta:
    """Exponential back-off with full jitter (AWS architecture blog's form)."""
    ceiling = min(cap, base * (2 ** max(0, attempt_number)))
    return timedelta(seconds=clock.jitter(base / 2, ceiling))


def required(text: str, what: str) -> str:
    text = (text or "").strip()
    if not text:
        raise InvalidField(InvalidField.EMPTY.format(field=what))
    return text


def only_from(attempt: Attempt, state: str, what: str) -> None:
    if attempt.state != state:
        raise IllegalTransition(f"attempt {attempt.pk} is {attempt.state}; {what} only from {state}")


def locked_for_decision(attempt_id: int, fence_seen: int | None) -> Attempt:
    attempt = get_attempt(attempt_id, lock=True)
    if fence_seen is not None and attempt.fence != fence_seen:
        raise StaleFence(
            f"attempt {attempt_id} changed since you loaded it (now {attempt.state}); reload and decide again"
        )
    return attempt


def person_of(actor: Actor) -> Any:
    """The person behind ``actor``'s decision, read now (None for the
    system, the reconciler and agents: their moves are not a person's)."""
    if actor.user_id is None:
        return None
    return get_user_model().objects.filter(pk=actor.user_id).first()


def person_may(actor: Actor, attempt: Attempt, move: str) -> None:
    """A person's move asks :func:`ledgerdash.ledger.rules.require` with
    the attempt as the caller locked it; the system's moves are not a
    person's decision."""
    if actor.user_id is not None:
        rules.require(person_of(actor), attempt, move)


def person_has_role(actor: Actor, tenant_id: int, role: Role) -> None:
    """A person's move needs ``role`` in the tenant now, asked
    here whatever path it came by (:class:`RoleRequired` says who lacks
    what); the system's and the reconciler's moves are not a person's."""
    if actor.user_id is None:
        return
    missing = refusal(person_of(actor), tenant_id, role)
    if missing:
        raise RoleRequired(missing)

"""The reconciler's moves.

The reconciler first claims due attempts (bumping their fence, no state
change), then asks the provider with no transaction open, then applies its
decision with the claim's fence. A claim superseded meanwhile (another
worker, a late report, an operator) makes the decision fail as stale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F

from ledgerdash.ledger import clock
from ledgerdash.ledger.authority import authority_of, authorize
from ledgerdash.ledger.errors import (
    LedgerError,
    StaleFence,
)
from ledgerdash.ledger.events import Actor, clean_text
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    Attempt,
    FailedBecause,
)
from ledgerdash.ledger.moves.base import S, backoff, move, only_from
from ledgerdash.ledger.moves.create import create_retry_under


def claim_lease() -> timedelta:
    """How long a reconciler's claim keeps other workers off an attempt
    (``LEDGER_RECONCILER_CLAIM_SECONDS``): a worker that dies mid-batch
    leaves its claims to the others after this."""
    return timedelta(seconds=settings.LEDGER_RECONCILER_CLAIM_SECONDS)


def attempts_claim_due(*, limit: int, now: datetime | None = None) -> list[Attempt]:
    """Claim up to ``limit`` in-flight attempts that are due, oldest due first.

    PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so any number of workers claim
    disjoint batches without waiting on each other. SQLite: the transaction
    takes the database's write lock when it begins (``IMMEDIATE``), so
    claims are serialized; the fence makes any overlap harmless either way.
    """
    now = now or clock.now()
    with transaction.atomic():
        ids = list(
            Attempt.objects.select_for_update(skip_locked=True)
            .filter(next_check_at__lte=now, state__in=IN_FLIGHT_STATES)
            .order_by("next_check_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return []
        Attempt.objects.filter(pk__in=ids).update(fence=F("fence") + 1, next_check_at=now + claim_lease())
        return list(Attempt.objects.filter(pk__in=ids).order_by("next_check_at", "id"))


def attempt_release(*, attempt: Attempt, fence: int, next_check_at: datetime) -> Attempt:
    """Hand a claimed attempt back, due again at ``next_check_at``; nothing was decided."""
    changed = Attempt.objects.filter(pk=attempt.pk, state=attempt.state, fence=fence).update(
        next_check_at=next_check_at
    )
    if changed != 1:
        raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current="?", given=fence))
    attempt.next_check_at = next_check_at
    return attempt


def attempt_expire_lease(*, attempt: Attempt, actor: Actor, fence: int) -> Attempt:
    """DISPATCHED past its lease, no outcome reported: UNKNOWN."""
    only_from(attempt, S.DISPATCHED, "a dispatch lease expires")
    now = clock.now()
    return move(
        attempt,
        to_state=S.UNKNOWN,
        actor=actor,
        fence=fence,
        reason="dispatch lease expired with no outcome reported; looking it up at the provider",
        updates={"next_check_at": now},
        now=now,
    )


def attempt_abandon(*, attempt: Attempt, actor: Actor, fence: int, reason: str = "") -> Attempt:
    """INTENT_RECORDED past its lease, never dispatched: FAILED as abandoned.

    Safe because DISPATCHED is committed before any request leaves: an
    attempt still in INTENT_RECORDED provably sent nothing. Failing it
    (visibly, with this reason) is better than letting it sit forever or
    sending on behalf of an agent that gave up on its task.
    """
    return move(
        attempt,
        to_state=S.FAILED,
        actor=actor,
        fence=fence,
        reason=reason or "abandoned: never dispatched within the intent lease, so nothing was sent",
        updates={"last_error": "abandoned", "failed_because": FailedBecause.ABANDONED},
    )


def attempt_check_later(
    *,
    attempt: Attempt,
    actor: Actor,
    fence: int,
    reason: str,
    lookup: dict[str, Any],
    error: str = "",
    backoff_base: float = 5.0,
    looked_at: datetime | None = None,
    not_before: float | None = None,
) -> Attempt:
    """UNKNOWN -> UNKNOWN: the provider could not answer; back off, decide
    nothing. ``not_before``: seconds the provider asked to be left alone
    (``Retry-After``); the next lookup waits at least that long."""
    only_from(attempt, S.UNKNOWN, "a lookup is retried later")
    now = clock.now()
    wait = backoff(attempt.check_count + 1, base=backoff_base)
    if not_before is not None:
        wait = max(wait, timedelta(seconds=not_before))
    return move(
        attempt,
        to_state=S.UNKNOWN,
        actor=actor,
        fence=fence,
        reason=reason,
        updates={
            "check_count": attempt.check_count + 1,
            "next_check_at": now + wait,
            "last_lookup": lookup.get("status", ""),
            "last_lookup_at": looked_at or now,
            "last_error": clean_text(error),
        },
        details={"lookup": lookup},
        now=now,
    )


def attempt_wait_for_landing(
    *,
    attempt: Attempt,
    actor: Actor,
    fence: int,
    lookup: dict[str, Any],
    looked_at: datetime | None = None,
    lag: float = 0.0,
) -> Attempt:
    """UNKNOWN -> UNKNOWN: the provider does not have it, but the lookup was
    asked (at ``looked_at``) while the request could still land, or before a
    lookup lagging ``lag`` seconds would show it (see
    :mod:`ledgerdash.ledger.landing`). A "not found" proves nothing yet:
    look again once it would."""
    only_from(attempt, S.UNKNOWN, "waiting for a request to land")
    now = clock.now()
    assert attempt.lands_by is not None
    shows_by = attempt.lands_by + timedelta(seconds=lag)
    if lag and (looked_at or now) >= attempt.lands_by:
        why = (
            f"not found at the provider yet, but its lookup may lag {lag:g} s behind it (a search index): "
            f"a request that landed by {attempt.lands_by:%Y-%m-%d %H:%M:%S} UTC shows by "
            f"{shows_by:%Y-%m-%d %H:%M:%S} UTC; looking again then"
        )
    else:
        why = (
            f"not found at the provider yet, but the request may still land until "
            f"{attempt.lands_by:%Y-%m-%d %H:%M:%S} UTC"
            + (f" and its lookup lags {lag:g} s more" if lag else "")
            + f"; looking again at {shows_by:%Y-%m-%d %H:%M:%S} UTC"
        )
    details: dict[str, Any] = {"lookup": lookup, "lands_by": attempt.lands_by.isoformat(), "counts_as_evidence": False}
    if lag:
        details["lookup_lag_seconds"] = lag
    return move(
        attempt,
        to_state=S.UNKNOWN,
        actor=actor,
        fence=fence,
        reason=why,
        updates={
            "next_check_at": max(shows_by, now) + timedelta(milliseconds=1),
            "last_lookup": lookup.get("status", ""),
            "last_lookup_at": looked_at or now,
        },
        details=details,
        now=now,
    )


def attempt_escalate(
    *,
    attempt: Attempt,
    actor: Actor,
    fence: int,
    reason: str,
    lookup: dict[str, Any] | None = None,
    looked_at: datetime | None = None,
) -> Attempt:
    """UNKNOWN, FAILED_RETRYABLE or a never-sent intent -> MANUAL_REVIEW: the
    facts cannot settle it. ``looked_at``: when the lookup it rests on was
    asked (default: now)."""
    updates: dict[str, Any] = {}
    if lookup:
        updates["last_lookup"] = lookup.get("status", "")
        updates["last_lookup_at"] = looked_at or clock.now()
    return move(
        attempt,
        to_state=S.MANUAL_REVIEW,
        actor=actor,
        fence=fence,
        reason=reason,
        updates=updates,
        details={"lookup": lookup} if lookup else {},
    )


def attempt_escalate_for_retry(
    *,
    attempt: Attempt,
    actor: Actor,
    fence: int,
    changes: Sequence[str],
    lookup: dict[str, Any] | None = None,
    looked_at: datetime | None = None,
) -> tuple[Attempt, Attempt | None]:
    """A retry is needed but the authority changed: don't reuse the attempt.

    Records a linked attempt under the tenant's current policy (its scope
    narrowed to what both the original and the current policy allow, never
    wider) for review, and moves the original to MANUAL_REVIEW beside it.
    Returns ``(original, linked)``; ``linked`` is None when nothing could
    be authorized now (the tool is no longer allowed, the tenant is gone).
    """
    now = authority_of(attempt.tenant_id, attempt.tool_name)
    policy, allowed = now.policy, None
    if now.tenant is not None:
        with contextlib.suppress(LedgerError):
            allowed = authorize(now.tenant, policy, attempt.tool_name)
    summary = "; ".join(changes)
    needed = (
        "not sent: the authority changed since the intent was recorded"
        if attempt.state == S.INTENT_RECORDED
        else "retry needed but authority changed"
    )
    with transaction.atomic():
        if policy is None or allowed is None:
            original = attempt_escalate(
                attempt=attempt,
                actor=actor,
                fence=fence,
                reason=f"{needed}, and nothing can be authorized now: {summary}",
                lookup=lookup,
                looked_at=looked_at,
            )
            return original, None
        original = attempt_escalate(
            attempt=attempt,
            actor=actor,
            fence=fence,
            reason=f"{needed} ({summary}); a linked attempt under the current policy awaits approval",
            lookup=lookup,
            looked_at=looked_at,
        )
        linked = create_retry_under(
            policy,
            allowed,
            original=original,
            actor=actor,
            reason=f"linked retry of #{attempt.pk} under policy v{policy.version}: {summary}",
        )
    return original, linked

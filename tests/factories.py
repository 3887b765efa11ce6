"""Attempts in each state, reached through the real transitions (never by
writing ``state`` directly), so every fixture row has its true event history.

An attempt that went UNKNOWN (and everything after it) has its landing time
moved into the past (time travel, not a state change), so by the time a
test decides anything the request can no longer land: a lookup then is
evidence, as it would be for a reconciler working after the lease."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.utils import timezone

from ledgerdash.ledger import clock, moves, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, State, Tenant
from tests.conftest import AGENT, RECONCILER, record


@contextmanager
def an_hour_ago() -> Iterator[None]:
    with clock.frozen_at(timezone.now() - timedelta(hours=1)):
        yield


def landed_already(attempt: Attempt) -> Attempt:
    """Move the time its request could still land into the past."""
    attempt.lands_by = timezone.now() - timedelta(seconds=1)
    Attempt.objects.filter(pk=attempt.pk).update(lands_by=attempt.lands_by)
    return attempt


def recorded_in_chain(tenant: Tenant, stripe: int, key: str) -> Attempt:
    """An intent of ``tenant`` whose events go to its chain ``stripe`` (keys
    ``key-0``, ``key-1``, … are recorded until one lands there)."""
    for n in range(tenant.chain_stripes * 2):
        attempt = record(tenant, f"{key}-{n}")
        if attempt.pk % tenant.chain_stripes == stripe:
            return attempt
    raise AssertionError(f"no attempt of {tenant.slug} landed in chain {stripe}")


def attempt_in(
    state: str, tenant: Tenant, *, key: str = "k-1", requester: Any = None, approver: Any = None, silent: bool = False
) -> Attempt:
    """An attempt of ``tenant`` in ``state``. RECONCILED needs two users (a
    requester and an approver) since it is reached by approving a retry.
    UNKNOWN (and what is reached through it) comes from its dispatcher's
    report that it cannot tell, or, ``silent``, from its lease running out
    (then a refusal its dispatcher reports late still settles it)."""
    attempt = record(tenant, key)
    if state == State.INTENT_RECORDED:
        return attempt
    attempt = recording.mark_dispatched(attempt, actor=AGENT)
    if state == State.DISPATCHED:
        return attempt
    if state == State.OUTCOME_CONFIRMED:
        # The provider's id for the effect is the side effect's own: one per key.
        return recording.confirm(attempt, provider_request_id=f"req-{key}", actor=AGENT)
    if state == State.FAILED_RETRYABLE:
        return recording.fail_retryable(attempt, reason="rejected before acting", actor=AGENT)
    if state == State.FAILED:
        return recording.fail(attempt, reason="refused", actor=AGENT)
    if silent:
        (claimed,) = moves.attempts_claim_due(limit=1, now=attempt.next_check_at)
        attempt = moves.attempt_expire_lease(attempt=claimed, actor=RECONCILER, fence=claimed.fence)
    else:
        attempt = recording.mark_unknown(attempt, reason="timeout", actor=AGENT)
    attempt = landed_already(attempt)
    if state == State.UNKNOWN:
        return attempt
    attempt = moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="not idempotent")
    if state == State.MANUAL_REVIEW:
        return attempt
    assert state == State.RECONCILED, state
    assert requester is not None
    assert approver is not None
    retry = moves.retry_request(attempt=attempt, actor=Actor.user(requester), reason="resend")
    moves.retry_approve(
        attempt=retry,
        actor=Actor.user(approver),
        comment="verified not delivered",
        safe_because="provider support confirmed it was never delivered",
    )
    attempt.refresh_from_db()
    return attempt


def linked_retry(tenant: Tenant, requester: Any, *, key: str = "k-1", lookup: str = "not_found") -> Attempt:
    """A linked retry awaiting approval: its original went UNKNOWN, then to
    review with the provider's last lookup saying ``lookup``; ``requester``
    asked for the retry."""
    original = attempt_in(State.UNKNOWN, tenant, key=key)  # its request can no longer land
    original = moves.attempt_escalate(
        attempt=original,
        actor=RECONCILER,
        fence=original.fence,
        reason="not idempotent",
        lookup={"status": lookup} if lookup else None,
    )
    return moves.retry_request(attempt=original, actor=Actor.user(requester), reason="customer says it never arrived")

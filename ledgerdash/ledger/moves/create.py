"""Recording attempts: an agent's intent, and linked attempts that re-try
another and must be reviewed before anything is sent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from ledgerdash.ledger import clock, landing, store
from ledgerdash.ledger.authority import Timing, scope_string
from ledgerdash.ledger.errors import (
    IllegalTransition,
)
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, clean_text
from ledgerdash.ledger.models import (
    Attempt,
    Policy,
)
from ledgerdash.ledger.moves.base import CREATE_MOVES, S, check_move, pick_owner, refuse_open_transaction
from ledgerdash.ledger.store import Guard, append_events


def _lease(seconds: int, now: datetime) -> datetime:
    return now + timedelta(seconds=seconds)


@dataclass(frozen=True)
class NewAttempt:
    """Validated fields of an attempt about to be recorded."""

    tenant_id: int
    task_id: str
    tool_name: str
    idempotency_key: str
    args: dict[str, Any]
    args_hash: str
    policy_version: int
    scopes: frozenset[str]
    #: The API token of the agent making the call (None in process).
    api_token_id: int | None = None


def attempt_create_intent(
    *,
    new: NewAttempt,
    actor: Actor,
    approval_required: str = "",
    requested_by_id: int | None = None,
    guard: Guard | None = None,
    claim: Timing | None = None,
) -> Attempt | None:
    """Record the root attempt for a key in INTENT_RECORDED, or, when its
    policy requires approval for this call (``approval_required`` says why),
    in MANUAL_REVIEW waiting for an approver, with an owner, and not due
    for the reconciler: it is not sent until approved. ``requested_by_id``:
    the person behind the agent (an API token's creator), who may not
    approve it.

    Returns None when the key already has a root (perhaps one committed a
    moment ago by a concurrent caller): the caller then matches against it.
    With ``guard`` (the authority the intent was checked against, still
    current: see :func:`ledgerdash.ledger.store.under_authority`),
    also None when it no longer holds.

    With ``claim`` (the tool's timing, for a tool whose intent and dispatch
    claim commit together: ``Tool.claim_with_intent``), a call that needs
    no approval is recorded already DISPATCHED, with both events (the
    intent, then its claim) in the one commit: the caller sends it next.
    """
    refuse_open_transaction("recording an intent")
    state = S.MANUAL_REVIEW if approval_required else S.INTENT_RECORDED
    if actor.kind not in CREATE_MOVES[state]:
        raise IllegalTransition(
            IllegalTransition.MESSAGE.format(actor=actor.kind, attempt_id="(new)", from_state="nothing", to_state=state)
        )
    now = clock.now()
    waits: dict[str, Any] = {}
    if approval_required:
        approval_required = clean_text(approval_required)[:1000]
        owner_id, source = pick_owner(new.tenant_id, now)
        waits = {"approval_required": approval_required, "owner_assigned": {"user_id": owner_id, "by": source}}
    attempt = Attempt(
        tenant_id=new.tenant_id,
        task_id=new.task_id,
        tool_name=new.tool_name,
        idempotency_key=new.idempotency_key,
        provider_key=new.idempotency_key,
        args=new.args,
        args_hash=new.args_hash,
        state=state,
        policy_version=new.policy_version,
        credential_scope=scope_string(new.scopes),
        next_check_at=None if approval_required else _lease(settings.LEDGER_INTENT_LEASE_SECONDS, now),
        last_note=f"waits for approval: {approval_required}" if approval_required else "intent recorded",
        approval_required=approval_required,
        owner_id=waits["owner_assigned"]["user_id"] if waits else None,
        requested_by_id=requested_by_id if approval_required else None,
        api_token_id=new.api_token_id,
        created_at=now,
        updated_at=now,
    )
    event = EventDraft(
        new.tenant_id,
        None,
        EventKind.TRANSITION,
        actor,
        to_state=state,
        fence=0,
        reason=attempt.last_note,
        details={
            **waits,
            "task_id": new.task_id,
            "tool_name": new.tool_name,
            "idempotency_key": new.idempotency_key,
            "args_hash": new.args_hash,
            "policy_version": new.policy_version,
            "credential_scope": attempt.credential_scope,
        },
    )
    events = [event]
    if claim is not None and not approval_required:
        events.append(_claim_with_intent(attempt, actor, claim, now))
    return attempt if store.insert_root(attempt, events, now, guard=guard) else None


def _claim_with_intent(attempt: Attempt, actor: Actor, timing: Timing, now: datetime) -> EventDraft:
    """Make the new ``attempt`` DISPATCHED, as :func:`~ledgerdash.ledger.moves.attempt_dispatch`
    would right after its intent, and return the claim's event."""
    check_move(attempt, S.DISPATCHED, actor)
    reason = "dispatched (claimed with its intent)"
    attempt.state, attempt.fence, attempt.last_note = S.DISPATCHED, 1, reason
    attempt.dispatch_fence, attempt.dispatch_count, attempt.check_count = 1, 1, 0
    attempt.next_check_at = now + timedelta(seconds=timing.lease_seconds)
    attempt.lands_by = landing.while_silent(now, timing)
    attempt.first_dispatched_at = now
    return EventDraft(
        attempt.tenant_id,
        None,
        EventKind.TRANSITION,
        actor,
        from_state=S.INTENT_RECORDED,
        to_state=S.DISPATCHED,
        fence=1,
        reason=reason,
        details={
            "provider_key": attempt.provider_key,
            "dispatch": 1,
            "policy_version": attempt.policy_version,
            "lease_seconds": timing.lease_seconds,
            "max_request_seconds": timing.max_request_seconds,
            "claimed_with_intent": True,
        },
    )


def linked_provider_key(root: Attempt, args_hash: str) -> str:
    """Same arguments as the root: the root's key, so the provider
    deduplicates a retry against the original if it did land. Other
    arguments: a key of their own, derived so that the same (key, arguments)
    always maps to the same provider key."""
    if args_hash == root.args_hash:
        return root.provider_key
    return f"{root.idempotency_key}~{args_hash[:16]}"


def attempt_create_linked(
    *,
    parent: Attempt,
    new: NewAttempt,
    actor: Actor,
    reason: str,
    requested_by_id: int | None = None,
) -> Attempt:
    """Record a linked attempt that re-tries ``parent`` and must be reviewed
    (MANUAL_REVIEW) before anything is sent. Inside the caller's transaction
    when the caller also moves the parent."""
    if actor.kind not in CREATE_MOVES[S.MANUAL_REVIEW]:
        raise IllegalTransition(
            IllegalTransition.MESSAGE.format(
                actor=actor.kind, attempt_id="(new)", from_state="nothing", to_state=S.MANUAL_REVIEW
            )
        )
    if parent.tenant_id != new.tenant_id or parent.idempotency_key != new.idempotency_key:
        raise IllegalTransition("a linked attempt keeps its parent's tenant and idempotency key")
    now = clock.now()
    reason = clean_text(reason)
    # A retry never widens credentials: whatever was asked for, the linked
    # attempt may use at most what its parent could.
    scopes = new.scopes & parent.scopes
    narrowed = new.scopes - scopes
    with transaction.atomic():
        root = (
            Attempt.objects.select_for_update()
            .filter(tenant_id=new.tenant_id, idempotency_key=new.idempotency_key, parent__isnull=True)
            .get()
        )
        owner_id, source = pick_owner(new.tenant_id, now)
        attempt = Attempt.objects.create(
            tenant_id=new.tenant_id,
            task_id=new.task_id,
            tool_name=new.tool_name,
            idempotency_key=new.idempotency_key,
            provider_key=linked_provider_key(root, new.args_hash),
            args=new.args,
            args_hash=new.args_hash,
            state=S.MANUAL_REVIEW,
            policy_version=new.policy_version,
            credential_scope=scope_string(scopes),
            parent=parent,
            owner_id=owner_id,
            requested_by_id=requested_by_id,
            api_token_id=new.api_token_id,
            last_note=reason,
            created_at=now,
            updated_at=now,
        )
        append_events(
            [
                EventDraft(
                    new.tenant_id,
                    attempt.pk,
                    EventKind.TRANSITION,
                    actor,
                    to_state=S.MANUAL_REVIEW,
                    fence=0,
                    reason=reason,
                    details={
                        "parent_id": parent.pk,
                        "task_id": new.task_id,
                        "tool_name": new.tool_name,
                        "idempotency_key": new.idempotency_key,
                        "provider_key": attempt.provider_key,
                        "args_hash": new.args_hash,
                        "parent_args_hash": parent.args_hash,
                        "policy_version": new.policy_version,
                        "parent_policy_version": parent.policy_version,
                        "credential_scope": attempt.credential_scope,
                        "scope_narrowed_from": scope_string(new.scopes) if narrowed else None,
                        "owner_assigned": {"user_id": owner_id, "by": source},
                    },
                )
            ],
            now=now,
        )
    return attempt


def create_retry_under(
    policy: Policy,
    allowed: frozenset[str],
    *,
    original: Attempt,
    actor: Actor,
    reason: str,
    requested_by_id: int | None = None,
) -> Attempt:
    """A linked retry of ``original`` under ``policy``: same arguments and
    key, the scope narrowed to what both the original and the policy allow."""
    return attempt_create_linked(
        parent=original,
        new=NewAttempt(
            tenant_id=original.tenant_id,
            task_id=original.task_id,
            tool_name=original.tool_name,
            idempotency_key=original.idempotency_key,
            args=original.args,
            args_hash=original.args_hash,
            policy_version=policy.version,
            scopes=original.scopes & allowed,
            api_token_id=original.api_token_id,
        ),
        actor=actor,
        reason=reason,
        requested_by_id=requested_by_id,
    )

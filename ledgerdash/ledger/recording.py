# Over 600 lines because: it is the agent's whole in-process API, the wrapper and every step.
"""The agent-facing recording API.

Wrap each side-effecting tool once::

    from ledgerdash.ledger import recording as ledger

    @ledger.tool("send_email", key="invoice:{invoice_id}:send")
    def send_email(call, *, invoice_id, to, body):
        response = provider.send(to=to, body=body, idempotency_key=call.key)
        call.record_request_id(response["id"])   # persisted at once
        return response

    with ledger.task(tenant="acme", task_id="billing-run-42"):
        send_email(invoice_id="INV-7", to="ap@example.com", body="…")

Each call records the intent (normalized, hashed, stamped with the tenant's
current policy version) before anything is sent, commits DISPATCHED before
the tool runs, and records the outcome. Re-running a task is safe: a call
whose key was confirmed returns the stored result without calling the tool;
one whose outcome is UNKNOWN, under review or in flight elsewhere raises
instead of calling it again.

Every step commits on its own and refuses to run inside the caller's open
transaction (:class:`~ledgerdash.ledger.errors.InsideTransaction`): a
rollback there would erase an intent whose tool already acted. A step that
finds the database gone raises
:class:`~ledgerdash.ledger.errors.LedgerUnavailable` and drops the broken
connection, so the next call connects again.

The same steps are available one by one (:func:`record_intent`,
:func:`mark_dispatched`, :func:`confirm`, …) for callers that need them,
such as the HTTP API.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError, connection, transaction

from ledgerdash.ledger import clock, moves, rules, store
from ledgerdash.ledger.authority import Authority, approval_needed, authorize
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import (
    AlreadyHappened,
    ApprovalRejected,
    AttemptBlocked,
    AttemptFailed,
    AttemptInFlight,
    AttemptSuperseded,
    AwaitingApproval,
    ClaimLost,
    IdempotencyConflict,
    InvalidField,
    InvalidKey,
    LedgerError,
    LedgerUnavailable,
    NothingHappened,
    OutcomeUnknown,
    PermanentFailure,
    ResultUnavailable,
    RetryPending,
    TenantInactive,
    UnderReview,
    UnknownTenant,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, FailedBecause, ResultSource, State, Tenant
from ledgerdash.ledger.moves import NewAttempt, Outcome, Report
from ledgerdash.ledger.store import Guard
from ledgerdash_client import keys, toolcalls
from ledgerdash_client.toolcalls import ToolCall

__all__ = [
    "ApprovalRejected",
    "AttemptBlocked",
    "AwaitingApproval",
    "IdempotencyConflict",
    "NoTask",
    "NothingHappened",
    "PermanentFailure",
    "Recorded",
    "ToolCall",
    "abandon",
    "confirm",
    "fail",
    "fail_retryable",
    "heartbeat",
    "mark_dispatched",
    "mark_unknown",
    "provider_tool",
    "record_intent",
    "record_request_id",
    "replay",
    "report_outcome",
    "task",
    "tool",
]


MAX_KEY = keys.MAX_KEY
MAX_NAME = 255


def _default_agent() -> Actor:
    return Actor.agent(f"{socket.gethostname()}:{os.getpid()}")


def reconnecting[**P, T](step: Callable[P, T]) -> Callable[P, T]:
    """Run an agent's step; when the database connection is gone, drop it
    (the next step connects afresh) and raise :class:`LedgerUnavailable`.

    Outside a request, Django keeps a broken connection until something
    closes it: without this, a server restart would fail every later call of
    a long-running agent until the process restarts."""

    @functools.wraps(step)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return step(*args, **kwargs)
        except (OperationalError, InterfaceError) as exc:
            if not connection.in_atomic_block:
                connection.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LedgerUnavailable(LedgerUnavailable.MESSAGE.format(error=first)) from exc

    return guarded


#: What this ledger raises instead of letting a tool run (framework adapters never hand it to a model).
REFUSALS = (LedgerError,)


# --- validation -------------------------------------------------------------------


def _has_control(value: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


def validate_key(key: Any) -> str:
    """The key as given, or InvalidKey saying why not (the rule: :mod:`ledgerdash_client.keys`)."""
    problem = keys.key_problem(key)
    if problem is not None:
        raise InvalidKey(problem)
    return str(key)


def validate_name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidField(InvalidField.EMPTY.format(field=field))
    if len(value) > MAX_NAME:
        raise InvalidField(InvalidField.TOO_LONG.format(field=field, length=len(value), limit=MAX_NAME))
    if _has_control(value):
        raise InvalidField(InvalidField.CONTROL.format(field=field))
    return value


def parse_scope(scope: str | Iterable[str] | None) -> frozenset[str] | None:
    if scope is None:
        return None
    items = scope.split() if isinstance(scope, str) else list(scope)
    for item in items:
        if not isinstance(item, str) or not item or " " in item or _has_control(item):
            raise InvalidField(f"credential scope entries must be non-empty strings without spaces, not {item!r}")
    return frozenset(items)


@reconnecting
def resolve_tenant(tenant: Tenant | str | int) -> Tenant:
    if isinstance(tenant, Tenant):
        found = tenant
    else:
        lookup = {"pk": tenant} if isinstance(tenant, int) else {"slug": tenant}
        try:
            found = Tenant.objects.get(**lookup)
        except (Tenant.DoesNotExist, ValueError):
            raise UnknownTenant(UnknownTenant.MESSAGE.format(tenant=tenant)) from None
    if not found.is_active:
        raise TenantInactive(TenantInactive.MESSAGE.format(tenant=found.slug))  # before any policy is read
    return found


# --- the steps ----------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """What :func:`record_intent` found or wrote."""

    attempt: Attempt
    #: False when the key was already recorded with these arguments: this is
    #: that attempt, nothing new was written.
    created: bool

    @property
    def claimed(self) -> bool:
        """The dispatch was claimed with the intent (``claim=True``, granted):
        the attempt is this caller's to send, DISPATCHED, with its fence."""
        return self.created and self.attempt.state == State.DISPATCHED


@reconnecting
def record_intent(
    *,
    tenant: Tenant | str | int,
    task_id: str,
    tool_name: str,
    idempotency_key: str,
    args: Any,
    credential_scope: str | Iterable[str] | None = None,
    actor: Actor | None = None,
    requested_by_id: int | None = None,
    api_token_id: int | None = None,
    claim: bool = False,
) -> Recorded:
    """Record the intent to call ``tool_name`` with ``args`` under ``idempotency_key``.

    ``claim``: the caller sends the call at once, so claim its dispatch in
    the same commit where the tool allows it (``Tool.claim_with_intent``; never
    for a call that waits for approval): :attr:`Recorded.claimed` says whether
    it was, and the attempt is then DISPATCHED (skip :func:`mark_dispatched`).

    When the tenant's policy requires approval for this call (see
    :func:`ledgerdash.ledger.authority.approval_needed`), the new attempt waits
    in MANUAL_REVIEW for an approver instead (:func:`refuse_unless_dispatchable`
    then raises :class:`AwaitingApproval`); ``requested_by_id`` names the
    person behind the agent, who may not approve it. ``api_token_id``: the
    token the agent called with (its decisions are told to that token's
    callbacks).

    - a new key: a new attempt in INTENT_RECORDED (``created=True``);
    - the same key and arguments: the existing attempt (``created=False``);
    - the same key with other arguments (or another tool): a linked attempt
      in MANUAL_REVIEW is recorded and :class:`IdempotencyConflict` raised,
      naming it. The tool must not be called.

    Bad input (arguments that are not JSON, an unknown tenant, a tool or
    scope the policy does not allow, an empty or over-long key) raises a
    named error and writes nothing.
    """
    actor = actor or _default_agent()
    key = validate_key(idempotency_key)
    task_id = validate_name(task_id, "task_id")
    tool_name = validate_name(tool_name, "tool_name")
    requested = parse_scope(credential_scope)
    normalized, args_hash = normalize_args(args)
    found = resolve_tenant(tenant)
    # Under the authority the store gives (:func:`ledgerdash.ledger.store.under_authority`):
    # a refusal, and a match against an earlier attempt, always rest on the
    # authority read now. Most keys are new: the intent is recorded first,
    # and only when the key already has an attempt (recorded earlier, or a
    # moment ago by a concurrent caller) is its chain read to match against.
    tried: list[NewAttempt] = []

    def intend(authority: Authority, guard: Guard | None) -> Attempt | None:
        # The tenant as read with the policy: a task's copy may predate its deactivation.
        scopes = authorize(authority.tenant or found, authority.policy, tool_name, requested)
        assert authority.policy is not None  # authorize refuses a tenant without one
        new = NewAttempt(
            tenant_id=found.pk,
            task_id=task_id,
            tool_name=tool_name,
            idempotency_key=key,
            args=normalized,
            args_hash=args_hash,
            policy_version=authority.policy.version,
            scopes=scopes,
            api_token_id=api_token_id,
        )
        tried.append(new)
        return moves.attempt_create_intent(
            new=new,
            actor=actor,
            approval_required=approval_needed(authority.policy, tool_name, normalized),
            requested_by_id=requested_by_id,
            guard=guard,
            claim=authority.timing if claim and authority.claims_with_intent else None,
        )

    created = store.under_authority(found.pk, tool_name, intend)
    if created is not None:
        return Recorded(created, True)
    new = tried[-1]
    existing = _match(found.pk, key, args_hash, tool_name)
    if existing is not None and existing.args_hash == args_hash and existing.tool_name == tool_name:
        return Recorded(existing, False)
    return _record_conflict(new, actor)


def _chain(tenant_id: int, key: str) -> list[Attempt]:
    return list(Attempt.objects.filter(tenant_id=tenant_id, idempotency_key=key).order_by("-id"))


def _match(tenant_id: int, key: str, args_hash: str, tool_name: str) -> Attempt | None:
    """The newest attempt of the key's chain with these arguments, else the
    chain's newest attempt (a conflict), else None (a new key)."""
    chain = _chain(tenant_id, key)
    for attempt in chain:
        if attempt.args_hash == args_hash and attempt.tool_name == tool_name:
            return attempt
    return chain[0] if chain else None


def _record_conflict(new: NewAttempt, actor: Actor) -> Recorded:
    with transaction.atomic():
        # Serialize conflicting recorders on the chain's root, then look again:
        # a concurrent caller may have recorded this very linked attempt.
        Attempt.objects.select_for_update().filter(
            tenant_id=new.tenant_id, idempotency_key=new.idempotency_key, parent__isnull=True
        ).get()
        chain = _chain(new.tenant_id, new.idempotency_key)
        for attempt in chain:
            if attempt.args_hash == new.args_hash and attempt.tool_name == new.tool_name:
                return Recorded(attempt, False)
        head = chain[0]
        linked = moves.attempt_create_linked(
            parent=head,
            new=new,
            actor=actor,
            reason=(
                f"idempotency key reused with different {'tool' if head.tool_name != new.tool_name else 'arguments'}"
                f" (attempt #{head.pk}); not sent, needs review"
            ),
        )
    raise IdempotencyConflict(
        IdempotencyConflict.MESSAGE.format(key=new.idempotency_key, original_id=head.pk, attempt_id=linked.pk),
        linked,
        original_id=chain[-1].pk,  # the first recorded (the chain is newest first)
    )


@reconnecting
def mark_dispatched(attempt: Attempt, *, actor: Actor | None = None) -> Attempt:
    """Claim the attempt for dispatch; commit happens before this returns, so
    call it BEFORE the request leaves. The returned attempt's ``fence`` goes
    with the outcome report. Losing to another worker raises ClaimLost."""
    return moves.attempt_dispatch(attempt=attempt, actor=actor or _default_agent(), fence=attempt.fence)


@reconnecting
def record_request_id(
    attempt: Attempt, request_id: str, *, fence: int | None = None, actor: Actor | None = None
) -> Attempt:
    return moves.attempt_record_request_id(
        attempt=attempt,
        fence=attempt.fence if fence is None else fence,
        request_id=request_id,
        actor=actor or _default_agent(),
    )


@reconnecting
def report_outcome(
    attempt: Attempt,
    *,
    outcome: str,
    fence: int | None = None,
    provider_request_id: str = "",
    result_ref: str = "",
    result: Any = None,
    result_source: str = ResultSource.TOOL,
    reason: str = "",
    actor: Actor | None = None,
) -> Report:
    """Report what the provider said (``confirmed``, ``failed``,
    ``failed_retryable`` or ``unknown``) with the dispatch fence. The same
    report sent twice is a replay (``replayed``); a report about an attempt
    that moved on is recorded as evidence (``late``). See
    :func:`ledgerdash.ledger.moves.attempt_report`."""
    return moves.attempt_report(
        attempt=attempt,
        fence=attempt.fence if fence is None else fence,
        actor=actor or _default_agent(),
        outcome=outcome,
        provider_request_id=provider_request_id,
        result_ref=result_ref,
        result=result,
        result_source=result_source,
        reason=reason,
    )


def confirm(
    attempt: Attempt,
    *,
    provider_request_id: str = "",
    result_ref: str = "",
    result: Any = None,
    fence: int | None = None,
    actor: Actor | None = None,
) -> Attempt:
    return report_outcome(
        attempt,
        outcome=Outcome.CONFIRMED,
        fence=fence,
        provider_request_id=provider_request_id,
        result_ref=result_ref,
        result=result,
        actor=actor,
    ).attempt


def fail(attempt: Attempt, *, reason: str, fence: int | None = None, actor: Actor | None = None) -> Attempt:
    return report_outcome(attempt, outcome=Outcome.FAILED, fence=fence, reason=reason, actor=actor).attempt


def fail_retryable(attempt: Attempt, *, reason: str, fence: int | None = None, actor: Actor | None = None) -> Attempt:
    return report_outcome(attempt, outcome=Outcome.FAILED_RETRYABLE, fence=fence, reason=reason, actor=actor).attempt


def mark_unknown(attempt: Attempt, *, reason: str, fence: int | None = None, actor: Actor | None = None) -> Attempt:
    return report_outcome(attempt, outcome=Outcome.UNKNOWN, fence=fence, reason=reason, actor=actor).attempt


@reconnecting
def heartbeat(attempt: Attempt, *, fence: int | None = None, actor: Actor | None = None) -> Attempt:
    """The dispatcher's work is still running: extend its lease (see
    :func:`ledgerdash.ledger.moves.attempt_heartbeat`)."""
    return moves.attempt_heartbeat(
        attempt=attempt, fence=attempt.fence if fence is None else fence, actor=actor or _default_agent()
    )


@reconnecting
def abandon(attempt: Attempt, *, reason: str = "", fence: int | None = None, actor: Actor | None = None) -> Attempt:
    """Give up an intent that was never sent (INTENT_RECORDED -> FAILED):
    for an agent that re-ran its task with other arguments after a crash,
    so the linked attempt it was told about can be approved."""
    return moves.attempt_abandon_intent(
        attempt=attempt, fence=attempt.fence if fence is None else fence, actor=actor or _default_agent(), reason=reason
    )


def replay(attempt: Attempt) -> Any:
    """A confirmed attempt's recorded result, for a re-run of its key: the
    tool's own return value, or the provider's answer when recovery
    confirmed it by a lookup. Raises :class:`ResultUnavailable` when none was
    recorded: the effect happened, and an empty value would say otherwise."""
    if attempt.result_source in (ResultSource.TOOL, ResultSource.LOOKUP):
        return attempt.result
    raise ResultUnavailable(
        ResultUnavailable.MESSAGE.format(attempt_id=attempt.pk, how=attempt.last_note or "confirmed"), attempt
    )


def refuse_unless_dispatchable(attempt: Attempt) -> None:
    """Raise the error that tells an agent why it must not call the tool now.

    Returns quietly for INTENT_RECORDED (go ahead: claim it) and
    OUTCOME_CONFIRMED (replay the stored result).
    """
    state = attempt.state
    if state in (State.INTENT_RECORDED, State.OUTCOME_CONFIRMED):
        return
    if state == State.UNKNOWN:
        raise OutcomeUnknown(OutcomeUnknown.MESSAGE.format(attempt_id=attempt.pk), attempt)
    refuse_while_approval_pending(attempt)
    if state == State.MANUAL_REVIEW:
        raise UnderReview(UnderReview.MESSAGE.format(attempt_id=attempt.pk), attempt)
    if state == State.DISPATCHED:
        raise AttemptInFlight(AttemptInFlight.MESSAGE.format(attempt_id=attempt.pk, holder="another worker"), attempt)
    if state == State.FAILED_RETRYABLE:
        if attempt.next_check_at is None or attempt.next_check_at <= clock.now():
            return
        raise RetryPending(RetryPending.MESSAGE.format(attempt_id=attempt.pk, due=attempt.next_check_at), attempt)
    if state == State.FAILED and attempt.failed_because == FailedBecause.ALREADY_HAPPENED:
        raise AlreadyHappened(AlreadyHappened.MESSAGE.format(attempt_id=attempt.pk, why=attempt.last_note), attempt)
    if state == State.FAILED:
        raise AttemptFailed(
            AttemptFailed.MESSAGE.format(attempt_id=attempt.pk, reason=attempt.last_note or "failed"), attempt
        )
    child = attempt.children.order_by("-id").first()
    raise AttemptSuperseded(
        AttemptSuperseded.MESSAGE.format(attempt_id=attempt.pk, child_id=child.pk if child else "?"), attempt
    )


def refuse_while_approval_pending(attempt: Attempt) -> None:
    """Raise :class:`AwaitingApproval` while a call waits for an approver,
    and :class:`ApprovalRejected` (with the approver's reason) once one
    rejected it before it was sent; else return quietly. Only first calls:
    a linked retry is under review (:class:`UnderReview`) and, rejected, failed."""
    if attempt.parent_id is not None:
        return
    if rules.awaiting_approval(attempt):
        raise AwaitingApproval(
            AwaitingApproval.MESSAGE.format(attempt_id=attempt.pk, why=attempt.approval_required),
            attempt,
        )
    if attempt.state == State.FAILED and attempt.failed_because == FailedBecause.REJECTED:
        raise ApprovalRejected(
            ApprovalRejected.MESSAGE.format(attempt_id=attempt.pk, reason=attempt.last_note or "rejected"), attempt
        )


# --- the one-line wrapper -------------------------------------------------------------


@dataclass(frozen=True)
class TaskContext:
    tenant: Tenant
    task_id: str
    actor: Actor


_current_task: ContextVar[TaskContext | None] = ContextVar("ledgerdash_task", default=None)


class NoTask(LedgerError):
    code = "no_task"
    MESSAGE = "call ledger tools inside `with ledger.task(tenant=..., task_id=...)`"


@contextmanager
def task(*, tenant: Tenant | str | int, task_id: str, agent: str | None = None) -> Iterator[TaskContext]:
    """The tenant and task that tool calls inside this block belong to."""
    context = TaskContext(
        tenant=resolve_tenant(tenant),
        task_id=validate_name(task_id, "task_id"),
        actor=Actor.agent(agent) if agent else _default_agent(),
    )
    token = _current_task.set(context)
    try:
        yield context
    finally:
        _current_task.reset(token)


class _InProcess:
    """The wrapper's way to the ledger in this process (see :mod:`ledgerdash_client.toolcalls`)."""

    def __init__(self, context: TaskContext) -> None:
        self.context = context

    def record_intent(
        self, *, tool_name: str, idempotency_key: str, args: dict[str, Any], credential_scope: Any
    ) -> tuple[Attempt, bool]:
        recorded = record_intent(
            tenant=self.context.tenant,
            task_id=self.context.task_id,
            tool_name=tool_name,
            idempotency_key=idempotency_key,
            args=args,
            credential_scope=credential_scope,
            actor=self.context.actor,
            claim=True,
        )
        return recorded.attempt, recorded.claimed

    def refuse_unless_dispatchable(self, attempt: Attempt) -> None:
        refuse_unless_dispatchable(attempt)

    def replay(self, attempt: Attempt) -> Any:
        return replay(attempt)

    def dispatch(self, attempt: Attempt) -> Attempt:
        try:
            return mark_dispatched(attempt, actor=self.context.actor)
        except ClaimLost:
            raise AttemptInFlight(
                AttemptInFlight.MESSAGE.format(attempt_id=attempt.pk, holder="another worker"), attempt
            ) from None

    def heartbeat_interval(self, attempt: Attempt) -> float:
        if attempt.next_check_at is None:
            return 0.0
        return max(0.05, (attempt.next_check_at - attempt.updated_at).total_seconds() / 3)

    def heartbeat(self, attempt: Attempt, fence: int) -> Attempt:
        return heartbeat(attempt, fence=fence, actor=self.context.actor)

    def heartbeat_done(self) -> None:
        connection.close()  # the heartbeat thread's own connection

    def record_request_id(self, attempt: Attempt, request_id: str, fence: int) -> Attempt:
        return record_request_id(attempt, request_id, fence=fence, actor=self.context.actor)

    def confirm(
        self, attempt: Attempt, *, fence: int, provider_request_id: str, result_ref: str, result: Any, storable: bool
    ) -> Attempt:
        return report_outcome(
            attempt,
            outcome=Outcome.CONFIRMED,
            provider_request_id=provider_request_id,
            result_ref=result_ref,
            result=result,
            result_source=ResultSource.TOOL if storable else "",
            fence=fence,
            actor=self.context.actor,
        ).attempt

    def fail(self, attempt: Attempt, *, fence: int, reason: str, retryable: bool) -> Attempt:
        report = fail_retryable if retryable else fail
        return report(attempt, fence=fence, actor=self.context.actor, reason=reason)

    def mark_unknown(self, attempt: Attempt, *, fence: int, reason: str) -> Attempt:
        return mark_unknown(attempt, reason=reason, fence=fence, actor=self.context.actor)


def _session() -> _InProcess:
    context = _current_task.get()
    if context is None:
        raise NoTask(NoTask.MESSAGE)
    return _InProcess(context)


def tool[T](
    name: str,
    *,
    key: str | Callable[[dict[str, Any]], str],
    scope: str | Iterable[str] | None = None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Wrap a tool function so every call goes through the ledger.

    ``key`` names the logical side effect: a format string over the call's
    arguments (``"invoice:{invoice_id}:send"``) or a function of them. It
    must be stable across restarts, never random.

    The tool receives a :class:`ToolCall` first (``call.key`` for the
    provider, ``call.record_request_id``), then its own arguments. Raise
    :class:`NothingHappened` when the provider guarantees it did not act,
    :class:`PermanentFailure` for a definitive refusal; any other exception
    leaves the outcome UNKNOWN for the reconciler. Return JSON-serializable
    values to have them replayed on a re-run. (The steps are shared with the
    HTTP client: :mod:`ledgerdash_client.toolcalls`.)
    """
    validate_name(name, "tool name")

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        return toolcalls.wrap(fn, name=name, key=key, scope=scope, session=_session)

    return decorate


def provider_tool(
    name: str, *, key: str | Callable[[dict[str, Any]], str], scope: str | Iterable[str] | None = None
) -> Callable[..., Any]:
    """A tool that needs no code: each call is sent through the provider
    adapter configured for ``name`` (the ``Tool`` table), with the same
    ledger steps as :func:`tool`. Returns the provider's response."""

    def call_provider(call: ToolCall, **_arguments: Any) -> Any:
        from ledgerdash.ledger.providers.base import dispatch_through
        from ledgerdash.ledger.providers.registry import profile_for

        try:
            profile = profile_for(name, getattr(call.attempt, "tenant_id", None))  # with the tenant's credentials
        except (OperationalError, InterfaceError) as exc:
            # The database went away between the dispatch and the send (a
            # failover): nothing left for the provider, and the agent may call
            # again with the key. The broken connection is not reused (as in
            # :func:`reconnecting`, unless a caller's transaction holds it).
            if not connection.in_atomic_block:
                connection.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise NothingHappened(
                f"the ledger's database could not be read before sending ({first}); nothing was sent"
            ) from exc
        if profile is None:
            raise PermanentFailure(f"no provider adapter is configured for {name}; nothing was sent")
        return dispatch_through(profile.adapter, call)

    return tool(name, key=key, scope=scope)(call_provider)

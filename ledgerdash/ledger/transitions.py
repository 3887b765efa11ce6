"""Every change to an attempt, and the event that records it.

This module is the only writer of ``Attempt.state``. Each function is
keyword-only, named ``<thing>_<verb>``, and in one transaction:

1. compare-and-sets the row on ``(id, state, fence)`` (or locks it, for
   people's decisions, which re-check authority under the lock),
2. checks the move is legal for that actor (:data:`LEGAL_MOVES`),
3. writes the new state and appends the event to the tenant's hash chain.

An illegal move raises a named error from :mod:`ledgerdash.ledger.errors`
and writes nothing. A stale caller (its fence moved on) gets
:class:`~ledgerdash.ledger.errors.StaleFence`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.db.models import Case, F, Field, Value, When
from django.db.models.functions import Coalesce, Greatest

from ledgerdash.ledger import chain, clock
from ledgerdash.ledger.authority import authority_of, current_policy, dispatch_standing, scope_string, standing_of
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    AttemptNotFound,
    AuthorizationChanged,
    ClaimLost,
    IllegalTransition,
    IncidentError,
    InsideTransaction,
    InvalidField,
    MissingEvidence,
    OwnershipError,
    RequestIdConflict,
    RetryPending,
    SelfApproval,
    StaleFence,
)
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    ActorKind,
    Attempt,
    AttemptEvent,
    ChainHead,
    FailedBecause,
    Incident,
    OnCallShift,
    Policy,
    ResultSource,
    State,
    Tenant,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

S = State
A, R, U = ActorKind.AGENT, ActorKind.RECONCILER, ActorKind.USER

#: (from, to) -> the kinds of actor that may make that move. DESIGN.md's
#: table, plus the moves it implies: INTENT_RECORDED -> FAILED (an intent
#: abandoned past its lease: nothing was sent), UNKNOWN -> FAILED (a late,
#: definitive failure report from the original dispatcher),
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
    (S.UNKNOWN, S.FAILED): frozenset({A}),
    (S.UNKNOWN, S.DISPATCHED): frozenset({R}),
    (S.UNKNOWN, S.UNKNOWN): frozenset({R}),
    (S.UNKNOWN, S.MANUAL_REVIEW): frozenset({R}),
    # people decide; the original dispatcher's late report is evidence too
    (S.MANUAL_REVIEW, S.OUTCOME_CONFIRMED): frozenset({U, A}),
    (S.MANUAL_REVIEW, S.FAILED): frozenset({U, A}),
    (S.MANUAL_REVIEW, S.RECONCILED): frozenset({U}),
    (S.MANUAL_REVIEW, S.INTENT_RECORDED): frozenset({U}),
    (S.MANUAL_REVIEW, S.UNKNOWN): frozenset({U}),
}
#: States an attempt can be created in, and by whom: an agent's intent, or
#: a linked attempt that must be reviewed before anything is sent.
CREATE_MOVES: dict[str, frozenset[str]] = {
    S.INTENT_RECORDED: frozenset({A}),
    S.MANUAL_REVIEW: frozenset({A, R, U}),
}

MAX_REASON = 4000


@dataclass(frozen=True)
class Actor:
    """Who makes a change: written into every event."""

    kind: str
    label: str
    user_id: int | None = None

    @classmethod
    def agent(cls, label: str = "agent") -> Actor:
        return cls(ActorKind.AGENT, label)

    @classmethod
    def reconciler(cls, label: str = "reconciler") -> Actor:
        return cls(ActorKind.RECONCILER, label)

    @classmethod
    def user(cls, user: AbstractBaseUser) -> Actor:
        return cls(ActorKind.USER, user.get_username(), user.pk)

    @classmethod
    def system(cls, label: str = "system") -> Actor:
        return cls(ActorKind.SYSTEM, label)

    def __str__(self) -> str:
        return f"{self.kind} {self.label}"


@dataclass
class _Event:
    tenant_id: int
    attempt_id: int | None
    kind: str
    actor: Actor
    from_state: str = ""
    to_state: str = ""
    fence: int | None = None
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def _clean_text(text: str) -> str:
    # PostgreSQL text cannot hold NUL; reasons are free text from people and tools.
    return text.replace("\x00", "\ufffd")[:MAX_REASON]


def append_events(events: list[_Event], *, now: datetime | None = None) -> list[AttemptEvent]:
    """Append events to their tenants' hash chains. Must run inside a transaction.

    Called last in every transaction, after the attempt rows are written, so
    the chain-head lock (one per tenant) is held for as short a time as
    possible and always taken after attempt locks (no lock-order deadlocks).
    """
    connection = transaction.get_connection()
    assert connection.in_atomic_block, "events are appended inside the change's transaction"
    now = now or clock.now()
    if len(events) == 1 and connection.vendor == "postgresql":
        row = _append_one_postgres(events[0], now)
        if row is not None:
            return [row]
    rows: list[AttemptEvent] = []
    for tenant_id in sorted({e.tenant_id for e in events}):
        head, _ = ChainHead.objects.select_for_update().get_or_create(
            tenant_id=tenant_id, defaults={"seq": 0, "hash": chain.GENESIS}
        )
        seq, prev = head.seq, head.hash
        for event in (e for e in events if e.tenant_id == tenant_id):
            seq += 1
            row = _event_row(event, now)
            row.seq, row.prev_hash = seq, prev
            row.hash = this_hash = chain.link(prev, row.content_hash)
            rows.append(row)
            prev = this_hash
        ChainHead.objects.filter(pk=tenant_id).update(seq=seq, hash=prev)
    AttemptEvent.objects.bulk_create(rows)
    return rows


def _event_row(event: _Event, now: datetime) -> AttemptEvent:
    row = AttemptEvent(
        tenant_id=event.tenant_id,
        attempt_id=event.attempt_id,
        kind=event.kind,
        actor_kind=event.actor.kind,
        actor_user_id=event.actor.user_id,
        actor_label=event.actor.label,
        from_state=event.from_state,
        to_state=event.to_state,
        fence=event.fence,
        reason=_clean_text(event.reason),
        details=event.details,
        created_at=now,
    )
    row.content_hash = chain.content_hash(chain.event_content(row))
    return row


# --- PostgreSQL: a change and its event in one statement -----------------------------
#
# The chain link is computed by the server (chain.link in SQL: sha256 of the
# two digests' bytes) while it holds the chain head's lock, so appending an
# event is one statement. Outside a transaction, the attempt's compare-and-set
# (or insert) goes into the same statement: the change and its event commit
# together, in one round trip, and the tenant's chain head stays locked only
# while the server executes and commits it, with no client work in between.

#: Lock the tenant's chain head (FOR UPDATE waits for, then reads, the latest
#: committed head), link the event to it, move the head, insert the event.
#: ``{guard}`` makes all of it conditional on the change having happened.
_APPEND_TAIL = """
head AS (
    SELECT seq, hash FROM {head} WHERE tenant_id = %s{guard} FOR UPDATE
), link AS (
    SELECT seq + 1 AS seq, hash AS prev_hash,
           encode(sha256(decode(hash, 'hex') || decode(%s, 'hex')), 'hex') AS hash
    FROM head
), head_moved AS (
    UPDATE {head} SET seq = link.seq, hash = link.hash FROM link WHERE {head}.tenant_id = %s
)
INSERT INTO {event} (
    tenant_id, seq, attempt_id, kind, actor_kind, actor_user_id, actor_label, from_state, to_state,
    fence, reason, details, created_at, content_hash, prev_hash, hash
)
SELECT %s::bigint, link.seq, %s::bigint, %s::varchar, %s::varchar, %s::integer, %s::varchar, %s::varchar,
       %s::varchar, %s::bigint, %s::text, %s::jsonb, %s::timestamptz, %s::varchar, link.prev_hash, link.hash
FROM {source}
RETURNING id, seq, prev_hash, hash
"""


def _append_sql(change: str = "") -> str:
    """The append statement; with ``change`` (a data-modifying statement that
    RETURNS the attempt's id), that change first, and the event only if it
    changed a row. If it did and the tenant has no chain head, the event's
    seq is NULL and the whole statement fails: never a change without its event."""
    tables = {"head": ChainHead._meta.db_table, "event": AttemptEvent._meta.db_table}
    if not change:
        return "WITH " + _APPEND_TAIL.format(guard="", source="link", **tables)
    tail = _APPEND_TAIL.format(
        guard=" AND EXISTS (SELECT FROM changed)", source="changed LEFT JOIN link ON true", **tables
    )
    return f"WITH changed AS (\n{change}\n), {tail}"


def _append_params(row: AttemptEvent, connection: Any) -> list[Any]:
    details = AttemptEvent._meta.get_field("details").get_db_prep_value(row.details, connection)
    return [
        row.tenant_id,
        row.content_hash,
        row.tenant_id,
        row.tenant_id,
        row.attempt_id,
        row.kind,
        row.actor_kind,
        row.actor_user_id,
        row.actor_label,
        row.from_state,
        row.to_state,
        row.fence,
        row.reason,
        details,
        row.created_at,
        row.content_hash,
    ]


def _execute_append(sql: str, params: list[Any], row: AttemptEvent) -> AttemptEvent | None:
    """Run an append statement; the event row as written, or None if none was."""
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchone()
    if returned is None:
        return None
    row.pk, row.seq, row.prev_hash, row.hash = returned
    row._state.adding = False
    row._state.db = connection.alias
    return row


def _append_one_postgres(event: _Event, now: datetime) -> AttemptEvent | None:
    """Append one event in one statement; None if the tenant has no chain
    head yet (nothing was written: the general path creates it)."""
    row = _event_row(event, now)
    return _execute_append(_append_sql(), _append_params(row, transaction.get_connection()), row)


def _one_statement() -> bool:
    """Whether a change and its event can be one autocommitted statement:
    on PostgreSQL, when no transaction is open (inside one, the caller's
    other statements must commit with it)."""
    connection = transaction.get_connection()
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _prepared(name: str, value: Any, connection: Any) -> tuple[str, Any]:
    """The quoted column of an Attempt field and ``value`` as the ORM would send it."""
    model_field = Attempt._meta.get_field(name)
    assert isinstance(model_field, Field)
    return connection.ops.quote_name(model_field.column), model_field.get_db_prep_save(value, connection)


def _cas_with_event(attempt: Attempt, values: dict[str, Any], event: _Event, now: datetime) -> bool:
    """Compare-and-set ``attempt`` on (id, state, fence), bump its fence, write
    ``values`` and append ``event``, in one statement. False if the row had
    moved on (nothing was written)."""
    connection = transaction.get_connection()
    assignments = [_prepared(name, value, connection) for name, value in values.items()]
    sets = ", ".join(f"{column} = %s" for column, _ in assignments)
    # Table and column names come from the model; every value is a parameter.
    table = Attempt._meta.db_table
    change = f"UPDATE {table} SET fence = fence + 1, {sets} WHERE id = %s AND state = %s AND fence = %s RETURNING id"  # noqa: S608
    row = _event_row(event, now)
    params = [value for _, value in assignments] + [attempt.pk, attempt.state, attempt.fence]
    return _execute_append(_append_sql(change), params + _append_params(row, connection), row) is not None


def _insert_with_event(attempt: Attempt, event: _Event, now: datetime) -> bool:
    """Insert a root attempt and append its event in one statement. False when
    the key already has a root (ON CONFLICT on the partial unique index:
    nothing was written)."""
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [Attempt._meta.db_table])
        (attempt.pk,) = cursor.fetchone()  # the event's content names the attempt
    assignments = [_prepared(f.name, f.pre_save(attempt, True), connection) for f in Attempt._meta.concrete_fields]
    columns, placeholders = ", ".join(column for column, _ in assignments), ", ".join(["%s"] * len(assignments))
    # Table and column names come from the model; every value is a parameter.
    change = (
        f"INSERT INTO {Attempt._meta.db_table} ({columns}) VALUES ({placeholders}) "  # noqa: S608
        "ON CONFLICT (tenant_id, idempotency_key) WHERE parent_id IS NULL DO NOTHING RETURNING id"
    )
    event.attempt_id = attempt.pk
    row = _event_row(event, now)
    params = [value for _, value in assignments]
    if _execute_append(_append_sql(change), params + _append_params(row, connection), row) is None:
        attempt.pk = None
        return False
    attempt._state.adding = False
    attempt._state.db = connection.alias
    return True


def event_record(
    *, tenant: Tenant | int, kind: str, actor: Actor, reason: str = "", details: dict[str, Any] | None = None
) -> AttemptEvent:
    """Record something that happened to a tenant's ledger as a whole (an
    export, a policy change, a drill run) in its chain."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    with transaction.atomic():
        (row,) = append_events([_Event(tenant_id, None, kind, actor, reason=reason, details=details or {})])
    return row


# --- helpers -----------------------------------------------------------------


def refuse_open_transaction(what: str) -> None:
    """Refuse to record an agent's step inside the caller's open transaction.

    The ledger's promise is that the intent and the dispatch claim are
    committed before the tool runs. Inside a caller's ``atomic()`` block they
    would be a savepoint: recovery could not see them while the tool runs,
    and the caller's rollback would erase them although the provider acted.
    ``atomic(durable=True)`` is Django's test for "no transaction is open"
    (it tolerates only the test case's own wrapping transaction).
    """
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        try:
            with transaction.atomic(durable=True):
                pass
        except RuntimeError:
            raise InsideTransaction(InsideTransaction.MESSAGE.format(what=what)) from None
    elif not connection.get_autocommit():
        raise InsideTransaction(InsideTransaction.MESSAGE.format(what=what))


def _get(attempt_id: int, *, lock: bool = False) -> Attempt:
    qs = Attempt.objects.select_for_update() if lock else Attempt.objects.all()
    try:
        return qs.get(pk=attempt_id)
    except Attempt.DoesNotExist:
        raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=attempt_id)) from None


def _check_move(attempt: Attempt, to_state: str, actor: Actor) -> None:
    allowed = LEGAL_MOVES.get((attempt.state, to_state), frozenset())
    if actor.kind not in allowed:
        raise IllegalTransition(
            IllegalTransition.MESSAGE.format(
                actor=actor.kind, attempt_id=attempt.pk, from_state=attempt.state, to_state=to_state
            )
        )


def _check_fence(attempt: Attempt, fence: int | None) -> None:
    if fence is not None and fence != attempt.fence:
        raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=attempt.fence, given=fence))


def _pick_owner(tenant_id: int, now: datetime) -> tuple[int | None, str]:
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


def _move(
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
    extra_events: list[_Event] | None = None,
) -> Attempt:
    """Compare-and-set ``attempt`` (as the caller read it) to ``to_state``.

    ``fence`` is the fence the caller holds; None means "the one I just read"
    (callers that lock the row first, or that act on a fresh read).
    """
    _check_move(attempt, to_state, actor)
    _check_fence(attempt, fence)
    now = now or clock.now()
    reason = _clean_text(reason)
    details = dict(details or {})
    values: dict[str, Any] = {"state": to_state, "updated_at": now, "last_note": reason, **(updates or {})}
    if to_state in OWNED_STATES and attempt.owner_id is None and "owner_id" not in values:
        owner_id, source = _pick_owner(attempt.tenant_id, now)
        values["owner_id"] = owner_id
        details["owner_assigned"] = {"user_id": owner_id, "by": source}
    if to_state not in IN_FLIGHT_STATES:
        values.setdefault("next_check_at", None)
    event = _Event(
        attempt.tenant_id,
        attempt.pk,
        "transition",
        actor,
        from_state=attempt.state,
        to_state=to_state,
        fence=attempt.fence + 1,
        reason=reason,
        details=details,
    )
    if _one_statement() and not extra_events:
        try:
            if not _cas_with_event(attempt, values, event, now):
                _raise_stale(attempt, stale_error)
            return _moved(attempt, values)
        except IntegrityError:
            if ChainHead.objects.filter(tenant_id=attempt.tenant_id).exists():
                raise
            # The tenant's first event: the path below creates its chain head.
    with transaction.atomic():
        changed = Attempt.objects.filter(pk=attempt.pk, state=attempt.state, fence=attempt.fence).update(
            fence=F("fence") + 1, **values
        )
        if changed != 1:
            _raise_stale(attempt, stale_error)
        append_events([event, *(extra_events or [])], now=now)
    return _moved(attempt, values)


def _moved(attempt: Attempt, values: dict[str, Any]) -> Attempt:
    """The caller's copy of ``attempt`` as the compare-and-set left the row."""
    for key, value in values.items():
        setattr(attempt, key, value)
    attempt.fence += 1
    return attempt


def _raise_stale(attempt: Attempt, stale_error: type[StaleFence]) -> None:
    current = Attempt.objects.filter(pk=attempt.pk).values_list("state", "fence").first()
    if current is None:
        raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=attempt.pk))
    state, current_fence = current
    raise stale_error(
        stale_error.MESSAGE.format(attempt_id=attempt.pk, current=current_fence, given=attempt.fence, state=state)
    )


def _lease(seconds: int, now: datetime) -> datetime:
    return now + timedelta(seconds=seconds)


# --- creation ----------------------------------------------------------------


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


def attempt_create_intent(*, new: NewAttempt, actor: Actor) -> Attempt | None:
    """Record the root attempt for a key in INTENT_RECORDED.

    Returns None when the key already has a root (perhaps one committed a
    moment ago by a concurrent caller): the caller then matches against it.
    """
    refuse_open_transaction("recording an intent")
    if actor.kind not in CREATE_MOVES[S.INTENT_RECORDED]:
        raise IllegalTransition(
            IllegalTransition.MESSAGE.format(
                actor=actor.kind, attempt_id="(new)", from_state="nothing", to_state=S.INTENT_RECORDED
            )
        )
    now = clock.now()
    attempt = Attempt(
        tenant_id=new.tenant_id,
        task_id=new.task_id,
        tool_name=new.tool_name,
        idempotency_key=new.idempotency_key,
        provider_key=new.idempotency_key,
        args=new.args,
        args_hash=new.args_hash,
        state=S.INTENT_RECORDED,
        policy_version=new.policy_version,
        credential_scope=scope_string(new.scopes),
        next_check_at=_lease(settings.LEDGER_INTENT_LEASE_SECONDS, now),
        last_note="intent recorded",
        created_at=now,
        updated_at=now,
    )
    event = _Event(
        new.tenant_id,
        None,
        "transition",
        actor,
        to_state=S.INTENT_RECORDED,
        fence=0,
        reason="intent recorded",
        details={
            "task_id": new.task_id,
            "tool_name": new.tool_name,
            "idempotency_key": new.idempotency_key,
            "args_hash": new.args_hash,
            "policy_version": new.policy_version,
            "credential_scope": attempt.credential_scope,
        },
    )
    if _one_statement():
        try:
            return attempt if _insert_with_event(attempt, event, now) else None
        except IntegrityError:
            if ChainHead.objects.filter(tenant_id=new.tenant_id).exists():
                raise
            # The tenant's first event: the path below creates its chain head.
            attempt.pk, attempt._state.adding = None, True
    # The insert is the transaction's first statement, so a duplicate key
    # rolls back the whole (still empty) transaction: no savepoint needed.
    try:
        with transaction.atomic():
            attempt.save(force_insert=True)
            event.attempt_id = attempt.pk
            append_events([event], now=now)
    except IntegrityError:
        if Attempt.objects.filter(
            tenant_id=new.tenant_id, idempotency_key=new.idempotency_key, parent__isnull=True
        ).exists():
            return None
        raise
    return attempt


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
    reason = _clean_text(reason)
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
        owner_id, source = _pick_owner(new.tenant_id, now)
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
            last_note=reason,
            created_at=now,
            updated_at=now,
        )
        append_events(
            [
                _Event(
                    new.tenant_id,
                    attempt.pk,
                    "transition",
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


# --- the agent's moves ----------------------------------------------------------


def attempt_dispatch(*, attempt: Attempt, actor: Actor, fence: int | None = None, reason: str = "") -> Attempt:
    """Claim the attempt for dispatch, committed BEFORE the request leaves.

    Re-checks the tenant's current authority first. When it no longer holds,
    the attempt is not reused: it goes to review beside a linked attempt
    under the current policy (scope never wider), and
    :class:`AuthorizationChanged` names that linked attempt. An agent may
    re-send a retryable failure only after its back-off (the reconciler
    sends it when its claim finds it due). The returned attempt's ``fence``
    is the token the dispatcher must present with the outcome; a concurrent
    claimer loses with :class:`ClaimLost`.
    """
    if actor.kind == ActorKind.AGENT:
        refuse_open_transaction("claiming a dispatch")
    _check_move(attempt, S.DISPATCHED, actor)
    now = clock.now()
    if (
        actor.kind != ActorKind.RECONCILER
        and attempt.state == S.FAILED_RETRYABLE
        and attempt.next_check_at is not None
        and attempt.next_check_at > now
    ):
        raise RetryPending(RetryPending.MESSAGE.format(attempt_id=attempt.pk, due=attempt.next_check_at), attempt)
    standing, timing = dispatch_standing(attempt)
    if not standing.holds:
        _refuse_changed_authority(attempt, actor=actor, fence=fence, changes=standing.changes)
    return _move(
        attempt,
        to_state=S.DISPATCHED,
        actor=actor,
        fence=fence,
        reason=reason or ("dispatched" if attempt.dispatch_count == 0 else "dispatched again with the same key"),
        updates={
            "dispatch_fence": attempt.fence + 1,
            "dispatch_count": attempt.dispatch_count + 1,
            "check_count": 0,
            "next_check_at": now + timedelta(seconds=timing.lease_seconds),
            "lands_by": now + timedelta(seconds=timing.max_request_seconds),
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
    )


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
    time until which its request may still land.

    Only the current dispatcher (the holder of the dispatch ``fence``) may
    beat. A beat never moves the fence, so the dispatcher's outcome report
    stays valid. When the lease already ran out (the reconciler took the
    attempt over) the beat still counts as evidence that the request may be
    in flight: ``lands_by`` moves on, so a "not found" at the provider is not
    taken as proof until the request could no longer land.
    """
    now = clock.now()
    timing = authority_of(attempt.tenant_id, attempt.tool_name).timing
    lands_by = now + timedelta(seconds=timing.max_request_seconds)
    lease_end = now + timedelta(seconds=timing.lease_seconds)
    changed = Attempt.objects.filter(pk=attempt.pk, dispatch_fence=fence).update(
        lands_by=Greatest(Coalesce(F("lands_by"), Value(lands_by)), Value(lands_by)),
        last_heartbeat_at=now,
        next_check_at=Case(When(state=S.DISPATCHED, fence=fence, then=Value(lease_end)), default=F("next_check_at")),
    )
    fresh = _get(attempt.pk)
    if changed != 1:
        raise StaleFence(
            f"attempt {attempt.pk} was dispatched again since (dispatch fence {fresh.dispatch_fence}, not {fence}); "
            "this dispatch is no longer the attempt's"
        )
    return fresh


@dataclass(frozen=True)
class Report:
    """What the ledger did with a dispatcher's outcome report."""

    attempt: Attempt
    #: This very report had been applied before (a retry after a lost answer): nothing was written.
    replayed: bool = False
    #: The attempt had moved on (the lease ran out, a person decided, a retry
    #: superseded it): the report was recorded as evidence.
    late: bool = False


class Outcome(models.TextChoices):
    CONFIRMED = "confirmed"
    FAILED = "failed"
    FAILED_RETRYABLE = "failed_retryable"
    UNKNOWN = "unknown"


#: The state each outcome report puts the attempt in.
OUTCOME_STATE = {
    Outcome.CONFIRMED: S.OUTCOME_CONFIRMED,
    Outcome.FAILED: S.FAILED,
    Outcome.FAILED_RETRYABLE: S.FAILED_RETRYABLE,
    Outcome.UNKNOWN: S.UNKNOWN,
}


@dataclass(frozen=True)
class _Evidence:
    outcome: str
    provider_request_id: str = ""
    result_ref: str = ""
    reason: str = ""

    def as_details(self) -> dict[str, Any]:
        out = {"outcome": self.outcome}
        if self.provider_request_id:
            out["provider_request_id"] = self.provider_request_id
        if self.result_ref:
            out["result_ref"] = self.result_ref
        if self.reason:
            out["reason"] = _clean_text(self.reason)[:1000]
        return out


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


def _already_reported(attempt: Attempt, fence: int, evidence: _Evidence) -> bool:
    """This very report landed before: the attempt is in the state it
    reports, from the dispatch that holds ``fence``, with the same receipt."""
    if attempt.dispatch_fence != fence or attempt.state != OUTCOME_STATE[Outcome(evidence.outcome)]:
        return False
    if evidence.outcome == Outcome.CONFIRMED:
        return (not evidence.provider_request_id or evidence.provider_request_id == attempt.provider_request_id) and (
            not evidence.result_ref or evidence.result_ref == attempt.result_ref
        )
    return True


def _as_holder(
    attempt: Attempt, fence: int, actor: Actor, op: Callable[[Attempt], Attempt], evidence: _Evidence
) -> Report:
    """Run ``op`` on the attempt as the holder of ``fence`` may act on it.

    Tries the caller's copy first (one compare-and-set, the common case);
    when that is stale, re-reads: the same report repeated is a replay;
    a late report from the original dispatcher is accepted while the
    attempt is DISPATCHED or UNKNOWN and recorded as evidence afterwards;
    anyone else is refused.
    """
    if attempt.fence == fence:
        try:
            return Report(op(attempt))
        except StaleFence:
            pass
    fresh = _get(attempt.pk)
    if _already_reported(fresh, fence, evidence):
        return Report(fresh, replayed=True)
    if fresh.fence == fence:
        return Report(op(fresh))
    if _late_report_allowed(fresh, fence, actor):
        return Report(op(fresh), late=True)
    if actor.kind == ActorKind.AGENT and fresh.dispatch_fence is not None and fresh.dispatch_fence == fence:
        return Report(_late_evidence(fresh, fence=fence, actor=actor, evidence=evidence), late=True)
    raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=fresh.fence, given=fence))


def attempt_record_request_id(*, attempt: Attempt, fence: int, request_id: str, actor: Actor) -> Attempt:
    """Persist the provider's request id the moment it is known.

    Does not move the fence: the dispatcher goes on to report the outcome.
    """
    request_id = _validate_ref(request_id, "provider_request_id", 255)
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
        with transaction.atomic():
            changed = Attempt.objects.filter(
                pk=target.pk, state=target.state, fence=target.fence, provider_request_id=""
            ).update(provider_request_id=request_id, updated_at=clock.now())
            if changed != 1:
                raise StaleFence(StaleFence.MESSAGE.format(attempt_id=target.pk, current="?", given=fence))
            target.provider_request_id = request_id
            append_events(
                [
                    _Event(
                        target.tenant_id,
                        target.pk,
                        "request_id",
                        actor,
                        fence=target.fence,
                        reason="provider request id recorded",
                        details={"provider_request_id": request_id},
                    )
                ]
            )
        return target

    fresh = attempt if attempt.fence == fence else _get(attempt.pk)
    if fresh.provider_request_id == request_id:
        return fresh
    if fresh.fence == fence or _late_report_allowed(fresh, fence, actor):
        return op(fresh)
    if actor.kind == ActorKind.AGENT and fresh.dispatch_fence == fence:
        # The attempt moved on; the request id is evidence all the same.
        return _late_evidence(
            fresh, fence=fence, actor=actor, evidence=_Evidence("request_id", provider_request_id=request_id)
        )
    raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=fresh.fence, given=fence))


def _validate_ref(value: str, name: str, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidField(f"{name} must be a string")
    if len(value) > limit:
        raise InvalidField(InvalidField.TOO_LONG.format(field=name, length=len(value), limit=limit))
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidField(InvalidField.CONTROL.format(field=name))
    return value


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
    went out too).
    """
    if actor.kind == ActorKind.AGENT:
        refuse_open_transaction("reporting an outcome")
    outcome = Outcome(outcome)
    provider_request_id = _validate_ref(provider_request_id, "provider_request_id", 255)
    result_ref = _validate_ref(result_ref, "result_ref", 1000)
    evidence = _Evidence(outcome, provider_request_id, result_ref, reason)
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
            late=target.fence != fence,
        ),
        evidence,
    )


def _apply_report(
    target: Attempt,
    *,
    actor: Actor,
    evidence: _Evidence,
    result: Any,
    result_source: str,
    details: dict[str, Any] | None,
    late: bool,
) -> Attempt:
    now = clock.now()
    reason = evidence.reason
    if evidence.outcome == Outcome.CONFIRMED:
        _check_move(target, S.OUTCOME_CONFIRMED, actor)
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
            info["late_report"] = True
        return _move(
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
            },
            details=info,
            now=now,
        )
    if evidence.outcome == Outcome.UNKNOWN:
        if target.state == S.UNKNOWN and late:
            return target  # the lease already said so
        return _move(
            target,
            to_state=S.UNKNOWN,
            actor=actor,
            fence=None,
            reason=reason,
            updates={"next_check_at": (details or {}).get("check_at") or now, "last_error": _clean_text(reason)},
            now=now,
        )
    if evidence.outcome == Outcome.FAILED_RETRYABLE:
        return _move(
            target,
            to_state=S.FAILED_RETRYABLE,
            actor=actor,
            fence=None,
            reason=reason or "provider rejected the request before acting",
            updates={
                "next_check_at": now + backoff(target.dispatch_count),
                "last_error": _clean_text(reason),
                "lands_by": now,
            },
            now=now,
        )
    return _move(
        target,
        to_state=S.FAILED,
        actor=actor,
        fence=None,
        reason=reason or "provider refused the request",
        updates={"last_error": _clean_text(reason), "failed_because": FailedBecause.PROVIDER, "lands_by": now},
        now=now,
    )


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


def attempt_fail(*, attempt: Attempt, fence: int, actor: Actor, reason: str, retryable: bool = False) -> Attempt:
    """The provider gave a definitive answer that nothing was done.

    ``retryable``: it rejected the request before acting, so the same key
    may be sent again after a back-off (FAILED_RETRYABLE); otherwise FAILED.
    """
    return attempt_report(
        attempt=attempt,
        fence=fence,
        actor=actor,
        outcome=Outcome.FAILED_RETRYABLE if retryable else Outcome.FAILED,
        reason=reason,
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
    note = _clean_text(reason.strip()) if reason else ""
    return _move(
        attempt,
        to_state=S.FAILED,
        actor=actor,
        fence=fence,
        reason=f"abandoned by {by} before it was sent" + (f": {note}" if note else "; nothing was sent"),
        updates={"last_error": "abandoned", "failed_because": FailedBecause.ABANDONED},
        details={"abandoned": True, "comment": note} if note else {"abandoned": True},
    )


def backoff(attempt_number: int, *, base: float = 5.0, cap: float = 3600.0) -> timedelta:
    """Exponential back-off with full jitter (AWS architecture blog's form)."""
    import random

    ceiling = min(cap, base * (2 ** max(0, attempt_number)))
    return timedelta(seconds=random.uniform(base / 2, ceiling))  # noqa: S311 - jitter, not security


# --- evidence that arrives after the attempt moved on ----------------------------------


def _late_evidence(attempt: Attempt, *, fence: int, actor: Actor, evidence: _Evidence) -> Attempt:
    """Record the original dispatcher's report about an attempt that has
    moved on (a person is deciding it, or it was settled), never dropping it.

    Under review (or failed retryably, waiting for its re-send), the
    provider's word settles it (confirmed, or refused). Settled, the report
    is an event; when it says the effect happened although the ledger had
    settled the attempt otherwise, or contradicts the recorded receipt, an
    incident is opened for people: a duplicate when another attempt at the
    same side effect was sent as well.
    """
    if attempt.state in (S.MANUAL_REVIEW, S.FAILED_RETRYABLE) and evidence.outcome in (
        Outcome.CONFIRMED,
        Outcome.FAILED,
        Outcome.FAILED_RETRYABLE,
    ):
        receipt = evidence.provider_request_id or attempt.provider_request_id or evidence.result_ref
        if evidence.outcome == Outcome.CONFIRMED and receipt:
            return _move(
                attempt,
                to_state=S.OUTCOME_CONFIRMED,
                actor=actor,
                fence=None,
                reason=f"late outcome report from the original dispatcher while {attempt.state}: the provider acted",
                updates={
                    "provider_request_id": evidence.provider_request_id or attempt.provider_request_id,
                    "result_ref": evidence.result_ref,
                    "lands_by": clock.now(),
                },
                details={"late_report": evidence.as_details(), "dispatch_fence": fence},
            )
        if evidence.outcome != Outcome.CONFIRMED:
            return _move(
                attempt,
                to_state=S.FAILED,
                actor=actor,
                fence=None,
                reason=f"late outcome report from the original dispatcher while {attempt.state}: the provider "
                f"did not act ({evidence.reason or evidence.outcome})",
                updates={
                    "failed_because": FailedBecause.PROVIDER,
                    "last_error": _clean_text(evidence.reason),
                    "lands_by": clock.now(),
                },
                details={"late_report": evidence.as_details(), "dispatch_fence": fence},
            )
    now = clock.now()
    with transaction.atomic():
        current = _get(attempt.pk, lock=True)
        incident = _incident_for_late_report(current, evidence)
        events = [
            _Event(
                current.tenant_id,
                current.pk,
                "late_report",
                actor,
                fence=current.fence,
                reason=f"late report from the original dispatcher (dispatch fence {fence}) after the attempt "
                f"became {current.state}: {evidence.outcome}",
                details={"report": evidence.as_details(), "dispatch_fence": fence, "state": current.state},
            )
        ]
        if incident is not None:
            events.append(_incident_opened(incident, actor, now))
        if evidence.outcome != Outcome.UNKNOWN:
            # The dispatcher heard back: its request is no longer in flight.
            Attempt.objects.filter(pk=current.pk).update(lands_by=now)
            current.lands_by = now
        append_events(events, now=now)
    return current


def _incident_for_late_report(attempt: Attempt, evidence: _Evidence) -> Incident | None:
    """The incident a late report about a settled attempt calls for, saved;
    None when the report agrees with the ledger."""
    acted = evidence.outcome in (Outcome.CONFIRMED, "request_id")
    summary = ""
    kind = Incident.Kind.CONTRADICTION
    retry: Attempt | None = None
    if acted and attempt.state in (S.RECONCILED, S.FAILED):
        retry = (
            Attempt.objects.filter(
                tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key, dispatch_count__gt=0
            )
            .exclude(pk=attempt.pk)
            .exclude(state=S.FAILED, failed_because=FailedBecause.PROVIDER)
            .order_by("id")
            .first()
        )
        if retry is not None:
            kind = Incident.Kind.DUPLICATE
            summary = (
                f"#{attempt.pk} acted at the provider after all (late report: {evidence.outcome}), and #{retry.pk} "
                f"was sent for the same side effect: it may have happened twice"
            )
        else:
            summary = f"#{attempt.pk} acted at the provider after all, although the ledger had it {attempt.state}"
    elif (
        acted
        and attempt.state == S.OUTCOME_CONFIRMED
        and evidence.provider_request_id
        and attempt.provider_request_id
        and evidence.provider_request_id != attempt.provider_request_id
    ):
        summary = (
            f"#{attempt.pk} has a second receipt: the dispatcher reports request {evidence.provider_request_id}, "
            f"the ledger confirmed {attempt.provider_request_id}"
        )
    elif evidence.outcome in (Outcome.FAILED, Outcome.FAILED_RETRYABLE) and attempt.state == S.OUTCOME_CONFIRMED:
        summary = f"#{attempt.pk} is confirmed, but its dispatcher reports the provider refused it"
    if not summary:
        return None
    now = clock.now()
    owner_id, _source = _pick_owner(attempt.tenant_id, now)
    return Incident.objects.create(
        tenant_id=attempt.tenant_id,
        attempt=attempt,
        retry=retry,
        kind=kind,
        owner_id=owner_id or attempt.owner_id,
        summary=summary,
        details={
            "report": evidence.as_details(),
            "attempt_state": attempt.state,
            "attempt_request_id": attempt.provider_request_id,
            "retry_id": retry.pk if retry else None,
            "retry_state": retry.state if retry else None,
            "retry_request_id": retry.provider_request_id if retry else None,
        },
        opened_at=now,
    )


def _incident_opened(incident: Incident, actor: Actor, now: datetime) -> _Event:
    return _Event(
        incident.tenant_id,
        incident.attempt_id,
        "incident",
        actor,
        reason=f"{incident.get_kind_display()} incident #{incident.pk} opened: {incident.summary}",
        details={
            "incident_id": incident.pk,
            "action": "opened",
            "kind": incident.kind,
            "retry_id": incident.retry_id,
            "owner_id": incident.owner_id,
        },
    )


# --- ownership and notes (no state change) ------------------------------------------


def attempt_assign(
    *, attempt_id: int, owner: AbstractBaseUser | None, actor: Actor, reason: str = "", expected_owner_id: Any = ...
) -> Attempt:
    """Give an attempt to ``owner`` (None: unassign), recording who and why.

    ``expected_owner_id``: the owner the caller saw; if it changed meanwhile,
    refuse rather than silently take the item from someone else.
    """
    with transaction.atomic():
        attempt = _get(attempt_id, lock=True)
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
                _Event(
                    attempt.tenant_id,
                    attempt.pk,
                    "owner",
                    actor,
                    fence=attempt.fence,
                    reason=reason or ("claimed" if new_owner_id == actor.user_id else "assigned"),
                    details={"from_user_id": previous, "to_user_id": new_owner_id},
                )
            ],
            now=now,
        )
    return attempt


def attempt_comment(*, attempt_id: int, actor: Actor, text: str) -> AttemptEvent:
    text = text.strip()
    if not text:
        raise InvalidField(InvalidField.EMPTY.format(field="comment"))
    with transaction.atomic():
        attempt = _get(attempt_id)
        (event,) = append_events(
            [_Event(attempt.tenant_id, attempt.pk, "comment", actor, fence=attempt.fence, reason=text)]
        )
    return event


# --- the reconciler's moves ----------------------------------------------------------
#
# The reconciler first claims due attempts (bumping their fence, no state
# change), then asks the provider with no transaction open, then applies its
# decision with the claim's fence. A claim superseded meanwhile (another
# worker, a late report, an operator) makes the decision fail as stale.


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


def _only_from(attempt: Attempt, state: str, what: str) -> None:
    if attempt.state != state:
        raise IllegalTransition(f"attempt {attempt.pk} is {attempt.state}; {what} only from {state}")


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
    _only_from(attempt, S.DISPATCHED, "a dispatch lease expires")
    now = clock.now()
    return _move(
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
    return _move(
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
) -> Attempt:
    """UNKNOWN -> UNKNOWN: the provider could not answer; back off, decide nothing."""
    _only_from(attempt, S.UNKNOWN, "a lookup is retried later")
    now = clock.now()
    return _move(
        attempt,
        to_state=S.UNKNOWN,
        actor=actor,
        fence=fence,
        reason=reason,
        updates={
            "check_count": attempt.check_count + 1,
            "next_check_at": now + backoff(attempt.check_count + 1, base=backoff_base),
            "last_lookup": lookup.get("status", ""),
            "last_lookup_at": now,
            "last_error": _clean_text(error),
        },
        details={"lookup": lookup},
        now=now,
    )


def attempt_wait_for_landing(*, attempt: Attempt, actor: Actor, fence: int, lookup: dict[str, Any]) -> Attempt:
    """UNKNOWN -> UNKNOWN: the provider does not have it, but the request may
    still be on its way (it was sent, or its dispatcher last beat, less than
    the tool's maximum request time ago). A "not found" proves nothing yet:
    look again once it could no longer land."""
    _only_from(attempt, S.UNKNOWN, "waiting for a request to land")
    now = clock.now()
    assert attempt.lands_by is not None
    return _move(
        attempt,
        to_state=S.UNKNOWN,
        actor=actor,
        fence=fence,
        reason=(
            f"not found at the provider yet, but the request may still land until "
            f"{attempt.lands_by:%Y-%m-%d %H:%M:%S} UTC; looking again then"
        ),
        updates={
            "next_check_at": max(attempt.lands_by, now) + timedelta(milliseconds=1),
            "last_lookup": lookup.get("status", ""),
            "last_lookup_at": now,
        },
        details={"lookup": lookup, "lands_by": attempt.lands_by.isoformat(), "counts_as_evidence": False},
        now=now,
    )


def attempt_escalate(
    *, attempt: Attempt, actor: Actor, fence: int, reason: str, lookup: dict[str, Any] | None = None
) -> Attempt:
    """UNKNOWN, FAILED_RETRYABLE or a never-sent intent -> MANUAL_REVIEW: the facts cannot settle it."""
    updates: dict[str, Any] = {}
    if lookup:
        updates["last_lookup"] = lookup.get("status", "")
        updates["last_lookup_at"] = clock.now()
    return _move(
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
) -> tuple[Attempt, Attempt | None]:
    """A retry is needed but the authority changed: don't reuse the attempt.

    Records a linked attempt under the tenant's current policy (its scope
    narrowed to what both the original and the current policy allow, never
    wider) for review, and moves the original to MANUAL_REVIEW beside it.
    Returns ``(original, linked)``; ``linked`` is None when nothing could
    be authorized now (the tool is no longer allowed, the tenant is gone).
    """
    policy = current_policy(attempt.tenant_id)
    tenant_active = Tenant.objects.filter(pk=attempt.tenant_id, is_active=True).exists()
    allowed = policy.scopes_for(attempt.tool_name) if policy is not None else None
    summary = "; ".join(changes)
    needed = (
        "not sent: the authority changed since the intent was recorded"
        if attempt.state == S.INTENT_RECORDED
        else "retry needed but authority changed"
    )
    with transaction.atomic():
        if policy is None or allowed is None or not tenant_active:
            original = attempt_escalate(
                attempt=attempt,
                actor=actor,
                fence=fence,
                reason=f"{needed}, and nothing can be authorized now: {summary}",
                lookup=lookup,
            )
            return original, None
        original = attempt_escalate(
            attempt=attempt,
            actor=actor,
            fence=fence,
            reason=f"{needed} ({summary}); a linked attempt under the current policy awaits approval",
            lookup=lookup,
        )
        linked = _create_retry_under(
            policy,
            allowed,
            original=original,
            actor=actor,
            reason=f"linked retry of #{attempt.pk} under policy v{policy.version}: {summary}",
        )
    return original, linked


def _create_retry_under(
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
        ),
        actor=actor,
        reason=reason,
        requested_by_id=requested_by_id,
    )


# --- people's decisions ---------------------------------------------------------------


def _locked_for_decision(attempt_id: int, fence_seen: int | None) -> Attempt:
    attempt = _get(attempt_id, lock=True)
    if fence_seen is not None and attempt.fence != fence_seen:
        raise StaleFence(
            f"attempt {attempt_id} changed since you loaded it (now {attempt.state}); reload and decide again"
        )
    return attempt


def _required(text: str, what: str) -> str:
    text = (text or "").strip()
    if not text:
        raise InvalidField(InvalidField.EMPTY.format(field=what))
    return text


def attempt_verify(
    *,
    attempt_id: int,
    actor: Actor,
    evidence: str,
    provider_request_id: str = "",
    fence_seen: int | None = None,
) -> Attempt:
    """MANUAL_REVIEW -> OUTCOME_CONFIRMED: an operator verified it at the provider."""
    evidence = _required(evidence, "evidence")
    provider_request_id = _validate_ref(provider_request_id.strip(), "provider_request_id", 255)
    with transaction.atomic():
        attempt = _locked_for_decision(attempt_id, fence_seen)
        _never_sent(attempt, "verify")
        updates: dict[str, Any] = {"result_ref": _clean_text(evidence)[:1000]}
        if provider_request_id:
            if attempt.provider_request_id and attempt.provider_request_id != provider_request_id:
                raise RequestIdConflict(
                    RequestIdConflict.MESSAGE.format(
                        attempt_id=attempt_id, existing=attempt.provider_request_id, given=provider_request_id
                    )
                )
            updates["provider_request_id"] = provider_request_id
        return _move(
            attempt,
            to_state=S.OUTCOME_CONFIRMED,
            actor=actor,
            fence=None,
            reason=f"verified at the provider by {actor.label}: {evidence}",
            updates=updates,
            details={"evidence": evidence, "provider_request_id": provider_request_id or attempt.provider_request_id},
        )


def attempt_mark_failed(
    *, attempt_id: int, actor: Actor, reason: str, fence_seen: int | None = None, kind: str = "marked failed"
) -> Attempt:
    """MANUAL_REVIEW -> FAILED: a person decided it did not happen (or must not).

    A person's "failed" is a claim with their reason, not the provider's
    word: approving a retry of an attempt failed this way still needs the
    approver's recorded reason, unless the attempt was never sent.
    """
    reason = _required(reason, "reason")
    with transaction.atomic():
        attempt = _locked_for_decision(attempt_id, fence_seen)
        _only_from(attempt, S.MANUAL_REVIEW, f"{kind} is decided")
        because = FailedBecause.REJECTED if attempt.dispatch_count == 0 else FailedBecause.PERSON
        return _move(
            attempt,
            to_state=S.FAILED,
            actor=actor,
            fence=None,
            reason=f"{kind} by {actor.label}: {reason}",
            updates={"last_error": _clean_text(reason), "failed_because": because},
            details={"comment": reason, "failed_because": because},
        )


def intent_abandon(*, attempt_id: int, actor: Actor, reason: str, fence_seen: int | None = None) -> Attempt:
    """An operator gives up an intent nobody sent (see :func:`attempt_abandon_intent`)."""
    reason = _required(reason, "reason")
    with transaction.atomic():
        attempt = _locked_for_decision(attempt_id, fence_seen)
        return attempt_abandon_intent(attempt=attempt, fence=attempt.fence, actor=actor, reason=reason)


def attempt_recheck(*, attempt_id: int, actor: Actor, reason: str = "") -> Attempt:
    """Ask the reconciler to look again now: MANUAL_REVIEW -> UNKNOWN (checks
    start over), or, for an UNKNOWN attempt, just make it due now."""
    now = clock.now()
    with transaction.atomic():
        attempt = _get(attempt_id, lock=True)
        _never_sent(attempt, "look up")
        note = reason.strip() or "re-check requested"
        if attempt.state == S.UNKNOWN:
            Attempt.objects.filter(pk=attempt.pk).update(next_check_at=now, updated_at=now)
            attempt.next_check_at = now
            append_events(
                [_Event(attempt.tenant_id, attempt.pk, "recheck", actor, fence=attempt.fence, reason=note)], now=now
            )
            return attempt
        return _move(
            attempt,
            to_state=S.UNKNOWN,
            actor=actor,
            fence=None,
            reason=f"{note} (by {actor.label})",
            updates={"check_count": 0, "next_check_at": now},
            now=now,
        )


def retry_request(*, attempt_id: int, actor: Actor, reason: str) -> Attempt:
    """An operator asks for a linked retry of an attempt under review, under
    the tenant's current policy. Someone else must approve it."""
    reason = _required(reason, "reason")
    with transaction.atomic():
        original = _get(attempt_id, lock=True)
        if original.state != S.MANUAL_REVIEW:
            raise IllegalTransition(f"only an attempt under review can be retried; #{attempt_id} is {original.state}")
        pending = original.children.filter(state__in=[S.MANUAL_REVIEW, S.INTENT_RECORDED, S.DISPATCHED]).first()
        if pending is not None:
            raise IllegalTransition(f"attempt #{attempt_id} already has a pending linked retry #{pending.pk}")
        policy = current_policy(original.tenant_id)
        allowed = policy.scopes_for(original.tool_name) if policy else None
        if policy is None or allowed is None:
            raise IllegalTransition(f"tool {original.tool_name} is not allowed by the tenant's current policy")
        return _create_retry_under(
            policy,
            allowed,
            original=original,
            actor=actor,
            reason=f"retry requested by {actor.label}: {reason}",
            requested_by_id=actor.user_id,
        )


@dataclass(frozen=True)
class OriginalStanding:
    """Whether a retry of ``original`` could perform its side effect a second
    time: the ledger's one answer, used by approvals, the dashboard and the API.

    ``blocked``: no approval at all yet (the original may still be sent, or
    was already superseded). ``risk``: a retry could duplicate it; an
    approver may accept that only with a recorded reason. ``proof``: why a
    retry cannot duplicate it, from the facts alone.
    """

    blocked: str | None = None
    risk: str | None = None
    proof: str | None = None


def _when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def original_standing(original: Attempt, *, now: datetime | None = None) -> OriginalStanding:
    """Only the provider's word (or never having sent it) proves an original
    did not happen: a definitive refusal, or a "not found" observed after the
    request could no longer land. A person's "failed" is a claim."""
    now = now or clock.now()
    if original.state in IN_FLIGHT_STATES:
        return OriginalStanding(
            blocked=f"the original #{original.pk} is {original.state} and may yet be sent (by its agent or the "
            "reconciler): settle it first"
        )
    if original.state == S.RECONCILED:
        return OriginalStanding(blocked=f"the original #{original.pk} was already superseded by an approved retry")
    if original.state == S.OUTCOME_CONFIRMED:
        return OriginalStanding(
            risk=f"the original #{original.pk} happened (confirmed): a retry performs it a second time"
        )
    if original.dispatch_count == 0:
        return OriginalStanding(proof=f"the original #{original.pk} was never sent")
    if original.lands_by is not None and original.lands_by > now:
        return OriginalStanding(
            risk=f"the original #{original.pk}'s request may still land at the provider until "
            f"{_when(original.lands_by)} (its dispatcher is still waiting on it)"
        )
    if original.state == S.FAILED and original.failed_because == FailedBecause.PROVIDER:
        return OriginalStanding(proof=f"the provider refused the original #{original.pk}: it did not act")
    if original.last_lookup == "not_found" and original.last_lookup_at is not None:
        if original.lands_by is None or original.last_lookup_at >= original.lands_by:
            return OriginalStanding(
                proof=f"the provider did not have the original #{original.pk} at {_when(original.last_lookup_at)}, "
                "after its request could no longer land"
            )
        return OriginalStanding(
            risk=f"the provider's last lookup of the original #{original.pk} (not found, "
            f"{_when(original.last_lookup_at)}) was made before its request could no longer land "
            f"({_when(original.lands_by)}): not evidence"
        )
    if original.state == S.FAILED and original.failed_because == FailedBecause.PERSON:
        return OriginalStanding(
            risk=f"the original #{original.pk} was marked failed by a person, not by the provider: a claim, "
            "not evidence that it did not happen"
        )
    said = original.last_lookup.replace("_", " ") if original.last_lookup else "no lookup yet"
    return OriginalStanding(
        risk=f"the provider has not said the original #{original.pk} did not happen (last lookup: {said})"
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
    attempt_id: int,
    actor: Actor,
    comment: str,
    may_act: Callable[[int], str | None],
    safe_because: str = "",
    fence_seen: int | None = None,
) -> Attempt:
    """Approve a linked retry: MANUAL_REVIEW -> INTENT_RECORDED, and its
    original (if under review) -> RECONCILED, superseded by it.

    Re-checks under row locks, in this transaction: the tenant is the
    original's and active, the retry is still authorized by the current
    policy (its tool allowed, its scope within what the tool may use), the
    scope is not wider than the original's, the approver may act for the
    tenant (``may_act`` returns a reason when not), the approver did not
    request it, and the original cannot have happened by the provider's
    word (:func:`original_standing`; otherwise ``safe_because`` must say why
    it is safe). A refusal is recorded as an event and raised as
    :class:`ApprovalRefused`. A decision is single-use: a second approval
    finds it decided.
    """
    comment = _required(comment, "comment")
    refusal: ApprovalRefused | None = None
    with transaction.atomic():
        peek = _get(attempt_id)
        if peek.parent_id is None:
            raise IllegalTransition(f"attempt #{attempt_id} is not a linked retry")
        # Lock parent before child: every path locks the older row first.
        original = _get(peek.parent_id, lock=True)
        retry = _locked_for_decision(attempt_id, fence_seen)
        _check_move(retry, S.INTENT_RECORDED, actor)
        changes: list[str] = []
        if actor.user_id is not None and actor.user_id == retry.requested_by_id:
            refusal = SelfApproval(SelfApproval.MESSAGE.format(user=actor.label), ["approver requested it"])
            changes = ["the approver requested this retry"]
        else:
            denied = may_act(retry.tenant_id)
            if denied:
                changes.append(denied)
            authority = standing_of(retry, original=original)
            changes.extend(authority.changes)
            standing = original_standing(original)
            if standing.blocked:
                changes.append(standing.blocked)
            elif standing.risk and not safe_because.strip():
                changes.append(f"{standing.risk}; record why it is safe to approve anyway")
            if changes:
                refusal = ApprovalRefused(
                    ApprovalRefused.MESSAGE.format(attempt_id=attempt_id, changes="; ".join(changes)), changes
                )
        if refusal is not None:
            append_events(
                [
                    _Event(
                        retry.tenant_id,
                        retry.pk,
                        "approval_refused",
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
                "policy_version_now": authority.policy.version if authority.policy else None,
            }
            if safe_because.strip():
                details["safe_because"] = safe_because.strip()
            if original.state == S.MANUAL_REVIEW:
                _move(
                    original,
                    to_state=S.RECONCILED,
                    actor=actor,
                    fence=None,
                    reason=f"superseded by approved linked retry #{retry.pk}",
                    details={"retry_id": retry.pk, "comment": comment},
                    now=now,
                )
            return _move(
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


def retry_reject(*, attempt_id: int, actor: Actor, comment: str, fence_seen: int | None = None) -> Attempt:
    """Reject a linked retry: MANUAL_REVIEW -> FAILED. The original stays as it is."""
    peek = _get(attempt_id)
    if peek.parent_id is None:
        raise IllegalTransition(f"attempt #{attempt_id} is not a linked retry")
    return attempt_mark_failed(
        attempt_id=attempt_id, actor=actor, reason=comment, fence_seen=fence_seen, kind="retry rejected"
    )


# --- incidents ---------------------------------------------------------------------


def _locked_incident(incident_id: int, fence_seen: int | None) -> Incident:
    try:
        incident = Incident.objects.select_for_update().get(pk=incident_id)
    except Incident.DoesNotExist:
        raise IncidentError(f"no incident {incident_id}") from None
    if fence_seen is not None and incident.fence != fence_seen:
        raise StaleFence(f"incident {incident_id} changed since you loaded it; reload and decide again")
    return incident


def incident_resolve(*, incident_id: int, actor: Actor, resolution: str, fence_seen: int | None = None) -> Incident:
    """A person settles an incident, saying what was done (refunded the
    second charge, told the customer, confirmed only one landed)."""
    resolution = _required(resolution, "resolution")
    with transaction.atomic():
        incident = _locked_incident(incident_id, fence_seen)
        if incident.status != Incident.Status.OPEN:
            raise IncidentError(f"incident {incident_id} is already {incident.status}")
        now = clock.now()
        Incident.objects.filter(pk=incident.pk).update(
            status=Incident.Status.RESOLVED,
            resolved_at=now,
            resolved_by_id=actor.user_id,
            resolution=_clean_text(resolution),
            fence=F("fence") + 1,
        )
        append_events(
            [
                _Event(
                    incident.tenant_id,
                    incident.attempt_id,
                    "incident",
                    actor,
                    reason=f"incident #{incident.pk} resolved by {actor.label}: {resolution}",
                    details={"incident_id": incident.pk, "action": "resolved", "resolution": resolution},
                )
            ],
            now=now,
        )
    incident.refresh_from_db()
    return incident


def incident_assign(
    *, incident_id: int, owner: AbstractBaseUser, actor: Actor, expected_owner_id: Any = ..., reason: str = ""
) -> Incident:
    """Give an open incident to ``owner``; refuse if its owner changed since the caller looked."""
    with transaction.atomic():
        incident = _locked_incident(incident_id, None)
        if expected_owner_id is not ... and incident.owner_id != expected_owner_id:
            raise OwnershipError(f"incident {incident_id} is now owned by someone else; reload and try again")
        if incident.owner_id == owner.pk:
            return incident
        previous = incident.owner_id
        Incident.objects.filter(pk=incident.pk).update(owner_id=owner.pk, fence=F("fence") + 1)
        append_events(
            [
                _Event(
                    incident.tenant_id,
                    incident.attempt_id,
                    "incident",
                    actor,
                    reason=reason or f"incident #{incident.pk} assigned to {owner.get_username()}",
                    details={
                        "incident_id": incident.pk,
                        "action": "assigned",
                        "from_user_id": previous,
                        "to_user_id": owner.pk,
                    },
                )
            ]
        )
    incident.refresh_from_db()
    return incident


# --- bulk ownership ------------------------------------------------------------------


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
        note = _clean_text(reason.strip()) or f"assigned to {owner.get_username()}"
        events = []
        for attempt in moving:
            events.append(
                _Event(
                    attempt.tenant_id,
                    attempt.pk,
                    "owner",
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

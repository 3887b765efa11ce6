"""The event store: every change to the ledger is an event in its tenant's
hash chain, appended in the same transaction as the change.

:class:`Actor` says who made a change, :class:`EventKind` what kind of
event it is, :class:`EventDraft` an event about to be appended.
:func:`append_events` links drafts into their tenants' chains (under each
chain head's row lock, taken after any attempt locks). On PostgreSQL, a
change to an attempt and its event are one statement
(:func:`cas_with_event`, :func:`insert_with_events`): the server links the
event while it holds the chain head's lock, so the lock is held only while
the server executes and commits, never across a round trip.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models, transaction
from django.db.models import NOT_PROVIDED, Field

from ledgerdash.ledger import chain, clock, copies
from ledgerdash.ledger.models import (
    ActorKind,
    Attempt,
    AttemptEvent,
    ChainHead,
    Tenant,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

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


class EventKind(models.TextChoices):
    """What an event records. Declared once: the timeline, the reports and
    the exports name events by these values (they are in every event's hash)."""

    TRANSITION = "transition", "a move from one state to another"
    REQUEST_ID = "request_id", "the provider's request id, recorded as soon as known"
    LATE_REPORT = "late_report", "a dispatcher's report about an attempt that had moved on"
    INCIDENT = "incident", "an incident opened, assigned or resolved"
    OWNER = "owner", "an owner claimed, assigned or removed"
    COMMENT = "comment", "a person's comment"
    RECHECK = "recheck", "a person asked for a lookup now"
    APPROVAL_REFUSED = "approval_refused", "an approval refused, with what changed"
    POLICY = "policy", "a policy version published"
    API_TOKEN = "api_token", "an API token issued or revoked"
    EXPORT = "export", "an audit export"
    REPORT = "report", "an audit report read"
    DRILL = "drill", "a crash-drill run"
    ACCOUNT_LOCKED = "account_locked", "an account locked out after failed sign-ins"
    ACCOUNT_UNLOCKED = "account_unlocked", "a locked-out account unlocked"
    TENANT = "tenant", "the tenant's settings changed"
    MEMBERSHIP = "membership", "a person's membership or role granted, changed or removed"
    ON_CALL = "on_call", "an on-call shift added, changed or removed"
    TOOL = "tool", "a tool's provider configuration changed"
    CREDENTIAL = "credential", "a tool's credential binding for the tenant changed"
    NOTIFY_CHANNEL = "notify_channel", "a notification channel created, changed or disabled"
    NOTIFY_RULE = "notify_rule", "a notification rule created, changed or disabled"
    NOTIFY_RESEND = "notify_resend", "a dead notification sent again"


@dataclass
class EventDraft:
    """An event about to be appended to its tenant's chain."""

    tenant_id: int
    attempt_id: int | None
    kind: EventKind
    actor: Actor
    from_state: str = ""
    to_state: str = ""
    fence: int | None = None
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def clean_text(text: str) -> str:
    # PostgreSQL text cannot hold NUL; reasons are free text from people and tools.
    return text.replace("\x00", "\ufffd")[:MAX_REASON]


def append_events(events: list[EventDraft], *, now: datetime | None = None) -> list[AttemptEvent]:
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
    # Read now, not from chains_of: this path makes a tenant's first event,
    # and a tenant id that a rolled-back transaction used (SQLite hands it
    # out again) may have had another number of chains.
    stripes = dict(Tenant.objects.filter(pk__in={e.tenant_id for e in events}).values_list("pk", "chain_stripes"))
    chains: dict[tuple[int, int], list[EventDraft]] = {}
    for event in events:
        n = stripes.get(event.tenant_id, 1)  # no such tenant: its foreign key refuses the event
        chains.setdefault((event.tenant_id, chain.stripe_of(event.attempt_id, n)), []).append(event)
    rows: list[AttemptEvent] = []
    for tenant_id, stripe in sorted(chains):  # one lock order for every transaction
        n = stripes.get(tenant_id, 1)
        head = _locked_head(tenant_id, stripe, n)
        seq, prev = head.seq, head.hash
        for event in chains[tenant_id, stripe]:
            seq = chain.next_seq(seq, stripe, n)
            row = _event_row(event, now)
            row.seq, row.prev_hash = seq, prev
            row.hash = this_hash = chain.link(prev, row.content_hash)
            rows.append(row)
            prev = this_hash
        ChainHead.objects.filter(tenant_id=tenant_id, stripe=stripe).update(seq=seq, hash=prev)
    AttemptEvent.objects.bulk_create(rows)
    return rows


def _locked_head(tenant_id: int, stripe: int, stripes: int) -> ChainHead:
    """The head of the tenant's ``stripe``, locked. A tenant's first event
    makes the heads of all its stripes, so a tenant that has one head has
    them all (the one-statement paths rely on it)."""
    heads = ChainHead.objects.select_for_update()
    head = heads.filter(tenant_id=tenant_id, stripe=stripe).first()
    if head is None:
        ChainHead.objects.bulk_create(
            [ChainHead(tenant_id=tenant_id, stripe=s, seq=0, hash=chain.GENESIS) for s in range(stripes)],
            ignore_conflicts=True,
        )
        head = heads.get(tenant_id=tenant_id, stripe=stripe)
    return head


class _Linked:
    """An event on its way into one statement, without a model instance: the
    fields its content hash covers, then where in the chain it landed."""

    __slots__ = (*chain.HASHED_FIELDS, "content_hash", "pk", "seq", "prev_hash", "hash")
    pk: int
    seq: int
    prev_hash: str
    hash: str

    def __init__(self, event: EventDraft, now: datetime) -> None:
        self.tenant_id, self.attempt_id, self.kind = event.tenant_id, event.attempt_id, str(event.kind)
        self.actor_kind, self.actor_user_id, self.actor_label = event.actor.kind, event.actor.user_id, event.actor.label
        self.from_state, self.to_state, self.fence = event.from_state, event.to_state, event.fence
        self.reason, self.details, self.created_at = clean_text(event.reason), event.details, now
        self.content_hash = chain.content_hash(chain.event_content(self))


def _event_row(event: EventDraft, now: datetime) -> AttemptEvent:
    """The event as a model instance (for the paths that save or return one)."""
    linked = _Linked(event, now)
    return AttemptEvent(
        **{name: getattr(linked, name) for name in chain.HASHED_FIELDS}, content_hash=linked.content_hash
    )


#: The parts of the append statement (see :func:`_append_sql`). Table names
#: come from the models; every value is a parameter. With a change, the
#: tenant and the attempt come from the row it changed (``changed``), so the
#: statement sends each only once: psycopg keeps a statement's parsed form
#: only up to 50 parameters, and parsing one again on every call cost about
#: 0.2 ms of a 2.4 ms tool call. How many chains the tenant keeps comes
#: from this process (:func:`chains_of`) and is written into the statement
#: (a statement per count; joining the tenant row to read it cost about
#: 0.1 ms of planning, and two more parameters took the two-commit intent
#: past 50); with a change, the chain is the changed attempt's id modulo it.
_HEAD = """head AS (
    SELECT tenant_id, stripe, {chains}::integer AS stripes, seq, hash FROM {head}
    WHERE tenant_id = {tenant} AND stripe = {stripe} FOR UPDATE
)"""
#: ``seq`` as :func:`chain.next_seq` computes it.
_LINK = """link{n} AS (
    SELECT tenant_id, stripe, stripes, CASE WHEN seq = 0 THEN stripe + 1 ELSE seq + stripes END AS seq,
           hash AS prev_hash, c.content_hash,
           encode(sha256(decode(hash, 'hex') || decode(c.content_hash, 'hex')), 'hex') AS hash
    FROM {previous}, (SELECT %s::varchar AS content_hash) c
)"""
_MOVE_HEAD = """head_moved AS (
    UPDATE {head} SET seq = {last}.seq, hash = {last}.hash FROM {last}
    WHERE {head}.tenant_id = {last}.tenant_id AND {head}.stripe = {last}.stripe
)"""
_EVENT_ROW = """SELECT {tenant_id}, link{n}.seq, {attempt_id}, %s::varchar, %s::varchar, %s::integer, %s::varchar,
       %s::varchar, %s::varchar, %s::bigint, %s::text, %s::jsonb, %s::timestamptz, link{n}.content_hash,
       link{n}.prev_hash, link{n}.hash
FROM {source}"""
_INSERT_EVENTS = """
INSERT INTO {event} (
    tenant_id, seq, attempt_id, kind, actor_kind, actor_user_id, actor_label, from_state, to_state,
    fence, reason, details, created_at, content_hash, prev_hash, hash
)
{rows}
RETURNING id, seq, prev_hash, hash, xmin::text
"""


@functools.lru_cache(maxsize=256)
def _append_sql(change: str = "", count: int = 1, chains: int = 1) -> str:
    """The append statement for ``count`` events of one attempt (or of the
    tenant as a whole): lock the head of the tenant's chain they go to
    (FOR UPDATE waits for, then reads, the latest committed head), link each
    event to the one before, move the head past the last, insert the events.

    With ``change`` (a data-modifying statement that RETURNS the attempt's
    ``id, tenant_id``), that change first, and the events, of that attempt,
    only if it changed a row. If it did and the tenant has no chain head,
    the events' seq is NULL and the whole statement fails: never a change
    without its events."""
    head, event = ChainHead._meta.db_table, AttemptEvent._meta.db_table
    tenant = "(SELECT tenant_id FROM changed)" if change else "%s"
    if chains == 1:
        stripe = "0"
    elif change:
        stripe = f"(SELECT id FROM changed) %% {int(chains)}"  # noqa: S608 - a number, not a value sent
    else:
        stripe = "%s"
    ctes = [_HEAD.format(head=head, tenant=tenant, stripe=stripe, chains=int(chains))]
    ctes += [_LINK.format(n=n, previous=f"link{n - 1}" if n > 1 else "head") for n in range(1, count + 1)]
    ctes.append(_MOVE_HEAD.format(head=head, last=f"link{count}"))
    rows = "\nUNION ALL\n".join(
        _EVENT_ROW.format(
            n=n,
            tenant_id="changed.tenant_id" if change else "%s::bigint",
            attempt_id="changed.id" if change else "%s::bigint",
            source=f"changed LEFT JOIN link{n} ON true" if change else f"link{n}",
        )
        for n in range(1, count + 1)
    )
    changed = [f"changed AS (\n{change}\n)"] if change else []
    return "WITH " + ", ".join(changed + ctes) + _INSERT_EVENTS.format(event=event, rows=rows)


def _append_params(rows: list[Any], connection: Any, *, change: bool = True) -> list[Any]:
    """The parameters of :func:`_append_sql`'s statement, after the change's own."""
    details = AttemptEvent._meta.get_field("details")
    tenant_id = rows[0].tenant_id
    assert all(row.tenant_id == tenant_id for row in rows), "one statement appends to one tenant's chain"
    assert all(row.attempt_id == rows[0].attempt_id for row in rows), "one statement appends to one chain"
    params: list[Any] = []
    if not change:
        params.append(tenant_id)
        chains = chains_of(tenant_id)
        if chains > 1:
            params.append(chain.stripe_of(rows[0].attempt_id, chains))
    params += [row.content_hash for row in rows]
    for row in rows:
        if not change:
            params += [row.tenant_id, row.attempt_id]
        params += [
            row.kind,
            row.actor_kind,
            row.actor_user_id,
            row.actor_label,
            row.from_state,
            row.to_state,
            row.fence,
            row.reason,
            details.get_db_prep_value(row.details, connection),
            row.created_at,
        ]
    return params


#: (database, tenant id) -> how many chains the tenant keeps.
_chains: dict[tuple[str, int], int] = {}
_chains_lock = threading.Lock()


def chains_of(tenant_id: int) -> int:
    """How many chains the tenant keeps, read once per process: the number
    is fixed once the tenant has events (a trigger refuses the change), and
    a tenant made through the application has one from its creation on.
    An unknown tenant counts as one chain (its statement writes nothing)."""
    connection = transaction.get_connection()
    key = (str(connection.settings_dict["NAME"]), tenant_id)
    known = _chains.get(key)
    if known is not None:
        return known
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT chain_stripes FROM {Tenant._meta.db_table} WHERE id = %s", [tenant_id])  # noqa: S608
        row = cursor.fetchone()
    if row is None:
        return 1
    with _chains_lock:
        _chains[key] = row[0]
    return int(row[0])


def _execute_append[R: (AttemptEvent, _Linked)](
    sql: str, params: list[Any], rows: list[R]
) -> tuple[list[R], str] | None:
    """Run an append statement: the event rows as written (in chain order)
    and the version (``xmin``) of what it wrote, or None if it wrote nothing.
    The events and the attempt row a change wrote with them were written by
    one transaction: they share the version (:mod:`ledgerdash.ledger.copies`)."""
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = sorted(cursor.fetchall(), key=lambda written: written[1])
    if not returned:
        return None
    assert len(returned) == len(rows)
    for row, (pk, seq, prev_hash, this_hash, _version) in zip(rows, returned, strict=True):
        row.pk, row.seq, row.prev_hash, row.hash = pk, seq, prev_hash, this_hash
        if isinstance(row, AttemptEvent):
            row._state.adding = False
            row._state.db = connection.alias
    return rows, returned[0][4]


def _append_one_postgres(event: EventDraft, now: datetime) -> AttemptEvent | None:
    """Append one event in one statement; None if the tenant has no chain
    head yet (nothing was written: the general path creates it)."""
    rows = [_event_row(event, now)]
    sql = _append_sql(chains=chains_of(event.tenant_id))
    written = _execute_append(sql, _append_params(rows, transaction.get_connection(), change=False), rows)
    return written[0][0] if written else None


def outside_any_transaction() -> bool:
    """Whether no transaction of anyone's is open, so a statement commits on
    its own. ``atomic(durable=True)`` is Django's test for it: it tolerates
    only a test case's own wrapping transaction, in which the suite runs
    the very statements production runs."""
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        return bool(connection.get_autocommit())
    try:
        with transaction.atomic(durable=True):
            pass
    except RuntimeError:
        return False
    return True


def one_statement() -> bool:
    """Whether a change and its event can be one autocommitted statement:
    on PostgreSQL, when no transaction is open (inside one, the caller's
    other statements must commit with it)."""
    return transaction.get_connection().vendor == "postgresql" and outside_any_transaction()


@contextmanager
def on_its_own() -> Iterator[None]:
    """Run one statement as it runs in production, all or nothing. Outside a
    transaction it commits by itself; inside a test case's wrapping one, a
    savepoint gives a failed statement the same edges (the test's
    transaction goes on, as production's next statement would)."""
    if transaction.get_connection().in_atomic_block:
        with transaction.atomic():
            yield
    else:
        yield


#: The Python type of a value the ORM sends to PostgreSQL exactly as it is,
#: by a field's internal type: its ``get_db_prep_save`` would return the
#: value itself (a string, a timezone-aware datetime, or None where the
#: field is not JSON). Not integers: the ORM types them for psycopg by the
#: column's size.
_SENT_AS_IS: dict[str, type] = {
    "CharField": str,
    "TextField": str,
    "DateTimeField": datetime,
}


@dataclass(frozen=True, slots=True)
class _Column:
    """An Attempt field as the one-statement changes write it (PostgreSQL only)."""

    field: Field[Any, Any]
    #: The column's quoted name.
    sql: str
    #: The type the ORM sends as it is (None: every value goes through the ORM).
    as_is: type | None
    #: Whether the field's ``pre_save`` does more than read the attribute (an ``auto_now``).
    own_pre_save: bool

    def db_value(self, value: Any, connection: Any) -> Any:
        """``value`` as the ORM's ``get_db_prep_save`` would send it.

        A change sends about ten values, and the ORM's conversions, each a
        few calls deep, cost 10 us a change where all but JSON and naive
        datetimes come back unchanged: those are returned at once, the rest
        still go through the ORM (``tests/test_transitions.py`` holds the
        two equal for every field)."""
        kind = type(value)
        if value is None:
            if self.as_is is not None:
                return None
        elif kind is self.as_is and (kind is not datetime or value.tzinfo is not None):
            return value
        return self.field.get_db_prep_save(value, connection)


@functools.cache
def _column(name: str) -> _Column:
    model_field = Attempt._meta.get_field(name)
    assert isinstance(model_field, Field)
    connection = transaction.get_connection()
    assert connection.vendor == "postgresql", "the one-statement changes are PostgreSQL's"
    return _Column(
        model_field,
        connection.ops.quote_name(model_field.column),
        _SENT_AS_IS.get(model_field.get_internal_type()),
        type(model_field).pre_save is not Field.pre_save,
    )


@functools.cache
def _insert_columns() -> tuple[_Column, ...]:
    return tuple(_column(f.name) for f in Attempt._meta.concrete_fields)


#: A guard (SQL and its parameters) a one-statement change must satisfy.
Guard = tuple[str, list[Any]]


def cas_with_event(
    attempt: Attempt, values: dict[str, Any], event: EventDraft, now: datetime, *, guard: Guard | None = None
) -> bool:
    """Compare-and-set ``attempt`` on (id, state, fence), bump its fence, write
    ``values`` and append ``event``, in one statement. False if the row had
    moved on, or ``guard`` did not hold (nothing was written). On a
    speculative copy (:mod:`ledgerdash.ledger.copies`) the row must also
    still be the version the copy was written as."""
    connection = transaction.get_connection()
    columns = [_column(name) for name in values]
    sets = ", ".join(f"{column.sql} = %s" for column in columns)
    guard_sql, guard_params = guard or ("", [])
    version = copies.speculative_version(attempt)
    # Table and column names come from the model; every value is a parameter.
    table = Attempt._meta.db_table
    change = (
        f"UPDATE {table} SET fence = fence + 1, {sets} WHERE id = %s AND state = %s AND fence = %s"  # noqa: S608
        f"{' AND xmin::text = %s' if version else ''}{' AND ' + guard_sql if guard else ''} RETURNING id, tenant_id"
    )
    rows = [_Linked(event, now)]
    params = [column.db_value(value, connection) for column, value in zip(columns, values.values(), strict=True)]
    params += [attempt.pk, attempt.state, attempt.fence, *([version] if version else []), *guard_params]
    sql = _append_sql(change, chains=chains_of(attempt.tenant_id))
    written = _execute_append(sql, params + _append_params(rows, connection), rows)
    if written is None:
        return False
    copies.written(attempt, written[1])
    return True


#: How many attempt ids a process takes from the sequence at once.
ID_BLOCK = 32
_ids: dict[str, deque[int]] = {}
_ids_lock = threading.Lock()


def next_attempt_id() -> int:
    """An id for a new attempt, from a block this process reserved (on
    PostgreSQL; the event recording an intent names its attempt, so the id
    is needed before the insert, and a round trip per intent for it cost as
    much as a statement). As with any sequence cache, ids are unique but
    their order across processes is not the order attempts were recorded
    in; what needs that order uses ``created_at``. Unused ids leave gaps,
    as a rolled-back insert does."""
    connection = transaction.get_connection()
    name = str(connection.settings_dict["NAME"])
    with _ids_lock:
        block = _ids.setdefault(name, deque())
        if not block:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
                    [Attempt._meta.db_table, ID_BLOCK],
                )
                block.extend(sorted(value for (value,) in cursor.fetchall()))
        return block.popleft()


def forget_database() -> None:
    """Drop what this process remembers of its database: for a process that
    outlives its database being replaced (a test's fresh copy). The blocks
    of ids came from the old database's sequence; used against the new one
    they would also be handed out by its sequence to plain inserts (a linked
    attempt's), which would then collide with them. A tenant id of the new
    database may keep another number of chains, an attempt id name another
    attempt."""
    with _ids_lock:
        _ids.clear()
    with _chains_lock:
        _chains.clear()
    copies.forget()


def reserved_id_taken(error: Exception) -> bool:
    """Whether ``error`` says an id of this process's block was in use
    already; if so the block is dropped, and the next id comes from a new one."""
    cause = error.__cause__
    diag = getattr(cause, "diag", None)
    if getattr(diag, "constraint_name", None) != f"{Attempt._meta.db_table}_pkey":
        return False
    with _ids_lock:
        _ids.pop(str(transaction.get_connection().settings_dict["NAME"]), None)
    return True


def insert_with_events(
    attempt: Attempt, events: list[EventDraft], now: datetime, *, guard: Guard | None = None
) -> bool:
    """Insert a root attempt and append its events (in order, naming it) in
    one statement. False when the key already has a root (ON CONFLICT on the
    partial unique index) or ``guard`` did not hold: nothing was written."""
    connection = transaction.get_connection()
    if attempt.pk is None:
        attempt.pk = next_attempt_id()  # the events' content names the attempt
    # Columns at their database default (NULL, or a db_default) are left out:
    # fewer parameters, and psycopg keeps a parsed statement only up to 50.
    names, values = [], []
    for column in _insert_columns():
        f = column.field
        value = f.pre_save(attempt, True) if column.own_pre_save else getattr(attempt, f.attname)
        if (value is None and f.db_default is NOT_PROVIDED) or (value == f.db_default and value is not None):
            continue  # the column's default writes the same
        names.append(f.name)
        values.append(column.db_value(value, connection))
    guard_sql, guard_params = guard or ("", [])
    for event in events:
        event.attempt_id = attempt.pk
    rows = [_Linked(event, now) for event in events]
    sql = _insert_sql(tuple(names), guard_sql, len(rows), chains_of(attempt.tenant_id))
    written = _execute_append(sql, values + guard_params + _append_params(rows, connection), rows)
    if written is None:
        attempt.pk = None
        return False
    copies.written(attempt, written[1])
    attempt._state.adding = False
    attempt._state.db = connection.alias
    return True


@functools.lru_cache(maxsize=64)
def _insert_sql(names: tuple[str, ...], guard_sql: str, count: int, chains: int) -> str:
    """The statement :func:`insert_with_events` sends (built once per shape)."""
    connection = transaction.get_connection()
    fields = [_column(name).field for name in names]
    columns = ", ".join(_column(name).sql for name in names)
    if guard_sql:
        # A SELECT rather than VALUES, to be conditional; typed, as VALUES would be by the columns.
        values = "SELECT " + ", ".join(f"%s::{f.cast_db_type(connection)}" for f in fields) + f" WHERE {guard_sql}"
    else:
        values = "VALUES (" + ", ".join(["%s"] * len(fields)) + ")"
    # Table and column names come from the model; every value is a parameter.
    change = (
        f"INSERT INTO {Attempt._meta.db_table} ({columns}) {values} "
        "ON CONFLICT (tenant_id, idempotency_key) WHERE parent_id IS NULL DO NOTHING RETURNING id, tenant_id"
    )
    return _append_sql(change, count, chains)


def event_record(
    *, tenant: Tenant | int, kind: EventKind, actor: Actor, reason: str = "", details: dict[str, Any] | None = None
) -> AttemptEvent:
    """Record something that happened to a tenant's ledger as a whole (an
    export, a policy change, a drill run) in its chain."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    with transaction.atomic():
        (row,) = append_events([EventDraft(tenant_id, None, kind, actor, reason=reason, details=details or {})])
    return row

"""One statement per change, on PostgreSQL: an attempt's change (or a new
root attempt) and its events, linked into the tenant's chain by the server
while it holds the chain head's lock, so the lock is held only while the
server executes and commits, never across a round trip. The ORM path
(:func:`ledgerdash.ledger.store.append_events` in the caller's
transaction) says the same in three to six round trips.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import NOT_PROVIDED, Field

from ledgerdash.ledger import chain
from ledgerdash.ledger.events import EventDraft, Linked, event_row
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainHead, Tenant
from ledgerdash.ledger.store.copies import VERSION, sending, speculating
from ledgerdash.ledger.store.switches import enabled

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
RETURNING id, seq, prev_hash, hash, {version}
"""


@functools.lru_cache(maxsize=256)
def _append_sql(change: str = "", count: int = 1, chains: int = 1) -> str:
    """The append statement for ``count`` events of one attempt (or of the
    tenant as a whole): lock the head of the tenant's chain they go to
    (FOR UPDATE waits for, then reads, the latest committed head), link each
    event to the one before, move the head past the last, insert the events.

    With ``change`` (a data-modifying statement that RETURNS the attempt's
    ``id, tenant_id, xmin``), that change first, and the events, of that attempt,
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
    # The attempt's version after the change (its xmin; the events' own cannot be read from a partitioned table).
    version = "(SELECT xmin::text FROM changed)" if change else "NULL::text"
    return "WITH " + ", ".join(changed + ctes) + _INSERT_EVENTS.format(event=event, rows=rows, version=version)


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


def _execute_append[R: (AttemptEvent, Linked)](sql: str, params: list[Any], rows: list[R]) -> str | None:
    """Run an append statement and fill ``rows`` in as written (in chain
    order): the version of the attempt it changed (its ``xmin``; "" when it
    changed none), or None if it wrote nothing."""
    connection = transaction.get_connection()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = sorted(cursor.fetchall(), key=lambda written: written[1])
    if not returned:
        return None
    assert len(returned) == len(rows)
    for row, (pk, seq, prev_hash, this_hash, _) in zip(rows, returned, strict=True):
        row.pk, row.seq, row.prev_hash, row.hash = pk, seq, prev_hash, this_hash
        if isinstance(row, AttemptEvent):
            row._state.adding = False
            row._state.db = connection.alias
    return returned[0][4] or ""


def append_one(event: EventDraft, now: datetime) -> AttemptEvent | None:
    """Append one event in one statement; None if the tenant has no chain
    head yet (nothing was written: the general path creates it)."""
    rows = [event_row(event, now)]
    sql = _append_sql(chains=chains_of(event.tenant_id))
    written = _execute_append(sql, _append_params(rows, transaction.get_connection(), change=False), rows)
    return rows[0] if written is not None else None


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
    moved on, or ``guard`` did not hold (nothing was written).

    A move made from this process's copy of the attempt (:mod:`.copies`)
    also compares the row's version: the row must still be the copy, every
    column of it. The version the write leaves is kept on ``attempt``."""
    connection = transaction.get_connection()
    columns = [_column(name) for name in values]
    sets = ", ".join(f"{column.sql} = %s" for column in columns)
    guard_sql, guard_params = guard or ("", [])
    chains = chains_of(attempt.tenant_id)
    speculation = speculating()
    if speculation is not None and speculation.attempt_id != attempt.pk:
        speculation = None  # another attempt's change: the wrapper refuses it before it leaves
    if speculation is not None:
        guard_sql = f"xmin = %s::text::xid{' AND ' + guard_sql if guard else ''}"
        guard_params = [speculation.version, *guard_params]
    # Table and column names come from the model; every value is a parameter.
    table = Attempt._meta.db_table
    change = (
        f"UPDATE {table} SET fence = fence + 1, {sets} WHERE id = %s AND state = %s AND fence = %s"  # noqa: S608
        f"{' AND ' + guard_sql if guard_sql else ''} RETURNING id, tenant_id, xmin"
    )
    rows = [Linked(event, now)]
    params = [column.db_value(value, connection) for column, value in zip(columns, values.values(), strict=True)]
    params += [attempt.pk, attempt.state, attempt.fence, *guard_params]
    sql = _append_sql(change, chains=chains)
    params += _append_params(rows, connection)
    if speculation is not None:
        with sending(speculation):
            version = _execute_append(sql, params, rows)
        speculation.made = version is not None
    else:
        version = _execute_append(sql, params, rows)
    if version is None:
        return False
    setattr(attempt, VERSION, version)
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
                    [Attempt._meta.db_table, ID_BLOCK if enabled("id_blocks") else 1],
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
    rows = [Linked(event, now) for event in events]
    sql = _insert_sql(tuple(names), guard_sql, len(rows), chains_of(attempt.tenant_id))
    version = _execute_append(sql, values + guard_params + _append_params(rows, connection), rows)
    if version is None:
        attempt.pk = None
        return False
    attempt._state.adding = False
    attempt._state.db = connection.alias
    setattr(attempt, VERSION, version)
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
        "ON CONFLICT (tenant_id, idempotency_key) WHERE parent_id IS NULL DO NOTHING RETURNING id, tenant_id, xmin"
    )
    return _append_sql(change, count, chains)

"""Where the ledger's rows are read and written, and the one place that
knows how to do it fast.

The moves (:mod:`ledgerdash.ledger.moves`) decide what changes; this layer
writes it. Every fast path lives here, each with the plain way it replaces,
and each can be switched off by name (``LEDGER_FAST_PATHS_OFF``, for the
benchmark that measures what each one gains, and for anyone who wants the
plain way): the answer is the same either way, only the round trips differ.

==========================  ==================================================================
``one_statement``           a change and its events in one autocommitted statement
                            (PostgreSQL: :mod:`.statements`), not a transaction of three to
                            six round trips
``id_blocks``               a new attempt's id from a block this process reserved (32 at a
                            time), not a round trip per intent
``remembered_authority``    the tenant's authority this process read last, guarded in the
                            write (:mod:`.memory`), not a read per intent and dispatch
``compiled_read``           an attempt read by a statement built once per process
                            (:mod:`.reads`), not an ORM query compiled per read
``remembered_attempt``      the attempt this process wrote last, its next move guarded in
                            the write by the row's version (:mod:`.copies`), not a read
                            per dispatch and outcome over the API
==========================  ==================================================================

``python -m bench --only fastpaths`` measures each: the same calls with it
switched off beside all of them on. A fast path stays only while it gains
at least 5% on the path it was made for (docs/benchmarks.md, *What each
fast path gains*, has the figures, and the ones that did not).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from ledgerdash.ledger import provider_ids
from ledgerdash.ledger.authority import Authority
from ledgerdash.ledger.events import EventDraft
from ledgerdash.ledger.models import Attempt, ChainHead
from ledgerdash.ledger.store import copies, memory, reads, statements
from ledgerdash.ledger.store.chains import append_events, event_record
from ledgerdash.ledger.store.statements import Guard, on_its_own, outside_any_transaction
from ledgerdash.ledger.store.switches import FAST_PATHS, enabled

__all__ = [
    "FAST_PATHS",
    "Guard",
    "append_events",
    "change",
    "enabled",
    "event_record",
    "forget",
    "from_copy",
    "insert_root",
    "on_its_own",
    "one_statement",
    "outside_any_transaction",
    "read_attempt",
    "remember",
    "under_authority",
]


def one_statement() -> bool:
    """Whether a change and its events can be one autocommitted statement:
    on PostgreSQL, when no transaction is open (inside one, the caller's
    other statements must commit with it)."""
    return enabled("one_statement") and statements.one_statement()


# --- reads -----------------------------------------------------------------------------------------


def read_attempt(attempt_id: int, tenant_id: int | None) -> Attempt | None:
    """The attempt (of ``tenant_id``, when given), unlocked; None when there is none.

    Read by its id alone, the tenant compared after (why: :mod:`.reads`)."""
    if enabled("compiled_read"):
        found = reads.read_attempt(attempt_id)
    else:
        found = Attempt.objects.filter(pk=attempt_id).first()
    return None if found is None or (tenant_id is not None and found.tenant_id != tenant_id) else found


def from_copy(attempt_id: int, tenant_id: int, act: Callable[[Attempt], Attempt]) -> Attempt | None:
    """``act`` made on the copy of the attempt this process kept when it last
    wrote it, if it kept one, its change guarded by the row's version
    (:mod:`.copies`); None when there is none, or the move from it would
    have done anything but that one change: nothing was written, and the
    caller makes the move from the attempt read now."""
    if not (enabled("remembered_attempt") and one_statement()):
        return None
    return copies.from_copy(attempt_id, tenant_id, act)


def remember(attempt: Attempt) -> None:
    """Keep ``attempt``, as its last write left it, for the next move on it
    by id (:func:`from_copy`); kept only when that write was one statement,
    else any copy of it is dropped. The instance is handed over: the caller
    does not use it afterwards."""
    if enabled("remembered_attempt"):
        copies.remember(attempt)


# --- writes ----------------------------------------------------------------------------------------


def change(
    attempt: Attempt,
    values: dict[str, Any],
    events: list[EventDraft],
    now: datetime,
    *,
    guard: Guard | None = None,
) -> bool:
    """Compare-and-set ``attempt`` (as the caller read it) on (id, state,
    fence): bump its fence, write ``values`` and append ``events``, all or
    nothing. False when the row had moved on or ``guard`` did not hold;
    nothing was written. ``guard`` is kept by one statement only: without
    one, a guarded change is False and the caller asks again without it.
    A provider request id another side effect holds is refused by the
    database, whichever way the change is written: :class:`RequestIdTaken`."""
    try:
        return _change(attempt, values, events, now, guard=guard)
    except IntegrityError as exc:
        request_id = values.get("provider_request_id") or ""
        if request_id and provider_ids.refused(exc):
            raise provider_ids.taken(attempt, request_id) from None
        raise


def _change(
    attempt: Attempt, values: dict[str, Any], events: list[EventDraft], now: datetime, *, guard: Guard | None
) -> bool:
    if one_statement() and len(events) == 1:
        try:
            with on_its_own():
                return statements.cas_with_event(attempt, values, events[0], now, guard=guard)
        except IntegrityError:
            if ChainHead.objects.filter(tenant_id=attempt.tenant_id).exists():
                raise
            # The tenant's first event: the path below creates its chain head.
    if guard is not None:
        return False
    attempt.__dict__.pop(copies.VERSION, None)  # the row's version is known after a one-statement write only
    with transaction.atomic():
        changed = Attempt.objects.filter(pk=attempt.pk, state=attempt.state, fence=attempt.fence).update(
            fence=F("fence") + 1, **values
        )
        if changed != 1:
            return False
        append_events(events, now=now)
    return True


def insert_root(attempt: Attempt, events: list[EventDraft], now: datetime, *, guard: Guard | None = None) -> bool:
    """Insert a root attempt and append its events (in order, naming it),
    all or nothing. False when its key already has a root (perhaps one
    committed a moment ago by a concurrent caller) or ``guard`` did not
    hold: nothing was written."""
    if one_statement():
        try:
            try:
                with on_its_own():
                    return statements.insert_with_events(attempt, events, now, guard=guard)
            except IntegrityError as exc:
                if not statements.reserved_id_taken(exc):
                    raise
                # The ids this process reserved were handed out again (the
                # sequence was reset, by a restore say): reserve afresh, once.
                attempt.pk = None
                with on_its_own():
                    return statements.insert_with_events(attempt, events, now, guard=guard)
        except IntegrityError:
            if ChainHead.objects.filter(tenant_id=attempt.tenant_id).exists():
                raise
            # The tenant's first event: the path below creates its chain head
            # (unguarded: the caller asks again with the authority read now).
            if guard is not None:
                return False
            attempt.pk, attempt._state.adding = None, True
    elif guard is not None:
        return False
    # The insert is the transaction's first statement, so a duplicate key
    # rolls back the whole (still empty) transaction: no savepoint needed.
    try:
        with transaction.atomic():
            attempt.save(force_insert=True)
            for each in events:
                each.attempt_id = attempt.pk
            append_events(events, now=now)
    except IntegrityError:
        if Attempt.objects.filter(
            tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key, parent__isnull=True
        ).exists():
            attempt.pk, attempt._state.adding = None, True
            return False
        raise
    return True


# --- the authority an agent's change is checked against --------------------------------------------


def under_authority[T](tenant_id: int, tool_name: str, act: Callable[[Authority, Guard | None], T | None]) -> T | None:
    """``act`` under the tenant's current authority for ``tool_name``
    (:func:`ledgerdash.ledger.store.memory.under_authority`): ``act`` gets the
    authority and the guard its write must carry (None: none), and returns
    None when it wrote nothing; a refusal rests on a read made now."""
    remember = enabled("remembered_authority") and one_statement()
    return memory.under_authority(tenant_id, tool_name, act, remember=remember)


def forget() -> None:
    """Drop everything this process remembers of its database: for a process
    that outlives its database being replaced (a test's fresh copy)."""
    statements.forget_database()
    memory.forget()
    copies.forget()

"""The attempts this process wrote last, kept for the next request about them.

An agent's tool call through the ingest API is two or three requests about
one attempt, in a row, usually on one kept connection and so in one web
process: record the intent, claim the dispatch, report the outcome. Each
request after the first would read the attempt before moving it: a round
trip per request for a row this process has just written.

So a process keeps the attempt as its last write left it (on PostgreSQL),
with the row's version: PostgreSQL gives every version of a row a new
``xmin`` (the id of the transaction that wrote it), and this process's
statement returned it. A later request :func:`take` s the copy instead of
reading the row. The copy is *speculative* until a write confirms it: the
one-statement change (:func:`ledgerdash.ledger.events.cas_with_event`)
also requires ``xmin`` to be the copy's, so it writes only if the row is
still exactly what the copy says; then the copy is as good as a fresh
read. Any other way of acting on a speculative copy is refused with
:class:`CopyOutdated` before it writes, and so is a failed compare-and-set;
a refusal or an answer the ledger derived from the copy alone is not given
either: the caller reads the row and acts again (:func:`act`). A copy is
never the source of an answer, only of a guess a write checks.

A copy older than :data:`MAX_AGE` seconds is dropped: ``xmin`` values come
round again only after some four billion transactions, but nothing should
rest on that. SQLite has no row versions: nothing is kept there.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from django.db import transaction

from ledgerdash.ledger.errors import LedgerError, LedgerUnavailable
from ledgerdash.ledger.models import Attempt

#: How many copies a process keeps (the newest; an agent's next request comes within milliseconds).
MAX_COPIES = 1024
#: Seconds a copy is kept.
MAX_AGE = 30.0

_VERSION = "_ledger_row_version"
_SPECULATIVE = "_ledger_speculative"

_copies: OrderedDict[tuple[str, int], tuple[float, Attempt]] = OrderedDict()
_lock = threading.Lock()


class CopyOutdated(Exception):
    """A write was about to rest on a speculative copy that the row no longer matches."""


def _database() -> str:
    return str(transaction.get_connection().settings_dict["NAME"])


def written(attempt: Attempt, version: str | None) -> None:
    """``attempt`` is the row as the write of ``version`` left it (None: the
    version is not known, as after a write through the ORM)."""
    setattr(attempt, _VERSION, version)
    setattr(attempt, _SPECULATIVE, False)


def speculative_version(attempt: Attempt) -> str | None:
    """The row version a write on ``attempt`` must find, when it is a speculative copy."""
    return getattr(attempt, _VERSION, None) if getattr(attempt, _SPECULATIVE, False) else None


def refuse_speculative(attempt: Attempt) -> None:
    """Refuse to go on from a copy no write has confirmed: the caller reads the row."""
    if getattr(attempt, _SPECULATIVE, False):
        raise CopyOutdated(f"attempt {attempt.pk}: this process's copy may be out of date")


def keep(attempt: Attempt) -> None:
    """Keep a copy of ``attempt`` when its row version is known."""
    version = getattr(attempt, _VERSION, None)
    if version is None or getattr(attempt, _SPECULATIVE, False) or attempt.pk is None:
        return
    kept = copy.copy(attempt)  # the caller goes on with its own (a response renders it)
    key = (_database(), attempt.pk)
    with _lock:
        _copies[key] = (time.monotonic(), kept)
        _copies.move_to_end(key)
        while len(_copies) > MAX_COPIES:
            _copies.popitem(last=False)


def take(attempt_id: int, tenant_id: int) -> Attempt | None:
    """The kept copy of the tenant's attempt, speculative, handed over (the
    process keeps none of it meanwhile); None when there is none."""
    with _lock:
        found = _copies.pop((_database(), attempt_id), None)
    if found is None:
        return None
    kept_at, attempt = found
    if attempt.tenant_id != tenant_id or time.monotonic() - kept_at > MAX_AGE:
        return None
    setattr(attempt, _SPECULATIVE, True)
    return attempt


def act(attempt_id: int, tenant_id: int, op: Callable[[Attempt], Attempt], read: Callable[[], Attempt]) -> Attempt:
    """``op`` on the tenant's attempt: on this process's copy when a write
    confirms it, else on the row as ``read`` reads it. The attempt ``op``
    returns is kept for the next request."""
    guess = take(attempt_id, tenant_id)
    if guess is not None:
        try:
            result = op(guess)
        except LedgerUnavailable:
            raise
        except (CopyOutdated, LedgerError):
            if getattr(guess, _SPECULATIVE, False):
                result = None  # refused on the copy's word alone, or the row had moved on: ask the row
            else:
                raise  # refused after a write confirmed the copy: the refusal rests on the row
        if result is not None and not getattr(guess, _SPECULATIVE, False):
            keep(result)
            return result
    result = op(read())
    keep(result)
    return result


def forget() -> None:
    """Drop every copy (the database was replaced under this process)."""
    with _lock:
        _copies.clear()

"""The attempts this process wrote last, kept for the agent's next step on them.

Over the API an agent names the attempt it dispatches, or reports on, by its
id, and each of those requests used to read the attempt first: two round
trips of the five a tool call made. The process that recorded the intent, or
the claim, has the attempt as its write left the row; it keeps a copy, with
the row's version (PostgreSQL's ``xmin``, which every write of the row, by
any path and any process, replaces), and the next move on that attempt
starts from the copy:

- the move's change carries the version as a guard: the server makes it only
  if the row is still exactly the copy, every column of it (a stricter check
  than a read before the write, which another write could follow; the
  change's own compare on state and fence would not see a request id or a
  heartbeat that moved no fence);
- until that change is made, nothing else may be sent: an execute wrapper
  refuses any other statement before it leaves (savepoints aside, which a
  test case's transaction wraps each change in). A move that would read,
  refuse, answer a replay or keep a late report as evidence has left the
  plain path, and so has a change the guard refused: nothing was written;
- then the move is made again from the row read now, whose answer stands.
  A refusal, a replay and anything but a plain change rest on a read made
  now, as they do without a copy.

A change sent whose answer never came (the connection broke while it ran) is
not made again: it may have been written, and the caller's error says so.
A write that reads back no version (the ORM's: a heartbeat, a request id)
drops the copy, so the next move reads rather than send a change the
version would refuse.

Copies are kept per process (a worker's threads share them, a move taking
its copy out while it works on it), at most :data:`KEPT` of them, none with
arguments over :data:`KEPT_ARGS_BYTES`, for at most :data:`KEEP_SECONDS`:
an agent's next step comes within seconds, and a version is a transaction
id, which comes round again only after four billion transactions. Only on
PostgreSQL, where changes are one statement.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DataError, IntegrityError, ProgrammingError, transaction

from ledgerdash.ledger.models import TERMINAL_STATES, Attempt

#: The attribute a one-statement write leaves on the instance it wrote: the row's version after it.
VERSION = "_ledger_row_version"
#: How many attempts a process keeps, and for how long (seconds, on :func:`monotonic`).
KEPT = 1024
KEEP_SECONDS = 300.0
#: An attempt whose arguments take more than this as JSON is not kept (its next move reads it):
#: with the count, it bounds what a process keeps to some 20 MB.
KEPT_ARGS_BYTES = 16 * 1024
#: Marks an instance whose arguments were found small enough to keep.
_SMALL = "_ledger_args_kept"
#: What a test case's transaction wraps each change in: neither reads nor writes a row.
_SAVEPOINTS = ("SAVEPOINT ", "RELEASE SAVEPOINT ", "ROLLBACK TO SAVEPOINT ")


def monotonic() -> float:
    """The clock copies age by (tests set it)."""
    return time.monotonic()


class LeftThePlainPath(Exception):
    """A move from a copy was about to send something other than its guarded change."""


@dataclass(slots=True)
class Speculation:
    """A move being made from a copy: which row, at which version, and how far it got."""

    attempt_id: int
    version: str
    #: The guarded change is being sent (its answer not yet back).
    sending: bool = False
    #: The guarded change was made: from here on the move goes on as any other.
    made: bool = False


#: (database, attempt id) -> (the attempt as written, its row version, when it was kept).
_kept: dict[tuple[str, int], tuple[Attempt, str, float]] = {}
_lock = threading.Lock()
_local = threading.local()


def _key(attempt_id: int) -> tuple[str, int]:
    return str(transaction.get_connection().settings_dict["NAME"]), attempt_id


def remember(attempt: Attempt) -> None:
    """Keep ``attempt`` as its last one-statement write left it, for the next
    move on it; an attempt that is final, whose arguments are large, or whose
    last write was not one statement, is dropped instead. The instance is
    handed over, not copied (a copy cost 10 us a request): the caller does
    not use it afterwards, and the move that takes it out has it alone."""
    version = attempt.__dict__.pop(VERSION, None)
    key = _key(attempt.pk)
    if version is not None and attempt.state in TERMINAL_STATES:
        version = None
    if version is not None and not attempt.__dict__.get(_SMALL):
        if len(json.dumps(attempt.args)) > KEPT_ARGS_BYTES:
            version = None
        else:
            attempt.__dict__[_SMALL] = True  # the arguments never change: measured once
    with _lock:
        if version is None:
            _kept.pop(key, None)
            return
        if len(_kept) >= KEPT and key not in _kept:
            del _kept[next(iter(_kept))]  # the oldest
        _kept[key] = (attempt, version, monotonic())


def forget() -> None:
    """Drop every copy (the database was replaced)."""
    with _lock:
        _kept.clear()


def speculating() -> Speculation | None:
    """The move this thread is making from a copy, if any and its change not made yet."""
    current: Speculation | None = getattr(_local, "speculation", None)
    return None if current is None or current.made else current


def from_copy(attempt_id: int, tenant_id: int, act: Callable[[Attempt], Attempt]) -> Attempt | None:
    """``act`` made on this process's copy of the attempt (of ``tenant_id``),
    its change guarded by the copy's version; None when there is no copy, or
    the move left the plain path: nothing was written, and the caller makes
    it from the row read now."""
    key = _key(attempt_id)
    with _lock:
        kept = _kept.get(key)
        if kept is None or kept[0].tenant_id != tenant_id:
            return None  # another tenant's request leaves the copy where it is
        del _kept[key]  # this move has it alone
    attempt, version, since = kept
    if monotonic() - since > KEEP_SECONDS:
        return None
    speculation = Speculation(attempt_id, version)
    connection = transaction.get_connection()
    _local.speculation = speculation
    try:
        with connection.execute_wrapper(_only_the_change):
            done = act(attempt)
    except Exception:
        if speculation.made or speculation.sending:
            raise  # written, or perhaps written: never made twice
        return None
    finally:
        _local.speculation = None
    return done if speculation.made else None


@contextmanager
def sending(speculation: Speculation) -> Iterator[None]:
    """Around the guarded change's statement: the one statement let through.
    When it fails with no answer (the connection broke), it may have been
    written, and stays in doubt; an error the server answered with wrote nothing."""
    speculation.sending = True
    try:
        yield
    except (IntegrityError, DataError, ProgrammingError):
        speculation.sending = False
        raise
    speculation.sending = False


def _only_the_change(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    current: Speculation | None = getattr(_local, "speculation", None)
    if current is not None and not current.made and not current.sending and not sql.startswith(_SAVEPOINTS):
        raise LeftThePlainPath(sql[:60])
    return execute(sql, params, many, context)

"""The ledger's one clock.

Every decision that depends on time (is a lease over, is a back-off due,
was a lookup made after the request could no longer land, is a key past
the provider's retention) reads :func:`now`. Normally that is the wall
clock; :func:`frozen_at` pins it for the current thread (and anything the
thread runs) so a sequence of decisions sees one instant.

The crash drill pins each recovery round to one instant: the round's second
pass then decides against the very time the first did, so "the second pass
changes nothing" holds however slowly a loaded machine runs between them.
Agents are never pinned: their timestamps are the real time of their work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.utils import timezone

_pinned: ContextVar[datetime | None] = ContextVar("ledgerdash_clock", default=None)


def now() -> datetime:
    """The time decisions are made at: the pinned instant, else the wall clock."""
    return _pinned.get() or timezone.now()


@contextmanager
def frozen_at(instant: datetime) -> Iterator[datetime]:
    """Decide everything inside this block at ``instant``."""
    if timezone.is_naive(instant):
        raise ValueError("the ledger's clock is timezone-aware; pass an aware datetime")
    token = _pinned.set(instant)
    try:
        yield instant
    finally:
        _pinned.reset(token)

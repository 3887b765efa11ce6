"""The ledger's one clock, and its one source of jitter.

Every decision that depends on time (is a lease over, is a back-off due,
was a lookup made after the request could no longer land, is a key past
the provider's retention) reads :func:`now`. Normally that is the wall
clock; :func:`frozen_at` pins it for the current thread (and anything the
thread runs) so a sequence of decisions sees one instant, and
:func:`driven_by` hands the whole process to another source of time (the
simulation's virtual clock, which every thread of it shares).

Back-offs spread with random jitter, drawn from :func:`jitter`: the
process's own random numbers, or the simulation's seeded ones, so a
simulated run makes the same draws every time it is replayed.

The crash drill pins each recovery round to one instant: the round's second
pass then decides against the very time the first did, so "the second pass
changes nothing" holds however slowly a loaded machine runs between them.
Agents are never pinned: their timestamps are the real time of their work.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.utils import timezone

_pinned: ContextVar[datetime | None] = ContextVar("ledgerdash_clock", default=None)
#: The process's source of time and of jitter when something drives them (see :func:`driven_by`).
_source: Callable[[], datetime] | None = None
_random: random.Random | None = None


def now() -> datetime:
    """The time decisions are made at: the pinned instant, else the driving source, else the wall clock."""
    pinned = _pinned.get()
    if pinned is not None:
        return pinned
    return _source() if _source is not None else timezone.now()


def jitter(low: float, high: float) -> float:
    """A random number between ``low`` and ``high`` to spread a back-off with."""
    return (_random or random).uniform(low, high)  # jitter, not security


@contextmanager
def frozen_at(instant: datetime) -> Iterator[datetime]:
    """Decide everything inside this block (in this thread) at ``instant``."""
    if timezone.is_naive(instant):
        raise ValueError("the ledger's clock is timezone-aware; pass an aware datetime")
    token = _pinned.set(instant)
    try:
        yield instant
    finally:
        _pinned.reset(token)


@contextmanager
def driven_by(source: Callable[[], datetime], chance: random.Random) -> Iterator[None]:
    """Take the time from ``source`` and the jitter from ``chance`` in every
    thread of the process, inside this block. One driver at a time."""
    global _source, _random
    if _source is not None:
        raise RuntimeError("the ledger's clock is already driven by another source")
    _source, _random = source, chance
    try:
        yield
    finally:
        _source, _random = None, None

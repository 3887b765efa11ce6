"""An attempt's timeline as its page shows it: runs of repeated checks
folded into one row with a count, in pages.

An attempt the provider cannot settle is looked up again and again (an
UNKNOWN checked hourly for a month has some 700 events). Rendering each
one made the page slow and long without telling the operator more than
"checked 700 times, the provider kept saying the same". Consecutive
events that changed nothing (the state stayed where it was) by the same
kind of actor fold into one row: its count, first and last time, the
reasons given (each with how often), and the last one's details.

The page reads every event's short columns (no details, no users) to
fold them, then the full rows of only what its page shows. The audit
report and the exports keep every event, unfolded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Page, Paginator

from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, EventArchive
from reviews import history

#: Rows (single events or folded runs) per page of the timeline.
PAGE_SIZE = 50
#: Distinct reasons a folded row lists (the rest are counted together).
REASONS_SHOWN = 3


@dataclass(frozen=True)
class _Short:
    """The columns that decide folding."""

    pk: int
    seq: int
    kind: str
    from_state: str
    to_state: str
    actor_kind: str
    reason: str

    def repeats(self, other: _Short) -> bool:
        """Whether ``self`` repeats ``other``: a move that kept the state, like it, by the same kind of actor."""
        return (
            self.kind == EventKind.TRANSITION
            and self.from_state != ""
            and self.from_state == self.to_state
            and (self.kind, self.from_state, self.to_state, self.actor_kind)
            == (other.kind, other.from_state, other.to_state, other.actor_kind)
        )


@dataclass
class _Run:
    events: list[_Short]

    @property
    def first(self) -> _Short:
        return self.events[0]

    @property
    def last(self) -> _Short:
        return self.events[-1]


@dataclass
class Row:
    """One row of the timeline: one event, or a run of repeated checks."""

    #: The event shown: the only one, or the last of a run (its details are the latest).
    event: AttemptEvent
    #: The run's first event (None for a single event).
    first: AttemptEvent | None = None
    count: int = 1
    #: For a run: each reason given and how often, most frequent first.
    reasons: list[tuple[str, int]] = field(default_factory=list)
    #: For a run: how many more distinct reasons there were than listed.
    more_reasons: int = 0
    owner_change: history.OwnerChange | None = None

    @property
    def folded(self) -> bool:
        return self.count > 1


@dataclass
class Timeline:
    #: The page of runs (its number, its paginator); ``rows`` are what it shows.
    page: Page[Any]
    rows: list[Row]
    #: Every event of the attempt, before folding.
    total_events: int
    #: The attempt's first event (for "recorded by"), wherever the page is.
    creating: AttemptEvent | None
    #: Archives (``archive_events``, not restored) that may hold the attempt's earlier events, when
    #: the database no longer holds the event that recorded it.
    archived: list[EventArchive] = field(default_factory=list)


def _fold(shorts: list[_Short]) -> list[_Run]:
    runs: list[_Run] = []
    for short in shorts:
        if runs and short.repeats(runs[-1].last):
            runs[-1].events.append(short)
        else:
            runs.append(_Run([short]))
    return runs


def timeline(attempt: Attempt, page: str | int = 1, per_page: int | None = None) -> Timeline:
    """Page ``page`` (1-based; anything else reads as the nearest valid page) of ``attempt``'s folded timeline."""
    shorts = [
        _Short(*values)
        for values in AttemptEvent.objects.filter(attempt_id=attempt.pk)
        .order_by("seq")
        .values_list("pk", "seq", "kind", "from_state", "to_state", "actor_kind", "reason")
    ]
    runs = _fold(shorts)
    chosen = Paginator(runs, per_page or PAGE_SIZE).get_page(page)
    wanted = {run.last.pk for run in chosen.object_list} | {run.first.pk for run in chosen.object_list}
    if shorts:
        wanted.add(shorts[0].pk)
    full = {event.pk: event for event in AttemptEvent.objects.filter(pk__in=wanted).select_related("actor_user")}
    names = history.user_names(full.values())
    rows = []
    for run in chosen.object_list:
        event = full[run.last.pk]
        row = Row(event=event, owner_change=history.owner_change(event, names))
        if len(run.events) > 1:
            counted = Counter(short.reason for short in run.events).most_common()
            row.first, row.count = full[run.first.pk], len(run.events)
            row.reasons, row.more_reasons = counted[:REASONS_SHOWN], max(0, len(counted) - REASONS_SHOWN)
        rows.append(row)
    creating = full.get(shorts[0].pk) if shorts else None
    archived: list[EventArchive] = []
    if creating is None or creating.from_state:
        # The event that recorded it is gone from the database: archived, with any other of its time.
        until = creating.created_at if creating is not None else None
        candidates = EventArchive.objects.filter(restored_at__isnull=True, last_at__gte=attempt.created_at)
        archived = list(candidates.filter(first_at__lte=until) if until is not None else candidates)
    return Timeline(page=chosen, rows=rows, total_events=len(shorts), creating=creating, archived=archived)

"""Pictures drawn on the server as SVG: the overview's last 24 hours and an attempt's states over time.

No JavaScript and nothing inline for the Content-Security-Policy to refuse: the templates
(``reviews/_charts.html``) draw rectangles from the numbers here, coloured by the stylesheet's
classes. Each picture is also said in words for people who do not see it: its caption's numbers,
and a label naming every bar or stay.

The last 24 hours are read from the newest events only (``RECENT_EVENTS`` at most, newest
first by primary key, which the ledger's index serves at any size): a busier day than that is
drawn from the hour the events reach back to, and says so. Queue sizes are counted back from
now: an hour's size is the next hour's, less what entered the queue in it, plus what left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from operator import itemgetter

from django.db.models import Count

from ledgerdash.ledger import clock
from ledgerdash.ledger.models import ActorKind, Attempt, AttemptEvent, State

#: How many of the newest events the overview's last 24 hours read, at most.
RECENT_EVENTS = 20_000
HOURS = 24
#: The queues drawn over the last 24 hours.
QUEUES = (State.UNKNOWN, State.MANUAL_REVIEW)
#: The charts' drawing boxes (SVG user units); the page scales each to its width.
WIDTH, HEIGHT = 480, 96
STRIP_WIDTH = 1000


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    value: int
    label: str  # the hour, "13:00"


@dataclass
class Series:
    """One picture of 24 hourly bars."""

    name: str
    css: str
    values: list[int]
    hours: list[datetime]
    caption: str
    #: Queue sizes are levels (read at each hour's end); the others are counts per hour.
    level: bool = False
    bars: list[Bar] = field(default_factory=list)

    def __post_init__(self) -> None:
        top = max(self.values, default=0) or 1
        step = WIDTH / len(self.values)
        for n, (value, hour) in enumerate(zip(self.values, self.hours, strict=True)):
            height = (HEIGHT - 14) * value / top
            self.bars.append(Bar(n * step + 1, HEIGHT - 12 - height, step - 2, height, value, f"{hour:%H:00}"))

    @property
    def peak(self) -> int:
        return max(self.values, default=0)

    @property
    def said(self) -> str:
        """The picture in words, beside it."""
        if self.level:
            return f"now {self.values[-1]}, at most {self.peak}"
        return f"{sum(self.values)} in all, at most {self.peak} in an hour"


@dataclass
class Trends:
    hours: list[datetime]
    queues: list[Series]
    decisions: Series
    reconciler: list[Series]
    since: datetime | None  # set when the newest events did not reach back 24 hours
    width: int = WIDTH
    height: int = HEIGHT


def trends(tenant_ids: list[int]) -> Trends:
    now = clock.now()
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    hours = [end - timedelta(hours=HOURS - n) for n in range(HOURS)]
    start = hours[0]
    rows = list(
        AttemptEvent.objects.filter(tenant_id__in=tenant_ids)
        .order_by("-id")
        .values_list("created_at", "from_state", "to_state", "actor_kind")[:RECENT_EVENTS]
    )
    since = None
    if len(rows) == RECENT_EVENTS and rows[-1][0] > start:
        since = rows[-1][0]
    entered: dict[str, list[int]] = {str(state): [0] * HOURS for state in QUEUES}
    left: dict[str, list[int]] = {str(state): [0] * HOURS for state in QUEUES}
    decisions = [0] * HOURS
    outcomes: dict[str, list[int]] = {}
    for at, from_state, to_state, actor in rows:
        if at < start or (since is not None and at < since):
            continue
        hour = min(int((at - start).total_seconds() // 3600), HOURS - 1)
        if from_state == to_state:
            continue  # a look that changed nothing (UNKNOWN again)
        if to_state in entered:
            entered[to_state][hour] += 1
        if from_state in left:
            left[from_state][hour] += 1
        if actor == ActorKind.USER and to_state:
            decisions[hour] += 1
        elif actor == ActorKind.RECONCILER and to_state:
            outcomes.setdefault(to_state, [0] * HOURS)[hour] += 1
    now_counts = dict(
        Attempt.objects.filter(tenant_id__in=tenant_ids, state__in=QUEUES)
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
    )
    queues = []
    for state in QUEUES:
        sizes = [0] * HOURS
        size = now_counts.get(state, 0)
        for hour in reversed(range(HOURS)):
            sizes[hour] = size
            size = max(0, size - entered[str(state)][hour] + left[str(state)][hour])
        caption = f"{state} waiting, at each hour's end"
        queues.append(Series(str(state), f"q-{state.lower()}", sizes, hours, caption, level=True))
    reconciler = [
        Series(state, f"q-{state.lower()}", values, hours, f"The reconciler's moves to {state}, per hour")
        for state, values in sorted(outcomes.items())
    ]
    people = Series("decisions", "decisions", decisions, hours, "People's decisions (moves), per hour")
    return Trends(hours, queues, people, reconciler, since)


@dataclass(frozen=True)
class Segment:
    """An attempt's time in one state."""

    state: str
    x: float
    width: float
    start: datetime
    end: datetime
    moved_by: str  # who moved it into this state
    moves: int  # how many moves it took (a look that left it UNKNOWN counts)

    @property
    def label(self) -> str:
        """Its name and length, drawn on it where they fit (12 px monospace: about 7.3 units a letter)."""
        text = f"{self.state} {self.lasted}"
        return text if self.width >= 7.3 * len(text) + 8 else ""

    @property
    def lasted(self) -> str:
        seconds = (self.end - self.start).total_seconds()
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size:
                return f"{seconds / size:.0f}{unit}"
        return f"{seconds:.0f}s"


@dataclass
class Strip:
    segments: list[Segment]
    start: datetime
    end: datetime
    width: int = STRIP_WIDTH
    height: int = 26


def strip(attempt: Attempt) -> Strip | None:
    """The attempt's states over time, one segment per stay, from its transition events. A stay's
    width grows with the logarithm of its length: seconds in DISPATCHED stay visible beside days
    in MANUAL_REVIEW, and each segment says how long it lasted."""
    moves = list(
        AttemptEvent.objects.filter(attempt=attempt)
        .exclude(to_state="")
        .order_by("seq")
        .values_list("created_at", "to_state", "actor_label")
    )
    if not moves:
        return None
    # A stay: the move into a state (when, which, by whom) and how many moves in a row left it there.
    stays = [(first, 1 + sum(1 for _ in rest)) for _, (first, *rest) in groupby(moves, key=itemgetter(1))]
    start = moves[0][0]
    end = max(clock.now(), moves[-1][0]) if attempt.state not in SETTLED else moves[-1][0]
    starts = [at for (at, _state, _who), _count in stays]
    ends = [*starts[1:], end]
    weights = [1 + math.log10(1 + (until - since).total_seconds()) for since, until in zip(starts, ends, strict=True)]
    scale = STRIP_WIDTH / sum(weights)
    segments, x = [], 0.0
    for ((at, state, who), count), until, weight in zip(stays, ends, weights, strict=True):
        segments.append(Segment(state, x, weight * scale, at, until, who, count))
        x += weight * scale
    return Strip(segments, start, end)


#: States an attempt stays in for good (its strip ends at the move into it).
SETTLED = frozenset({State.OUTCOME_CONFIRMED, State.FAILED, State.RECONCILED})

"""When a request can no longer land: the one rule for what a provider's
"not found" proves.

A provider acts on a request within the tool's maximum request time of
receiving it, or never; and it receives a request only while its sender is
still waiting on it. So a dispatch's request can land until the latest
moment it could have left, plus the maximum request time. That moment is
not the dispatch claim (a tool may prepare before it sends) but the
dispatcher's last sign of life:

- while it is silent (after its claim or a heartbeat), it may still send
  until its lease ends: the request can land until the lease's end plus the
  maximum request time;
- once it reports (any outcome, "unknown" included) it has stopped waiting:
  the request can land until the report plus the maximum request time, and
  a definitive report (a receipt, a refusal) ends that at once;
- a sign of life after its lease ran out (a late heartbeat or report from a
  dispatcher that was paused) can only push the time on, never back.

A lookup is evidence that the request did not land only when it was asked
at or after that time: the moment it was *asked*, not when its answer
arrived, since the provider may have looked any time in between. A lookup
through a search index sees an effect only some time after it happened
(the tool's lookup lag): its "not found" counts only once it was asked at
or after that time plus the lag.

A dispatcher that sends after its lease ran out breaks the first rule: the
ledger may by then have taken a "not found" for proof. The fence does not
stop such a request (the provider knows nothing of fences); it stops the
dispatcher's stale report from counting as current, and its late report
or heartbeat is recorded as evidence that pushes the time on (and opens an
incident where the attempt was settled on the earlier time).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from ledgerdash.ledger.authority import Timing


class Landing(Protocol):
    """What the rule reads of an attempt."""

    lands_by: datetime | None
    last_lookup: str
    last_lookup_at: datetime | None


def while_silent(at: datetime, timing: Timing) -> datetime:
    """Until when a request may land, for a dispatcher that holds its lease
    from ``at`` (a claim or a heartbeat) and has not reported: it may send
    until the lease ends."""
    return at + timedelta(seconds=timing.lease_seconds + timing.max_request_seconds)


def after_report(at: datetime, timing: Timing) -> datetime:
    """Until when a request may land, for a dispatcher that reported at
    ``at`` that it cannot tell what happened: it sent, if at all, by then."""
    return at + timedelta(seconds=timing.max_request_seconds)


def after_unknown(previous: datetime | None, at: datetime, timing: Timing, *, late: bool) -> datetime:
    """Until when a request may land once its dispatcher reported "unknown"
    at ``at`` (``previous``: until when the ledger had it landing). Within
    its lease the report is its last sign of life; after its lease ran out
    (``late``) it can only push the time on."""
    reported = after_report(at, timing)
    if late and previous is not None:
        return max(previous, reported)
    return reported


def could_still_land(attempt: Landing, at: datetime) -> bool:
    """Whether the attempt's last request may still land at the provider at ``at``."""
    return attempt.lands_by is not None and at < attempt.lands_by


def shows_by(attempt: Landing, lag: float) -> datetime | None:
    """When a lookup with ``lag`` seconds of lag shows whatever the
    attempt's last request did: once it could no longer land, plus the lag."""
    return attempt.lands_by + timedelta(seconds=lag) if attempt.lands_by is not None else None


def could_still_hide(attempt: Landing, at: datetime, lag: float) -> bool:
    """Whether a lookup asked at ``at`` may miss the attempt's request: it may
    still land, or have landed too recently for a lookup that lags ``lag`` s."""
    until = shows_by(attempt, lag)
    return until is not None and at < until


def not_found_is_evidence(attempt: Landing, lag: float = 0.0) -> bool:
    """Whether the attempt's last lookup is the provider's word that its
    request did not land: "not found", asked once it could no longer land
    and the lookup (lagging ``lag`` seconds) would show it."""
    return (
        attempt.last_lookup == "not_found"
        and attempt.last_lookup_at is not None
        and not could_still_hide(attempt, attempt.last_lookup_at, lag)
    )

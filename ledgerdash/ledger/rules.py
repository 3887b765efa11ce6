"""The ledger's answers to "may this happen now, and why not?".

Moves, the dashboard and the API ask these questions; none of them
re-derives the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ledgerdash.ledger import clock
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    Attempt,
    FailedBecause,
    State,
)

S = State


@dataclass(frozen=True)
class OriginalStanding:
    """Whether a retry of ``original`` could perform its side effect a second
    time: the ledger's one answer, used by approvals, the dashboard and the API.

    ``blocked``: no approval at all yet (the original may still be sent, or
    was already superseded). ``risk``: a retry could duplicate it; an
    approver may accept that only with a recorded reason. ``proof``: why a
    retry cannot duplicate it, from the facts alone.
    """

    blocked: str | None = None
    risk: str | None = None
    proof: str | None = None


def when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def original_standing(original: Attempt, *, now: datetime | None = None) -> OriginalStanding:
    """Only the provider's word (or never having sent it) proves an original
    did not happen: a definitive refusal, or a "not found" observed after the
    request could no longer land. A person's "failed" is a claim."""
    now = now or clock.now()
    if original.state in IN_FLIGHT_STATES:
        return OriginalStanding(
            blocked=f"the original #{original.pk} is {original.state} and may yet be sent (by its agent or the "
            "reconciler): settle it first"
        )
    if original.state == S.RECONCILED:
        return OriginalStanding(blocked=f"the original #{original.pk} was already superseded by an approved retry")
    if original.state == S.OUTCOME_CONFIRMED:
        return OriginalStanding(
            risk=f"the original #{original.pk} happened (confirmed): a retry performs it a second time"
        )
    if original.dispatch_count == 0:
        return OriginalStanding(proof=f"the original #{original.pk} was never sent")
    if original.lands_by is not None and original.lands_by > now:
        return OriginalStanding(
            risk=f"the original #{original.pk}'s request may still land at the provider until "
            f"{when(original.lands_by)} (its dispatcher is still waiting on it)"
        )
    if original.state == S.FAILED and original.failed_because == FailedBecause.PROVIDER:
        return OriginalStanding(proof=f"the provider refused the original #{original.pk}: it did not act")
    if original.last_lookup == "not_found" and original.last_lookup_at is not None:
        if original.lands_by is None or original.last_lookup_at >= original.lands_by:
            return OriginalStanding(
                proof=f"the provider did not have the original #{original.pk} at {when(original.last_lookup_at)}, "
                "after its request could no longer land"
            )
        return OriginalStanding(
            risk=f"the provider's last lookup of the original #{original.pk} (not found, "
            f"{when(original.last_lookup_at)}) was made before its request could no longer land "
            f"({when(original.lands_by)}): not evidence"
        )
    if original.state == S.FAILED and original.failed_because == FailedBecause.PERSON:
        return OriginalStanding(
            risk=f"the original #{original.pk} was marked failed by a person, not by the provider: a claim, "
            "not evidence that it did not happen"
        )
    said = original.last_lookup.replace("_", " ") if original.last_lookup else "no lookup yet"
    return OriginalStanding(
        risk=f"the provider has not said the original #{original.pk} did not happen (last lookup: {said})"
    )

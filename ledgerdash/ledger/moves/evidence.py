"""What a dispatcher reports, and what the ledger does with a report that
arrives after the attempt moved on: never dropped, it settles an attempt
still open, or is recorded as evidence and opens an incident when it
contradicts how the attempt was settled. A report naming a provider id
another side effect holds is kept as evidence too, with an incident."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.db.models import Q

from ledgerdash.ledger import clock, landing
from ledgerdash.ledger.authority import authority_of
from ledgerdash.ledger.canonical import canonical_bytes, sha256_hex
from ledgerdash.ledger.errors import RequestIdTaken
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, clean_text
from ledgerdash.ledger.models import (
    ActorKind,
    Attempt,
    AttemptEvent,
    FailedBecause,
    Incident,
)
from ledgerdash.ledger.moves.base import S, get_attempt, move, pick_owner
from ledgerdash.ledger.rules import SendVerdict, late_receipt
from ledgerdash.ledger.store import append_events


@dataclass(frozen=True)
class Report:
    """What the ledger did with a dispatcher's outcome report."""

    attempt: Attempt
    #: This very report had been applied before (a retry after a lost answer): nothing was written.
    replayed: bool = False
    #: The attempt had moved on (the lease ran out, a person decided, a retry
    #: superseded it): the report was recorded as evidence.
    late: bool = False


class Outcome(models.TextChoices):
    CONFIRMED = "confirmed"
    FAILED = "failed"
    FAILED_RETRYABLE = "failed_retryable"
    UNKNOWN = "unknown"


#: The state each outcome report puts the attempt in.
OUTCOME_STATE = {
    Outcome.CONFIRMED: S.OUTCOME_CONFIRMED,
    Outcome.FAILED: S.FAILED,
    Outcome.FAILED_RETRYABLE: S.FAILED_RETRYABLE,
    Outcome.UNKNOWN: S.UNKNOWN,
}


@dataclass(frozen=True)
class Evidence:
    outcome: str
    provider_request_id: str = ""
    result_ref: str = ""
    reason: str = ""

    def as_details(self) -> dict[str, Any]:
        out = {"outcome": self.outcome}
        if self.provider_request_id:
            out["provider_request_id"] = self.provider_request_id
        if self.result_ref:
            out["result_ref"] = self.result_ref
        if self.reason:
            out["reason"] = clean_text(self.reason)[:1000]
        return out


#: How many of an attempt's reports it keeps (``Attempt.reports_heard``): a dispatcher
#: sends a handful; the same report sent again comes soon after the first.
REPORTS_KEPT = 16


def report_mark(fence: int, evidence: Evidence) -> str:
    """One dispatcher's report, named by its dispatch fence and a digest of what it said."""
    return f"{fence}:{sha256_hex(canonical_bytes(evidence.as_details()))[:24]}"


def heard_before(attempt: Attempt, fence: int, evidence: Evidence) -> bool:
    """Whether the attempt's row keeps this very report (sent again after a lost answer)."""
    return report_mark(fence, evidence) in (attempt.reports_heard or [])


def hearing(attempt: Attempt, fence: int, evidence: Evidence) -> dict[str, Any]:
    """What the attempt's row keeps of a report it heard now: the report's mark, and, when
    its dispatcher says it cannot tell whether its request landed, that dispatch."""
    heard = [report_mark(fence, evidence), *(attempt.reports_heard or [])]
    kept: dict[str, Any] = {"reports_heard": list(dict.fromkeys(heard))[:REPORTS_KEPT]}
    if evidence.outcome == Outcome.UNKNOWN:
        kept["said_unknown_fence"] = max(fence, attempt.said_unknown_fence or 0)
    return kept


def said_unknown(attempt: Attempt, fence: int | None) -> bool:
    """Whether the dispatcher holding ``fence`` said it could not tell whether its request
    landed: a refusal it reports since is of a later request of that dispatch (its SDK
    sent it again), and says nothing of the first request's fate."""
    return fence is not None and attempt.said_unknown_fence == fence


def already_reported(attempt: Attempt, fence: int, evidence: Evidence) -> bool:
    """This very report landed before (sent again after a lost answer):
    an event of the attempt records it, applied on the spot (the move from
    DISPATCHED that took the dispatch's fence one further), applied late,
    or kept as late evidence."""
    if heard_before(attempt, fence, evidence):
        return True  # (the row keeps it: the events below may have been archived)
    said = evidence.as_details()
    wanted = OUTCOME_STATE[Outcome(evidence.outcome)]
    events = AttemptEvent.objects.filter(
        attempt_id=attempt.pk, actor_kind=ActorKind.AGENT, kind__in=[EventKind.TRANSITION, EventKind.LATE_REPORT]
    ).values_list("kind", "from_state", "to_state", "fence", "details")
    for kind, from_state, to_state, event_fence, details in events:
        details = details or {}
        if details.get("dispatch_fence") == fence and said in (details.get("report"), details.get("late_report")):
            return True
        if kind == EventKind.TRANSITION and (from_state, to_state, event_fence) == (S.DISPATCHED, wanted, fence + 1):
            if evidence.outcome != Outcome.CONFIRMED:
                return True
            return (
                not evidence.provider_request_id or evidence.provider_request_id == details.get("provider_request_id")
            ) and (not evidence.result_ref or evidence.result_ref == details.get("result_ref"))
    return False


def dispatched_with(attempt: Attempt, fence: int) -> bool:
    """Whether ``fence`` was handed out by one of the attempt's dispatch
    claims (an earlier one, when the attempt was sent again since).

    The claims are events; once the oldest of the attempt's events were
    archived (``archive_events``: a settled attempt, which a late report
    may still reach), the ledger cannot tell from the database. A fence
    below the last dispatch's is then taken as an earlier dispatch's, so
    its report is kept rather than dropped, and weighs what an earlier
    dispatch's report weighs (:func:`late_evidence`: never a refusal's
    settlement; a receipt while a person reviews it). The archive is a
    prefix of each chain: an attempt whose creation is still in the
    database has all its events there."""
    events = AttemptEvent.objects.filter(attempt_id=attempt.pk, kind=EventKind.TRANSITION)
    if events.filter(to_state=S.DISPATCHED, fence=fence).exists():
        return True
    history_archived = not events.filter(Q(from_state="") | Q(from_state__isnull=True)).exists()
    return history_archived and attempt.dispatch_fence is not None and 0 < fence < attempt.dispatch_fence


def late_evidence(attempt: Attempt, *, fence: int, actor: Actor, evidence: Evidence) -> Attempt:
    """Record the original dispatcher's report about an attempt that has
    moved on (a person is deciding it, or it was settled), never dropping it.

    Under review (or failed retryably, waiting for its re-send), the
    provider's word settles it: a receipt from any of its dispatches (it
    happened), a refusal only from its last one (an earlier request's
    refusal says nothing of a later request's fate). Settled, the report
    is an event; when it says the effect happened although the ledger had
    settled the attempt otherwise, or contradicts the recorded receipt, an
    incident is opened for people: a duplicate when another attempt at the
    same side effect was sent as well.
    """
    if heard_before(attempt, fence, evidence):
        return attempt
    last_dispatch = attempt.dispatch_fence == fence
    if attempt.state in (S.MANUAL_REVIEW, S.FAILED_RETRYABLE) and evidence.outcome in (
        Outcome.CONFIRMED,
        Outcome.FAILED,
        Outcome.FAILED_RETRYABLE,
    ):
        receipt = evidence.provider_request_id or attempt.provider_request_id or evidence.result_ref
        if evidence.outcome == Outcome.CONFIRMED and receipt:
            return move(
                attempt,
                to_state=S.OUTCOME_CONFIRMED,
                actor=actor,
                fence=None,
                reason=f"late outcome report from the original dispatcher while {attempt.state}: the provider acted",
                updates={
                    "provider_request_id": evidence.provider_request_id or attempt.provider_request_id,
                    "result_ref": evidence.result_ref,
                    "lands_by": clock.now(),
                    **hearing(attempt, fence, evidence),
                },
                details={"late_report": evidence.as_details(), "dispatch_fence": fence},
            )
        if evidence.outcome != Outcome.CONFIRMED and last_dispatch and not said_unknown(attempt, fence):
            # (after "unknown", a refusal from the same dispatch is of a later request of it)
            return move(
                attempt,
                to_state=S.FAILED,
                actor=actor,
                fence=None,
                reason=f"late outcome report from the original dispatcher while {attempt.state}: the provider "
                f"did not act ({evidence.reason or evidence.outcome})",
                updates={
                    "failed_because": FailedBecause.PROVIDER,
                    "last_error": clean_text(evidence.reason),
                    "lands_by": clock.now(),
                    **hearing(attempt, fence, evidence),
                },
                details={"late_report": evidence.as_details(), "dispatch_fence": fence},
            )
    now = clock.now()
    with transaction.atomic():
        current = get_attempt(attempt.pk, lock=True)
        if heard_before(current, fence, evidence):
            return current
        earlier = current.dispatch_fence != fence
        incident = _incident_for_late_report(current, evidence, earlier=earlier)
        events = [
            EventDraft(
                current.tenant_id,
                current.pk,
                EventKind.LATE_REPORT,
                actor,
                fence=current.fence,
                reason=f"late report from {'an earlier' if earlier else 'the original'} dispatcher (dispatch fence "
                f"{fence}) after the attempt became {current.state}: {evidence.outcome}",
                details={"report": evidence.as_details(), "dispatch_fence": fence, "state": current.state},
            )
        ]
        if incident is not None:
            events.append(incident_opened(incident, actor, now))
        lands_by = _lands_by_after_late_report(current, evidence, now, earlier=earlier)
        # Kept on the row as well as in the event: the send rule reads it for every attempt at the side
        # effect, long after this event's partition may have been archived.
        kept = {
            "lands_by": lands_by,
            "late_receipt": current.late_receipt or late_receipt(evidence.as_details()),
            **hearing(current, fence, evidence),
        }
        if incident is not None and rested_on_its_word(current, fence):
            return _back_before_a_person(current, actor=actor, evidence=evidence, kept=kept, events=events)
        Attempt.objects.filter(pk=current.pk).update(**kept)
        for name, value in kept.items():
            setattr(current, name, value)
        append_events(events, now=now)
    return current


def rested_on_its_word(attempt: Attempt, fence: int) -> bool:
    """Whether ``attempt`` was settled as not happened on the word of the
    dispatcher that holds ``fence``: failed on the provider's refusal, as
    reported for its last dispatch (only that dispatch's holder reports
    with its fence)."""
    failed_on_a_refusal = attempt.state == S.FAILED and attempt.failed_because == FailedBecause.PROVIDER
    return failed_on_a_refusal and attempt.dispatch_fence == fence


def _back_before_a_person(
    attempt: Attempt, *, actor: Actor, evidence: Evidence, kept: dict[str, Any], events: list[EventDraft]
) -> Attempt:
    """FAILED -> MANUAL_REVIEW: the ledger settled ``attempt`` as not
    happened on its dispatcher's word, and the same dispatcher now says it
    may have happened (it cannot tell, or it holds a receipt). The
    settlement no longer rests on anything, so a person decides, with the
    late report and the incident beside it."""
    updates: dict[str, Any] = {**kept, "failed_because": ""}
    if evidence.provider_request_id and not attempt.provider_request_id:
        updates["provider_request_id"] = evidence.provider_request_id
    said = (
        f"a receipt ({evidence.provider_request_id or evidence.result_ref})"
        if evidence.outcome in (Outcome.CONFIRMED, "request_id")
        else "that it cannot tell whether its request landed"
    )
    return move(
        attempt,
        to_state=S.MANUAL_REVIEW,
        actor=actor,
        fence=None,
        reason=f"no longer settled: it failed on its dispatcher's word that the provider refused it, and the same "
        f"dispatcher now reports {said}; a person decides",
        updates=updates,
        details={"late_report": evidence.as_details(), "dispatch_fence": attempt.dispatch_fence},
        extra_events=events,
    )


def _lands_by_after_late_report(
    attempt: Attempt, evidence: Evidence, now: datetime, *, earlier: bool
) -> datetime | None:
    """Until when the attempt's request may land, given a late report.

    "Unknown" says the dispatcher was alive now and may have sent until
    now: the time moves on (never back). A definitive word from the last
    dispatch says its request is no longer in flight; one from an earlier
    dispatch says nothing about the last one's.
    """
    if evidence.outcome == Outcome.UNKNOWN:
        timing = authority_of(attempt.tenant_id, attempt.tool_name).timing
        return landing.after_unknown(attempt.lands_by, now, timing, late=True)
    refusal = evidence.outcome in (Outcome.FAILED, Outcome.FAILED_RETRYABLE)
    if earlier or (refusal and said_unknown(attempt, attempt.dispatch_fence)):
        return attempt.lands_by  # (a refusal after "unknown" is of a later request: the first may land still)
    return now


def _incident_for_late_report(attempt: Attempt, evidence: Evidence, *, earlier: bool) -> Incident | None:
    """The incident a late report about a settled attempt calls for, saved;
    None when the report agrees with the ledger.

    A receipt (or a request id) says the effect happened; "unknown" says
    the dispatcher was still at work after the ledger had settled the
    attempt as not happened, so it may have sent it after all (a refusal
    of this very dispatch included: its SDK may have sent it again).
    Either contradicts a settlement as failed or superseded, and is a
    possible duplicate when a retry of the same side effect went out too.
    The incident names the attempt's people (its owner, who asked for it,
    who approved it) and the retry's.
    """
    acted = evidence.outcome in (Outcome.CONFIRMED, "request_id")
    may_have_acted = evidence.outcome == Outcome.UNKNOWN
    # The provider's refusal of the dispatch this report is about settled
    # it as failed too: the dispatcher's "cannot tell" withdraws that word.
    settled_as_not_happened = attempt.state in (S.RECONCILED, S.FAILED)
    summary = ""
    kind = Incident.Kind.CONTRADICTION
    retry: Attempt | None = None
    if (acted and attempt.state in (S.RECONCILED, S.FAILED)) or (may_have_acted and settled_as_not_happened):
        retry = (
            Attempt.objects.filter(
                tenant_id=attempt.tenant_id, idempotency_key=attempt.idempotency_key, dispatch_count__gt=0
            )
            .exclude(pk=attempt.pk)
            .exclude(state=S.FAILED, failed_because=FailedBecause.PROVIDER)
            .order_by("id")
            .first()
        )
        how = (
            f"acted at the provider after all (late report: {evidence.outcome})"
            if acted
            else "may have acted at the provider after all: its dispatcher was still at work and reports it cannot "
            "tell whether its request landed"
        )
        if retry is not None:
            kind = Incident.Kind.DUPLICATE
            summary = (
                f"#{attempt.pk} {how}, and #{retry.pk} was sent for the same side effect: it may have happened twice"
            )
        else:
            summary = f"#{attempt.pk} {how}, although the ledger had it {attempt.state}"
    elif (
        acted
        and attempt.state == S.OUTCOME_CONFIRMED
        and evidence.provider_request_id
        and attempt.provider_request_id
        and evidence.provider_request_id != attempt.provider_request_id
    ):
        summary = (
            f"#{attempt.pk} has a second receipt: the dispatcher reports request {evidence.provider_request_id}, "
            f"the ledger confirmed {attempt.provider_request_id}"
        )
    elif evidence.outcome in (Outcome.FAILED, Outcome.FAILED_RETRYABLE) and attempt.state == S.OUTCOME_CONFIRMED:
        summary = f"#{attempt.pk} is confirmed, but its dispatcher reports the provider refused it"
    if not summary:
        return None
    now = clock.now()
    owner_id, _source = pick_owner(attempt.tenant_id, now)
    return Incident.objects.create(
        tenant_id=attempt.tenant_id,
        attempt=attempt,
        retry=retry,
        kind=kind,
        owner_id=owner_id or attempt.owner_id,
        summary=summary,
        details={
            "report": evidence.as_details(),
            "people": people_of(attempt),
            "retry_people": people_of(retry) if retry is not None else None,
            "attempt_state": attempt.state,
            "attempt_request_id": attempt.provider_request_id,
            "retry_id": retry.pk if retry else None,
            "retry_state": retry.state if retry else None,
            "retry_request_id": retry.provider_request_id if retry else None,
        },
        opened_at=now,
    )


def not_sent_incident(retry: Attempt, verdict: SendVerdict, *, now: datetime) -> Incident:
    """The incident of ``retry``, an attempt the ledger did not send because
    another attempt at the same side effect (``verdict.by``) acted: on that
    attempt, naming the retry and the people who asked for and approved it,
    so they hear that what they let through was not needed."""
    assert verdict.by is not None
    owner_id, _source = pick_owner(retry.tenant_id, now)
    return Incident.objects.create(
        tenant_id=retry.tenant_id,
        attempt_id=verdict.by,
        retry=retry,
        kind=Incident.Kind.NOT_SENT,
        owner_id=owner_id or retry.owner_id,
        summary=f"#{retry.pk} was not sent: {verdict.happened}. Check that nothing is missing and tell whoever "
        "waits on it",
        details={
            "happened": verdict.happened,
            "retry_id": retry.pk,
            "retry_state": retry.state,
            "retry_people": people_of(retry),
        },
        opened_at=now,
    )


def people_of(attempt: Attempt) -> dict[str, int | None]:
    """Who answers for ``attempt``: its owner, who asked for it (a retry),
    who approved it; an incident names them."""
    return {
        "owner_id": attempt.owner_id,
        "requested_by_id": attempt.requested_by_id,
        "approved_by_id": attempt.approved_by_id,
    }


def taken_id_evidence(attempt: Attempt, *, fence: int, actor: Actor, evidence: Evidence, taken: RequestIdTaken) -> None:
    """Keep a dispatcher's report that names a provider id the ledger
    recorded on another side effect (``taken``), which the database refused
    to write: an event on the attempt (once per report), and an incident
    naming both attempts (once per id). One of the two did not happen as
    recorded, and a person finds out which. The attempt stays as it was: its
    lease and recovery go on, and its lookup leaves that id out."""
    said = evidence.as_details()
    now = clock.now()
    with transaction.atomic():
        current = get_attempt(attempt.pk, lock=True)
        kept = list(
            AttemptEvent.objects.filter(attempt_id=current.pk, kind=EventKind.REQUEST_ID_TAKEN).values_list(
                "details", flat=True
            )
        )
        if any(d.get("dispatch_fence") == fence and d.get("report") == said for d in kept):
            return  # the same report sent again: kept once
        held = {"attempt_id": taken.holder_id, "idempotency_key": taken.holder_key, "request_id": taken.request_id}
        events = [
            EventDraft(
                current.tenant_id,
                current.pk,
                EventKind.REQUEST_ID_TAKEN,
                actor,
                fence=current.fence,
                reason=f"report from its dispatcher (dispatch fence {fence}, {evidence.outcome}) kept as evidence, "
                f"not applied: {taken}",
                details={"report": said, "dispatch_fence": fence, "state": current.state, "held_by": held},
            )
        ]
        if not any((d.get("held_by") or {}).get("request_id") == taken.request_id for d in kept):
            owner_id, _source = pick_owner(current.tenant_id, now)
            incident = Incident.objects.create(
                tenant_id=current.tenant_id,
                attempt=current,
                kind=Incident.Kind.CONTRADICTION,
                owner_id=owner_id or current.owner_id,
                summary=f"#{current.pk}'s dispatcher reports provider request {taken.request_id!r}, which the ledger "
                f"recorded on #{taken.holder_id} (key {taken.holder_key!r}), another side effect: one provider "
                "effect is the outcome of one side effect, so one of the two did not happen as recorded",
                details={
                    "report": said,
                    "attempt_state": current.state,
                    "attempt_request_id": current.provider_request_id,
                    "holder_id": taken.holder_id,
                    "holder_key": taken.holder_key,
                },
                opened_at=now,
            )
            events.append(incident_opened(incident, actor, now))
        append_events(events, now=now)


def incident_opened(incident: Incident, actor: Actor, now: datetime) -> EventDraft:
    return EventDraft(
        incident.tenant_id,
        incident.attempt_id,
        EventKind.INCIDENT,
        actor,
        reason=f"{incident.get_kind_display()} incident #{incident.pk} opened: {incident.summary}",
        details={
            "incident_id": incident.pk,
            "action": "opened",
            "kind": incident.kind,
            "retry_id": incident.retry_id,
            "owner_id": incident.owner_id,
        },
    )

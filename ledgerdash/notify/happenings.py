"""What rules and agent callbacks match: a happening is something in a
tenant's ledger someone asked to hear about, ready to become a delivery.

Events are matched by :func:`matches` (rules) and :func:`agent_decision`
(agent callbacks); conditions no single event marks (an attempt past its
SLA, a broken chain, a stalled reconciler) by the functions in
:data:`CONDITIONS`, evaluated at an instant. :mod:`ledgerdash.notify.outbox`
turns them into deliveries.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, OuterRef, Subquery

from ledgerdash.ledger import chain, rules, workers
from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainCheck, State
from ledgerdash.notify.models import ALSO_HELD_CALLS, Channel, Rule, RuleEvent


@dataclass(frozen=True)
class Happening:
    """Something a rule matched, ready to become a delivery."""

    dedup_key: str
    title: str
    text: str
    occurred_at: datetime
    attempt: Attempt | None = None
    source_seq: int | None = None
    details: dict[str, Any] | None = None


def attempt_url(attempt_id: int) -> str:
    return f"{settings.LEDGERDASH_BASE_URL}/attempts/{attempt_id}/"


# --- events ----------------------------------------------------------------------------------------


def _hears_held_calls(rule: Rule) -> bool:
    """Whether ``rule`` sends first calls held for approval: an awaiting_approval rule, or (until the
    next release) a retry_awaiting_approval rule whose channel has no awaiting_approval rule."""
    if rule.event == RuleEvent.AWAITING_APPROVAL:
        return True
    if rule.event != RuleEvent.RETRY_AWAITING_APPROVAL or not ALSO_HELD_CALLS:
        return False
    twin = Rule.objects.filter(tenant_id=rule.tenant_id, channel_id=rule.channel_id, event=RuleEvent.AWAITING_APPROVAL)
    return not twin.exists()


def matches(rule: Rule, event: AttemptEvent) -> Happening | None:
    """The happening ``event`` is for ``rule``, or None."""
    if not chain.past(event.seq, rule.from_seqs):
        return None
    attempt = event.attempt
    key = f"event:{event.seq}"
    if event.kind == EventKind.TRANSITION and event.to_state == State.MANUAL_REVIEW and attempt is not None:
        awaits = rules.recorded_awaiting_approval(attempt, event.from_state, event.to_state)
        if awaits and attempt.parent_id is None and _hears_held_calls(rule):
            title = f"Call #{attempt.pk} awaits approval"
            body = f"{attempt.tool_name}: its policy holds this call for an approver. {event.reason}"
            return Happening(key, title, body, event.created_at, attempt, event.seq)
        if awaits and attempt.parent_id is not None and rule.event == RuleEvent.RETRY_AWAITING_APPROVAL:
            title = f"Linked retry #{attempt.pk} of #{attempt.parent_id} awaits approval"
            body = f"{attempt.tool_name}: a linked retry of attempt #{attempt.parent_id} needs an approver. "
            return Happening(key, title, body + event.reason, event.created_at, attempt, event.seq)
        if rule.event == RuleEvent.ENTERED_MANUAL_REVIEW and not awaits and event.from_state != event.to_state:
            return Happening(
                key,
                f"Attempt #{attempt.pk} entered manual review",
                f"{attempt.tool_name} ({event.from_state or 'new'} -> MANUAL_REVIEW): {event.reason}",
                event.created_at,
                attempt,
                event.seq,
            )
    if (
        rule.event == RuleEvent.DUPLICATE_INCIDENT
        and event.kind == EventKind.INCIDENT
        and event.details.get("action") == "opened"
        and event.details.get("kind") == "duplicate"
    ):
        return Happening(
            key,
            f"Duplicate incident #{event.details.get('incident_id')} on attempt #{event.attempt_id}",
            event.reason,
            event.created_at,
            attempt,
            event.seq,
            {"incident_id": event.details.get("incident_id"), "retry_id": event.details.get("retry_id")},
        )
    if (
        rule.event == RuleEvent.RETRY_NOT_SENT
        and event.kind == EventKind.INCIDENT
        and event.details.get("action") == "opened"
        and event.details.get("kind") == "not_sent"
    ):
        # The retry's happening, so its people hear it (the incident sits on the attempt that acted).
        retry = Attempt.objects.filter(pk=event.details.get("retry_id")).select_related("owner").first()
        return Happening(
            key,
            f"Approved call #{event.details.get('retry_id')} was not sent: its side effect had happened",
            event.reason,
            event.created_at,
            retry or attempt,
            event.seq,
            {"incident_id": event.details.get("incident_id"), "acted_id": event.attempt_id},
        )
    return None


# --- agent callbacks -------------------------------------------------------------------------------


SETTLED = frozenset({State.OUTCOME_CONFIRMED, State.FAILED, State.MANUAL_REVIEW})
RETRY_DECISIONS: dict[str, str] = {State.INTENT_RECORDED: "retry_approved", State.FAILED: "retry_rejected"}
#: A first call the tenant's policy held for an approver.
CALL_DECISIONS: dict[str, str] = {State.INTENT_RECORDED: "call_approved", State.FAILED: "call_rejected"}


def agent_decision(channel: Channel, event: AttemptEvent) -> Happening | None:
    """A decision about an attempt the channel's token recorded (its ``api_token``): a linked
    retry, or a first call its policy held, approved or rejected by a
    person; or a reconciler's verdict."""
    attempt = event.attempt
    if not chain.past(event.seq, channel.from_seqs) or attempt is None or event.kind != EventKind.TRANSITION:
        return None
    if event.from_state == event.to_state:
        return None
    decision = ""
    held = rules.held_first_call(attempt)
    if (
        (attempt.parent_id is not None or held)
        and event.from_state == State.MANUAL_REVIEW
        and event.actor_kind == "user"
    ):
        decision = (CALL_DECISIONS if held else RETRY_DECISIONS).get(event.to_state, "")
    elif event.actor_kind == "reconciler" and event.to_state in SETTLED:
        decision = "settled"
    if not decision or channel.token_id is None or attempt.api_token_id != channel.token_id:
        return None
    return Happening(
        f"agent:{event.seq}",
        f"Attempt #{attempt.pk}: {decision.replace('_', ' ')} ({event.to_state})",
        event.reason,
        event.created_at,
        attempt,
        event.seq,
        {
            "decision": decision,
            "from_state": event.from_state,
            "to_state": event.to_state,
            "fence": event.fence,
            "idempotency_key": attempt.idempotency_key,
            "by": f"{event.actor_kind} {event.actor_label}",
        },
    )


# --- conditions ------------------------------------------------------------------------------------


def _repeat_number(rule: Rule, due: datetime, now: datetime) -> int:
    """Which repetition of a condition that fell due at ``due`` this is (0: the first)."""
    if rule.repeat_minutes <= 0:
        return 0
    return int((now - due) / timedelta(minutes=rule.repeat_minutes))


def sla_overdue(rule: Rule, now: datetime) -> list[Happening]:
    """Attempts of the rule's tenant UNKNOWN or in manual review longer than
    their tool's SLA, measured from the transition that put them there (a
    back-off that leaves an attempt UNKNOWN does not restart the clock).
    Sent again every ``repeat_minutes`` until the attempt leaves the state."""
    entered = AttemptEvent.objects.filter(
        attempt_id=OuterRef("pk"), kind=EventKind.TRANSITION, to_state=OuterRef("state")
    ).exclude(from_state=F("to_state"))
    latest = entered.order_by("-seq")
    waiting = (
        Attempt.objects.filter(tenant_id=rule.tenant_id, state__in=[State.UNKNOWN, State.MANUAL_REVIEW])
        .annotate(entered_seq=Subquery(latest.values("seq")[:1]), entered_at=Subquery(latest.values("created_at")[:1]))
        .select_related("owner")
    )
    found = []
    for attempt in waiting:
        entered_at: datetime = attempt.entered_at or attempt.updated_at
        sla = rule.sla_for(attempt.tool_name)
        due = entered_at + timedelta(minutes=sla)
        if now < due:
            continue
        number = _repeat_number(rule, due, now)
        minutes = int((now - entered_at).total_seconds() // 60)
        found.append(
            Happening(
                f"sla:{attempt.pk}:{attempt.entered_seq}:{number}",
                f"Attempt #{attempt.pk} has been {attempt.state} for {minutes} min (SLA {sla} min)",
                f"{attempt.tool_name}, owner {attempt.owner.get_username() if attempt.owner else 'nobody'}: "
                f"{attempt.state} since {entered_at:%Y-%m-%d %H:%M} UTC. Reminder {number + 1}.",
                now,
                attempt,
                details={"state": attempt.state, "since": entered_at.isoformat(), "reminder": number + 1},
            )
        )
    return found


def reconciler_stalled(rule: Rule, now: datetime) -> list[Happening]:
    """The newest reconciler pass (any worker) is older than ``stalled_minutes``.
    With no pass ever recorded, the rule's creation is the baseline."""
    last = workers.last_pass()
    baseline = last or rule.created_at
    due = baseline + timedelta(minutes=rule.stalled_minutes)
    if now < due:
        return []
    number = _repeat_number(rule, due, now)
    since = f"since {last:%Y-%m-%d %H:%M:%S} UTC" if last else "ever (no pass was recorded)"
    return [
        Happening(
            f"stalled:{baseline.isoformat()}:{number}",
            "The reconciler has stopped",
            f"No reconciler pass completed {since}: UNKNOWN work is not being looked up. "
            "Check the `manage.py reconcile` processes.",
            now,
            details={"last_pass_at": last.isoformat() if last else None, "stalled_minutes": rule.stalled_minutes},
        )
    ]


def audit_break(rule: Rule, now: datetime) -> list[Happening]:
    """The tenant's last ``verify_audit`` found a break: once per distinct break."""
    check = ChainCheck.objects.filter(tenant_id=rule.tenant_id, ok=False).first()
    if check is None:
        return []
    return [
        Happening(
            f"audit:{check.problem}:{check.break_seq}",
            f"verify_audit found a break in the event chain ({check.problem})",
            check.message or f"the chain breaks at seq {check.break_seq}",
            check.checked_at,
            details={
                "problem": check.problem,
                "break_seq": check.break_seq,
                "checked_at": check.checked_at.isoformat(),
            },
        )
    ]


CONDITIONS = {
    RuleEvent.SLA_OVERDUE: sla_overdue,
    RuleEvent.RECONCILER_STALLED: reconciler_stalled,
    RuleEvent.AUDIT_BREAK: audit_break,
}

"""The outbox: how a happening in the ledger becomes a delivery that cannot be lost.

Every change to the ledger already commits, in its own transaction, an
event in its tenant's append-only chain (:func:`ledgerdash.ledger.store.append_events`).
That event *is* the outbox record of the change: the notify worker reads
each tenant's chain past a durable :class:`~ledgerdash.notify.models.Cursor`
and, in ONE transaction, writes the deliveries the tenant's rules ask for
and moves the cursor. So:

- a crash after the change commits and before any delivery is written
  loses nothing: the event is there, past the cursor, and the next pass
  turns it into deliveries;
- a crash while deliveries are written rolls back them and the cursor
  together: the next pass writes them once;
- the hot path (a tool call, a transition) writes nothing more than it did:
  no extra row, no rule lookup, inside the chain-head lock. A tool call that
  triggers no notification costs exactly what it cost before.

Why the cursor can trust ``seq``: the events of a chain are numbered under
its head's row lock, held until the appending transaction commits, so a
chain's next event can only commit after the one before it did. A reader
that sees an event has seen every event before it in its chain; no event
commits later behind the cursor. A tenant with several chains (see
:mod:`ledgerdash.ledger.chain`) numbers them side by side, and a busy chain
numbers ahead of a quiet one, so the cursor keeps a position per chain
(``Cursor.positions``), as do the rules and agent channels for where they
start (``from_seqs``).

What each rule or agent callback matches is decided in
:mod:`ledgerdash.notify.happenings`. Conditions that no single event marks (an attempt past its SLA, a broken
chain found by ``verify_audit``, a reconciler that stopped) are looked at
each loop by :func:`collect_timed`. Each delivery has a ``dedup_key`` unique
per channel (the event's seq, or the condition and its repeat number), so
any number of workers may evaluate the same rules at once: the database
keeps one delivery per happening.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from ledgerdash.ledger import chain, clock
from ledgerdash.ledger.models import Attempt, AttemptEvent, Membership, Role, Tenant
from ledgerdash.ledger.queries import chain_heads, per_chain
from ledgerdash.notify.happenings import CONDITIONS, Happening, agent_decision, attempt_url, matches
from ledgerdash.notify.models import (
    TIMED_EVENTS,
    Audience,
    Channel,
    ChannelKind,
    Cursor,
    Delivery,
    Rule,
    RuleEvent,
)

#: Events read per tenant per pass.
EVENT_BATCH = 500


def start_seqs(tenant: Tenant) -> list[int]:
    """Where a rule made now starts: the head seq of each of the tenant's chains."""
    return _head_seqs([tenant])[tenant.pk]


def _head_seqs(tenants: list[Tenant]) -> dict[int, list[int]]:
    return {tenant_id: [seq for seq, _ in heads] for tenant_id, heads in chain_heads(tenants).items()}


# --- events -> deliveries -------------------------------------------------------------------------


def collect_events(*, limit: int = EVENT_BATCH) -> int:
    """Turn events past each tenant's cursor into deliveries; how many were written."""
    tenants = set(
        Rule.objects.filter(enabled=True, channel__enabled=True)
        .exclude(event__in=TIMED_EVENTS)
        .values_list("tenant_id", flat=True)
        .distinct()
    )
    tenants |= set(Channel.objects.filter(kind=ChannelKind.AGENT, enabled=True).values_list("tenant_id", flat=True))
    _skip_unheard(tenants)
    return sum(_collect_tenant(tenant_id, limit) for tenant_id in sorted(tenants))


def _skip_unheard(tenants: set[int]) -> None:
    """Move the cursors of tenants with nothing enabled to their chains'
    heads: what happens meanwhile is nobody's to hear, so a rule or channel
    enabled again does not replay it."""
    idle = list(Cursor.objects.exclude(tenant_id__in=tenants).select_related("tenant"))
    if not idle:
        return
    heads = _head_seqs([c.tenant for c in idle])
    behind = [c for c in idle if c.positions != heads[c.tenant_id]]
    now = clock.now()
    for cursor in behind:
        # Never back: a head read before a concurrent pass moved the cursor on.
        mine = _per_chain(cursor.positions, cursor.tenant.chain_stripes)
        cursor.positions = [max(pair) for pair in zip(heads[cursor.tenant_id], mine, strict=True)]
        cursor.updated_at = now
    Cursor.objects.bulk_update(behind, ["positions", "updated_at"])


def _per_chain(seqs: list[int], chains: int) -> list[int]:
    """A seq for each of ``chains`` chains (0 for one ``seqs`` does not name)."""
    return (list(seqs) + [0] * chains)[:chains]


def _collect_tenant(tenant_id: int, limit: int) -> int:
    rules = list(
        Rule.objects.filter(tenant_id=tenant_id, enabled=True, channel__enabled=True)
        .exclude(event__in=TIMED_EVENTS)
        .select_related("channel", "tenant")
    )
    callbacks = list(
        Channel.objects.filter(tenant_id=tenant_id, kind=ChannelKind.AGENT, enabled=True).select_related(
            "token", "tenant"
        )
    )
    if not rules and not callbacks:
        return 0
    tenant = rules[0].tenant if rules else callbacks[0].tenant
    n = tenant.chain_stripes
    # Each chain from where the earliest rule or channel starts in it.
    starts = [_per_chain(r.from_seqs, n) for r in rules] + [_per_chain(c.from_seqs, n) for c in callbacks]
    earliest = [min(column) for column in zip(*starts, strict=True)]
    Cursor.objects.get_or_create(tenant_id=tenant_id, defaults={"positions": earliest, "updated_at": clock.now()})
    with transaction.atomic():
        # Another worker holding this tenant's cursor is doing this very work.
        cursor = Cursor.objects.select_for_update(skip_locked=True).filter(pk=tenant_id).first()
        if cursor is None:
            return 0
        positions = _per_chain(cursor.positions, n)
        # In seq order, and each chain's events in seq order: what a batch
        # takes of each chain is where that chain's reading left off.
        events = list(
            per_chain(AttemptEvent.objects.filter(tenant_id=tenant_id), positions, "gt")
            .select_related("attempt", "attempt__owner")
            .order_by("seq")[:limit]
        )
        if not events:
            return 0
        now = clock.now()
        rows = [
            _delivery(rule, happening, now)
            for event in events
            for rule in rules
            if (happening := matches(rule, event)) is not None
        ]
        rows += [
            _agent_delivery(channel, happening, now)
            for event in events
            for channel in callbacks
            if (happening := agent_decision(channel, event)) is not None
        ]
        Delivery.objects.bulk_create(rows, ignore_conflicts=True)
        for event in events:
            stripe = chain.stripe_of_seq(event.seq, n)
            positions[stripe] = max(positions[stripe], event.seq)
        Cursor.objects.filter(pk=tenant_id).update(positions=positions, updated_at=now)
    return len(rows)


# --- conditions -> deliveries ---------------------------------------------------------------------


def collect_timed(*, now: datetime | None = None) -> int:
    """Evaluate every enabled timed rule at ``now``; how many deliveries were written."""
    now = now or clock.now()
    made = 0
    for rule in Rule.objects.filter(enabled=True, channel__enabled=True, event__in=TIMED_EVENTS).select_related(
        "channel", "tenant"
    ):
        happenings = CONDITIONS[RuleEvent(rule.event)](rule, now)
        if happenings:
            with transaction.atomic():
                rows = [_delivery(rule, h, now) for h in happenings]
                Delivery.objects.bulk_create(rows, ignore_conflicts=True)
            made += len(rows)
    return made


# --- the delivery row -----------------------------------------------------------------------------


def recipients_for(rule: Rule, attempt: Attempt | None) -> list[str]:
    channel = rule.channel
    if channel.kind != ChannelKind.EMAIL:
        return []
    fallback = [a.strip() for a in channel.target.split(",") if a.strip()]
    if rule.audience == Audience.OWNER and attempt is not None and attempt.owner and attempt.owner.email:
        return [attempt.owner.email]
    if rule.audience == Audience.DECIDERS and attempt is not None:
        people = [attempt.requested_by, attempt.approved_by]
        emails = sorted({person.email for person in people if person is not None and person.email})
        if emails:
            return emails
    if rule.audience == Audience.APPROVERS:
        emails = sorted(
            set(
                Membership.objects.filter(tenant_id=rule.tenant_id, role__in=[Role.APPROVER, Role.ADMIN])
                .exclude(user__email="")
                .values_list("user__email", flat=True)
            )
        )
        if emails:
            return emails
    return fallback


def payload_for(delivery_id: uuid.UUID, event: str, tenant: Tenant, happening: Happening) -> dict[str, Any]:
    attempt = happening.attempt
    return {
        "delivery_id": str(delivery_id),
        "event": event,
        "tenant": tenant.slug,
        "title": happening.title,
        "text": happening.text,
        "occurred_at": happening.occurred_at.isoformat(),
        "url": attempt_url(attempt.pk) if attempt else settings.LEDGERDASH_BASE_URL + "/",
        "attempt": (
            {
                "id": attempt.pk,
                "tool_name": attempt.tool_name,
                "task_id": attempt.task_id,
                "state": attempt.state,
                "owner": attempt.owner.get_username() if attempt.owner else None,
                "parent_id": attempt.parent_id,
            }
            if attempt
            else None
        ),
        "event_seq": happening.source_seq,
        "details": happening.details or {},
    }


def _delivery(rule: Rule, happening: Happening, now: datetime) -> Delivery:
    delivery_id = uuid.uuid4()
    return Delivery(
        id=delivery_id,
        tenant_id=rule.tenant_id,
        channel=rule.channel,
        rule=rule,
        event=rule.event,
        # Per rule: two rules on one channel may both want the same happening.
        dedup_key=f"{rule.pk}:{happening.dedup_key}"[:200],
        source_seq=happening.source_seq,
        attempt_id=happening.attempt.pk if happening.attempt else None,
        payload=payload_for(delivery_id, rule.event, rule.tenant, happening),
        recipients=recipients_for(rule, happening.attempt),
        next_try_at=now,
        created_at=now,
    )


AGENT_DECISION = "agent_decision"


def _agent_delivery(channel: Channel, happening: Happening, now: datetime) -> Delivery:
    delivery_id = uuid.uuid4()
    return Delivery(
        id=delivery_id,
        tenant_id=channel.tenant_id,
        channel=channel,
        event=AGENT_DECISION,
        dedup_key=happening.dedup_key,
        source_seq=happening.source_seq,
        attempt_id=happening.attempt.pk if happening.attempt else None,
        payload=payload_for(delivery_id, AGENT_DECISION, channel.tenant, happening),
        next_try_at=now,
        created_at=now,
    )

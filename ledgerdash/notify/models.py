"""Notifications: where a tenant wants to hear about its ledger, about
what, and every delivery the outbox owes or made.

A :class:`Channel` is a place to send to (a webhook, a Slack-compatible
incoming webhook, email). A :class:`Rule` says which happenings go to which
channel. A :class:`Delivery` is one message owed to one channel: the outbox
row, with a stable id every payload carries so a receiver can drop a
duplicate; each send is a :class:`DeliveryTry`.

How a happening becomes a delivery without being lost is told in
:mod:`ledgerdash.notify.outbox`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from ledgerdash.ledger.models import ApiToken, Tenant


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "webhook (signed JSON)"
    SLACK = "slack", "Slack-compatible incoming webhook"
    EMAIL = "email", "email"
    AGENT = "agent", "an agent's callback (signed webhook: decisions on one API token's attempts)"


class RuleEvent(models.TextChoices):
    """What a rule listens for. All but the last three follow the tenant's
    event log; those are conditions the notify worker looks at each loop."""

    ENTERED_MANUAL_REVIEW = "entered_manual_review", "an attempt entered manual review"
    AWAITING_APPROVAL = "awaiting_approval", "a first call its policy holds awaits approval"
    #: Older than first calls held for approval, it covered them too: a channel whose only rule is this
    #: one still hears of them until the next release (:data:`ALSO_HELD_CALLS`).
    RETRY_AWAITING_APPROVAL = "retry_awaiting_approval", "a linked retry awaits approval"
    DUPLICATE_INCIDENT = "duplicate_incident", "a duplicate incident was raised"
    RETRY_NOT_SENT = "retry_not_sent", "an approved call was not sent: its side effect had happened"
    SLA_OVERDUE = "sla_overdue", "an attempt is UNKNOWN or in manual review longer than its SLA"
    AUDIT_BREAK = "audit_break", "verify_audit found a break in the event chain"
    RECONCILER_STALLED = "reconciler_stalled", "the reconciler has not completed a pass for a while"


#: Until the next release, a retry_awaiting_approval rule also sends a held first call, unless its
#: channel has an awaiting_approval rule (the deprecation ``ledger_config plan`` warns of).
ALSO_HELD_CALLS = True
#: Why a retry_awaiting_approval rule without its awaiting_approval twin is warned of.
HELD_CALLS_MOVED = (
    "retry_awaiting_approval no longer stands for first calls held for approval: they fire awaiting_approval. "
    "Until the next release this rule still sends them while its channel has no awaiting_approval rule; "
    "add one to keep hearing of them"
)

#: Rules evaluated against the clock each loop rather than against events.
TIMED_EVENTS = frozenset({RuleEvent.SLA_OVERDUE, RuleEvent.AUDIT_BREAK, RuleEvent.RECONCILER_STALLED})


class Audience(models.TextChoices):
    """Who an email goes to. Webhooks and Slack always go to the channel's URL."""

    CHANNEL = "channel", "the channel's address"
    OWNER = "owner", "the attempt's owner (else the channel's address)"
    APPROVERS = "approvers", "the tenant's approvers and admins"
    DECIDERS = "deciders", "who asked for the attempt and who approved it (else the channel's address)"


class Channel(models.Model):
    """A place a tenant's notifications go.

    ``secret`` signs webhook bodies (HMAC-SHA256). It has to be usable to
    sign, so it is kept as is, not hashed: it is generated when the channel
    is created, shown once to the admin who created it, and never shown
    again (rotate it to get a new one). Protect the database and its backups
    as you protect the signing key.

    An ``agent`` channel is an agent's callback: it needs no rule; it gets
    the decisions on the attempts its API ``token`` recorded (a linked retry
    approved or rejected, an attempt settled by the reconciler) made after
    it was (``from_seqs``: where each of the tenant's chains stood then), so
    the agent need not poll.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="notify_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    #: The URL (webhook, Slack) or the address(es), comma-separated (email).
    target = models.CharField(max_length=1000)
    secret = models.CharField(max_length=128, blank=True, editable=False)
    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.PROTECT, related_name="callbacks")
    #: The head seq of each of the tenant's chains when the channel was made.
    from_seqs = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="notify_channel_unique_name"),
            models.CheckConstraint(
                condition=Q(kind__in=["webhook", "slack", "email", "agent"]), name="notify_channel_kind"
            ),
            models.CheckConstraint(
                condition=Q(kind="agent", token__isnull=False) | (~Q(kind="agent") & Q(token__isnull=True)),
                name="notify_channel_agent_token",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Rule(models.Model):
    """Which happenings of a tenant go to which channel.

    An event rule matches the tenant's events appended after the rule was
    made (``from_seqs``: the head seq of each of the tenant's chains when it
    was made), so a new rule does not replay history. ``sla_overdue`` fires past ``tool_sla``'s
    minutes for the attempt's tool, else ``sla_minutes``, else the tenant's
    own SLA (the one the overview counts late work by). A timed rule
    sends again every ``repeat_minutes`` (0: once) while the condition holds.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="notify_rules")
    event = models.CharField(max_length=32, choices=RuleEvent.choices)
    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="rules")
    audience = models.CharField(max_length=16, choices=Audience.choices, default=Audience.CHANNEL)
    enabled = models.BooleanField(default=True)
    sla_minutes = models.PositiveIntegerField(null=True, blank=True)
    tool_sla = models.JSONField(default=dict, blank=True)
    repeat_minutes = models.PositiveIntegerField(default=60)
    stalled_minutes = models.PositiveIntegerField(default=10)
    from_seqs = models.JSONField(default=list)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["tenant", "event", "id"]
        indexes = [models.Index(fields=["tenant", "enabled", "event"], name="notify_rule_lookup")]

    def __str__(self) -> str:
        return f"{self.event} -> {self.channel_id}"

    def sla_for(self, tool_name: str) -> int:
        """Minutes an attempt of ``tool_name`` may wait before this rule fires."""
        minutes = (self.tool_sla or {}).get(tool_name, self.sla_minutes)
        if minutes is None:
            return int(self.tenant.sla.total_seconds() // 60)
        return int(minutes)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    SENT = "sent", "sent"
    DEAD = "dead", "dead"


class Delivery(models.Model):
    """One message owed to one channel: the outbox row.

    ``id`` is the delivery id every payload carries (webhook header and body,
    Slack text, the email's Message-ID): a send whose success could not be
    recorded is sent again, and the receiver drops the second by this id.
    ``dedup_key`` keeps one delivery per (rule, happening), however many
    workers saw the happening.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="notify_deliveries", db_index=False)
    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="deliveries")
    rule = models.ForeignKey(Rule, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries")
    #: A rule's event, or ``agent_decision`` (an agent callback).
    event = models.CharField(max_length=32)
    dedup_key = models.CharField(max_length=200)
    #: The event in the tenant's chain it came from, if any.
    source_seq = models.PositiveBigIntegerField(null=True, blank=True)
    attempt_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField()
    #: Email recipients, fixed when the delivery was made.
    recipients = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=8, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    tries = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["channel", "dedup_key"], name="notify_delivery_once"),
            models.CheckConstraint(condition=Q(status__in=["pending", "sent", "dead"]), name="notify_delivery_status"),
        ]
        indexes = [
            models.Index(fields=["status", "next_try_at"], name="notify_delivery_due"),
            models.Index(fields=["tenant", "status", "-created_at"], name="notify_delivery_list"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.event} [{self.status}]"


class DeliveryTry(models.Model):
    """One send of a delivery and what came of it."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempts_made")
    number = models.PositiveIntegerField()
    at = models.DateTimeField()
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"{self.delivery_id} try {self.number}: {'ok' if self.ok else self.error[:40]}"


class Cursor(models.Model):
    """How far in each of a tenant's event chains the outbox has turned
    events into deliveries (``positions``: the last seq of each chain it
    read, 0 for none): moved in the same transaction that writes them."""

    tenant = models.OneToOneField(Tenant, primary_key=True, on_delete=models.CASCADE, related_name="notify_cursor")
    positions = models.JSONField(default=list)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.tenant_id} @ {self.positions}"


class Heartbeat(models.Model):
    """The last pass each ``manage.py notify`` worker completed (the
    reconcilers keep their own: :class:`ledgerdash.ledger.models.ReconcilerWorker`)."""

    worker = models.CharField(max_length=255, primary_key=True)
    last_pass_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.worker}: {self.last_pass_at:%Y-%m-%d %H:%M:%S}"

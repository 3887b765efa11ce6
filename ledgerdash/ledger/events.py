"""The event store: every change to the ledger is an event in its tenant's
hash chain, appended in the same transaction as the change.

:class:`Actor` says who made a change, :class:`EventKind` what kind of
event it is, :class:`EventDraft` an event about to be appended, linked
into its tenant's chain (under the
chain head's row lock, taken after any attempt locks). The store appends
them (:func:`ledgerdash.ledger.store.append_events`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models

from ledgerdash.ledger import chain
from ledgerdash.ledger.models import (
    ActorKind,
    AttemptEvent,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

MAX_REASON = 4000


@dataclass(frozen=True)
class Actor:
    """Who makes a change: written into every event."""

    kind: str
    label: str
    user_id: int | None = None

    @classmethod
    def agent(cls, label: str = "agent") -> Actor:
        return cls(ActorKind.AGENT, label)

    @classmethod
    def reconciler(cls, label: str = "reconciler") -> Actor:
        return cls(ActorKind.RECONCILER, label)

    @classmethod
    def user(cls, user: AbstractBaseUser) -> Actor:
        return cls(ActorKind.USER, user.get_username(), user.pk)

    @classmethod
    def system(cls, label: str = "system") -> Actor:
        return cls(ActorKind.SYSTEM, label)

    def __str__(self) -> str:
        return f"{self.kind} {self.label}"


class EventKind(models.TextChoices):
    """What an event records. Declared once: the timeline, the reports and
    the exports name events by these values (they are in every event's hash)."""

    TRANSITION = "transition", "a move from one state to another"
    REQUEST_ID = "request_id", "the provider's request id, recorded as soon as known"
    LATE_REPORT = "late_report", "a dispatcher's report about an attempt that had moved on"
    REQUEST_ID_TAKEN = "request_id_taken", "a dispatcher's report naming a provider id another side effect holds"
    INCIDENT = "incident", "an incident opened, assigned or resolved"
    OWNER = "owner", "an owner claimed, assigned or removed"
    COMMENT = "comment", "a person's comment"
    RECHECK = "recheck", "a person asked for a lookup now"
    APPROVAL_REFUSED = "approval_refused", "an approval refused, with what changed"
    POLICY = "policy", "a policy version published"
    API_TOKEN = "api_token", "an API token issued or revoked"
    EXPORT = "export", "an audit export"
    REPORT = "report", "an audit report read"
    DRILL = "drill", "a crash-drill run"
    ACCOUNT_LOCKED = "account_locked", "an account locked out after failed sign-ins"
    ACCOUNT_UNLOCKED = "account_unlocked", "a locked-out account unlocked"
    TENANT = "tenant", "the tenant's settings changed"
    MEMBERSHIP = "membership", "a person's membership or role granted, changed or removed"
    ON_CALL = "on_call", "an on-call shift added, changed or removed"
    TOOL = "tool", "a tool's provider configuration changed"
    CREDENTIAL = "credential", "a tool's credential binding for the tenant changed"
    NOTIFY_CHANNEL = "notify_channel", "a notification channel created, changed or disabled"
    NOTIFY_RULE = "notify_rule", "a notification rule created, changed or disabled"
    NOTIFY_RESEND = "notify_resend", "a dead notification sent again"


@dataclass
class EventDraft:
    """An event about to be appended to its tenant's chain."""

    tenant_id: int
    attempt_id: int | None
    kind: EventKind
    actor: Actor
    from_state: str = ""
    to_state: str = ""
    fence: int | None = None
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def clean_text(text: str) -> str:
    # PostgreSQL text cannot hold NUL; reasons are free text from people and tools.
    return text.replace("\x00", "\ufffd")[:MAX_REASON]


class Linked:
    """An event on its way into one statement, without a model instance: the
    fields its content hash covers, then where in the chain it landed."""

    __slots__ = (*chain.HASHED_FIELDS, "content_hash", "pk", "seq", "prev_hash", "hash")
    pk: int
    seq: int
    prev_hash: str
    hash: str

    def __init__(self, event: EventDraft, now: datetime) -> None:
        self.tenant_id, self.attempt_id, self.kind = event.tenant_id, event.attempt_id, str(event.kind)
        self.actor_kind, self.actor_user_id, self.actor_label = event.actor.kind, event.actor.user_id, event.actor.label
        self.from_state, self.to_state, self.fence = event.from_state, event.to_state, event.fence
        self.reason, self.details, self.created_at = clean_text(event.reason), event.details, now
        self.content_hash = chain.content_hash(chain.event_content(self))


def event_row(event: EventDraft, now: datetime) -> AttemptEvent:
    """The event as a model instance (for the paths that save or return one)."""
    linked = Linked(event, now)
    return AttemptEvent(
        **{name: getattr(linked, name) for name in chain.HASHED_FIELDS}, content_hash=linked.content_hash
    )

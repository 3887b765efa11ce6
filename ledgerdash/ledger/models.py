# Over 600 lines because: Django finds an app's models in one module, and the tables' rules sit with their fields.
"""The ledger's tables.

Rows here are written by :mod:`ledgerdash.ledger.moves` (attempts and
their events) and by admins (tenants, policies). Nothing else writes
``Attempt.state``; events are append-only, which the database itself enforces
(see migration 0002).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ledgerdash.ledger import clock
from ledgerdash.ledger.audited import AuditedModel
from ledgerdash.ledger.providers.factory import build_adapter, placeholders, preset_facts

#: The most hash chains one tenant's events may be kept in.
MAX_CHAIN_STRIPES = 32
CHAIN_STRIPES_HELP = (
    "How many hash chains the tenant's events are kept in. One chain records one event at a time; "
    "give a tenant whose agents record many calls at once several (8 on a 2-core server). "
    "Chosen when the tenant is made: it cannot change afterwards."
)


class State(models.TextChoices):
    INTENT_RECORDED = "INTENT_RECORDED", "intent recorded"
    DISPATCHED = "DISPATCHED", "dispatched"
    OUTCOME_CONFIRMED = "OUTCOME_CONFIRMED", "outcome confirmed"
    FAILED_RETRYABLE = "FAILED_RETRYABLE", "failed, retryable"
    FAILED = "FAILED", "failed"
    UNKNOWN = "UNKNOWN", "unknown"
    MANUAL_REVIEW = "MANUAL_REVIEW", "manual review"
    RECONCILED = "RECONCILED", "reconciled"


class FailedBecause(models.TextChoices):
    """Why an attempt is FAILED. Only the first three prove nothing happened
    at the provider; a person's word is a claim (with their reason)."""

    PROVIDER = "provider", "the provider refused it (its own definitive answer)"
    ABANDONED = "abandoned", "abandoned before it was sent"
    REJECTED = "rejected", "a linked retry rejected before it was sent"
    PERSON = "person", "marked failed by a person"
    #: A retry (or a resend) the ledger did not send because another attempt
    #: at the same side effect had acted: what it would have done was done.
    ALREADY_HAPPENED = "already_happened", "not sent: another attempt at the same side effect had acted"


class ResultSource(models.TextChoices):
    TOOL = "tool", "the tool's return value"
    LOOKUP = "lookup", "the provider's answer to a lookup"


TERMINAL_STATES = frozenset({State.OUTCOME_CONFIRMED, State.FAILED, State.RECONCILED})
#: States the reconciler works on when they fall due (``next_check_at``).
IN_FLIGHT_STATES = frozenset({State.INTENT_RECORDED, State.DISPATCHED, State.UNKNOWN, State.FAILED_RETRYABLE})
#: States that must have an owner: someone is accountable until they settle.
OWNED_STATES = frozenset({State.UNKNOWN, State.MANUAL_REVIEW})


class ActorKind(models.TextChoices):
    AGENT = "agent"
    RECONCILER = "reconciler"
    USER = "user"
    SYSTEM = "system"


class Tenant(AuditedModel):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    is_active = models.BooleanField(default=True)
    default_owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Owns UNKNOWN and MANUAL_REVIEW work when nobody is on call.",
    )
    #: How long work may wait on people before it is late; empty: the
    #: LEDGER_DEFAULT_SLA_MINUTES setting.
    sla_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="How old UNKNOWN and MANUAL_REVIEW work may get before the overview calls it late "
        "(empty: the LEDGER_DEFAULT_SLA_MINUTES setting).",
    )
    created_at = models.DateTimeField(default=timezone.now)
    #: How many hash chains the tenant's events are kept in (see
    #: :mod:`ledgerdash.ledger.chain`): fixed once the tenant has events,
    #: which it has from its creation on (a trigger refuses a change).
    chain_stripes = models.PositiveSmallIntegerField(
        default=1,
        db_default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CHAIN_STRIPES)],
        help_text=CHAIN_STRIPES_HELP,
    )

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(chain_stripes__gte=1, chain_stripes__lte=MAX_CHAIN_STRIPES),
                name="ledger_tenant_chain_stripes",
            )
        ]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        super().clean()
        if self.pk is None:
            return
        kept = Tenant.objects.filter(pk=self.pk).values_list("chain_stripes", flat=True).first()
        if kept is not None and kept != self.chain_stripes and ChainHead.objects.filter(tenant_id=self.pk).exists():
            raise ValidationError(
                {"chain_stripes": f"the tenant's events are kept in {kept} chain(s); that is fixed once it has events"}
            )

    @property
    def sla(self) -> timedelta:
        return timedelta(minutes=self.sla_minutes or settings.LEDGER_DEFAULT_SLA_MINUTES)


class Role(models.TextChoices):
    """What a member of a tenant may do there. Each role can do what the ones before it can."""

    VIEWER = "viewer", "viewer"
    OPERATOR = "operator", "operator"
    APPROVER = "approver", "approver"
    ADMIN = "admin", "admin"


#: Each role can do what the roles before it can.
ROLE_RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.APPROVER: 2, Role.ADMIN: 3}


def roles_at_least(role: Role | str) -> list[Role]:
    """``role`` and every role above it."""
    return [r for r in Role if ROLE_RANK[r] >= ROLE_RANK[Role(role)]]


class Membership(AuditedModel):
    """A person's role in a tenant: who may see and decide what there
    (:mod:`ledgerdash.ledger.tenancy` answers the questions)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The table the dashboard created before memberships moved into the ledger.
        db_table = "reviews_membership"
        ordering = ["tenant", "user"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="reviews_membership_unique"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="reviews_membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role} of {self.tenant}"

    def can(self, role: Role | str) -> bool:
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role(role)]


class Policy(AuditedModel):
    """One version of what a tenant's agents may do. Versions are never edited:
    a change is a new row with the next version number, so every attempt can
    name exactly the authority it was recorded under."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="policies")
    version = models.PositiveIntegerField()
    #: ``{"tool_name": ["scope", ...], ...}``: the tools allowed and the
    #: credential scopes each may use.
    tools = models.JSONField(default=dict)
    #: ``{"tool_name": "condition", ...}``: tools whose calls wait for an
    #: approver before the first dispatch; the condition is a JMESPath
    #: expression over the call's arguments (e.g. ``amount_cents > `50000```),
    #: empty for every call. See :func:`ledgerdash.ledger.authority.approval_needed`.
    approvals = models.JSONField(default=dict, db_default={}, blank=True)
    note = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["tenant", "-version"]
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "version"], name="ledger_policy_unique_version"),
            models.CheckConstraint(condition=Q(version__gte=1), name="ledger_policy_version_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} v{self.version}"

    def clean(self) -> None:
        validate_policy_tools(self.tools)
        validate_policy_approvals(self.approvals, self.tools)

    def scopes_for(self, tool_name: str) -> frozenset[str] | None:
        """The scopes ``tool_name`` may use, or None when the tool is not allowed."""
        scopes = self.tools.get(tool_name)
        return None if scopes is None else frozenset(scopes)


def validate_policy_tools(tools: Any) -> None:
    if not isinstance(tools, dict):
        raise ValidationError("tools must be a JSON object mapping tool names to lists of scopes")
    for name, scopes in tools.items():
        if not isinstance(name, str) or not name.strip():
            raise ValidationError("tool names must be non-empty strings")
        if not isinstance(scopes, list) or not all(isinstance(s, str) and s and " " not in s for s in scopes):
            raise ValidationError(f"scopes of {name!r} must be a list of non-empty strings without spaces")


def validate_policy_approvals(approvals: Any, tools: Any) -> None:
    """Each entry names a tool the policy allows and a JMESPath condition
    that compiles (empty: every call of the tool waits for approval)."""
    import jmespath
    from jmespath.exceptions import JMESPathError

    if not isinstance(approvals, dict):
        raise ValidationError("approvals must be a JSON object mapping tool names to conditions")
    for name, condition in approvals.items():
        if not isinstance(tools, dict) or name not in tools:
            raise ValidationError(f"approvals name {name!r}, which the policy does not allow")
        if not isinstance(condition, str) or len(condition) > 1000:
            raise ValidationError(f"the approval condition of {name!r} must be a JMESPath expression (text)")
        if condition.strip():
            try:
                jmespath.compile(condition)
            except JMESPathError as exc:
                raise ValidationError(f"the approval condition of {name!r} is not valid JMESPath: {exc}") from None


class OnCallShift(AuditedModel):
    """Who owns newly stuck work of a tenant during a window of time."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="on_call")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()

    class Meta:
        ordering = ["tenant", "starts_at"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="ledger_shift_ends_after_start")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.user_id} {self.starts_at:%Y-%m-%d %H:%M} to {self.ends_at:%H:%M}"


class Attempt(models.Model):
    """One attempt at one logical side effect.

    The idempotency key names the side effect, not the attempt: the first
    attempt for a key (the root, ``parent`` empty) holds it uniquely per
    tenant; a linked retry is a new row with the same key that points at the
    attempt it re-tries, so the whole chain shares one key.
    """

    # No index of its own: every index below leads with the tenant.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="attempts", db_index=False)
    task_id = models.CharField(max_length=255)
    tool_name = models.CharField(max_length=255)
    idempotency_key = models.CharField(max_length=255)
    #: The key sent to the provider. The root's is the idempotency key; a
    #: linked retry with the same arguments keeps it (so the provider
    #: deduplicates against the original); one with other arguments gets a
    #: key derived from its arguments hash, since the provider would otherwise
    #: answer with the original's effect.
    provider_key = models.CharField(max_length=300)
    args = models.JSONField()
    args_hash = models.CharField(max_length=64)
    state = models.CharField(max_length=32, choices=State.choices)
    policy_version = models.PositiveIntegerField()
    #: Space-separated, sorted credential scopes this attempt was authorized to use.
    credential_scope = models.CharField(max_length=1000, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: Who asked for this linked retry (an approver may not approve their own).
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: The API token whose agent made this call (a linked retry a person
    #: requested keeps its original's): whom its decisions are told. Empty
    #: for an agent in process.
    api_token = models.ForeignKey("ApiToken", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    #: What the approval was given under: the policy version then, and the
    #: condition by which that version held this call for an approver ("":
    #: every call of the tool; None: that version did not hold it, e.g. a
    #: linked retry). At dispatch, a current policy that holds the call by
    #: any other rule holds it again (``authority.held_again``).
    approved_policy_version = models.PositiveIntegerField(null=True, blank=True)
    # None and "" say different things here ("not held" and "every call held").
    approved_hold = models.CharField(max_length=1000, null=True, blank=True)  # noqa: DJ001
    #: Why this call waits for an approver before its first dispatch (its
    #: policy requires approval for the tool, and the condition held); empty
    #: when it needs none.
    approval_required = models.CharField(max_length=1000, blank=True, default="", db_default="")
    #: Bumped on every transition and every reconciler claim; a writer must
    #: name the fence it holds, so a stale one cannot complete a newer claim.
    fence = models.PositiveBigIntegerField(default=0)
    #: The fence handed to whoever last dispatched. A late outcome report
    #: (after the lease moved the attempt to UNKNOWN) is accepted with it.
    dispatch_fence = models.PositiveBigIntegerField(null=True, blank=True)
    dispatch_count = models.PositiveIntegerField(default=0)
    #: When the provider first saw this key: its key retention counts from here.
    first_dispatched_at = models.DateTimeField(null=True, blank=True)
    provider_request_id = models.CharField(max_length=255, blank=True, default="", db_default="")
    result_ref = models.CharField(max_length=1000, blank=True, default="", db_default="")
    #: A dispatcher's late report that the provider acted (its receipt), heard
    #: after the attempt had moved on. The late report's event says so too,
    #: but the send rule and approvals read it here: an event's partition may
    #: be archived while another attempt at the same side effect still moves.
    late_receipt = models.CharField(max_length=1000, blank=True, default="", db_default="")
    #: The dispatcher reports heard on this attempt, the most recent first
    #: (each its dispatch fence and a digest of what it said): the same report
    #: sent again is known as a replay even after the events that applied it
    #: were archived.
    reports_heard = models.JSONField(default=list, db_default=[], blank=True)
    #: The dispatch whose dispatcher reported that it could not tell whether
    #: its request landed. A refusal it reports later is the refusal of a
    #: later request of that dispatch (its SDK sent it again) and settles
    #: nothing: the first request may have acted.
    said_unknown_fence = models.PositiveBigIntegerField(null=True, blank=True)
    #: The tool's return value, replayed to an agent that re-runs the call.
    result = models.JSONField(null=True, blank=True)
    #: When the reconciler should next look at this attempt (a lease for
    #: INTENT_RECORDED and DISPATCHED, a back-off for UNKNOWN and
    #: FAILED_RETRYABLE); empty when it waits on people or is settled.
    next_check_at = models.DateTimeField(null=True, blank=True)
    check_count = models.PositiveIntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True, default="", db_default="")
    #: The answer of the last provider lookup: found, not_found, mismatch, unavailable,
    #: ambiguous (more than one effect may be the call's), not_evidence (nothing seen where
    #: the lookup could not have seen the call), or past_retention (not found, answered
    #: after the provider may have forgotten the key or what it did).
    last_lookup = models.CharField(max_length=16, blank=True, default="", db_default="")
    #: When the last lookup was made. A "not found" is evidence that the
    #: effect did not happen only when it was observed at or after ``lands_by``.
    last_lookup_at = models.DateTimeField(null=True, blank=True)
    #: Until when the last dispatch may still land at the provider: its
    #: dispatch time (or the dispatcher's last heartbeat) plus the tool's
    #: maximum request time; the dispatcher's definitive report ends it early.
    lands_by = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    #: Why a FAILED attempt failed, which decides whether it proves that
    #: nothing happened at the provider (see ``FailedBecause``).
    failed_because = models.CharField(
        max_length=16, blank=True, choices=FailedBecause.choices, default="", db_default=""
    )
    #: Where ``result`` came from: the tool's own return value, the
    #: provider's lookup answer, or empty when nothing can be replayed.
    result_source = models.CharField(max_length=16, blank=True, choices=ResultSource.choices, default="", db_default="")
    #: The reason given by the last transition, shown in the queues.
    last_note = models.TextField(blank=True)
    created_at = models.DateTimeField(default=clock.now)
    updated_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=State.values), name="ledger_attempt_state_valid"),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(parent__isnull=True),
                name="ledger_attempt_unique_root_key",
            ),
            models.CheckConstraint(condition=~Q(idempotency_key=""), name="ledger_attempt_key_not_empty"),
            models.CheckConstraint(condition=~Q(task_id=""), name="ledger_attempt_task_not_empty"),
            models.CheckConstraint(
                condition=Q(args_hash__regex=r"^[0-9a-f]{64}$"), name="ledger_attempt_args_hash_sha256"
            ),
            models.CheckConstraint(condition=~Q(parent=models.F("id")), name="ledger_attempt_not_own_parent"),
        ]
        indexes = [
            models.Index(fields=["tenant", "idempotency_key"], name="ledger_attempt_key_chain"),
            models.Index(
                fields=["next_check_at"],
                condition=Q(next_check_at__isnull=False),
                name="ledger_attempt_due",
            ),
            models.Index(fields=["tenant", "state", "-created_at", "-id"], name="ledger_attempt_queue"),
            # The dashboard's lists page by keyset on (created_at, id) within
            # one tenant (reviews.queries): these keep every page an index
            # range scan, however many attempts the tenant has.
            models.Index(fields=["tenant", "-created_at", "-id"], name="ledger_attempt_recent"),
            models.Index(
                fields=["tenant", "owner", "state", "-created_at", "-id"],
                condition=Q(owner__isnull=False),
                name="ledger_attempt_owner_queue",
            ),
            models.Index(
                fields=["tenant", "owner", "-created_at", "-id"],
                condition=Q(owner__isnull=False),
                name="ledger_attempt_owner_recent",
            ),
            # Unassigned stuck work is rare (a tenant with nobody to own it),
            # so "unassigned" must not scan the queue to find none.
            models.Index(
                fields=["tenant", "state", "-created_at", "-id"],
                condition=Q(owner__isnull=True, state__in=[State.UNKNOWN, State.MANUAL_REVIEW]),
                name="ledger_attempt_unassigned",
            ),
            # The approvals queue and its count: only what awaits an approver
            # (rules.awaiting_approval_filter, the same condition).
            models.Index(
                fields=["tenant", "-created_at", "-id"],
                condition=Q(state=State.MANUAL_REVIEW, dispatch_count=0)
                & (Q(parent__isnull=False) | (~Q(approval_required="") & Q(approved_at__isnull=True))),
                name="ledger_attempt_awaiting",
            ),
            # All work that waits on people or facts, newest or oldest first
            # ("my work", "past the SLA"): the two states in one index order.
            models.Index(
                fields=["tenant", "-created_at", "-id"],
                condition=Q(state__in=[State.UNKNOWN, State.MANUAL_REVIEW]),
                name="ledger_attempt_attention",
            ),
            models.Index(
                fields=["tenant", "owner", "-created_at", "-id"],
                condition=Q(owner__isnull=False, state__in=[State.UNKNOWN, State.MANUAL_REVIEW]),
                name="ledger_attempt_owner_attention",
            ),
            # Search: exact task id or provider request id, args hash by prefix.
            models.Index(fields=["tenant", "task_id"], name="ledger_attempt_task"),
            models.Index(fields=["tenant", "provider_request_id"], name="ledger_attempt_request_id"),
            models.Index(fields=["args_hash"], opclasses=["varchar_pattern_ops"], name="ledger_attempt_args_hash"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.tool_name} {self.idempotency_key} [{self.state}]"

    @property
    def scopes(self) -> frozenset[str]:
        return frozenset(self.credential_scope.split())

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class ProviderId(models.Model):
    """A provider's id for an effect, and the one side effect (tenant, tool,
    idempotency key) whose outcome it is.

    Written by the database, never by the application: a trigger on the
    attempts' table adds the row when an attempt first names the id, and
    refuses an attempt at another side effect naming it too (migration
    0028), whichever way the attempt is written. Attempts of one side effect
    share it (a linked retry the provider answers by replaying the key).
    ``attempt``: the first attempt that named it.
    """

    pk = models.CompositePrimaryKey("tenant", "tool_name", "provider_request_id")
    # The primary key (tenant, tool, id) serves the foreign key.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    tool_name = models.CharField(max_length=255)
    provider_request_id = models.CharField(max_length=255)
    idempotency_key = models.CharField(max_length=255)
    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="+", db_index=False)

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.tool_name} {self.provider_request_id} -> {self.idempotency_key}"


class Tool(AuditedModel):
    """How to reach the provider behind a tool: its adapter and what the
    recovery rules need to know about it. Policies say who may use a tool;
    this says how it behaves."""

    class Adapter(models.TextChoices):
        HTTP = "http", "generic HTTP (configured, not coded)"
        PYTHON = "python", "a Python class (config: {'class': 'package.module.Class', ...})"
        PRESET = "preset", "a provider preset (config: {'preset': 'stripe.payment_intent', ...}; docs/providers.md)"

    name = models.CharField(max_length=255, unique=True)
    adapter = models.CharField(max_length=16, choices=Adapter.choices, default=Adapter.HTTP)
    #: Adapter settings; for HTTP see :class:`ledgerdash.ledger.providers.http.HttpConfig`.
    #: Secrets go in the environment and are referenced as ``${NAME}``.
    config = models.JSONField(default=dict)
    #: The provider honours idempotency keys: sending the same key again
    #: cannot perform the effect twice (within the key retention).
    idempotent = models.BooleanField(default=False)
    #: How long the provider remembers a key; empty: for ever. Past it, a
    #: "not found" proves nothing and a retry could repeat the effect.
    key_retention_seconds = models.PositiveIntegerField(null=True, blank=True)
    #: How long a dispatch may take before it counts as UNKNOWN; empty: the
    #: LEDGER_DISPATCH_LEASE_SECONDS setting.
    dispatch_lease_seconds = models.FloatField(null=True, blank=True)
    #: First back-off between lookups the provider could not answer; doubles
    #: each time, with full jitter, up to an hour.
    backoff_base_seconds = models.FloatField(default=5.0)
    max_checks = models.PositiveIntegerField(
        default=8, help_text="lookups the provider may fail to answer before a person decides"
    )
    max_dispatches = models.PositiveIntegerField(
        default=3, help_text="times the same key may be sent before a person decides"
    )
    #: The longest one request to the provider may take: the adapter's
    #: timeout, and the time after a dispatch (or its last heartbeat) after
    #: which the request can no longer land. The dispatch lease exceeds it.
    max_request_seconds = models.FloatField(
        default=30.0,
        help_text="the adapter's timeout; a request cannot land later than this after it was sent",
    )
    #: How long after an effect the provider's lookup may still not show it
    #: (a search index's lag); empty: the preset's documented lag, or none.
    #: A "not found" counts as evidence only once the request could no
    #: longer land plus this (ledgerdash.ledger.landing).
    lookup_lag_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="how long the lookup may lag behind the provider (a search index); empty: the preset's "
        "documented lag, or none",
    )
    enabled = models.BooleanField(default=True)
    #: An agent's intent and its dispatch claim commit together (two commits
    #: per call, not three). Only for an idempotent tool whose lookup can say
    #: a call did not land: a crash after that commit, before the request
    #: left, is then recovered by a lookup once the request could no longer
    #: land (and sent again with the same key), where a separate intent
    #: commit would have proven "nothing was sent" at once.
    claim_with_intent = models.BooleanField(
        default=False,
        help_text="record the intent and claim its dispatch in one commit; needs an idempotent tool with a "
        "lookup that can say a call did not land",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(adapter__in=["http", "python", "preset"]), name="ledger_tool_adapter_valid"
            ),
            models.CheckConstraint(
                condition=Q(lookup_lag_seconds__isnull=True) | Q(lookup_lag_seconds__gte=0),
                name="ledger_tool_lookup_lag_not_negative",
            ),
            models.CheckConstraint(condition=Q(max_dispatches__gte=1), name="ledger_tool_dispatches_positive"),
            models.CheckConstraint(condition=Q(backoff_base_seconds__gt=0), name="ledger_tool_backoff_positive"),
            models.CheckConstraint(
                condition=Q(dispatch_lease_seconds__isnull=True) | Q(dispatch_lease_seconds__gt=0),
                name="ledger_tool_lease_positive",
            ),
            models.CheckConstraint(condition=Q(max_request_seconds__gt=0), name="ledger_tool_request_time_positive"),
            models.CheckConstraint(
                condition=Q(dispatch_lease_seconds__isnull=True)
                | Q(dispatch_lease_seconds__gt=models.F("max_request_seconds")),
                name="ledger_tool_lease_exceeds_request_time",
            ),
            models.CheckConstraint(
                condition=Q(claim_with_intent=False) | Q(idempotent=True), name="ledger_tool_claim_needs_idempotent"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        lease = self.dispatch_lease_seconds or settings.LEDGER_DISPATCH_LEASE_SECONDS
        if self.max_request_seconds is not None and lease <= self.max_request_seconds:
            raise ValidationError(
                {
                    "dispatch_lease_seconds": f"the dispatch lease ({lease:g}s) must exceed the maximum request time "
                    f"({self.max_request_seconds:g}s): a request still in flight must never look lost"
                }
            )
        try:
            build_adapter(self)
        except (ValueError, TypeError, ImportError) as exc:
            raise ValidationError({"config": str(exc)}) from exc
        self._clean_preset()
        if self.claim_with_intent and not self.idempotent:
            raise ValidationError(
                {
                    "claim_with_intent": "claiming the dispatch with the intent needs an idempotent tool: recovery "
                    "sends a call that did not land again only with the same key, and a non-idempotent one would go "
                    "to a person after every crash in that window"
                }
            )
        if self.claim_with_intent and self.adapter == self.Adapter.HTTP and not (self.config or {}).get("lookup_url"):
            raise ValidationError(
                {
                    "claim_with_intent": "claiming the dispatch with the intent needs a lookup (config.lookup_url): "
                    "without one, a crash after that commit could only be settled by a person"
                }
            )

    def _clean_preset(self) -> None:
        """A preset states its provider's facts: a tool may not say otherwise."""
        preset = preset_facts(self)
        if preset is None:
            return
        if self.idempotent != preset.deduplicates:
            said = (
                f"deduplicates by key for {preset.retention_seconds // 3600} h: idempotent must be true"
                if preset.deduplicates and preset.retention_seconds
                else "does not deduplicate: idempotent must be false (the ledger would send a call again that the "
                "provider performs twice)"
            )
            raise ValidationError({"idempotent": f"{preset.provider} ({preset.name}) {said}"})
        if preset.retention_seconds and (self.key_retention_seconds or 0) > preset.retention_seconds:
            raise ValidationError(
                {
                    "key_retention_seconds": f"{preset.provider} keeps keys for {preset.retention_seconds} s; "
                    f"a tool cannot count on {self.key_retention_seconds} s"
                }
            )
        if preset.deduplicates and not self.key_retention_seconds:
            raise ValidationError(
                {
                    "key_retention_seconds": f"{preset.provider} forgets keys after {preset.retention_seconds} s: "
                    "set key_retention_seconds (at most that)"
                }
            )


class ToolRetention(models.Model):
    """From when a tool said its provider keeps what the lookup reads for
    ``days`` (a preset's ``retention_days``, where the account chooses), until
    the tool's next row. Written with every change of the setting, in the
    change's transaction (:mod:`ledgerdash.ledger.retention`); kept by tool
    name, so a tool removed and made again keeps its history. Append-only."""

    tool_name = models.CharField(max_length=255)
    days = models.PositiveIntegerField()
    since = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["tool_name", "since", "id"]
        indexes = [models.Index(fields=["tool_name", "since"], name="ledger_toolretention_since")]

    def __str__(self) -> str:
        return f"{self.tool_name}: {self.days} days from {self.since:%Y-%m-%d %H:%M:%S}"


#: How a secret is named: the ``${NAME}`` placeholders of a tool's header
#: templates and the names of secrets in the environment or secrets file.
SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"  # noqa: S105 - a pattern, not a secret


class ToolCredential(AuditedModel):
    """Which secret a tenant's calls through a tool use for one placeholder.

    A tool's header templates name placeholders (``Bearer ${API_TOKEN}``);
    binding ``API_TOKEN`` to ``ACME_MAIL_TOKEN`` for tenant acme makes acme's
    calls read the secret named ``ACME_MAIL_TOKEN`` from the secrets file
    (setting ``LEDGERDASH_SECRETS_FILE``) or the environment, at call time.
    The database holds the name only, never the secret. Once any tenant binds
    a placeholder of a tool, it is per tenant for every tenant: one without a
    binding cannot call (nothing is sent), never borrowing a shared secret.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="tool_credentials")
    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="credentials")
    placeholder = models.CharField(
        max_length=128, help_text="The ${NAME} in the tool's header templates this binding fills, without ${}."
    )
    secret_name = models.CharField(
        max_length=128,
        help_text="The secret's name in the secrets file or the environment (never the secret itself).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant", "tool", "placeholder"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool", "placeholder"], name="ledger_toolcredential_unique"),
            models.CheckConstraint(
                condition=Q(placeholder__regex=SECRET_NAME_PATTERN), name="ledger_toolcredential_placeholder_name"
            ),
            models.CheckConstraint(
                condition=Q(secret_name__regex=SECRET_NAME_PATTERN), name="ledger_toolcredential_secret_name"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.tool_id} ${{{self.placeholder}}} = {self.secret_name}"

    def clean(self) -> None:
        import re

        errors: dict[str, str] = {}
        for name in ("placeholder", "secret_name"):
            if not re.fullmatch(SECRET_NAME_PATTERN, getattr(self, name) or ""):
                errors[name] = "a name of letters, digits and underscores, not starting with a digit"
        if self.tool_id is not None and "placeholder" not in errors:
            used = placeholders(self.tool)
            if self.placeholder not in used:
                where = "credential settings" if self.tool.adapter == Tool.Adapter.PRESET else "headers"
                errors["placeholder"] = f"tool {self.tool.name} uses no ${{{self.placeholder}}} in its {where}" + (
                    f" (it uses {', '.join(sorted(used))})" if used else ""
                )
        if errors:
            raise ValidationError(errors)


class ChainHead(models.Model):
    """The latest link of one of a tenant's event hash chains.

    Appending an event locks this row, so each chain is one ordered
    sequence; tenants never wait on each other, and one tenant's export can
    be verified without any other tenant's events. A tenant keeps
    ``Tenant.chain_stripes`` chains (see :mod:`ledgerdash.ledger.chain`),
    one row each; ``seq`` is the seq of the chain's last event (0 before
    its first).
    """

    pk = models.CompositePrimaryKey("tenant", "stripe")
    # The primary key (tenant, stripe) serves the foreign key.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="chain_heads", db_index=False)
    stripe = models.PositiveSmallIntegerField(default=0)
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.stripe} @ {self.seq}"


class AttemptEvent(models.Model):
    """An append-only record of something that happened to an attempt (or,
    with no attempt, to the tenant's ledger: an export, a policy change).

    ``hash`` = sha256(prev_hash bytes + content_hash bytes); ``content_hash``
    is sha256 of the RFC 8785 canonical JSON of the event's fields (see
    :func:`ledgerdash.ledger.chain.event_content`).
    """

    # Neither foreign key has an index of its own: (tenant, seq) and
    # (attempt, seq) serve them, and each index less is one write less per
    # event, inside the tenant's chain-head lock.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="events", db_index=False)
    seq = models.PositiveBigIntegerField()
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.PROTECT, related_name="events", db_index=False
    )
    kind = models.CharField(max_length=32)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_label = models.CharField(max_length=255)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    fence = models.PositiveBigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    content_hash = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["tenant", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "seq"], name="ledger_event_unique_seq"),
        ]
        indexes = [models.Index(fields=["attempt", "seq"], name="ledger_event_attempt")]

    def __str__(self) -> str:
        return f"{self.tenant_id}#{self.seq} {self.kind} {self.from_state}->{self.to_state}"


class Incident(models.Model):
    """Something the ledger learned that people must settle: an effect that
    happened although the ledger had settled the attempt otherwise.

    ``duplicate``: the original acted after all, and a linked retry of it
    was sent too: the side effect may have happened twice. ``contradiction``:
    the provider's or the dispatcher's word contradicts how the attempt was
    settled (it acted after it was failed or superseded, with no retry sent;
    a refusal, or "cannot tell", after the ledger settled it on that
    dispatcher's word; or a second, different receipt). ``not_sent``: a
    retry an approver let through was not sent, because by the time it
    would have left the ledger knew another attempt at the same side effect
    had acted (``retry``: that retry). An incident waits on people (open, with
    an owner) until someone resolves it, saying what they did; every step is
    an event in the tenant's chain on the incident's attempt.
    """

    class Kind(models.TextChoices):
        DUPLICATE = "duplicate", "duplicate effect"
        CONTRADICTION = "contradiction", "the facts contradict the ledger"
        NOT_SENT = "not_sent", "a retry not sent: its side effect had happened"

    class Status(models.TextChoices):
        OPEN = "open", "open"
        RESOLVED = "resolved", "resolved"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="incidents")
    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="incidents")
    #: The linked retry that also went out (a duplicate).
    retry = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    summary = models.TextField()
    #: The evidence: the late report, the attempts' states and receipts.
    details = models.JSONField(default=dict)
    opened_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolution = models.TextField(blank=True)
    #: Bumped on every change, so a decision made on a stale page is refused.
    fence = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=["duplicate", "contradiction", "not_sent"]), name="ledger_incident_kind"
            ),
            models.CheckConstraint(condition=Q(status__in=["open", "resolved"]), name="ledger_incident_status"),
        ]
        indexes = [models.Index(fields=["tenant", "status", "-opened_at"], name="ledger_incident_queue")]

    def __str__(self) -> str:
        return f"incident #{self.pk} {self.kind} on attempt #{self.attempt_id} [{self.status}]"


class DrillRun(models.Model):
    """One run of the crash drill and its auditable report.

    ``report`` holds every case: what happened at the provider (effects per
    key) and in the ledger (attempts and their events), and each assertion
    with its evidence. ``ok`` is true only if every assertion held.
    """

    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="drill_runs")
    mode = models.CharField(max_length=16, default="fixed")
    seed = models.BigIntegerField(null=True, blank=True)
    iterations = models.PositiveIntegerField(default=0)
    database = models.CharField(max_length=32)
    host = models.CharField(max_length=255, blank=True)
    ok = models.BooleanField(null=True)
    cases_total = models.PositiveIntegerField(default=0)
    cases_failed = models.PositiveIntegerField(default=0)
    report = models.JSONField(default=dict)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        verdict = "running" if self.ok is None else ("passed" if self.ok else "FAILED")
        return f"drill #{self.pk} {verdict} ({self.cases_total} cases)"


class TokenScope(models.TextChoices):
    """What an API token may do. Write does not imply read: an agent that only
    records and reports needs no access to the tenant's other attempts."""

    READ = "attempts:read", "read attempts"
    WRITE = "attempts:write", "record intents, claim dispatch, report outcomes"
    #: A person's token: list and decide what awaits approval, as that person
    #: (their role re-checked at every decision). Never beside WRITE: the
    #: token that records a call cannot also approve it.
    DECIDE = "approvals:decide", "list and decide what awaits approval, as the token's person"


#: What a token gets when nobody names its scopes: an agent's.
AGENT_SCOPES = (TokenScope.READ.value, TokenScope.WRITE.value)


class ApiToken(models.Model):
    """A tenant's bearer token for the ingest API.

    The secret is shown once, when the token is created, and stored only as
    sha256 of the whole token: it carries 256 random bits, so a fast hash is
    enough (slow hashes are for guessable passwords). ``prefix`` is public:
    it finds the row and names the token in lists and events.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. the agent that holds it.")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    #: Space-separated :class:`TokenScope` values.
    scopes = models.CharField(max_length=200)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: Updated at most once a minute, so using a token costs no write per request.
    last_used_at = models.DateTimeField(null=True, blank=True)
    #: The person an ``approvals:decide`` token acts for (empty for an agent's token).
    person = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The person whose approvals and rejections the token makes (approvals:decide tokens only).",
    )

    class Meta:
        ordering = ["tenant", "-created_at", "-id"]
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(
                condition=Q(secret_hash__regex=r"^[0-9a-f]{64}$"),  # noqa: S106 - a pattern, not a secret
                name="ledger_apitoken_hash",
            ),
            models.CheckConstraint(condition=~Q(scopes=""), name="ledger_apitoken_has_scope"),
            models.CheckConstraint(
                condition=~Q(scopes__contains="approvals:decide")
                | (Q(person__isnull=False) & ~Q(scopes__contains="attempts:write")),
                name="ledger_apitoken_decide_is_a_persons",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix} ({self.name})"

    @property
    def scope_set(self) -> frozenset[str]:
        return frozenset(self.scopes.split())

    def state_at(self, now: Any) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


class ChainCheck(models.Model):
    """The last verification of a tenant's event chain (``manage.py verify_audit``).

    The dashboard's badge reads this row instead of walking the chain on a
    page view: a walk reads every event of the tenant. ``verified_seq``
    against the live :class:`ChainHead` tells how much was appended since.
    """

    tenant = models.OneToOneField(Tenant, primary_key=True, on_delete=models.CASCADE, related_name="chain_check")
    checked_at = models.DateTimeField()
    ok = models.BooleanField()
    #: The last seq the walk reached (the head's, when it held).
    verified_seq = models.PositiveBigIntegerField(default=0)
    events = models.PositiveBigIntegerField(default=0)
    #: The first break: edited, missing, reordered, head mismatch, attempt without events.
    problem = models.CharField(max_length=32, blank=True)
    break_seq = models.PositiveBigIntegerField(null=True, blank=True)
    break_event_id = models.BigIntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    #: The furthest heads a walk ever verified, ``[seq, hash]`` for each of
    #: the tenant's chains that has events (moved only by walks that held):
    #: a later walk whose chains no longer reach them reports the lost tail.
    reached_heads = models.JSONField(default=list, blank=True)
    reached_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.tenant_id}: {'ok' if self.ok else self.problem} @ {self.checked_at:%Y-%m-%d %H:%M}"


class EventArchive(models.Model):
    """A partition of the events that left the database for a file
    (``manage.py archive_events``; PostgreSQL): where it went, its digest,
    and where each chain it held began and ended, so the walks of the live
    events go on from those ends, and one that reads the file checks it.

    Never deleted: it is what tells a shortened chain from an archived one.
    ``restored_at``: when ``restore_events`` brought the partition back.
    """

    name = models.CharField(max_length=63)
    #: The partition's id range: ``low`` None is from the lowest id.
    low = models.BigIntegerField(null=True, blank=True)
    high = models.BigIntegerField()
    file = models.CharField(max_length=255)
    sha256 = models.CharField(max_length=64)
    events = models.PositiveBigIntegerField()
    first_at = models.DateTimeField(null=True, blank=True)
    last_at = models.DateTimeField(null=True, blank=True)
    #: One entry per chain with events in it: tenant_id, tenant (slug),
    #: stripe, first_seq, prev_hash, last_seq, hash, events.
    chains = models.JSONField(default=list)
    archived_at = models.DateTimeField()
    restored_at = models.DateTimeField(null=True, blank=True)
    #: The people its events name (their ``actor_user`` ids, which the events' hashes cover): none of
    #: them may be deleted while it waits to be restored. None: archived before this was kept.
    people = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["high"]

    def __str__(self) -> str:
        return f"{self.name} ({self.events} events) -> {self.file}"


class ReconcilerWorker(models.Model):
    """One ``manage.py reconcile`` process's running totals, written after each pass.

    Read by the metrics endpoint (and anyone asking whether the reconciler
    still runs): the web processes cannot see a worker's memory. One row per
    worker label; a restarted worker has a new pid, so a new row.
    """

    label = models.CharField(max_length=255, unique=True)
    started_at = models.DateTimeField()
    last_pass_at = models.DateTimeField(null=True, blank=True)
    passes = models.PositiveBigIntegerField(default=0)
    claimed = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    #: Decisions since the worker started, by name ("confirmed", "escalated", ...).
    decisions = models.JSONField(default=dict)

    def __str__(self) -> str:
        return self.label

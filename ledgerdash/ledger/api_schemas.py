"""The ingest API's request and response shapes; the OpenAPI document is generated from them.

Requests are strict: unknown fields are refused (``extra="forbid"``) and
nothing is coerced (``"5"`` is not a fence, ``true`` is not a number), so a
typo in an agent's request is an error, not a silently dropped field.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from ledgerdash.ledger.events import MAX_REASON
from ledgerdash.ledger.models import Attempt, AttemptEvent, State
from ledgerdash.ledger.recording import MAX_KEY, MAX_NAME
from ledgerdash_client import errorcodes

#: Largest value a fence or an id can take (a signed 64-bit column).
MAX_BIGINT = 2**63 - 1
MAX_REQUEST_ID = 255
MAX_RESULT_REF = 1000

Fence = Annotated[
    int,
    Field(ge=0, le=MAX_BIGINT, description="The fence the dispatch claim returned: proof you hold the attempt."),
]
Reason = Annotated[str, Field(min_length=1, max_length=MAX_REASON, description="What happened, for the operators.")]


class StrictIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class IntentIn(StrictIn):
    task_id: str = Field(min_length=1, max_length=MAX_NAME, description="The agent's task this call belongs to.")
    tool_name: str = Field(min_length=1, max_length=MAX_NAME, description="Must be allowed by the tenant's policy.")
    idempotency_key: str = Field(
        min_length=1,
        max_length=MAX_KEY,
        description="Names the logical side effect; stable across restarts, never random.",
    )
    args: dict[str, Any] = Field(
        description="The tool's arguments, a JSON object. Hashed as RFC 8785 canonical JSON; "
        "limited in size and depth (LEDGER_MAX_ARGS_BYTES, LEDGER_MAX_ARGS_DEPTH)."
    )
    credential_scope: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None,
        max_length=100,
        description="Scopes this call will use; must be allowed for the tool. Omitted: all the policy allows.",
    )
    claim: bool = Field(
        False,
        description="You send the call at once: also claim its dispatch in the same commit where the tool "
        "allows it (its claim_with_intent setting; never for a call held for approval). Granted, the answer is "
        "201 with state DISPATCHED and the fence to report with: do not call /dispatch.",
    )


class DispatchIn(StrictIn):
    fence: Fence | None = Field(
        None, description="The fence you read; the claim loses (409 claim_lost) if the attempt moved since."
    )


class HeartbeatIn(StrictIn):
    fence: Fence


class AbandonIn(StrictIn):
    fence: Fence = Field(description="The fence you read when the intent was recorded (an intent's is 0).")
    reason: str = Field("", max_length=MAX_REASON, description="Why it is given up, for the operators.")


class RequestIdIn(StrictIn):
    fence: Fence
    provider_request_id: str = Field(min_length=1, max_length=MAX_REQUEST_ID)


class ConfirmedIn(StrictIn):
    outcome: Literal["confirmed"]
    fence: Fence
    provider_request_id: str = Field(
        "", max_length=MAX_REQUEST_ID, description="The provider's id for the request; this or result_ref is required."
    )
    result_ref: str = Field("", max_length=MAX_RESULT_REF, description="Where the result can be checked.")
    result: Any = Field(None, description="The tool's return value (JSON), replayed to a re-run of the same key.")


class FailedIn(StrictIn):
    outcome: Literal["failed"]
    fence: Fence
    reason: Reason


class FailedRetryableIn(StrictIn):
    outcome: Literal["failed_retryable"]
    fence: Fence
    reason: Reason


class UnknownIn(StrictIn):
    outcome: Literal["unknown"]
    fence: Fence
    reason: Reason


OutcomeIn = Annotated[
    ConfirmedIn | FailedIn | FailedRetryableIn | UnknownIn,
    Field(discriminator="outcome"),
]


# --- responses: read from the models' attributes ---------------------------------------


class EventOut(Schema):
    seq: int
    kind: str
    actor_kind: str
    actor_label: str
    from_state: str
    to_state: str
    fence: int | None
    reason: str
    details: dict[str, Any]
    created_at: datetime
    hash: str


class FromAttempt(BaseModel):
    """A response read from an :class:`Attempt`: each field is the attribute
    of the same name, but those :attr:`derived` names, each a function of the
    attempt (read in the view: ``api.attempts._whole``).

    A plain pydantic model with one ``before`` validator, not django-ninja's
    ``Schema``, whose resolvers wrap the object in a getter asked for each
    field in Python: 15 us an attempt against 5. The answers and the
    OpenAPI document are the same as the ``Schema`` gave."""

    model_config = ConfigDict(from_attributes=True)
    derived: ClassVar[dict[str, Callable[[Attempt], Any]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _read(cls, value: Any) -> Any:
        if not isinstance(value, Attempt):
            return value
        derived = cls.derived
        return {name: derived[name](value) if name in derived else getattr(value, name) for name in cls.model_fields}


def _owner_name(attempt: Attempt) -> str | None:
    return attempt.owner.get_username() if attempt.owner_id is not None and attempt.owner else None


class AttemptSummaryOut(FromAttempt):
    id: int
    task_id: str
    tool_name: str
    idempotency_key: str
    provider_key: str = Field(description="The key to send to the provider.")
    args_hash: str
    state: State
    fence: int
    dispatch_fence: int | None
    dispatch_count: int
    policy_version: int
    credential_scope: list[str]
    parent_id: int | None
    provider_request_id: str
    result_ref: str
    last_note: str
    next_check_at: datetime | None
    lands_by: datetime | None = Field(
        description="Until when the last dispatch may still land at the provider: the latest moment its request "
        "could have left (its dispatcher's last report, or the end of its lease while it is silent) plus the "
        "tool's maximum request time. A lookup asked before then is not evidence that it did not land."
    )
    last_lookup: str = Field(
        description="The provider's answer to the last lookup: found, not_found, mismatch, unavailable, "
        "ambiguous (more than one effect may be the call's: a person decides), not_evidence (nothing seen, but "
        "the call may lie where the lookup cannot see: a redacted message, an issue moved away), or "
        "past_retention (not found, after the provider may have forgotten the key or what it did: not evidence)."
    )
    last_lookup_at: datetime | None
    owner: str | None = Field(
        description="The person who owns the attempt while it waits on people (UNKNOWN, MANUAL_REVIEW): "
        "their username; null when nobody does."
    )
    created_at: datetime
    updated_at: datetime

    derived: ClassVar[dict[str, Callable[[Attempt], Any]]] = {
        "credential_scope": lambda attempt: sorted(attempt.scopes),
        "owner": _owner_name,
    }


class AttemptOut(AttemptSummaryOut):
    args: dict[str, Any]
    result: Any = Field(None, description="The recorded result, replayed to a re-run of the same key.")
    result_source: Literal["tool", "lookup", ""] = Field(
        description="Where `result` came from: the tool's return value (`tool`), the provider's answer to a "
        "lookup (`lookup`), or nothing that can be replayed (empty: the effect happened, but there is no "
        "result to return; a re-run must not call the tool)."
    )


def _events_in_order(attempt: Attempt) -> list[AttemptEvent]:
    # read in the view, in order (``api.attempts._whole``): a read here would fail outside the error handling
    return sorted(attempt.events.all(), key=lambda event: event.seq)


class AttemptDetailOut(AttemptOut):
    events: list[EventOut]

    derived: ClassVar[dict[str, Callable[[Attempt], Any]]] = {**AttemptOut.derived, "events": _events_in_order}


class AttemptListOut(Schema):
    items: list[AttemptSummaryOut]
    next_before: int | None = Field(description="Pass as `before` for the next page; null on the last page.")


class FieldErrorOut(BaseModel):
    field: str
    message: str
    type: str


class ErrorOut(BaseModel):
    """Every error answer. ``code`` is stable and meant for machines."""

    code: str = Field(
        description="Stable, for machines: what went wrong (ledgerdash_client.errorcodes has each code's meaning).",
        json_schema_extra={"enum": list[JsonValue](errorcodes.answered())},
    )
    message: str
    attempt_id: int | None = Field(
        None,
        description="The attempt the error is about (the linked one on idempotency_key_reused and "
        "authorization_changed).",
    )
    original_id: int | None = Field(
        None, description="On idempotency_key_reused and authorization_changed: the attempt first recorded."
    )
    state: str | None = None
    retry_after: int | None = Field(
        None,
        description="Seconds to wait before asking again, as the Retry-After header says, on every answer "
        "that carries one (awaiting_approval, retry_pending, attempt_in_flight, ledger_unavailable).",
    )
    errors: list[FieldErrorOut] | None = None
    changes: list[str] | None = Field(
        None, description="On approval_refused and self_approval: each thing that no longer holds."
    )
    holder_id: int | None = Field(
        None,
        description="On request_id_taken: the attempt at another side effect that recorded the provider request "
        "id first.",
    )


class RejectIn(StrictIn):
    fence: Fence = Field(
        description="The attempt's fence as the approvals list showed it: a decision on an attempt that moved "
        "since is refused (stale_fence)."
    )
    comment: Reason = Field(description="Why: recorded in its events, and told to the agent on a rejection.")


class ApproveIn(RejectIn):
    safe_because: str = Field(
        "",
        max_length=MAX_REASON,
        description="Why approving is safe although the original may have happened: needed when the list's "
        "`needs_reason` says so, recorded with the approval.",
    )


class ApprovalOut(Schema):
    """One item awaiting approval, with what approving it would meet now for the token's person."""

    attempt: AttemptSummaryOut
    original: AttemptSummaryOut | None = Field(
        description="The attempt a linked retry re-tries; null for a first call the policy held."
    )
    verdict: Literal["approvable", "needs a reason", "refused"] = Field(
        description="approvable: approving would go through now. needs a reason: only with `safe_because`. "
        "refused: approving would be refused whatever is said (`summary` says why)."
    )
    summary: str
    needs_reason: str = Field(description="The risk `safe_because` must answer; empty when there is none.")


class ApprovalListOut(Schema):
    items: list[ApprovalOut]

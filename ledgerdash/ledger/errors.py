"""Named errors of the ledger. Messages are class constants so tests and the
API can refer to them; each error has a stable ``code`` for machines, whose
row in :mod:`ledgerdash_client.errorcodes` gives its HTTP status: a class whose code
has no row is refused when this module is imported."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ledgerdash_client import errorcodes, keys

# What a tool tells the ledger, shared with the client: the server's modules import them from here too.
from ledgerdash_client.outcomes import NothingHappened as NothingHappened
from ledgerdash_client.outcomes import PermanentFailure as PermanentFailure


class Attempt(Protocol):
    """What an error says of the attempt it is about (an ``Attempt`` row).
    This module does not import the models: it is imported by modules the
    models import (canonical JSON, the provider adapters) and by the client."""

    @property
    def pk(self) -> Any: ...
    @property
    def state(self) -> str: ...
    @property
    def parent_id(self) -> int | None: ...
    @property
    def next_check_at(self) -> datetime | None: ...


class LedgerError(Exception):
    """Base of every error the ledger raises on purpose."""

    code = "ledger_error"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if errorcodes.row(cls.code).origin not in ("ledger", "process"):
            raise ValueError(f"{cls.__name__}: {cls.code} is not a ledger error's code in ledgerdash_client.errorcodes")


# --- bad input: nothing was written ------------------------------------------


class InvalidInput(LedgerError):
    code = "invalid_input"


class InvalidArgs(InvalidInput):
    code = "invalid_args"
    NOT_OBJECT = "tool arguments must be a JSON object (a dict), not {type}"
    NOT_JSON = "tool arguments are not JSON-serializable"
    UNSUPPORTED_TYPE = "tool arguments are not JSON-serializable: {type} is not a JSON type"
    KEY_NOT_STRING = "tool arguments are not JSON-serializable: object key {key} is not a string"
    NOT_FINITE = "tool arguments contain NaN or Infinity, which JSON cannot represent"
    INT_RANGE = "tool arguments contain an integer outside ±2**53, which JSON cannot carry exactly"
    TOO_DEEP = "tool arguments are nested deeper than {max_depth} levels"
    NUL = "tool arguments contain a NUL character (U+0000), which the ledger does not store"
    NOT_UNICODE = "text that is not Unicode (a lone surrogate)"
    TOO_LARGE = "tool arguments are {size} bytes as canonical JSON; the limit is {limit}"


class InvalidKey(InvalidInput):
    """The key breaks :mod:`ledgerdash_client.keys`' rule; the message says which part."""

    code = "invalid_idempotency_key"
    EMPTY = keys.EMPTY
    TOO_LONG = keys.TOO_LONG
    INVISIBLE = keys.INVISIBLE
    NOT_NFC = keys.NOT_NFC
    NOT_NFKC = keys.NOT_NFKC


class InvalidField(InvalidInput):
    code = "invalid_field"
    EMPTY = "{field} must not be empty"
    TOO_LONG = "{field} is {length} characters; the limit is {limit}"
    CONTROL = "{field} must not contain control characters"


class InsideTransaction(LedgerError):
    """The agent-side API was called inside the caller's open database
    transaction. Its intent and DISPATCHED rows would only be a savepoint
    there: invisible to recovery while the tool runs, and erased with the
    caller's rollback although the provider acted."""

    code = "inside_transaction"
    MESSAGE = (
        "{what} must not run inside an open database transaction: the ledger commits the intent and the "
        "dispatch claim before the tool runs, and a rollback of your transaction would erase them although "
        "the provider acted. Call the tool outside `transaction.atomic()` (e.g. with "
        "`transaction.on_commit`), or in a process or thread of its own"
    )


class LedgerUnavailable(LedgerError):
    """The ledger's database could not be reached; nothing is known to have
    been written by this call. The connection is reset, so the next call
    connects again."""

    code = "ledger_unavailable"
    MESSAGE = "the ledger's database is unavailable ({error}); the tool was not called by this step, retry later"


class UnknownTenant(LedgerError):
    code = "unknown_tenant"
    MESSAGE = "no tenant {tenant!r}"


class TenantInactive(LedgerError):
    code = "tenant_inactive"
    MESSAGE = "tenant {tenant} is not active"


class NoPolicy(LedgerError):
    code = "no_policy"
    MESSAGE = "tenant {tenant!r} has no policy; nothing is allowed"


class ToolNotAllowed(LedgerError):
    code = "tool_not_allowed"
    MESSAGE = "tool {tool} is not allowed by policy v{version} of tenant {tenant}"


class ScopeNotAllowed(LedgerError):
    code = "scope_not_allowed"
    MESSAGE = "scope {scopes} is not allowed for {tool} by policy v{version} (it allows: {allowed})"


# --- API tokens: who is calling ----------------------------------------------


class TokenError(LedgerError):
    """The bearer token does not authenticate the caller (HTTP 401)."""

    code = "invalid_token"


class InvalidToken(TokenError):
    code = "invalid_token"
    MESSAGE = "the bearer token is not a ledgerdash API token this server issued"


class TokenRevoked(TokenError):
    code = "token_revoked"
    MESSAGE = "API token {prefix} was revoked at {at}"


class TokenExpired(TokenError):
    code = "token_expired"
    MESSAGE = "API token {prefix} expired at {at}"


class InsufficientScope(LedgerError):
    code = "insufficient_scope"
    MESSAGE = "API token {prefix} lacks scope {scope} (it has: {scopes})"


class RoleRequired(LedgerError):
    """The person a token acts for lacks the role the request needs in the tenant now."""

    code = "role_required"


# --- moves the state machine refuses ------------------------------------------


class AttemptNotFound(LedgerError):
    code = "attempt_not_found"
    MESSAGE = "no attempt {attempt_id}"


class IllegalTransition(LedgerError):
    code = "illegal_transition"
    MESSAGE = "{actor} may not move attempt {attempt_id} from {from_state} to {to_state}"


class StaleFence(LedgerError):
    """The caller's fence is not the attempt's: someone else moved it since."""

    code = "stale_fence"
    MESSAGE = "attempt {attempt_id} is at fence {current}, not {given}: it changed since you read it"


class ClaimLost(StaleFence):
    """Another worker claimed the attempt for dispatch first."""

    code = "claim_lost"
    MESSAGE = "attempt {attempt_id} was claimed by another worker (now {state} at fence {current})"
    #: The caller named a fence the attempt has moved past: nobody raced it, it read an old version.
    FENCE_MESSAGE = (
        "attempt {attempt_id} is {state} at fence {current}, not at the fence {given} you sent: it moved since "
        "you read it; read it again, and do not call the tool"
    )


class MissingEvidence(LedgerError):
    code = "missing_evidence"
    MESSAGE = "confirming attempt {attempt_id} needs evidence: a provider request id or a result reference"


class RequestIdConflict(LedgerError):
    code = "request_id_conflict"
    MESSAGE = "attempt {attempt_id} already names provider request {existing!r}, not {given!r}"


class RequestIdTaken(LedgerError):
    """The provider's request id is already recorded on an attempt at another
    side effect of the tenant (another idempotency key, the same tool). One
    provider effect is the outcome of one side effect: the attempt was not
    changed. ``holder_id``: the attempt that named the id first."""

    code = "request_id_taken"
    MESSAGE = (
        "provider request {request_id!r} of {tool} is already recorded on attempt {holder_id} (idempotency key "
        "{holder_key!r}), another side effect: one provider effect is the outcome of one side effect, so attempt "
        "{attempt_id} cannot name it too"
    )

    def __init__(
        self, message: str, *, attempt_id: int, request_id: str, holder_id: int | None, holder_key: str = ""
    ) -> None:
        super().__init__(message)
        self.attempt_id = attempt_id
        self.request_id = request_id
        self.holder_id = holder_id
        self.holder_key = holder_key


class AuthorizationChanged(LedgerError):
    """The authority an attempt was recorded under no longer holds. The
    attempt was not sent; a linked attempt under the current policy (when one
    can be authorized) awaits review."""

    code = "authorization_changed"
    MESSAGE = "attempt {attempt_id} may not be dispatched: {changes}"

    def __init__(self, message: str, attempt: Attempt | None = None, original: Attempt | None = None) -> None:
        super().__init__(message)
        #: The attempt to follow now: the linked one awaiting review (or the original, if none could be made).
        self.attempt = attempt
        self.original = original


# --- people's decisions ----------------------------------------------------------------


class OwnershipError(LedgerError):
    code = "ownership"


class IncidentError(LedgerError):
    code = "incident"


class ApprovalRefused(LedgerError):
    """An approval was refused; the refusal itself is recorded as an event.
    ``changes`` says exactly what no longer holds."""

    code = "approval_refused"
    MESSAGE = "approval of attempt {attempt_id} refused: {changes}"

    def __init__(self, message: str, changes: list[str]) -> None:
        super().__init__(message)
        self.changes = changes


class SelfApproval(ApprovalRefused):
    code = "self_approval"
    MESSAGE = "{user} requested this retry and cannot also approve it"
    FIRST_CALL = "{user} triggered this call and cannot also approve it"


# --- what an agent is told instead of dispatching -------------------------------


class AttemptBlocked(LedgerError):
    """The ledger refuses to let the agent call the tool for this key now."""

    code = "attempt_blocked"

    def __init__(self, message: str, attempt: Attempt) -> None:
        super().__init__(message)
        self.attempt = attempt


class IdempotencyConflict(AttemptBlocked):
    """The key was used before with other arguments. A linked attempt was
    recorded for review; the tool was not called. ``original_id``: the
    attempt first recorded under the key (the chain's root)."""

    code = "idempotency_key_reused"
    MESSAGE = (
        "idempotency key {key!r} was used with other arguments (attempt {original_id}); "
        "recorded linked attempt {attempt_id} for review instead of calling the tool"
    )

    def __init__(self, message: str, attempt: Attempt, *, original_id: int) -> None:
        super().__init__(message, attempt)
        self.original_id = original_id


class OutcomeUnknown(AttemptBlocked):
    code = "outcome_unknown"
    MESSAGE = "attempt {attempt_id} may already have happened; the reconciler is checking with the provider"


class UnderReview(AttemptBlocked):
    code = "under_review"
    MESSAGE = "attempt {attempt_id} is waiting for an operator's decision"


class AwaitingApproval(AttemptBlocked):
    """The tenant's policy requires an approver's yes before this call is
    sent; it waits in the approvals queue. Call again later: once approved,
    the same call dispatches (once); once rejected, it fails with the reason."""

    code = "awaiting_approval"
    MESSAGE = "attempt {attempt_id} waits for an approver before it may be sent ({why}); call again later"


class AttemptInFlight(AttemptBlocked):
    code = "attempt_in_flight"
    MESSAGE = "attempt {attempt_id} is being dispatched by {holder}"


class RetryPending(AttemptBlocked):
    code = "retry_pending"
    MESSAGE = "attempt {attempt_id} failed retryably; it may be dispatched again after {due}"


class SideEffectInFlight(RetryPending):
    """A request of the same side effect may still land at the provider, or
    another attempt at it may yet be sent: this one may not leave now.
    ``due``: when the ledger can tell (None: once that attempt settles)."""

    code = "side_effect_in_flight"
    MESSAGE = "attempt {attempt_id} may not be sent yet: {why}; call again {after}"

    def __init__(self, message: str, attempt: Attempt, *, due: datetime | None) -> None:
        super().__init__(message, attempt)
        self.due = due


class AttemptFailed(AttemptBlocked):
    code = "attempt_failed"
    MESSAGE = "attempt {attempt_id} failed: {reason}"


class AlreadyHappened(AttemptFailed):
    """Another attempt at the same side effect acted, so this one was not
    sent, and never will be: what it would have done was done."""

    code = "already_happened"
    MESSAGE = "attempt {attempt_id} was not sent: {why}"


class ApprovalRejected(AttemptFailed):
    """An approver rejected the call before it was sent: final, with their reason."""

    code = "approval_rejected"
    MESSAGE = "attempt {attempt_id} was rejected by an approver and will not be sent: {reason}"


class ResultUnavailable(AttemptBlocked):
    """The attempt's effect happened (it is confirmed) but no result was
    recorded that could be replayed. Do not call the tool again."""

    code = "result_unavailable"
    MESSAGE = (
        "attempt {attempt_id} is confirmed ({how}) but has no recorded result to replay; the effect happened, "
        "do not call the tool again"
    )


class AttemptSuperseded(AttemptBlocked):
    code = "attempt_superseded"
    MESSAGE = "attempt {attempt_id} was superseded by linked attempt {child_id}"

"""Every error code the ledger and its API answer with, in one table.

From this table come the ledger's errors' codes (:mod:`ledgerdash.ledger.errors`
refuses a class whose code has no row), the API's status for each code
(:mod:`ledgerdash.ledger.api.errors`), the OpenAPI enum of ``ErrorOut.code``,
and the Python client's exception classes (:mod:`ledgerdash_client`, which
builds one class per row that names one).

Standard library only: the client imports it in an agent's environment,
without Django.

Columns:

- ``code``: stable, for machines; never renamed.
- ``status``: the HTTP status the API answers it with.
- ``retryable``: the same request, sent again unchanged, may succeed later
  (once a lease ends, a back-off passes, recovery or a person settles the
  attempt, or the database is back). False: it keeps failing until the
  request, the token or the policy changes.
- ``origin``: who answers it: ``ledger`` (an error class of the ledger),
  ``process`` (an error of the ledger's in-process wrapper, never sent over
  HTTP), ``api`` (the HTTP layer itself: parsing, routing, limits), or
  ``client`` (never answered: the name of a family of the client's exceptions).
- ``client``: the name of the Python client's exception class; ``None`` for
  a ledger error the API never answers (people's decisions, in-process use).
- ``parent``: the code whose client class is this one's base (``None``: the
  client's ``ApiError``). Within a status, the first row with a client class
  is the family the client raises for a code it does not know yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Origin = Literal["ledger", "process", "api", "client"]


@dataclass(frozen=True)
class ErrorCode:
    code: str
    status: int
    description: str
    origin: Origin = "ledger"
    client: str | None = None
    parent: str | None = None
    retryable: bool = False


E = ErrorCode

TABLE: tuple[ErrorCode, ...] = (
    # --- 400 and 422: the request is wrong; fix it, sending it again will not help
    E("invalid_input", 422, "The input is invalid.", client="InvalidInput"),
    E("malformed_json", 400, "The body is not JSON (NaN/Infinity, duplicate keys, too deep, numbers out of range).",
      "api", "MalformedRequest", "invalid_input"),
    E("invalid_utf8", 400, "The body is not UTF-8.", "api", "InvalidUtf8", "malformed_json"),
    E("invalid_unicode", 400, "The body has a lone surrogate escape.", "api", "InvalidUnicode", "malformed_json"),
    E("invalid_content_length", 400, "Content-Length is not a number.", "api", "InvalidContentLength",
      "malformed_json"),
    E("bad_request", 400, "The request was refused as malformed.", "api", "BadRequest", "malformed_json"),
    E("length_required", 411, "A chunked body without Content-Length.", "api", "LengthRequired", "malformed_json"),
    E("invalid_args", 422, "The tool's arguments cannot be recorded (too large, too deep, NUL, not JSON).",
      client="InvalidArgs", parent="invalid_input"),
    E("invalid_idempotency_key", 422, "The idempotency key is empty, too long, or a look-alike.",
      client="InvalidKey", parent="invalid_input"),
    E("invalid_field", 422, "A field's value cannot be recorded.", client="InvalidField", parent="invalid_input"),
    E("missing_evidence", 422, "Confirmed without a receipt (provider request id or result reference).",
      client="MissingEvidence", parent="invalid_input"),
    E("validation_error", 422, "Types, lengths or missing fields; `errors` lists each.", "api", "ValidationFailed",
      "invalid_input"),
    E("unknown_field", 422, "A field or query parameter the endpoint does not take.", "api", "UnknownField",
      "invalid_input"),
    E("body_too_large", 413, "The body is over LEDGER_API_MAX_BODY_BYTES.", "api", "BodyTooLarge", "invalid_input"),
    E("unsupported_media_type", 415, "The body is not application/json in UTF-8.", "api", "UnsupportedMediaType",
      "invalid_input"),
    # --- 401: who is calling
    E("not_authenticated", 401, "The caller is not authenticated (the client's family of 401 answers).", "client",
      "NotAuthenticated"),
    E("missing_token", 401, "No bearer token was sent.", "api", "MissingToken", "not_authenticated"),
    E("invalid_token", 401, "The bearer token is not one this server issued.", client="InvalidToken",
      parent="not_authenticated"),
    E("token_revoked", 401, "The API token was revoked.", client="TokenRevoked", parent="not_authenticated"),
    E("token_expired", 401, "The API token expired.", client="TokenExpired", parent="not_authenticated"),
    E("unknown_tenant", 401, "No such tenant."),
    # --- 403: what they may do
    E("not_allowed", 403, "The caller may not do this (the client's family of 403 answers).", "client",
      "NotAllowed"),
    E("insufficient_scope", 403, "The API token lacks the scope (read or write).", client="InsufficientScope",
      parent="not_allowed"),
    E("role_required", 403, "The person deciding (an approver's token's) lacks the role it needs in the tenant now.",
      client="RoleRequired", parent="not_allowed"),
    E("tenant_inactive", 403, "The tenant is not active.", client="TenantInactive", parent="not_allowed"),
    E("no_policy", 403, "The tenant has no policy; nothing is allowed.", client="NoPolicy", parent="not_allowed"),
    E("tool_not_allowed", 403, "The policy does not allow the tool (or it is unknown).", client="ToolNotAllowed",
      parent="not_allowed"),
    E("scope_not_allowed", 403, "The policy does not allow the credential scope for the tool.",
      client="ScopeNotAllowed", parent="not_allowed"),
    E("authorization_changed", 403, "The policy changed since the intent; a linked attempt awaits approval.",
      client="AuthorizationChanged", parent="not_allowed"),
    # --- 404 and 405
    E("not_found", 404, "No API endpoint at this path.", "api", "NotFound"),
    E("attempt_not_found", 404, "No such attempt (another tenant's looks like none).", client="AttemptNotFound",
      parent="not_found"),
    E("method_not_allowed", 405, "The method is not allowed here; `Allow` names those that are.", "api",
      "MethodNotAllowed"),
    # --- 409: the attempt is not where the caller thinks; do not call the tool, read the attempt
    E("attempt_blocked", 409, "The ledger refuses to let the agent call the tool for this key now.",
      client="AttemptBlocked"),
    E("idempotency_key_reused", 409, "The key was used with other arguments; a linked attempt awaits review.",
      client="IdempotencyConflict", parent="attempt_blocked"),
    E("outcome_unknown", 409, "The attempt may already have happened; recovery is checking with the provider.",
      client="OutcomeUnknown", parent="attempt_blocked", retryable=True),
    E("under_review", 409, "The attempt waits for an operator's decision.", client="UnderReview",
      parent="attempt_blocked", retryable=True),
    E("awaiting_approval", 409, "The policy requires a person's approval first; call again after Retry-After.",
      client="AwaitingApproval", parent="attempt_blocked", retryable=True),
    E("attempt_in_flight", 409, "Another worker is dispatching the attempt.", client="AttemptInFlight",
      parent="attempt_blocked", retryable=True),
    E("retry_pending", 409, "The attempt failed retryably; it may be dispatched again after Retry-After.",
      client="RetryPending", parent="attempt_blocked", retryable=True),
    E("side_effect_in_flight", 409, "A request of the same side effect may still land, or another attempt at it "
      "may yet be sent: not now; call again after Retry-After.", client="SideEffectInFlight", parent="retry_pending",
      retryable=True),
    E("attempt_failed", 409, "The attempt failed for good.", client="AttemptFailed", parent="attempt_blocked"),
    E("already_happened", 409, "Not sent, and never will be: another attempt at the same side effect acted. The "
      "side effect happened; do not call the tool again.", client="AlreadyHappened", parent="attempt_failed"),
    E("approval_rejected", 409, "An approver rejected the call; it will not be sent. `detail` says why.",
      client="ApprovalRejected", parent="attempt_failed"),
    E("attempt_superseded", 409, "A linked attempt superseded this one.", client="AttemptSuperseded",
      parent="attempt_blocked"),
    E("result_unavailable", 409, "Confirmed, but no result was recorded to replay: the effect happened.",
      client="ResultUnavailable", parent="attempt_blocked"),
    E("illegal_transition", 409, "The state machine does not allow this move from the attempt's state.",
      client="IllegalTransition"),
    E("stale_fence", 409, "The fence sent is not the attempt's: it changed since it was read.",
      client="StaleFence"),
    E("claim_lost", 409, "The dispatch claim lost: the attempt moved since it was read.", client="ClaimLost",
      parent="stale_fence"),
    E("request_id_conflict", 409, "The attempt already names another provider request id.",
      client="RequestIdConflict"),
    E("request_id_taken", 409, "The provider request id is recorded on an attempt at another side effect (another "
      "key) of the tenant and tool: one provider effect is one side effect's outcome. `holder_id` names that attempt.",
      client="RequestIdTaken"),
    E("ownership", 409, "A person's ownership change was refused."),
    E("approval_refused", 409, "An approval was refused; `changes` says what no longer holds.",
      client="ApprovalRefused"),
    E("self_approval", 409, "The person who requested a retry (or issued the token of the agent that made the "
      "call) cannot also approve it.", client="SelfApproval", parent="approval_refused"),
    E("incident", 409, "An incident change was refused."),
    # --- the ledger itself
    E("ledger_error", 400, "An error of the ledger without a more precise code."),
    E("internal_error", 500, "The ledger failed to answer; nothing is known to have changed.", "api",
      "ServerError"),
    E("inside_transaction", 500, "The in-process API was called inside an open database transaction."),
    E("no_task", 500, "A ledger tool was called outside `ledger.task(...)`.", "process"),
    E("ledger_unavailable", 503, "The ledger's database is unavailable; retry after Retry-After.",
      client="LedgerUnavailable", retryable=True),
)  # fmt: skip

BY_CODE: dict[str, ErrorCode] = {row.code: row for row in TABLE}


def row(code: str) -> ErrorCode:
    """The row of ``code``; a :class:`KeyError` that says where to add one."""
    try:
        return BY_CODE[code]
    except KeyError:
        raise KeyError(
            f"error code {code!r} has no row in clients/python/src/ledgerdash_client/errorcodes.py"
        ) from None


def is_answered(r: ErrorCode) -> bool:
    """Whether the API may answer with ``r``: its own codes, and the ledger's
    that have a client class (the others are people's decisions and
    in-process errors, never sent over HTTP)."""
    return r.origin == "api" or (r.origin == "ledger" and r.client is not None)


def answered(status: int | None = None) -> list[str]:
    """Every code the API may answer with (with ``status``: only those), sorted."""
    return sorted(r.code for r in TABLE if is_answered(r) and (status is None or r.status == status))


def _check(table: tuple[ErrorCode, ...]) -> None:
    seen: set[str] = set()
    for r in table:
        if r.code in seen:
            raise ValueError(f"error code {r.code} has two rows")
        if r.parent is not None and (r.parent not in seen or BY_CODE[r.parent].client is None):
            raise ValueError(f"error code {r.code}: its parent {r.parent} must come first and have a client class")
        if r.parent is not None and r.client is None:
            raise ValueError(f"error code {r.code} has a parent but no client class")
        seen.add(r.code)


_check(TABLE)

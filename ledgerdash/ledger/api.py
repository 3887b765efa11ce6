"""The ingest API: the recording API over HTTP, for agents in any language.

``/api/v1/``, JSON, one bearer token per agent (:mod:`ledgerdash.ledger.tokens`).
Views parse, authorize, call one function of :mod:`ledgerdash.ledger.recording`
and render; they never write attempt rows themselves. Every error answer is
``{"code": …, "message": …}`` with the ledger's stable codes
(:mod:`ledgerdash.ledger.errors`), and a refused request writes nothing (the
one exception is the ledger's own rule: an idempotency key reused with other
arguments records a linked attempt for review and answers 409 naming it).

Checks run in this order, so an answer says the first thing wrong:
body size (before anything is read), token, scope, content type, JSON,
schema, then the ledger's own validation and state machine.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, re_path
from django.utils import timezone
from ninja import NinjaAPI, Path, Query
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser
from ninja.responses import Status
from ninja.security import HttpBearer

from ledgerdash.ledger import recording
from ledgerdash.ledger.api_schemas import (
    MAX_BIGINT,
    AbandonIn,
    AttemptDetailOut,
    AttemptListOut,
    AttemptOut,
    ConfirmedIn,
    DispatchIn,
    ErrorOut,
    HeartbeatIn,
    IntentIn,
    OutcomeIn,
    RequestIdIn,
)
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    AttemptBlocked,
    AttemptNotFound,
    AuthorizationChanged,
    ClaimLost,
    IdempotencyConflict,
    InsufficientScope,
    InvalidArgs,
    InvalidField,
    InvalidInput,
    LedgerError,
    RetryPending,
    TokenError,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import OWNED_STATES, ApiToken, Attempt, AttemptEvent, TokenScope
from ledgerdash.ledger.tokens import token_authenticate, token_touch

log = logging.getLogger("ledgerdash.api")

#: HTTP status of each ledger error code. A test checks that every error in
#: :mod:`ledgerdash.ledger.errors` is here, so a new one cannot fall through.
STATUS_BY_CODE: dict[str, int] = {
    # the request is wrong: fix it, don't retry it
    "invalid_input": 422,
    "invalid_args": 422,
    "invalid_idempotency_key": 422,
    "invalid_field": 422,
    "missing_evidence": 422,
    # who is calling
    "invalid_token": 401,
    "token_revoked": 401,
    "token_expired": 401,
    "unknown_tenant": 401,
    # what they may do
    "insufficient_scope": 403,
    "tenant_inactive": 403,
    "no_policy": 403,
    "tool_not_allowed": 403,
    "scope_not_allowed": 403,
    "authorization_changed": 403,
    "inside_transaction": 500,
    "attempt_not_found": 404,
    # the attempt is not where the caller thinks: read it again, don't call the tool
    "illegal_transition": 409,
    "stale_fence": 409,
    "claim_lost": 409,
    "request_id_conflict": 409,
    "ownership": 409,
    "approval_refused": 409,
    "self_approval": 409,
    "attempt_blocked": 409,
    "idempotency_key_reused": 409,
    "outcome_unknown": 409,
    "under_review": 409,
    "attempt_in_flight": 409,
    "retry_pending": 409,
    "attempt_failed": 409,
    "attempt_superseded": 409,
    "result_unavailable": 409,
    "incident": 409,
    "ledger_error": 400,
    "ledger_unavailable": 503,
}

#: Codes the API itself answers with (not ledger errors), and their statuses.
API_CODES: dict[str, int] = {
    "malformed_json": 400,
    "invalid_utf8": 400,
    "invalid_unicode": 400,
    "invalid_content_length": 400,
    "bad_request": 400,
    "missing_token": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "length_required": 411,
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "validation_error": 422,
    "unknown_field": 422,
    "internal_error": 500,
    "ledger_unavailable": 503,
}

READ = TokenScope.READ.value
WRITE = TokenScope.WRITE.value
JSON_TYPE = "application/json"
AGENT_HEADER = "Ledgerdash-Agent"
REPLAYED_HEADER = "Idempotent-Replayed"
LATE_HEADER = "Ledgerdash-Late-Report"


class ApiError(Exception):
    """An answer the API gives on its own (not a ledger error)."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.status = API_CODES[code]
        self.message = message
        self.extra = extra


def error_response(
    status: int, code: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> HttpResponse:
    body = {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    response = HttpResponse(
        json.dumps(body, ensure_ascii=False), status=status, content_type=f"{JSON_TYPE}; charset=utf-8"
    )
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="ledgerdash"' + (
            "" if code == "missing_token" else ', error="invalid_token"'
        )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


# --- parsing: strict JSON ------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise ApiError("malformed_json", f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ApiError("malformed_json", f"number {text[:40]} is too large to represent")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ApiError("malformed_json", f"key {key[:80]!r} appears twice in one object")
        obj[key] = value
    return obj


def parse_json(body: bytes) -> Any:
    """Parse a request body as I-JSON (RFC 7493): UTF-8, no duplicate keys, no
    NaN/Infinity, no lone surrogates. What the ledger hashes is what was meant."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError("invalid_utf8", f"the body is not UTF-8 (invalid byte at offset {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constants, parse_float=_finite, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ApiError("malformed_json", "the body is nested too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, or an integer with too many digits
        raise ApiError("malformed_json", f"the body is not JSON: {exc}"[:300]) from None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            "invalid_unicode", "the body has a lone surrogate escape (like \\ud800), which is not text"
        ) from None
    return value


class StrictJsonParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        if request.content_type != JSON_TYPE:
            raise ApiError(
                "unsupported_media_type",
                f"send the body as {JSON_TYPE}, not {request.content_type or 'an unlabelled body'}",
            )
        charset = (request.content_params or {}).get("charset", "utf-8").lower()
        if charset not in ("utf-8", "utf8"):
            raise ApiError("unsupported_media_type", f"send the body as UTF-8, not {charset}")
        return parse_json(request.body)


# --- authentication ------------------------------------------------------------------


#: What a request without a usable Authorization header is told.
MISSING_TOKEN = "send the API token as `Authorization: Bearer <token>`"  # noqa: S105 - a message


class BearerToken(HttpBearer):
    """``Authorization: Bearer <token>``, and nothing else: a session cookie
    never authenticates an API request (so CSRF cannot apply to one)."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    def __call__(self, request: HttpRequest) -> ApiToken:
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise ApiError("missing_token", MISSING_TOKEN)
        return self.authenticate(request, credentials.strip())

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken:
        found = token_authenticate(token)
        if self.scope not in found.scope_set:
            raise InsufficientScope(
                InsufficientScope.MESSAGE.format(prefix=found.prefix, scope=self.scope, scopes=found.scopes)
            )
        recording.resolve_tenant(found.tenant)  # refuses an inactive tenant
        token_touch(found)
        return found


def _token(request: HttpRequest) -> ApiToken:
    token = getattr(request, "auth", None)
    assert isinstance(token, ApiToken), "every operation is authenticated"
    return token


def _actor(request: HttpRequest) -> Actor:
    """The agent named in the events: its own label (if it sends one) and the token."""
    label = "".join(c for c in request.headers.get(AGENT_HEADER, "") if c.isprintable()).strip()[:100]
    return Actor.agent(f"{label or 'api'} via token {_token(request).prefix}")


# --- the API ----------------------------------------------------------------------------

api = NinjaAPI(
    title="ledgerdash ingest API",
    version="1",
    description=(
        "Record an agent's side effects in the ledger before they happen: record the intent, claim it for "
        "dispatch (the claim returns a fence), call the provider, report the outcome with the fence. "
        "Every error is `{code, message}`; see the README's status table."
    ),
    urls_namespace="ledger-api-v1",
    docs_url=None,
    parser=StrictJsonParser(),
)

ERROR_STATUSES = frozenset({400, 401, 403, 404, 409, 413, 415, 422, 500, 503})
WRITE_ERRORS = {ERROR_STATUSES: ErrorOut}
READ_ERRORS = {ERROR_STATUSES - {409, 415}: ErrorOut}
AttemptId = Path(..., ge=1, le=MAX_BIGINT, description="The attempt's id.")


def _attempt_for(request: HttpRequest, attempt_id: int) -> Attempt:
    """The caller's tenant's attempt, or 404: another tenant's looks like none at all."""
    try:
        return Attempt.objects.get(pk=attempt_id, tenant_id=_token(request).tenant_id)
    except Attempt.DoesNotExist:
        raise AttemptNotFound(AttemptNotFound.MESSAGE.format(attempt_id=attempt_id)) from None


def _only_params(request: HttpRequest, allowed: frozenset[str] = frozenset()) -> None:
    unknown = sorted(set(request.GET) - allowed)
    if unknown:
        raise ApiError(
            "unknown_field",
            f"unknown query parameter {', '.join(unknown)[:200]}"
            + (f"; this endpoint takes {', '.join(sorted(allowed))}" if allowed else ""),
        )


def _attempt_data(attempt: Attempt, *, full: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": attempt.pk,
        "task_id": attempt.task_id,
        "tool_name": attempt.tool_name,
        "idempotency_key": attempt.idempotency_key,
        "provider_key": attempt.provider_key,
        "args_hash": attempt.args_hash,
        "state": attempt.state,
        "fence": attempt.fence,
        "dispatch_fence": attempt.dispatch_fence,
        "dispatch_count": attempt.dispatch_count,
        "policy_version": attempt.policy_version,
        "credential_scope": sorted(attempt.scopes),
        "parent_id": attempt.parent_id,
        "provider_request_id": attempt.provider_request_id,
        "result_ref": attempt.result_ref,
        "last_note": attempt.last_note,
        "next_check_at": attempt.next_check_at,
        "lands_by": attempt.lands_by,
        "last_lookup": attempt.last_lookup,
        "last_lookup_at": attempt.last_lookup_at,
        "created_at": attempt.created_at,
        "updated_at": attempt.updated_at,
    }
    if full:
        data["args"] = attempt.args
        data["result"] = attempt.result
        data["result_source"] = attempt.result_source
    return data


def _event_data(event: AttemptEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "actor_kind": event.actor_kind,
        "actor_label": event.actor_label,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "fence": event.fence,
        "reason": event.reason,
        "details": event.details,
        "created_at": event.created_at,
        "hash": event.hash,
    }


@api.post(
    "/attempts",
    auth=BearerToken(WRITE),
    response={201: AttemptOut, 200: AttemptOut, **WRITE_ERRORS},
    operation_id="record_intent",
    summary="Record the intent to call a tool",
    description=(
        "201: recorded. 200: this key was already recorded with these arguments; that attempt is returned "
        "(header Idempotent-Replayed: true) whatever its state: OUTCOME_CONFIRMED carries the stored "
        "result, do not call the tool again. 409 idempotency_key_reused: the key was used with other "
        "arguments; a linked attempt (attempt_id) was recorded for review and the tool must not be called."
    ),
)
def record_intent(request: HttpRequest, response: HttpResponse, payload: IntentIn) -> Status[dict[str, Any]]:
    _only_params(request)
    recorded = recording.record_intent(
        tenant=_token(request).tenant,
        task_id=payload.task_id,
        tool_name=payload.tool_name,
        idempotency_key=payload.idempotency_key,
        args=payload.args,
        credential_scope=payload.credential_scope,
        actor=_actor(request),
    )
    if not recorded.created:
        response[REPLAYED_HEADER] = "true"
    return Status(201 if recorded.created else 200, _attempt_data(recorded.attempt))


@api.post(
    "/attempts/{attempt_id}/dispatch",
    auth=BearerToken(WRITE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="claim_dispatch",
    summary="Claim the attempt for dispatch, before the request leaves",
    description=(
        "Commits DISPATCHED and returns the attempt with its new `fence`: send that fence with the outcome. "
        "Call the provider only after this answers 200. 409 says why not: claim_lost / attempt_in_flight "
        "(another worker has it), outcome_unknown, under_review, retry_pending, attempt_failed, "
        "attempt_superseded, illegal_transition (e.g. already confirmed)."
    ),
)
def claim_dispatch(
    request: HttpRequest, attempt_id: int = AttemptId, payload: DispatchIn | None = None
) -> dict[str, Any]:
    _only_params(request)
    attempt = _attempt_for(request, attempt_id)
    recording.refuse_unless_dispatchable(attempt)
    if payload is not None and payload.fence is not None and payload.fence != attempt.fence:
        raise ClaimLost(ClaimLost.MESSAGE.format(attempt_id=attempt.pk, state=attempt.state, current=attempt.fence))
    return _attempt_data(recording.mark_dispatched(attempt, actor=_actor(request)))


@api.post(
    "/attempts/{attempt_id}/request-id",
    auth=BearerToken(WRITE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="record_request_id",
    summary="Record the provider's request id as soon as it is known",
    description="Safe to repeat with the same id. Another id than the one recorded: 409 request_id_conflict.",
)
def record_request_id(request: HttpRequest, payload: RequestIdIn, attempt_id: int = AttemptId) -> dict[str, Any]:
    _only_params(request)
    attempt = _attempt_for(request, attempt_id)
    attempt = recording.record_request_id(
        attempt, payload.provider_request_id, fence=payload.fence, actor=_actor(request)
    )
    return _attempt_data(attempt)


_OUTCOMES = ("confirmed", "failed", "failed_retryable", "unknown")


def _storable_result(value: Any) -> Any:
    if value is None:
        return None
    try:
        normalized, _ = normalize_args({"result": value})
    except InvalidArgs as exc:
        raise InvalidField(f"result cannot be stored for replay: {exc}") from None
    return normalized["result"]


@api.post(
    "/attempts/{attempt_id}/outcome",
    auth=BearerToken(WRITE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="report_outcome",
    summary="Report what the provider said, with the dispatch fence",
    description=(
        "confirmed needs a receipt (provider_request_id or result_ref): a 200 from the provider is not proof. "
        "failed_retryable: the provider guarantees it did not act. unknown: you cannot tell (timeout, lost "
        "answer). A late report (the lease already moved the attempt to UNKNOWN, a person is deciding it, or it "
        "was settled) is never dropped: it is recorded as evidence (header Ledgerdash-Late-Report: true), and "
        "raises an incident when it contradicts how the attempt was settled. Repeating a report that already "
        "landed answers 200 with Idempotent-Replayed: true; a fence that is not yours answers 409."
    ),
)
def report_outcome(
    request: HttpRequest, response: HttpResponse, payload: OutcomeIn, attempt_id: int = AttemptId
) -> dict[str, Any]:
    _only_params(request)
    attempt = _attempt_for(request, attempt_id)
    fields: dict[str, Any] = {"reason": getattr(payload, "reason", "")}
    if isinstance(payload, ConfirmedIn):
        fields = {
            "provider_request_id": payload.provider_request_id,
            "result_ref": payload.result_ref,
            "result": _storable_result(payload.result),
        }
    report = recording.report_outcome(
        attempt, outcome=payload.outcome, fence=payload.fence, actor=_actor(request), **fields
    )
    if report.replayed:
        response[REPLAYED_HEADER] = "true"
    if report.late:
        response[LATE_HEADER] = "true"
    return _attempt_data(report.attempt)


@api.post(
    "/attempts/{attempt_id}/heartbeat",
    auth=BearerToken(WRITE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="heartbeat",
    summary="Say the dispatched work is still running",
    description=(
        "Send every third of the lease while the tool runs (the Python client does it on its own): the lease is "
        "extended, and the ledger knows the request may still land (`lands_by`), so a provider's 'not found' is "
        "not taken as proof meanwhile. Only the dispatcher (the dispatch fence) may beat; 409 stale_fence when "
        "the attempt was dispatched again since."
    ),
)
def heartbeat(request: HttpRequest, payload: HeartbeatIn, attempt_id: int = AttemptId) -> dict[str, Any]:
    _only_params(request)
    attempt = _attempt_for(request, attempt_id)
    return _attempt_data(recording.heartbeat(attempt, fence=payload.fence, actor=_actor(request)))


@api.post(
    "/attempts/{attempt_id}/abandon",
    auth=BearerToken(WRITE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="abandon_intent",
    summary="Give up an intent that was never sent",
    description=(
        "INTENT_RECORDED -> FAILED: nothing was sent, so nothing happened. For an agent that re-ran its task "
        "with other arguments after a crash: its new call became a linked attempt awaiting approval "
        "(idempotency_key_reused), which the open original would otherwise block. 409 illegal_transition when "
        "the attempt was dispatched (use the outcome report instead), stale_fence when it moved since."
    ),
)
def abandon_intent(request: HttpRequest, payload: AbandonIn, attempt_id: int = AttemptId) -> dict[str, Any]:
    _only_params(request)
    attempt = _attempt_for(request, attempt_id)
    return _attempt_data(recording.abandon(attempt, reason=payload.reason, fence=payload.fence, actor=_actor(request)))


@api.get(
    "/attempts/{attempt_id}",
    auth=BearerToken(READ),
    response={200: AttemptDetailOut, **READ_ERRORS},
    operation_id="get_attempt",
    summary="One attempt, with its events",
)
def get_attempt(request: HttpRequest, attempt_id: int = AttemptId) -> dict[str, Any]:
    _only_params(request)
    attempt = _attempt_for(request, attempt_id)
    data = _attempt_data(attempt)
    data["events"] = [_event_data(e) for e in attempt.events.order_by("seq")]
    return data


LIST_PARAMS = frozenset({"idempotency_key", "needs_attention", "limit", "before"})


@api.get(
    "/attempts",
    auth=BearerToken(READ),
    response={200: AttemptListOut, **READ_ERRORS},
    operation_id="list_attempts",
    summary="The tenant's attempts, newest first: by idempotency key, or those needing attention",
    description=(
        "idempotency_key: the key's whole chain (the attempt first recorded and its linked attempts). "
        "needs_attention=true: only UNKNOWN and MANUAL_REVIEW. Page with `before`=next_before."
    ),
)
def list_attempts(
    request: HttpRequest,
    idempotency_key: str | None = Query(None, description="Only this key's attempts."),
    needs_attention: bool = Query(False, description="Only UNKNOWN and MANUAL_REVIEW attempts."),
    limit: int = Query(50, ge=1, le=200),
    before: int | None = Query(None, ge=1, le=MAX_BIGINT, description="Only attempts with a smaller id."),
) -> dict[str, Any]:
    _only_params(request, LIST_PARAMS)
    attempts = Attempt.objects.filter(tenant_id=_token(request).tenant_id)
    if idempotency_key is not None:
        attempts = attempts.filter(idempotency_key=recording.validate_key(idempotency_key))
    if needs_attention:
        attempts = attempts.filter(state__in=OWNED_STATES)
    if before is not None:
        attempts = attempts.filter(pk__lt=before)
    rows = list(attempts.order_by("-id")[: limit + 1])
    return {
        "items": [_attempt_data(a, full=False) for a in rows[:limit]],
        "next_before": rows[limit - 1].pk if len(rows) > limit else None,
    }


# --- errors: always {code, message} ------------------------------------------------------


def _ledger_error(request: HttpRequest, exc: LedgerError) -> HttpResponse:
    status = STATUS_BY_CODE.get(exc.code)
    if status is None:
        status = 422 if isinstance(exc, InvalidInput) else 409 if isinstance(exc, AttemptBlocked) else 400
        log.warning("ledger error code %s has no HTTP status; answering %s", exc.code, status)
    extra: dict[str, Any] = {}
    if isinstance(exc, AttemptBlocked):
        extra = {"attempt_id": exc.attempt.pk, "state": exc.attempt.state}
        if isinstance(exc, IdempotencyConflict):
            extra["original_id"] = exc.attempt.parent_id
        if isinstance(exc, RetryPending) and exc.attempt.next_check_at is not None:
            seconds = max(1, math.ceil((exc.attempt.next_check_at - timezone.now()).total_seconds()))
            extra["headers"] = {"Retry-After": str(seconds)}
    if isinstance(exc, AuthorizationChanged) and exc.attempt is not None:
        extra = {"attempt_id": exc.attempt.pk, "state": exc.attempt.state}
        if exc.original is not None:
            extra["original_id"] = exc.original.pk
    if isinstance(exc, ApprovalRefused):
        extra["changes"] = exc.changes
    if exc.code == "ledger_unavailable":
        extra["headers"] = {"Retry-After": "1"}
    if isinstance(exc, TokenError):
        log.info("API request refused: %s", exc.code)
    return error_response(status, exc.code, str(exc), **extra)


def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return error_response(exc.status, exc.code, exc.message, **exc.extra)


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    # ninja prefixes the source ("body", "query", "path") and the parameter name.
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        source, parts = parts[0], parts[1:]
        if source == "body" and parts and parts[0] == "payload":
            parts = parts[1:]
        # the outcome union adds the variant's tag; the caller knows which it sent
        if source == "body" and parts and parts[0] in _OUTCOMES:
            parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    errors = [
        {"field": _field_name(e.get("loc", ())), "message": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors
    ]
    extra_only = bool(errors) and all(e["type"] == "extra_forbidden" for e in errors)
    code = "unknown_field" if extra_only else "validation_error"
    first = errors[0] if errors else {"field": "body", "message": "invalid"}
    message = f"{first['field']}: {first['message']}"
    if extra_only:
        message = f"unknown field {', '.join(e['field'] for e in errors)[:300]}"
    elif len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return error_response(422, code, message, errors=errors)


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps whatever the parser raised; answer with what the parser said.
    if isinstance(exc.__cause__, ApiError):
        return _api_error(request, exc.__cause__)
    if exc.status_code == 401:
        return error_response(401, "missing_token", MISSING_TOKEN)
    code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    return error_response(exc.status_code, code, str(exc))


def _no_endpoint(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """A path (or an exception handler's Http404) the API does not serve."""
    return error_response(404, "not_found", f"no API endpoint at {request.path}")


def _too_large(request: HttpRequest, exc: Exception) -> HttpResponse:
    return _body_too_large()


def _suspicious(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error_response(400, "bad_request", "the request was refused as malformed")


def _unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.warning("API request failed, the database is unavailable: %s", exc)
    return error_response(
        503, "ledger_unavailable", "the ledger's database is unavailable; retry later", headers={"Retry-After": "1"}
    )


def _internal(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("API request failed: %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal_error", "the ledger failed to answer; nothing is known to have changed")


for _exc, _handler in (
    (LedgerError, _ledger_error),
    (ApiError, _api_error),
    (NinjaValidationError, _validation_error),
    (HttpError, _http_error),
    (Http404, _no_endpoint),
    (RequestDataTooBig, _too_large),
    (SuspiciousOperation, _suspicious),
    (OperationalError, _unavailable),
    (InterfaceError, _unavailable),
    (Exception, _internal),
):
    api.add_exception_handler(_exc, _handler)  # type: ignore[arg-type]


# --- what is checked before ninja sees a request -----------------------------------------


def _body_too_large() -> HttpResponse:
    limit = settings.LEDGER_API_MAX_BODY_BYTES
    return error_response(413, "body_too_large", f"the request body is over the limit of {limit} bytes")


def _refuse_body(request: HttpRequest) -> HttpResponse | None:
    """Refuse a body over LEDGER_API_MAX_BODY_BYTES: by its Content-Length
    before reading a byte, and by what was actually read. Checked before
    Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE), which would answer 400."""
    limit = settings.LEDGER_API_MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH", "")
    if declared:
        if not declared.strip().isdigit():
            return error_response(400, "invalid_content_length", "Content-Length is not a number")
        if int(declared) > limit:
            return _body_too_large()
    elif "HTTP_TRANSFER_ENCODING" in request.META:
        return error_response(411, "length_required", "send a Content-Length; chunked bodies are not read")
    try:
        body = request.body
    except RequestDataTooBig:
        return _body_too_large()
    if len(body) > limit:
        return _body_too_large()
    return None


def _guard(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _refuse_body(request)
        if refused is not None:
            return refused
        try:
            response = view(request, *args, **kwargs)
        except Http404:
            return _no_endpoint(request)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith(JSON_TYPE):
            allow = response.get("Allow", "")
            return error_response(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed here; use {allow}",
                headers={"Allow": allow},
            )
        return response

    guarded.csrf_exempt = True  # type: ignore[attr-defined]
    return guarded


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, each behind the body check, with JSON answers
    for unknown paths and methods. Include under ``api/v1/``."""
    patterns, app_name, namespace = api.urls
    guarded: list[URLPattern | URLResolver] = []
    for pattern in patterns:
        assert isinstance(pattern, URLPattern)
        guarded.append(URLPattern(pattern.pattern, _guard(pattern.callback), pattern.default_args, pattern.name))
    guarded.append(re_path(r"", _guard(_no_endpoint), name="no-endpoint"))
    return guarded, app_name, namespace

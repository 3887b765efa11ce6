"""The attempt endpoints: each parses, calls one function of
:mod:`ledgerdash.ledger.recording` and returns the attempt's answer in its
response schema (:mod:`ledgerdash.ledger.api_schemas`).

Each answer is made whole in the view (:func:`_whole`): what its schema
shows from other tables (the owner, the events) is read there and the
schema is filled there, inside the API's error handling. A database error
from a read made later, while django-ninja renders the answer, would reach
pydantic, which turns it into a validation error: a 500 where a failing
database must answer 503 ``ledger_unavailable`` with ``Retry-After``
(``tests/test_answers_under_trouble.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.db.models import Prefetch, QuerySet, prefetch_related_objects
from django.http import HttpRequest, HttpResponse
from ninja import Path, Query, Router
from ninja.responses import Status

from ledgerdash.ledger import moves, recording, store
from ledgerdash.ledger.api.auth import READ, WRITE, BearerToken, actor_of, token_of
from ledgerdash.ledger.api.errors import ApiError
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
from ledgerdash.ledger.errors import ClaimLost, InvalidArgs, InvalidField
from ledgerdash.ledger.models import OWNED_STATES, Attempt, AttemptEvent

REPLAYED_HEADER = "Idempotent-Replayed"
LATE_HEADER = "Ledgerdash-Late-Report"

ERROR_STATUSES = frozenset({400, 401, 403, 404, 409, 413, 415, 422, 500, 503})
WRITE_ERRORS = {ERROR_STATUSES: ErrorOut}
READ_ERRORS = {ERROR_STATUSES - {409, 415}: ErrorOut}
#: The longest long poll: well inside the web server's worker timeout.
MAX_WAIT_SECONDS = 25
GET_PARAMS = frozenset({"wait", "fence"})
#: How often a long poll reads the attempt again (one primary-key read).
POLL_SECONDS = 0.25


AttemptId = Path(..., ge=1, le=MAX_BIGINT, description="The attempt's id.")

router = Router()


def _attempt_for(request: HttpRequest, attempt_id: int) -> Attempt:
    """The caller's tenant's attempt, or 404: another tenant's looks like none at all."""
    return moves.get_attempt(attempt_id, tenant_id=token_of(request).tenant_id)


def _answered(attempt: Attempt) -> AttemptOut:
    """The answer after a write: made whole (:func:`_whole`), then the attempt
    is handed to the worker's copies for the agent's next request on it (or
    its copy dropped, when the write read back no row version)."""
    answer = _whole(attempt)
    store.remember(attempt)
    return answer


def _acting_on(request: HttpRequest, attempt_id: int, act: Callable[[Attempt], Attempt]) -> Attempt:
    """``act`` on the caller's tenant's attempt (404 for another tenant's), from
    the copy this worker kept when it last wrote it where that saves the read
    (:func:`ledgerdash.ledger.moves.on_attempt`; ``act`` may run twice, and
    only the run whose answer is returned wrote anything)."""
    return moves.on_attempt(attempt_id, tenant_id=token_of(request).tenant_id, act=act)


def _whole(attempt: Attempt, *, events: bool = False) -> AttemptOut:
    """The answer about ``attempt``, made in the view, inside the API's error handling: what it shows
    from other tables is read now. django-ninja renders an instance of the response's own schema as it
    is, without reading it again."""
    lookups: list[str | Prefetch[str]] = []
    if attempt.owner_id is not None and not Attempt.owner.is_cached(attempt):
        lookups.append("owner")
    if events:
        lookups.append(Prefetch("events", queryset=AttemptEvent.objects.order_by("seq")))
    if lookups:
        prefetch_related_objects([attempt], *lookups)
    return (AttemptDetailOut if events else AttemptOut).model_validate(attempt)


def _only_params(request: HttpRequest, allowed: frozenset[str] = frozenset()) -> None:
    if not request.META.get("QUERY_STRING"):
        return  # nothing sent: the query dict is not built for it
    unknown = sorted(set(request.GET) - allowed)
    if unknown:
        raise ApiError(
            "unknown_field",
            f"unknown query parameter {', '.join(unknown)[:200]}"
            + (f"; this endpoint takes {', '.join(sorted(allowed))}" if allowed else ""),
        )


@router.post(
    "/attempts",
    auth=BearerToken(WRITE),
    response={201: AttemptOut, 200: AttemptOut, **WRITE_ERRORS},
    operation_id="record_intent",
    summary="Record the intent to call a tool",
    description=(
        "201: recorded. 200: this key was already recorded with these arguments; that attempt is returned "
        "(header Idempotent-Replayed: true) whatever its state: OUTCOME_CONFIRMED carries the stored "
        "result, do not call the tool again. With claim: true, a 201 in state DISPATCHED is yours to send "
        "(the claim committed with the intent). 409 idempotency_key_reused: the key was used with other "
        "arguments; a linked attempt (attempt_id) was recorded for review and the tool must not be called. "
        "409 awaiting_approval: the tenant's policy holds this call for an approver; send the same request "
        "again after Retry-After (once approved it answers 200, once rejected 409 approval_rejected)."
    ),
)
def record_intent(request: HttpRequest, response: HttpResponse, payload: IntentIn) -> Status[AttemptOut]:
    _only_params(request)
    recorded = recording.record_intent(
        tenant=token_of(request).tenant,
        task_id=payload.task_id,
        tool_name=payload.tool_name,
        idempotency_key=payload.idempotency_key,
        args=payload.args,
        credential_scope=payload.credential_scope,
        actor=actor_of(request),
        # the person who issued the token is behind the agent: they may not approve its calls
        requested_by_id=token_of(request).created_by_id,
        api_token_id=token_of(request).pk,
        claim=payload.claim,
    )
    # a call the policy holds for an approver: 409 awaiting_approval (Retry-After) or approval_rejected
    recording.refuse_while_approval_pending(recorded.attempt)
    if not recorded.created:
        response[REPLAYED_HEADER] = "true"
    return Status(201 if recorded.created else 200, _answered(recorded.attempt))


@router.post(
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
def claim_dispatch(request: HttpRequest, attempt_id: int = AttemptId, payload: DispatchIn | None = None) -> AttemptOut:
    _only_params(request)
    actor = actor_of(request)

    def claim(attempt: Attempt) -> Attempt:
        recording.refuse_unless_dispatchable(attempt)
        if payload is not None and payload.fence is not None and payload.fence != attempt.fence:
            raise ClaimLost(
                ClaimLost.FENCE_MESSAGE.format(
                    attempt_id=attempt.pk, state=attempt.state, current=attempt.fence, given=payload.fence
                )
            )
        return recording.mark_dispatched(attempt, actor=actor)

    return _answered(_acting_on(request, attempt_id, claim))


@router.post(
    "/attempts/{attempt_id}/request-id",
    auth=BearerToken(WRITE),
    response={200: AttemptOut, **WRITE_ERRORS},
    operation_id="record_request_id",
    summary="Record the provider's request id as soon as it is known",
    description="Safe to repeat with the same id. Another id than the one recorded: 409 request_id_conflict. An "
    "id the ledger recorded on another side effect (another key of the tool): 409 request_id_taken (holder_id), "
    "kept as evidence with an incident.",
)
def record_request_id(request: HttpRequest, payload: RequestIdIn, attempt_id: int = AttemptId) -> AttemptOut:
    _only_params(request)
    actor = actor_of(request)

    def record(attempt: Attempt) -> Attempt:
        return recording.record_request_id(attempt, payload.provider_request_id, fence=payload.fence, actor=actor)

    return _answered(_acting_on(request, attempt_id, record))


def _storable_result(value: Any) -> Any:
    if value is None:
        return None
    try:
        normalized, _ = normalize_args({"result": value})
    except InvalidArgs as exc:
        raise InvalidField(f"result cannot be stored for replay: {exc}") from None
    return normalized["result"]


@router.post(
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
        "landed answers 200 with Idempotent-Replayed: true; a fence that is not yours answers 409. A receipt "
        "naming a provider request id the ledger recorded on another side effect answers 409 request_id_taken "
        "(holder_id: that attempt); it is kept as evidence, with an incident naming both."
    ),
)
def report_outcome(
    request: HttpRequest, response: HttpResponse, payload: OutcomeIn, attempt_id: int = AttemptId
) -> AttemptOut:
    _only_params(request)
    fields: dict[str, Any] = {"reason": getattr(payload, "reason", "")}
    if isinstance(payload, ConfirmedIn):
        fields = {
            "provider_request_id": payload.provider_request_id,
            "result_ref": payload.result_ref,
            "result": _storable_result(payload.result),
        }
    actor = actor_of(request)
    reports: list[moves.Report] = []

    def report(attempt: Attempt) -> Attempt:
        reports[:] = [
            recording.report_outcome(attempt, outcome=payload.outcome, fence=payload.fence, actor=actor, **fields)
        ]
        return reports[0].attempt

    attempt = _acting_on(request, attempt_id, report)
    if reports[0].replayed:
        response[REPLAYED_HEADER] = "true"
    if reports[0].late:
        response[LATE_HEADER] = "true"
    return _answered(attempt)


@router.post(
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
def heartbeat(request: HttpRequest, payload: HeartbeatIn, attempt_id: int = AttemptId) -> AttemptOut:
    _only_params(request)
    actor = actor_of(request)

    def beat(attempt: Attempt) -> Attempt:
        return recording.heartbeat(attempt, fence=payload.fence, actor=actor)

    return _answered(_acting_on(request, attempt_id, beat))


@router.post(
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
def abandon_intent(request: HttpRequest, payload: AbandonIn, attempt_id: int = AttemptId) -> AttemptOut:
    _only_params(request)
    actor = actor_of(request)

    def abandon(attempt: Attempt) -> Attempt:
        return recording.abandon(attempt, reason=payload.reason, fence=payload.fence, actor=actor)

    return _answered(_acting_on(request, attempt_id, abandon))


@router.get(
    "/attempts/{attempt_id}",
    auth=BearerToken(READ),
    response={200: AttemptDetailOut, **READ_ERRORS},
    operation_id="get_attempt",
    summary="One attempt, with its events; optionally once it changes (long poll)",
    description=(
        "With `wait`, an agent learns of a decision without polling: the request is answered as soon as "
        "the attempt moves (approved, rejected, settled by recovery), or when the wait ends. Each waiting "
        "request holds one web worker for its length."
    ),
)
def get_attempt(
    request: HttpRequest,
    attempt_id: int = AttemptId,
    wait: float = Query(
        0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description=(
            f"Seconds (at most {MAX_WAIT_SECONDS}) to wait for the attempt to change before answering: "
            "the answer comes as soon as its fence differs from `fence`, else when the wait ends, with the "
            "attempt as it is. 0: at once."
        ),
    ),
    fence: int | None = Query(
        None,
        ge=0,
        le=MAX_BIGINT,
        description="The fence the caller last saw (default: the attempt's fence when the request arrives).",
    ),
) -> AttemptOut:
    _only_params(request, GET_PARAMS)
    attempt = _attempt_for(request, attempt_id)
    if wait > 0:
        attempt = _changed(attempt, attempt.fence if fence is None else fence, _monotonic() + wait)
    return _whole(attempt, events=True)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _monotonic() -> float:
    return time.monotonic()


def _changed(attempt: Attempt, seen_fence: int, deadline: float) -> Attempt:
    """``attempt`` once its fence moves past ``seen_fence`` (every move of
    the attempt changes it), or as it is at ``deadline``. Each read is its
    own autocommitted query, so it sees what other processes committed."""
    while attempt.fence == seen_fence:
        left = deadline - _monotonic()
        if left <= 0:
            break
        _sleep(min(POLL_SECONDS, left))
        attempt = Attempt.objects.get(pk=attempt.pk)
    return attempt


LIST_PARAMS = frozenset({"idempotency_key", "needs_attention", "limit", "before"})


@router.get(
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
    attempts: QuerySet[Attempt] = Attempt.objects.filter(tenant_id=token_of(request).tenant_id)
    if idempotency_key is not None:
        attempts = attempts.filter(idempotency_key=recording.validate_key(idempotency_key))
    if needs_attention:
        attempts = attempts.filter(state__in=OWNED_STATES)
    if before is not None:
        attempts = attempts.filter(pk__lt=before)
    rows = list(attempts.select_related("owner").order_by("-id")[: limit + 1])
    return {"items": rows[:limit], "next_before": rows[limit - 1].pk if len(rows) > limit else None}

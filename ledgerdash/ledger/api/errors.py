"""The API's error answers: always ``{"code": …, "message": …}``, with the status of the code.

Every exception a view can raise is turned into such an answer here, so the
endpoints raise ledger errors (or :class:`ApiError`) and never build one.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError

from ledgerdash.ledger import clock
from ledgerdash.ledger.api.rendering import JSON_TYPE, encode
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    AttemptBlocked,
    AttemptInFlight,
    AuthorizationChanged,
    AwaitingApproval,
    IdempotencyConflict,
    InvalidInput,
    LedgerError,
    RequestIdTaken,
    RetryPending,
    SideEffectInFlight,
    TokenError,
)
from ledgerdash.ledger.models import ApiToken, Attempt, State
from ledgerdash.ops.logs import first_line
from ledgerdash.ops.requests import note_problem
from ledgerdash.ops.unavailable import is_unavailable
from ledgerdash_client import errorcodes

log = logging.getLogger("ledgerdash.api")

#: HTTP status of each ledger error code, from the table of codes.
STATUS_BY_CODE: dict[str, int] = {row.code: row.status for row in errorcodes.TABLE if row.origin == "ledger"}

#: Codes the API itself answers with (not ledger errors), and their statuses.
API_CODES: dict[str, int] = {row.code: row.status for row in errorcodes.TABLE if row.origin == "api"}

#: What a request without a usable Authorization header is told.
MISSING_TOKEN = "send the API token as `Authorization: Bearer <token>`"  # noqa: S105 - a message

#: Names of a validation error's location that only say where ninja found the value.
_OUTCOMES = ("confirmed", "failed", "failed_retryable", "unknown")


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
    if headers and "Retry-After" in headers:
        # the wait in the body too: a client that reads only the body (or loses headers) still has it
        extra.setdefault("retry_after", int(headers["Retry-After"]))
    body = {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    response = HttpResponse(encode(body), status=status, content_type=f"{JSON_TYPE}; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="ledgerdash"' + (
            "" if code == "missing_token" else ', error="invalid_token"'
        )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def body_too_large() -> HttpResponse:
    limit = settings.LEDGER_API_MAX_BODY_BYTES
    return error_response(413, "body_too_large", f"the request body is over the limit of {limit} bytes")


def no_endpoint(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """A path (or an exception handler's Http404) the API does not serve."""
    return error_response(404, "not_found", f"no API endpoint at {request.path}")


def _seconds_until(when: datetime | None) -> int:
    """Seconds from now until ``when``, a time of the ledger's (a lease's end, a back-off's):
    counted on the ledger's clock, whatever this web node's own says."""
    if when is None:
        return 1
    return max(1, math.ceil((when - clock.now()).total_seconds()))


def _attempt_in_path(request: HttpRequest) -> Attempt | None:
    """The caller's tenant's attempt the request's path names, as it is now."""
    match = getattr(request, "resolver_match", None)
    raw = str(match.kwargs.get("attempt_id", "")) if match is not None else ""
    token = getattr(request, "auth", None)
    if not (raw.isascii() and raw.isdigit() and 0 < len(raw) < 19) or not isinstance(token, ApiToken):
        return None
    return Attempt.objects.filter(pk=int(raw), tenant_id=token.tenant_id).only("pk", "state").first()


def _ledger_error(request: HttpRequest, exc: LedgerError) -> HttpResponse:
    status = STATUS_BY_CODE.get(exc.code)
    if status is None:
        status = 422 if isinstance(exc, InvalidInput) else 409 if isinstance(exc, AttemptBlocked) else 400
        log.warning("ledger error code %s has no HTTP status; answering %s", exc.code, status)
    extra: dict[str, Any] = {}
    if isinstance(exc, AttemptBlocked):
        extra = {"attempt_id": exc.attempt.pk, "state": exc.attempt.state}
        if isinstance(exc, IdempotencyConflict):
            extra["original_id"] = exc.original_id
        if isinstance(exc, SideEffectInFlight):
            # until a request of the side effect can no longer land (unknown: about a claim's length)
            extra["headers"] = {
                "Retry-After": str(_seconds_until(exc.due) if exc.due else settings.LEDGER_RECONCILER_CLAIM_SECONDS)
            }
        elif isinstance(exc, RetryPending) and exc.attempt.next_check_at is not None:
            extra["headers"] = {"Retry-After": str(_seconds_until(exc.attempt.next_check_at))}
        if isinstance(exc, AwaitingApproval):
            seconds = settings.LEDGER_APPROVAL_RETRY_AFTER_SECONDS
            extra["retry_after"] = seconds
            extra["headers"] = {"Retry-After": str(seconds)}
    if isinstance(exc, AuthorizationChanged) and exc.attempt is not None:
        extra = {"attempt_id": exc.attempt.pk, "state": exc.attempt.state}
        if exc.original is not None:
            extra["original_id"] = exc.original.pk
    if isinstance(exc, AttemptInFlight) and exc.attempt.state == State.DISPATCHED:
        # the dispatcher's lease: after it, recovery takes the attempt over
        extra["headers"] = {"Retry-After": str(_seconds_until(exc.attempt.next_check_at))}
    if isinstance(exc, ApprovalRefused):
        extra["changes"] = exc.changes
    if isinstance(exc, RequestIdTaken):
        extra["holder_id"] = exc.holder_id
    if "attempt_id" not in extra and (attempt := _attempt_in_path(request)) is not None:
        # every error about an attempt says which, and where it stands now
        extra.update(attempt_id=attempt.pk, state=attempt.state)
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


def _too_large(request: HttpRequest, exc: Exception) -> HttpResponse:
    return body_too_large()


def _suspicious(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error_response(400, "bad_request", "the request was refused as malformed")


def _unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    note_problem(request, f"the database is unavailable: {first_line(exc)}")
    return error_response(
        503, "ledger_unavailable", "the ledger's database is unavailable; retry later", headers={"Retry-After": "1"}
    )


def _database_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A database error: unavailable (a server taking no writes) or the ledger's own failure."""
    return _unavailable(request, exc) if is_unavailable(exc) else _internal(request, exc)


def _internal(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("API request failed: %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal_error", "the ledger failed to answer; nothing is known to have changed")


def install_handlers(api: NinjaAPI) -> None:
    """Answer every exception a view raises with ``{code, message}``."""
    for exc, handler in (
        (LedgerError, _ledger_error),
        (ApiError, _api_error),
        (NinjaValidationError, _validation_error),
        (HttpError, _http_error),
        (Http404, no_endpoint),
        (RequestDataTooBig, _too_large),
        (SuspiciousOperation, _suspicious),
        (OperationalError, _unavailable),
        (InterfaceError, _unavailable),
        (DatabaseError, _database_error),
        (Exception, _internal),
    ):
        api.add_exception_handler(exc, handler)  # type: ignore[arg-type]

"""One log line and one metric sample per request, with a request id.

The request id is the proxy's ``X-Request-ID`` when it sends a sane one,
else a new one; it is answered in ``X-Request-ID`` so a client's report
can be found in the log, and every other line written while the request
is served carries it (:mod:`ledgerdash.ops.logs`). What went wrong beside
the status (the database unavailable) is said on the same line, logged as
a warning. Health checks are logged at DEBUG only: a load balancer asks
every few seconds.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable

from django.http import HttpRequest
from django.http.response import HttpResponseBase

from ledgerdash.ops.logs import current_request_id
from ledgerdash.ops.metrics import REQUEST_SECONDS

log = logging.getLogger("ledgerdash.requests")

QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id(request: HttpRequest) -> str:
    given = request.META.get("HTTP_X_REQUEST_ID", "")  # not request.headers: it maps every header first
    return given if _REQUEST_ID.match(given) else uuid.uuid4().hex


#: What a request's line says went wrong beside its status (set with :func:`note_problem`).
_PROBLEM = "_ledger_problem"


def note_problem(request: HttpRequest, problem: str) -> None:
    """Say on the request's one log line what went wrong (it is then logged as a warning)."""
    setattr(request, _PROBLEM, problem)


class RequestLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        rid = request_id(request)
        request.request_id = rid  # type: ignore[attr-defined]
        token = current_request_id.set(rid)
        try:
            response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        seconds = time.perf_counter() - started
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else "unmatched"
        REQUEST_SECONDS.labels(route=route, method=request.method or "", status=str(response.status_code)).observe(
            seconds
        )
        response["X-Request-ID"] = rid
        problem = getattr(request, _PROBLEM, None)
        level = logging.WARNING if problem else logging.DEBUG if request.path in QUIET_PATHS else logging.INFO
        if not log.isEnabledFor(level):
            return response  # the line's fields are not gathered for a level nobody keeps
        kwargs = match.kwargs if match is not None else {}
        attempt = kwargs.get("pk") if "attempts/" in route else kwargs.get("attempt_id")
        log.log(
            level,
            "%s %s %s %.1fms%s",
            request.method,
            request.path,
            response.status_code,
            seconds * 1000,
            f": {problem}" if problem else "",
            extra={
                "problem": problem,
                "request_id": rid,
                "method": request.method,
                "path": request.path,
                "route": route,
                "status": response.status_code,
                "duration_ms": round(seconds * 1000, 1),
                "user": getattr(getattr(request, "user", None), "pk", None)
                if hasattr(request, "_cached_user")
                else None,
                "tenant": getattr(getattr(request, "auth", None), "tenant_id", None),
                "attempt": attempt,
            },
        )
        return response

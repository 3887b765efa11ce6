"""When the database is down, refusing connections, too slow or taking no writes: a fast, clean 503.

A lost connection, "too many clients", a pool with no free connection, or a
statement ended by ``statement_timeout`` / ``lock_timeout`` all reach Django
as ``OperationalError`` or ``InterfaceError``; a server that answers but
takes no writes (a standby after a failover, still reached through a pooler
or an old address) as an ``InternalError`` whose SQLSTATE is 25006,
``read_only_sql_transaction``. Instead of a 500, the
dashboard answers a page in its own look and the API its JSON
``ledger_unavailable``, both with status 503 and ``Retry-After``; nothing
was changed (the ledger's transactions commit whole or not at all). The
connection that failed is closed at the end of the request and the next
request connects afresh (``CONN_HEALTH_CHECKS``), so the app recovers by
itself when the database is back.

Two places catch it: the middleware, for errors raised in a view, and the
500 handler, for errors raised in a middleware (a session read, the login
throttle) before any view ran.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.template import loader
from django.views.decorators.csrf import requires_csrf_token

from ledgerdash.ops import errorpages
from ledgerdash.ops.logs import first_line
from ledgerdash.ops.requests import note_problem

log = logging.getLogger(__name__)

#: Seconds a client should wait before trying again.
RETRY_AFTER = 5
UNAVAILABLE_ERRORS = (OperationalError, InterfaceError)
#: SQLSTATEs of a server that answers but cannot take the ledger's writes now: a read-only transaction
#: (a hot standby, ``default_transaction_read_only``).
UNAVAILABLE_STATES = frozenset({"25006"})
API_PREFIX = "/api/"
MESSAGE = "the ledger's database is unavailable; nothing was changed, retry later"


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve the request now (rather than that the request or
    the code is wrong): unreachable, overloaded, timed out, or taking no writes."""
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    return isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) in UNAVAILABLE_STATES


def unavailable_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    note_problem(request, f"the database is unavailable: {first_line(exc)}")
    if request.path.startswith(API_PREFIX):
        response = HttpResponse(
            json.dumps({"code": "ledger_unavailable", "message": MESSAGE, "retry_after": RETRY_AFTER}),
            status=503,
            content_type="application/json; charset=utf-8",
        )
    else:
        try:
            body = loader.get_template("503.html").render(
                {"stylesheet": errorpages.stylesheet(), "retry_after": RETRY_AFTER}
            )
        except Exception:
            log.exception("the 503 page could not be rendered; serving the fixed one")
            body = errorpages.FALLBACK
        response = HttpResponse(body, status=503)
        # A page left open reloads itself once the wait is over (no script: the CSP allows none inline).
        response["Refresh"] = str(RETRY_AFTER)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if is_unavailable(exc):
            return unavailable_response(request, exc)
        return None


@requires_csrf_token
def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    """The 500 handler: a 503 when what failed was the database, else the 500 page."""
    import sys

    exc = sys.exc_info()[1]
    if exc is not None and is_unavailable(exc):
        return unavailable_response(request, exc)
    return errorpages.server_error(request, template_name)

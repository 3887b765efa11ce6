"""``/healthz`` and ``/readyz``: unauthenticated, cheap, for load balancers and orchestrators.

- ``/healthz``: the process answers (no database): restart it when this fails.
- ``/readyz``: the database answers, takes writes (not a standby reached
  after a failover) and has every migration this code knows applied: send
  traffic only when this passes. A failing check answers 503
  with JSON naming it.

Both are answered by :class:`ProbeMiddleware`, in ``MIDDLEWARE`` after the
request log (so they are timed and counted) and
before anything reads the ``Host`` header: a container's health check or a
load balancer asks by IP address (``Host: 127.0.0.1:8000``), which
``ALLOWED_HOSTS`` rightly refuses for every other page. The answers build no
URL and carry nothing about the deployment, so the host they were asked by
does not matter. (``SECURE_REDIRECT_EXEMPT`` keeps them on plain HTTP too.)
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.urls import resolve
from django.views.decorators.http import require_GET

from ledgerdash.ops.logs import first_line

#: Once this process saw every migration applied it stops asking: they are not unapplied under a running app.
_migrations_applied = False


def database_problem() -> str | None:
    """None when the database answers and takes writes, through the connection the app's requests use
    (a standby reached after a failover answers, read-only)."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            if connection.vendor != "postgresql":
                cursor.execute("SELECT 1")
                return None
            cursor.execute("SHOW transaction_read_only")
            row = cursor.fetchone()
    except DatabaseError as exc:
        return f"unreachable: {first_line(exc)}"
    if row is not None and row[0] == "on":
        return "read-only: it answers but takes no writes (a standby, or default_transaction_read_only)"
    return None


def _migrations() -> str | None:
    global _migrations_applied
    if _migrations_applied:
        return None
    connection = connections[DEFAULT_DB_ALIAS]
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _backwards in plan[:5])
        return f"{len(plan)} not applied (run manage.py migrate as the owner role): {names}"
    _migrations_applied = True
    return None


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    problem = database_problem()
    checks["database"] = problem or "ok"
    if problem:
        checks["migrations"] = "not checked"
    else:
        try:
            checks["migrations"] = _migrations() or "ok"
        except DatabaseError as exc:
            checks["migrations"] = f"could not be read: {exc}"
    ready = all(value == "ok" for value in checks.values())
    response = JsonResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks}, status=200 if ready else 503
    )
    if not ready:
        response["Retry-After"] = "5"
    return response


PROBES = frozenset({"/healthz", "/readyz"})


class ProbeMiddleware:
    """Answer ``/healthz`` and ``/readyz`` whatever the ``Host`` header says."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info not in PROBES:
            return self.get_response(request)
        request.resolver_match = match = resolve(request.path_info)  # the request log's route
        response: HttpResponse = match.func(request)
        return response

"""``/healthz`` and ``/readyz``: unauthenticated, cheap, for load balancers and orchestrators.

- ``/healthz``: the process answers (no database): restart it when this fails.
- ``/readyz``: the database answers and every migration this code knows is
  applied: send traffic only when this passes. A failing check answers 503
  with JSON naming it.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

#: Once this process saw every migration applied it stops asking: they are not unapplied under a running app.
_migrations_applied = False


def _database() -> str | None:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return f"unreachable: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
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
    problem = _database()
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

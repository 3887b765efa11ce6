"""Every API endpoint and dashboard page answers a database failure with a
clean 503, wherever in the request the failure strikes.

For each table the app reads, every query that touches it fails as a lock
timeout or a terminated session does (``OperationalError``), through
:meth:`connection.execute_wrapper`; every endpoint and page is asked in
turn. The only acceptable answers are 2xx/3xx/4xx (the request did not need
that table) or 503 with ``Retry-After``: never a 500, which would mean part
of the answer was built outside the error boundary (a lazy read while the
response is rendered). The PostgreSQL tests with real locks and terminated
sessions are in ``tests/test_database_trouble.py``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.apps import apps
from django.db import OperationalError, connection
from django.test import Client

from ledgerdash.ledger.models import State, Tenant
from tests.api_support import BASE, issue_token
from tests.conftest import record
from tests.factories import attempt_in

pytestmark = pytest.mark.django_db

#: Every table of the app's own models, and the session and user tables every page reads.
TABLES = sorted(
    {
        model._meta.db_table
        for model in apps.get_models()
        if model._meta.app_label in ("ledger", "reviews", "notify", "auth", "sessions", "drill") and model._meta.managed
    }
)


@contextlib.contextmanager
def failing(table: str) -> Iterator[list[str]]:
    """Every query that names ``table`` fails as under a held lock; the queries that failed."""
    failed: list[str] = []
    quoted = (f'"{table}"', f"`{table}`", f" {table} ", f" {table}\n")

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if any(name in sql for name in quoted) or sql.endswith(f" {table}"):
            failed.append(sql[:80])
            raise OperationalError("canceling statement due to lock timeout")
        return run(sql, params, many, context)

    with connection.execute_wrapper(execute):
        yield failed


def api_requests(attempt_id: int, unknown_id: int) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("get", f"/attempts/{attempt_id}", None),
        ("get", f"/attempts/{attempt_id}?wait=0.01", None),
        ("get", "/attempts?needs_attention=true", None),
        ("get", "/attempts?idempotency_key=invoice:7:send", None),
        (
            "post",
            "/attempts",
            {"task_id": "t", "tool_name": "send_email", "idempotency_key": "k-new", "args": {"a": 1}},
        ),
        ("post", f"/attempts/{attempt_id}/dispatch", None),
        ("post", f"/attempts/{attempt_id}/request-id", {"provider_request_id": "req-1", "fence": 1}),
        ("post", f"/attempts/{attempt_id}/heartbeat", {"fence": 1}),
        ("post", f"/attempts/{attempt_id}/outcome", {"outcome": "unknown", "fence": 1, "reason": "timeout"}),
        ("post", f"/attempts/{attempt_id}/abandon", {"reason": "gave up", "fence": 0}),
        ("post", f"/attempts/{unknown_id}/outcome", {"outcome": "failed", "fence": 1, "reason": "declined"}),
    ]


PAGES = [
    "/",
    "/queues/unknown/",
    "/queues/review/",
    "/approvals/",
    "/attempts/",
    "/attempts/{unknown}/",
    "/attempts/{unknown}/report/",
    "/incidents/",
    "/members/",
    "/tenants/{tenant}/settings/",
    "/notifications/",
    "/drills/",
]


def acceptable(response: Any) -> bool:
    if response.status_code == 503:
        return int(response.headers.get("Retry-After", "0")) > 0
    return response.status_code < 500


def test_every_endpoint_answers_a_failing_table_with_503(tenant_a: Tenant, admin_a: Any) -> None:
    token = issue_token(tenant_a)
    api = Client(raise_request_exception=False)
    page = Client(raise_request_exception=False)
    page.force_login(admin_a)
    attempt = record(tenant_a)
    unknown = attempt_in(State.UNKNOWN, tenant_a, key="trouble-unknown")
    paths = [p.format(unknown=unknown.pk, tenant=tenant_a.slug) for p in PAGES]
    wrong: list[str] = []
    for table in TABLES:
        for method, path, body in api_requests(attempt.pk, unknown.pk):
            with failing(table):
                response = getattr(api, method)(
                    BASE + path,
                    data=body if body is None else json.dumps(body),
                    content_type="application/json",
                    headers={"Authorization": f"Bearer {token}"},
                )
            if not acceptable(response):
                wrong.append(f"{table}: {method.upper()} {path}: {response.status_code} {response.content[:120]!r}")
        for path in paths:
            with failing(table):
                response = page.get(path)
            if not acceptable(response):
                wrong.append(f"{table}: GET {path}: {response.status_code}")
    assert wrong == [], "\n".join(wrong)


def test_the_attempt_is_read_whole_before_its_answer_is_rendered(tenant_a: Tenant) -> None:
    """The lazy read that once answered 500: the events, read while the answer was rendered."""
    token = issue_token(tenant_a)
    attempt = record(tenant_a)
    api = Client(raise_request_exception=False)
    with failing("ledger_attemptevent") as failed:
        response = api.get(f"{BASE}/attempts/{attempt.pk}", headers={"Authorization": f"Bearer {token}"})
    assert failed, "the events were never read"
    assert response.status_code == 503, response.content
    assert response.json()["code"] == "ledger_unavailable"
    assert int(response.headers["Retry-After"]) > 0

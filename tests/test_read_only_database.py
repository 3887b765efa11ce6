"""A database that answers but takes no writes (a standby after a failover,
reached through a pooler that still routes to it) is unavailable, not a bug:
every write answers 503 with Retry-After, the API's ``ledger_unavailable``
and the dashboard's page alike, and ``/readyz`` says it cannot write.

On a real PostgreSQL session set read-only (``default_transaction_read_only``),
as a hot standby refuses writes (SQLSTATE 25006, ``ReadOnlySqlTransaction``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from ledgerdash.ledger.models import Attempt, Tenant
from tests.api_support import BASE, issue_token
from tests.conftest import record

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def read_only() -> Iterator[None]:
    """From here on, this connection's transactions cannot write (as on a standby)."""
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_read_only")


def test_a_write_to_a_read_only_database_answers_503_through_the_api(
    tenant_a: Tenant, request: pytest.FixtureRequest
) -> None:
    token = issue_token(tenant_a)
    request.getfixturevalue("read_only")
    body = {"task_id": "t", "tool_name": "send_email", "idempotency_key": "k-standby", "args": {"a": 1}}

    response = Client().post(
        BASE + "/attempts", data=body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )

    assert response.status_code == 503, response.content[:300]
    assert json.loads(response.content)["code"] == "ledger_unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_a_write_to_a_read_only_database_answers_503_on_the_dashboard(
    tenant_a: Tenant, operator_a: Any, request: pytest.FixtureRequest
) -> None:
    attempt = record(tenant_a, "k-claim")
    browser = Client()
    browser.force_login(operator_a)
    request.getfixturevalue("read_only")

    response = browser.post(f"/attempts/{attempt.pk}/claim/", {"fence": attempt.fence})

    assert response.status_code == 503, response.content[:300]
    assert int(response.headers["Retry-After"]) > 0
    assert Attempt.objects.get(pk=attempt.pk).owner_id is None


def test_readyz_says_the_database_takes_no_writes(read_only: None) -> None:
    response = Client().get("/readyz")

    assert response.status_code == 503
    assert json.loads(response.content)["checks"]["database"].startswith("read-only")
    assert int(response.headers["Retry-After"]) > 0


def test_readyz_is_ready_on_a_database_that_takes_writes() -> None:
    response = Client().get("/readyz")

    assert response.status_code == 200, response.content
    assert json.loads(response.content)["checks"]["database"] == "ok"

"""A page reads the user's memberships once per question it asks of them."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledgerdash.ledger.models import Attempt, State, Tenant
from tests.conftest import as_user
from tests.factories import attempt_in


def _membership_reads(user: Any, url: str) -> int:
    client = as_user(user)
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return sum('"reviews_membership"' in q["sql"] for q in captured.captured_queries)


@pytest.fixture
def unknown(tenant_a: Tenant) -> Attempt:
    return attempt_in(State.UNKNOWN, tenant_a, key="reads-unknown")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("page", "reads"),
    [
        # which tenants the user sees, whether they administer one (the Members link)
        ("home", 2),
        # which tenants they see, which they operate in, whom work can go to
        ("queue", 3),
        # which tenants they see (the attempt's scope), their role in its
        # tenant, whom work can go to, the navigation's queue counts
        ("detail", 4),
    ],
)
def test_pages_read_memberships_once_per_question(page: str, reads: int, operator_a: Any, unknown: Attempt) -> None:
    url = {
        "home": reverse("reviews:home"),
        "queue": reverse("reviews:queue", args=["unknown"]),
        "detail": reverse("reviews:attempt", args=[unknown.pk]),
    }[page]
    assert _membership_reads(operator_a, url) == reads

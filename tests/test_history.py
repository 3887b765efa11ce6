"""Pages that tell the truth about who did what: owner events name the new
owner, and a linked attempt says what really created it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.errors import IdempotencyConflict
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import RECONCILER, TOOLS_V1, as_user, record
from tests.factories import attempt_in, linked_retry


def text(html: str) -> str:
    """The page as people read it: tags gone, whitespace collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def detail(user: Any, attempt: Attempt) -> str:
    return as_user(user).get(reverse("reviews:attempt", args=[attempt.pk])).content.decode()


def report(user: Any, attempt: Attempt) -> str:
    return as_user(user).get(reverse("reviews:attempt_report", args=[attempt.pk])).content.decode()


# --- owner events --------------------------------------------------------------------------


def test_owner_events_name_the_new_owner_and_the_old_one(
    tenant_a: Tenant, operator_a: Any, approver_a: Any, viewer_a: Any
) -> None:
    attempt = attempt_in(State.UNKNOWN, tenant_a, key="owned")  # the tenant's default owner, oncall-a
    moves.attempt_assign(attempt=attempt, owner=operator_a, actor=Actor.user(operator_a))
    moves.attempt_assign(attempt=attempt, owner=approver_a, actor=Actor.user(operator_a), reason="her shift")
    for page in (text(detail(viewer_a, attempt)), text(report(viewer_a, attempt))):
        assert "owner: oncall-a (tenant default owner)" in page  # chosen by the ledger on entering UNKNOWN
        assert "owner: oncall-a → operator-a" in page
        assert "owner: operator-a → approver-a" in page


def test_a_bulk_assignment_names_the_owner_too(tenant_a: Tenant, operator_a: Any, viewer_a: Any) -> None:
    attempt = attempt_in(State.UNKNOWN, tenant_a, key="bulk")
    moves.attempts_assign(
        attempt_ids=[attempt.pk],
        owner=operator_a,
        actor=Actor.user(operator_a),
        expected_owner_ids={attempt.pk: attempt.owner_id},
    )
    assert "owner: oncall-a → operator-a" in text(detail(viewer_a, attempt))


def test_an_owner_who_no_longer_exists_is_named_by_id(tenant_a: Tenant, operator_a: Any, make_user: Any) -> None:
    from reviews.history import OwnerChange, owner_change

    attempt = attempt_in(State.UNKNOWN, tenant_a, key="gone")
    moves.attempt_assign(attempt=attempt, owner=operator_a, actor=Actor.user(operator_a))
    event = attempt.events.filter(kind="owner").get()
    assert owner_change(event, {}) == OwnerChange(
        f"user #{tenant_a.default_owner_id} (no longer exists)", f"user #{operator_a.pk} (no longer exists)"
    )


@pytest.mark.parametrize("view", ["reviews:attempt", "reviews:attempt_report", "reviews:side_effect_report"])
def test_usernames_are_read_in_one_query_however_many_owner_events(
    tenant_a: Tenant, operator_a: Any, approver_a: Any, viewer_a: Any, view: str
) -> None:
    def queries_for(changes: int) -> int:
        attempt = attempt_in(State.UNKNOWN, tenant_a, key=f"owners-{changes}")
        for i in range(changes):
            owner = operator_a if i % 2 == 0 else approver_a
            moves.attempt_assign(attempt=attempt, owner=owner, actor=Actor.user(operator_a))
        client = as_user(viewer_a)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse(view, args=[attempt.pk])).status_code == 200
        return len(captured.captured_queries)

    assert queries_for(1) == queries_for(12)


# --- what created a linked attempt ---------------------------------------------------------


def created_by(page: str) -> str:
    match = re.search(r'<dd class="origin[^"]*">(.*?)</dd>', page, re.S)
    assert match is not None
    return text(match.group(1)).strip()


def test_a_linked_attempt_from_an_agents_key_reuse_says_so(tenant_a: Tenant, approver_a: Any) -> None:
    record(tenant_a, "reused", args={"to": "a@example.com"})
    with pytest.raises(IdempotencyConflict) as conflict:
        record(tenant_a, "reused", args={"to": "b@example.com"})
    linked = conflict.value.attempt
    expected = "agent agent-test: reused the idempotency key with other arguments"
    assert created_by(detail(approver_a, linked)) == expected
    assert created_by(report(approver_a, linked)) == expected


def test_a_linked_attempt_the_reconciler_made_after_a_policy_change_says_so(tenant_a: Tenant, approver_a: Any) -> None:
    original = attempt_in(State.UNKNOWN, tenant_a, key="policy-moved")
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, actor=Actor.system("security"), note="rotate scopes")
    _, linked = moves.attempt_escalate_for_retry(
        attempt=original,
        actor=RECONCILER,
        fence=original.fence,
        changes=["policy is now v2 (attempt recorded under v1)"],
        lookup={"status": "not_found"},
    )
    assert linked is not None
    page = detail(approver_a, linked)
    assert "This linked attempt waits for an approver" in page
    expected = "the reconciler (reconciler-test): the authority changed before a retry (policy v1 → v2)"
    assert created_by(page) == expected
    assert "key reused" not in page
    assert created_by(report(approver_a, linked)) == expected


def test_a_linked_attempt_a_person_asked_for_names_them(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> None:
    linked = linked_retry(tenant_a, operator_a)
    assert created_by(detail(approver_a, linked)) == "operator-a: asked for a retry"
    assert created_by(report(approver_a, linked)) == "operator-a: asked for a retry"


def test_a_root_attempt_names_the_agent_that_recorded_it(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = record(tenant_a, "root")
    assert created_by(detail(viewer_a, attempt)) == "agent agent-test: recorded the intent"


def test_an_attempt_that_found_no_owner_says_why_once(tenant_a: Tenant, viewer_a: Any) -> None:
    Tenant.objects.filter(pk=tenant_a.pk).update(default_owner=None)
    record(tenant_a, "nobody-home")
    with pytest.raises(IdempotencyConflict) as conflict:
        record(tenant_a, "nobody-home", args={"to": "elsewhere@example.com"})
    page = text(detail(viewer_a, conflict.value.attempt))
    assert "no owner: the tenant has no default owner and nobody is on call" in page

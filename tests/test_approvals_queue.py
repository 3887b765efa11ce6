"""The approvals queue: what waits for an approver, with the original's
standing and what approving would meet now, straight from the ledger."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from ledgerdash.ledger import clock, rules
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from reviews import queries
from tests.conftest import TOOLS_V1, as_user
from tests.factories import attempt_in, linked_retry

URL = reverse("reviews:approvals")


def test_the_queue_lists_only_what_awaits_an_approver_with_a_count_in_the_navigation(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a, key="k-retry")
    plain_review = attempt_in(State.MANUAL_REVIEW, tenant_a, key="k-review")
    response = as_user(approver_a).get(URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert f'id="approval-{retry.pk}"' in page
    assert f'id="approval-{plain_review.pk}"' not in page
    assert f'id="approval-{retry.parent_id}"' not in page
    assert queries.queue_counts(approver_a)["APPROVALS"] == 1
    assert 'id="count-approvals">1<' in page


def test_each_row_shows_the_originals_standing_and_the_verdict_now(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    proven = linked_retry(tenant_a, operator_a, key="k-proven", lookup="not_found")
    risky = linked_retry(tenant_a, operator_a, key="k-risky", lookup="unavailable")
    page = as_user(approver_a).get(URL).content.decode()
    proven_row = page.split(f'id="approval-{proven.pk}"')[1].split("</tr>")[0]
    risky_row = page.split(f'id="approval-{risky.pk}"')[1].split("</tr>")[0]
    assert "last lookup:</span>" in proven_row
    assert "not_found" in proven_row
    assert "cannot duplicate:" in proven_row
    assert "approvable" in proven_row
    assert "could duplicate:" in risky_row
    assert "needs a reason" in risky_row
    assert "unavailable" in risky_row


def test_the_verdict_is_the_ledgers_own_and_names_four_eyes_and_policy_changes(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a, key="k-1")
    original = Attempt.objects.get(pk=retry.parent_id)
    # The operator who requested it is told they cannot decide it (nor can an operator at all).
    requester = rules.approval_verdict(retry, original, operator_a)
    assert requester.word == "refused"
    assert "operator-a is an operator of the tenant and needs to be an approver" in requester.summary
    assert rules.approval_verdict(retry, original, approver_a).word == "approvable"
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"), note="v2")
    changed = rules.approval_verdict(retry, original, approver_a)
    assert changed.word == "refused"
    assert "policy v2" in changed.summary
    page = as_user(approver_a).get(URL).content.decode()
    row = page.split(f'id="approval-{retry.pk}"')[1].split("</tr>")[0]
    assert "refused" in row
    assert "policy v2" in row


def test_filters_by_tool_tenant_and_age(
    tenant_a: Tenant, tenant_b: Tenant, operator_a: Any, approver_a: Any, make_user: Any
) -> None:
    from ledgerdash.ledger.models import Membership

    Membership.objects.create(user=approver_a, tenant=tenant_b, role="approver")
    operator_b = make_user("operator-b")
    Membership.objects.create(user=operator_b, tenant=tenant_b, role="operator")
    with clock.frozen_at(timezone.now() - timedelta(days=2)):
        old = linked_retry(tenant_a, operator_a, key="k-old")
    Attempt.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    new = linked_retry(tenant_a, operator_a, key="k-new")
    other = linked_retry(tenant_b, operator_b, key="k-b")
    client = as_user(approver_a)

    def shown(query: str) -> set[int]:
        page = client.get(URL + query).content.decode()
        return {a for a in (old.pk, new.pk, other.pk) if f'id="approval-{a}"' in page}

    assert shown("") == {old.pk, new.pk, other.pk}
    assert shown("?tenant=globex") == {other.pk}
    assert shown("?age=gt1d") == {old.pk}
    assert shown("?tool=send_email&age=lt1h") == {new.pk, other.pk}
    assert shown("?tool=no_such_tool") == set()


def test_another_tenants_items_are_not_shown(
    tenant_a: Tenant, tenant_b: Tenant, operator_a: Any, make_user: Any
) -> None:
    from tests.conftest import member

    outsider = member(make_user, "approver-b", tenant_b, "approver")
    retry = linked_retry(tenant_a, operator_a)
    page = as_user(outsider).get(URL).content.decode()
    assert f'id="approval-{retry.pk}"' not in page
    assert queries.queue_counts(outsider)["APPROVALS"] == 0

"""Refusals read as a person would say them, and nobody is offered a
decision the ledger would refuse them."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from ledgerdash.ledger.models import Membership, Tenant
from tests.conftest import as_user
from tests.factories import linked_retry


def test_a_requester_who_approves_is_not_offered_the_form_and_is_told_why_in_words(
    tenant_a: Tenant, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, approver_a)
    client = as_user(approver_a)
    page = client.get(reverse("reviews:attempt", args=[retry.pk])).content.decode()
    assert reverse("reviews:approve", args=[retry.pk]) not in page
    assert "You requested this retry: someone else must decide it." in page
    response = client.post(
        reverse("reviews:approve", args=[retry.pk]), {"comment": "mine", "fence": retry.fence}, follow=True
    )
    text = response.content.decode()
    assert "Approval refused: you requested this retry; another approver must decide it." in text
    assert "What changed:" not in text
    assert "Refused because:" in text


def test_a_role_refusal_uses_the_right_article(tenant_a: Tenant, operator_a: Any, make_user: Any) -> None:
    from ledgerdash.ledger import tenancy

    assert tenancy.refusal(operator_a, tenant_a.pk, "approver") == (
        "operator-a is an operator of the tenant and needs to be an approver"
    )
    viewer = make_user("viewer-x")
    Membership.objects.create(user=viewer, tenant=tenant_a, role="viewer")
    refused = str(tenancy.refusal(viewer, tenant_a.pk, "operator"))
    assert "is a viewer of the tenant and needs to be an operator" in refused

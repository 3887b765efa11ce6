"""Bulk assignment: a preview of exactly what it touches, then all or nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.errors import AttemptNotFound, OwnershipError
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, Membership, State, Tenant
from tests.conftest import as_user, ledger_snapshot
from tests.factories import attempt_in

S = State
HTMX = {"HX-Request": "true"}
BULK = reverse("reviews:bulk_assign")


@pytest.fixture
def two(tenant_a: Tenant) -> list[Attempt]:
    return [attempt_in(S.UNKNOWN, tenant_a, key="bulk-1"), attempt_in(S.MANUAL_REVIEW, tenant_a, key="bulk-2")]


def expect(attempts: list[Attempt]) -> list[str]:
    return [f"{a.pk}:{a.owner_id or ''}" for a in attempts]


# --- the ledger function ------------------------------------------------------------------


def test_attempts_assign_moves_each_and_records_an_event_each(two: list[Attempt], operator_a: Any) -> None:
    previous = {a.pk: a.owner_id for a in two}
    moves.attempts_assign(
        attempt_ids=[a.pk for a in two],
        owner=operator_a,
        actor=Actor.user(operator_a),
        expected_owner_ids=previous,
        reason="taking the morning shift",
    )
    for attempt in two:
        attempt.refresh_from_db()
        assert attempt.owner_id == operator_a.pk
        event = AttemptEvent.objects.filter(attempt=attempt, kind="owner").get()
        assert event.reason == "taking the morning shift"
        assert event.actor_user_id == operator_a.pk
        assert event.details == {"from_user_id": previous[attempt.pk], "to_user_id": operator_a.pk, "batch_size": 2}


def test_attempts_assign_writes_nothing_when_any_owner_changed(
    two: list[Attempt], operator_a: Any, approver_a: Any
) -> None:
    seen = {a.pk: a.owner_id for a in two}
    moves.attempt_assign(attempt=two[1], owner=approver_a, actor=Actor.user(approver_a))
    before = ledger_snapshot()
    with pytest.raises(OwnershipError, match=f"#{two[1].pk} changed since the preview"):
        moves.attempts_assign(
            attempt_ids=[a.pk for a in two], owner=operator_a, actor=Actor.user(operator_a), expected_owner_ids=seen
        )
    assert ledger_snapshot() == before


def test_attempts_assign_needs_a_preview_for_each_and_existing_attempts(two: list[Attempt], operator_a: Any) -> None:
    with pytest.raises(OwnershipError, match="preview"):
        moves.attempts_assign(
            attempt_ids=[a.pk for a in two], owner=operator_a, actor=Actor.user(operator_a), expected_owner_ids={}
        )
    with pytest.raises(AttemptNotFound):
        moves.attempts_assign(
            attempt_ids=[987654], owner=operator_a, actor=Actor.user(operator_a), expected_owner_ids={987654: None}
        )


def test_attempts_assign_leaves_what_the_owner_already_holds(two: list[Attempt], operator_a: Any) -> None:
    moves.attempt_assign(attempt=two[0], owner=operator_a, actor=Actor.user(operator_a))
    seen = {a.pk: Attempt.objects.get(pk=a.pk).owner_id for a in two}
    events = AttemptEvent.objects.count()
    moves.attempts_assign(
        attempt_ids=[a.pk for a in two], owner=operator_a, actor=Actor.user(operator_a), expected_owner_ids=seen
    )
    assert AttemptEvent.objects.count() == events + 1


# --- the view -------------------------------------------------------------------------------


def test_the_preview_lists_what_it_will_touch_and_writes_nothing(two: list[Attempt], operator_a: Any) -> None:
    before = ledger_snapshot()
    response = as_user(operator_a).get(BULK, {"ids": [a.pk for a in two], "owner": operator_a.pk})
    page = response.content.decode()
    assert response.status_code == 200
    assert "<html" in page
    assert "Preview: what this assignment will touch" in page
    for attempt in two:
        assert f'name="expect" value="{attempt.pk}:{attempt.owner_id}"' in page
    assert 'Assign 2 selected to <bdi class="u">operator-a</bdi>' in page
    assert ledger_snapshot() == before


def test_the_preview_under_htmx_is_only_its_region(two: list[Attempt], operator_a: Any) -> None:
    page = as_user(operator_a).get(BULK, {"ids": [two[0].pk], "owner": operator_a.pk}, headers=HTMX).content.decode()
    assert "<html" not in page
    assert page.lstrip().startswith('<section id="preview"')


def test_the_preview_says_whom_it_skips_and_why(
    two: list[Attempt], tenant_a: Tenant, tenant_b: Tenant, operator_a: Any, make_user: Any
) -> None:
    Membership.objects.create(user=operator_a, tenant=tenant_b, role="operator")
    elsewhere = attempt_in(S.UNKNOWN, tenant_b, key="bulk-b")
    only_a = make_user("only-a")
    Membership.objects.create(user=only_a, tenant=tenant_a, role="operator")
    page = as_user(operator_a).get(BULK, {"ids": [two[0].pk, elsewhere.pk], "owner": only_a.pk}).content.decode()
    assert 'skipped: <bdi class="u wraps">only-a is not a member of globex</bdi>' in page
    assert "Assign 2 selected" in page  # the plan lists both; only one is touched
    response = as_user(operator_a).post(
        BULK, {"ids": [two[0].pk, elsewhere.pk], "owner": only_a.pk, "expect": expect([two[0], elsewhere])}
    )
    assert response.status_code == 303
    assert Attempt.objects.get(pk=two[0].pk).owner_id == only_a.pk
    assert Attempt.objects.get(pk=elsewhere.pk).owner_id != only_a.pk


def test_confirming_assigns_all_and_goes_back_to_the_list(two: list[Attempt], operator_a: Any) -> None:
    back = "/queues/unknown/?owner=anyone"
    data = {"ids": [a.pk for a in two], "owner": operator_a.pk, "expect": expect(two), "reason": "mine", "next": back}
    client = as_user(operator_a)
    response = client.post(BULK, data)
    assert response.status_code == 303
    assert response["Location"] == back
    assert set(Attempt.objects.filter(pk__in=[a.pk for a in two]).values_list("owner_id", flat=True)) == {operator_a.pk}
    assert "Assigned 2 attempt(s) to operator-a." in client.get(back).content.decode()


def test_confirming_under_htmx_refreshes_the_list(two: list[Attempt], operator_a: Any) -> None:
    data = {"ids": [a.pk for a in two], "owner": operator_a.pk, "expect": expect(two)}
    response = as_user(operator_a).post(BULK, data, headers=HTMX)
    assert response.status_code == 200
    assert response["HX-Trigger"] == "ledgerdash:refresh"
    page = response.content.decode()
    assert page.lstrip().startswith('<section id="preview"')
    assert "Assigned 2 attempt(s)" in page


def test_confirming_a_stale_preview_assigns_nothing_and_shows_it_again(
    two: list[Attempt], operator_a: Any, approver_a: Any
) -> None:
    data = {"ids": [a.pk for a in two], "owner": operator_a.pk, "expect": expect(two)}
    moves.attempt_assign(attempt=two[0], owner=approver_a, actor=Actor.user(approver_a))
    before = ledger_snapshot()
    response = as_user(operator_a).post(BULK, data)
    page = response.content.decode()
    assert response.status_code == 200
    assert "changed since the preview; nothing was assigned" in page
    assert f'name="expect" value="{two[0].pk}:{approver_a.pk}"' in page  # the new preview
    assert ledger_snapshot() == before


def test_bulk_assign_refuses_other_methods(operator_a: Any) -> None:
    assert as_user(operator_a).put(BULK).status_code == 405
    assert as_user(operator_a).delete(BULK).status_code == 405


def test_another_tenants_attempt_in_the_selection_is_404(two: list[Attempt], tenant_b: Tenant, operator_a: Any) -> None:
    foreign = attempt_in(S.UNKNOWN, tenant_b, key="foreign")
    before = ledger_snapshot()
    client = as_user(operator_a)
    assert client.get(BULK, {"ids": [two[0].pk, foreign.pk], "owner": operator_a.pk}).status_code == 404
    data = {"ids": [foreign.pk], "owner": operator_a.pk, "expect": expect([foreign])}
    assert client.post(BULK, data).status_code == 404
    assert ledger_snapshot() == before


def test_viewers_cannot_assign(two: list[Attempt], viewer_a: Any, operator_a: Any) -> None:
    client = as_user(viewer_a)
    assert client.get(BULK, {"ids": [two[0].pk], "owner": operator_a.pk}).status_code == 403
    data = {"ids": [two[0].pk], "owner": operator_a.pk, "expect": expect(two[:1])}
    assert client.post(BULK, data).status_code == 403


def test_an_operator_of_one_tenant_cannot_assign_anothers_work_they_only_view(
    tenant_a: Tenant, tenant_b: Tenant, operator_a: Any
) -> None:
    Membership.objects.create(user=operator_a, tenant=tenant_b, role="viewer")
    viewed = attempt_in(S.UNKNOWN, tenant_b, key="viewed")
    assert as_user(operator_a).get(BULK, {"ids": [viewed.pk], "owner": operator_a.pk}).status_code == 403


def test_nothing_selected_is_said_plainly(operator_a: Any) -> None:
    page = as_user(operator_a).get(BULK, {"owner": operator_a.pk}).content.decode()
    assert "select some attempts first" in page

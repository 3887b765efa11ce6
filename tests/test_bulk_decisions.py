"""Decisions on several attempts at once, and bulk assign's preview rule:
the preview says exactly what happens; if anything changed since, nothing does."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.errors import IllegalTransition, StaleFence
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, FailedBecause, State, Tenant
from tests.conftest import as_user, ledger_snapshot
from tests.factories import attempt_in, linked_retry

S = State


def url(decision: str) -> str:
    return reverse("reviews:bulk_decide", args=[decision])


def preview(client: Any, decision: str, attempts: list[Attempt]) -> tuple[str, dict[str, Any]]:
    """The preview page, and the confirmation it offers (its hidden fields)."""
    page = client.get(url(decision), {"ids": [a.pk for a in attempts]}).content.decode()
    form = page.split('<form method="post"')[1].split("</form>")[0] if '<form method="post"' in page else ""
    fields: dict[str, Any] = {
        "ids": re.findall(r'name="ids" value="(\d+)"', form),
        "expect": re.findall(r'name="expect" value="([^"]+)"', form),
    }
    return page, fields


@pytest.fixture
def review(tenant_a: Tenant) -> list[Attempt]:
    return [attempt_in(S.MANUAL_REVIEW, tenant_a, key=f"r-{n}") for n in range(2)]


def test_the_preview_names_what_it_touches_and_why_it_skips_the_rest(
    review: list[Attempt], tenant_a: Tenant, operator_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a, key="never-sent")
    page, fields = preview(as_user(operator_a), "recheck", [*review, retry])
    assert f'id="plan-{review[0].pk}" class="touch"' in page
    assert f'id="plan-{retry.pk}" class="skip"' in page
    assert "was never sent: nothing at the provider to ask about" in page
    assert sorted(fields["expect"]) == sorted(f"{a.pk}:{a.fence}:{a.owner_id}" for a in review)
    assert "Re-check 2 attempts" in page


def test_bulk_recheck_and_mark_failed_apply_to_every_previewed_attempt(review: list[Attempt], operator_a: Any) -> None:
    client = as_user(operator_a)
    _, fields = preview(client, "fail", review)
    response = client.post(url("fail"), {**fields, "reason": "provider dashboard shows neither"}, follow=True)
    assert "2 attempt(s) marked failed" in response.content.decode()
    for attempt in review:
        attempt.refresh_from_db()
        assert attempt.state == S.FAILED
        assert attempt.failed_because == FailedBecause.PERSON
        assert "provider dashboard shows neither (one of 2 decided together)" in attempt.last_note


def test_mark_failed_needs_evidence(review: list[Attempt], operator_a: Any) -> None:
    client = as_user(operator_a)
    _, fields = preview(client, "fail", review)
    before = ledger_snapshot()
    page = client.post(url("fail"), {**fields, "reason": " "}, follow=True).content.decode()
    assert "evidence" in page
    assert ledger_snapshot() == before


def test_nothing_happens_when_any_attempt_moved_on_since_the_preview(
    review: list[Attempt], operator_a: Any, approver_a: Any
) -> None:
    client = as_user(operator_a)
    _, fields = preview(client, "recheck", review)
    # Someone else decides one of them meanwhile.
    moves.attempt_verify(attempt=review[1], actor=Actor.user(approver_a), evidence="found it", fence=review[1].fence)
    before = ledger_snapshot()
    page = client.post(url("recheck"), {**fields, "reason": "look again"}, follow=True).content.decode()
    assert "nothing was done, preview again" in page
    assert ledger_snapshot() == before


def test_nothing_happens_when_an_owner_changed_since_the_preview(
    review: list[Attempt], operator_a: Any, approver_a: Any
) -> None:
    client = as_user(operator_a)
    _, fields = preview(client, "fail", review)
    moves.attempt_assign(attempt=review[0], owner=approver_a, actor=Actor.user(approver_a))
    before = ledger_snapshot()
    page = client.post(url("fail"), {**fields, "reason": "not sent"}, follow=True).content.decode()
    assert f"#{review[0].pk} changed since the preview; nothing was done" in page
    assert ledger_snapshot() == before


def test_one_refusal_undoes_the_whole_batch(review: list[Attempt], tenant_a: Tenant, operator_a: Any) -> None:
    settled = attempt_in(S.OUTCOME_CONFIRMED, tenant_a, key="done")
    expected = {a.pk: (a.fence, a.owner_id) for a in [*review, settled]}
    before = ledger_snapshot()
    with pytest.raises(IllegalTransition):
        moves.attempts_decide(
            decision="fail",
            attempt_ids=list(expected),
            expected=expected,
            actor=Actor.user(operator_a),
            reason="not sent",
        )
    assert ledger_snapshot() == before
    with pytest.raises(StaleFence, match="no previewed version"):
        moves.attempts_decide(
            decision="recheck", attempt_ids=[review[0].pk], expected={}, actor=Actor.user(operator_a), reason="x"
        )


def test_bulk_reject_is_an_approvers_and_not_the_requesters(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> None:
    theirs = [linked_retry(tenant_a, operator_a, key=f"t-{n}") for n in range(2)]
    own = linked_retry(tenant_a, approver_a, key="own")
    page, _ = preview(as_user(operator_a), "reject", theirs)
    assert "operator-a is an operator of acme and needs to be an approver" in page
    assert "None of the selected attempts can be decided this way now" in page
    client = as_user(approver_a)
    page, fields = preview(client, "reject", [*theirs, own])
    assert "you requested this retry; another approver must decide it" in page
    response = client.post(url("reject"), {**fields, "reason": "the customer cancelled"}, follow=True)
    assert "2 attempt(s) rejected" in response.content.decode()
    for retry in theirs:
        retry.refresh_from_db()
        assert retry.state == S.FAILED
        assert retry.failed_because == FailedBecause.REJECTED
    own.refresh_from_db()
    assert own.state == S.MANUAL_REVIEW


def test_bulk_assign_refuses_the_batch_when_the_target_claimed_a_row_meanwhile(
    review: list[Attempt], operator_a: Any, approver_a: Any
) -> None:
    client = as_user(approver_a)
    page = client.get(reverse("reviews:bulk_assign"), {"ids": [a.pk for a in review], "owner": operator_a.pk})
    text = page.content.decode()
    form = text.split('<form method="post"')[1].split("</form>")[0]
    fields = {
        "ids": re.findall(r'name="ids" value="(\d+)"', form),
        "expect": re.findall(r'name="expect" value="([^"]+)"', form),
        "owner": operator_a.pk,
    }
    assert "Assign 2 selected" in text
    # The target claims one of them before the assignment is confirmed.
    moves.attempt_assign(attempt=review[0], owner=operator_a, actor=Actor.user(operator_a), reason="claimed")
    before = ledger_snapshot()
    owner_events = AttemptEvent.objects.filter(kind="owner").count()
    response = client.post(reverse("reviews:bulk_assign"), fields, follow=True).content.decode()
    assert "Assigned" not in response.split('id="preview"')[0]
    assert f"#{review[0].pk} changed since the preview; nothing was assigned" in response
    assert ledger_snapshot() == before
    assert AttemptEvent.objects.filter(kind="owner").count() == owner_events
    assert Attempt.objects.get(pk=review[1].pk).owner_id != operator_a.pk

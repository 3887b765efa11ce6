"""One attempt: its page, and every decision people take on it.

Every view: wrong method, another tenant's attempt (404), a role too small
(403), the htmx region, the full page (a redirect back, without JavaScript).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledgerdash.ledger import moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import TOOLS_V1, as_user, ledger_snapshot, member, record, together
from tests.factories import attempt_in, linked_retry

S = State
HTMX = {"HX-Request": "true"}


def url(name: str, attempt: Attempt) -> str:
    return reverse(f"reviews:{name}", args=[attempt.pk])


# --- the detail page ------------------------------------------------------------------


def test_the_detail_page_shows_keys_hashes_policy_and_the_timeline(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = attempt_in(S.OUTCOME_CONFIRMED, tenant_a, key="invoice:9:send")
    page = as_user(viewer_a).get(url("attempt", attempt)).content.decode()
    assert "<html" in page
    for text in [attempt.args_hash, "invoice:9:send", "req-invoice:9:send", "task-1", "v1", "email:send"]:
        assert text in page
    assert "INTENT_RECORDED → DISPATCHED" in page.replace("&nbsp;", " ")
    assert 'by agent <strong><bdi class="u">agent-test</bdi></strong>' in page
    assert "&quot;ap@example.com&quot;" in page  # the arguments, as JSON text


def test_the_lookups_count_says_since_when_it_counts(tenant_a: Tenant, viewer_a: Any) -> None:
    """A person asked to check again: the count starts over while the last answer stays, and the page
    says both rather than "0 lookups, the last said mismatch"."""
    attempt = attempt_in(S.DISPATCHED, tenant_a)
    Attempt.objects.filter(pk=attempt.pk).update(check_count=0, last_lookup="mismatch")
    page = as_user(viewer_a).get(url("attempt", attempt)).content.decode()
    said = page.split("<dt>Provider lookups</dt><dd>")[1].split("</dd>")[0]
    assert said == (
        'the last said <strong><bdi class="u">mismatch</bdi></strong>; 0 since it was last sent or asked to be '
        "checked again"
    )


def test_under_htmx_the_detail_renders_only_its_region(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    response = as_user(viewer_a).get(url("attempt", attempt), headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in page
    assert page.lstrip().startswith('<div id="detail"')


def test_another_tenants_attempt_is_404(tenant_a: Tenant, outsider_b: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    assert as_user(outsider_b).get(url("attempt", attempt)).status_code == 404
    assert as_user(outsider_b).get(url("attempt", attempt), headers=HTMX).status_code == 404
    assert as_user(outsider_b).get("/attempts/999999/").status_code == 404


def test_the_detail_page_refuses_posts(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    assert as_user(viewer_a).post(url("attempt", attempt)).status_code == 405


def test_a_viewer_is_offered_no_actions(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = attempt_in(S.MANUAL_REVIEW, tenant_a)
    page = as_user(viewer_a).get(url("attempt", attempt)).content.decode()
    assert "acting on it needs the operator role" in page
    assert url("claim", attempt) not in page


def test_attacker_controlled_text_is_escaped_everywhere(tenant_a: Tenant, operator_a: Any) -> None:
    payload = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    attempt = record(tenant_a, f"key-{payload}", task_id=f"task-{payload}", args={"body": payload, payload: 1})
    client = as_user(operator_a)
    for page in [
        client.get(url("attempt", attempt)).content.decode(),
        client.get(reverse("reviews:search")).content.decode(),
        client.get(reverse("reviews:search"), {"q": f"key-{payload}"}).content.decode(),
    ]:
        assert "<img src=x" not in page
        assert "<script>alert" not in page
        assert "&lt;img src=x onerror=" in page


def test_a_linked_retry_shows_the_diff_and_the_originals_standing(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    original = record(tenant_a, "mail-1", args={"to": "a@example.com"})
    from ledgerdash.ledger.errors import IdempotencyConflict

    with pytest.raises(IdempotencyConflict) as conflict:
        record(tenant_a, "mail-1", args={"to": "b@example.com"})
    linked = conflict.value.attempt
    page = as_user(approver_a).get(url("attempt", linked)).content.decode()
    assert "This linked attempt waits for an approver" in page
    assert f'The original, <a href="{url("attempt", original)}">#{original.pk}</a>' in page
    assert f"the original #{original.pk} is INTENT_RECORDED and may yet be sent" in page
    assert "argument to" in page
    assert "&quot;a@example.com&quot;" in page
    assert "&quot;b@example.com&quot;" in page
    assert "args hash" in page
    assert "Approve retry" in page
    # The original's page shows the same diff from its side.
    parent_page = as_user(approver_a).get(url("attempt", original)).content.decode()
    assert f'What changed in linked retry <a href="{url("attempt", linked)}">#{linked.pk}</a>' in parent_page


def test_the_approver_sees_when_the_original_may_have_happened(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a, lookup="unavailable")
    page = as_user(approver_a).get(url("attempt", retry)).content.decode()
    assert "May already have happened" in page
    assert "last lookup: unavailable" in page
    assert "Why it is safe although the original may have happened" in page


def test_the_approver_sees_in_advance_what_the_check_would_refuse(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a)
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"), note="v2")
    page = as_user(approver_a).get(url("attempt", retry)).content.decode()
    assert "The approval check would refuse now" in page
    assert (
        "scope email:send is not allowed for send_email by policy v2 (it allows: none) (attempt recorded under v1)"
        in page
    )


# --- the action matrix: every POST view ----------------------------------------------


@dataclass(frozen=True)
class Action:
    name: str
    state: str  # the attempt's state to act on ("retry": a linked retry awaiting approval)
    role: str  # the least role that may act
    data: Callable[[Attempt, dict[str, Any]], dict[str, Any]]
    success: str  # the message shown after it worked

    def __str__(self) -> str:
        return self.name


ACTIONS = [
    Action("claim", S.UNKNOWN, "operator", lambda a, p: {"owner_seen": a.owner_id or ""}, "You own #"),
    Action(
        "assign",
        S.UNKNOWN,
        "operator",
        lambda a, p: {"owner": p["approver"].pk, "owner_seen": a.owner_id or "", "reason": "x"},
        "is assigned to",
    ),
    Action("unassign", S.OUTCOME_CONFIRMED, "operator", lambda a, p: {"owner_seen": a.owner_id or ""}, "has no owner"),
    Action("comment", S.UNKNOWN, "operator", lambda a, p: {"text": "called the provider"}, "Comment recorded"),
    Action("recheck", S.MANUAL_REVIEW, "operator", lambda a, p: {"reason": "support says retry lookup"}, "look #"),
    Action(
        "verify",
        S.MANUAL_REVIEW,
        "operator",
        lambda a, p: {"evidence": "seen in provider dashboard", "provider_request_id": "req-9", "fence": a.fence},
        "is confirmed",
    ),
    Action(
        "mark_failed",
        S.MANUAL_REVIEW,
        "operator",
        lambda a, p: {"reason": "provider has no record", "fence": a.fence},
        "is marked failed",
    ),
    Action("retry_request", S.MANUAL_REVIEW, "operator", lambda a, p: {"reason": "resend"}, "Linked retry #"),
    Action("approve", "retry", "approver", lambda a, p: {"comment": "checked", "fence": a.fence}, "approved"),
    Action("reject", "retry", "approver", lambda a, p: {"comment": "duplicate", "fence": a.fence}, "rejected"),
]
ROLES = ["viewer", "operator", "approver", "admin"]


@pytest.fixture
def people(viewer_a: Any, operator_a: Any, approver_a: Any, admin_a: Any, outsider_b: Any) -> dict[str, Any]:
    return {
        "viewer": viewer_a,
        "operator": operator_a,
        "approver": approver_a,
        "admin": admin_a,
        "outsider": outsider_b,
    }


def target(action: Action, tenant: Tenant, people: dict[str, Any]) -> Attempt:
    if action.state == "retry":
        return linked_retry(tenant, people["operator"])
    attempt = attempt_in(action.state, tenant)
    if action.name == "unassign":
        moves.attempt_assign(attempt=attempt, owner=people["operator"], actor=Actor.system())
        attempt.refresh_from_db()
    return attempt


def actor_for(action: Action, people: dict[str, Any]) -> Any:
    return people[action.role]


@pytest.mark.parametrize("action", ACTIONS, ids=str)
def test_actions_refuse_get(action: Action, tenant_a: Tenant, people: dict[str, Any]) -> None:
    attempt = target(action, tenant_a, people)
    assert as_user(people["admin"]).get(url(action.name, attempt)).status_code == 405


@pytest.mark.parametrize("action", ACTIONS, ids=str)
def test_actions_on_another_tenants_attempt_are_404_and_write_nothing(
    action: Action, tenant_a: Tenant, people: dict[str, Any]
) -> None:
    attempt = target(action, tenant_a, people)
    before = ledger_snapshot()
    response = as_user(people["outsider"]).post(url(action.name, attempt), action.data(attempt, people))
    assert response.status_code == 404
    assert ledger_snapshot() == before


@pytest.mark.parametrize("action", ACTIONS, ids=str)
def test_actions_need_their_role(action: Action, tenant_a: Tenant, people: dict[str, Any]) -> None:
    attempt = target(action, tenant_a, people)
    too_small = ROLES[ROLES.index(action.role) - 1]
    before = ledger_snapshot()
    response = as_user(people[too_small]).post(url(action.name, attempt), action.data(attempt, people))
    assert response.status_code == 403
    assert ledger_snapshot() == before


@pytest.mark.parametrize("action", ACTIONS, ids=str)
def test_actions_without_javascript_redirect_back_with_a_message(
    action: Action, tenant_a: Tenant, people: dict[str, Any]
) -> None:
    attempt = target(action, tenant_a, people)
    client = as_user(actor_for(action, people))
    response = client.post(url(action.name, attempt), action.data(attempt, people))
    assert response.status_code == 303
    assert response["Location"] == url("attempt", attempt)
    page = client.get(response["Location"]).content.decode()
    assert action.success in page
    assert 'class="success"' in page


@pytest.mark.parametrize("action", ACTIONS, ids=str)
def test_actions_under_htmx_return_the_fresh_detail_and_the_message(
    action: Action, tenant_a: Tenant, people: dict[str, Any]
) -> None:
    attempt = target(action, tenant_a, people)
    events = AttemptEvent.objects.count()
    response = as_user(actor_for(action, people)).post(
        url(action.name, attempt), action.data(attempt, people), headers=HTMX
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in page
    assert page.lstrip().startswith('<div id="detail"')
    assert 'id="flash" role="status" aria-live="polite" hx-swap-oob="true"' in page
    assert action.success in page
    assert AttemptEvent.objects.count() > events  # every change is an event


def test_a_claim_from_the_queue_returns_the_row(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    headers = {**HTMX, "HX-Target": f"row-{attempt.pk}", "HX-Current-URL": "http://testserver/queues/unknown/?owner=me"}
    response = as_user(operator_a).post(url("claim", attempt), {"owner_seen": attempt.owner_id}, headers=headers)
    page = response.content.decode()
    assert page.lstrip().startswith(f'<tr id="row-{attempt.pk}"')
    assert '<span class="mine">yours</span>' in page
    assert "You own #" in page
    assert 'hx-swap-oob="true"' in page


def test_without_javascript_an_action_returns_to_the_list_it_came_from(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    back = "/queues/unknown/?owner=anyone"
    response = as_user(operator_a).post(url("claim", attempt), {"owner_seen": attempt.owner_id, "next": back})
    assert response["Location"] == back
    elsewhere = as_user(operator_a).post(url("comment", attempt), {"text": "x", "next": "https://evil.example/"})
    assert elsewhere["Location"] == url("attempt", attempt)


# --- what the actions do -----------------------------------------------------------------


def test_claiming_records_who_and_why(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    previous = attempt.owner_id
    as_user(operator_a).post(url("claim", attempt), {"owner_seen": previous})
    attempt.refresh_from_db()
    assert attempt.owner_id == operator_a.pk
    event = AttemptEvent.objects.filter(attempt=attempt, kind="owner").get()
    assert (event.actor_user_id, event.reason) == (operator_a.pk, "claimed")
    assert event.details == {"from_user_id": previous, "to_user_id": operator_a.pk}


def test_a_claim_is_refused_when_someone_else_took_it_meanwhile(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    seen = attempt.owner_id
    moves.attempt_assign(attempt=attempt, owner=approver_a, actor=Actor.user(approver_a))
    client = as_user(operator_a)
    response = client.post(url("claim", attempt), {"owner_seen": seen}, follow=True)
    assert "owned by someone else" in response.content.decode()
    assert Attempt.objects.get(pk=attempt.pk).owner_id == approver_a.pk


def test_assigning_to_someone_outside_the_tenant_is_refused(tenant_a: Tenant, operator_a: Any, outsider_b: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    before = ledger_snapshot()
    response = as_user(operator_a).post(
        url("assign", attempt), {"owner": outsider_b.pk, "owner_seen": attempt.owner_id}, follow=True
    )
    assert "Select a valid choice" in response.content.decode()
    assert ledger_snapshot() == before


def test_an_owned_state_cannot_be_unassigned(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    response = as_user(operator_a).post(url("unassign", attempt), {"owner_seen": attempt.owner_id}, follow=True)
    assert "must keep an owner" in response.content.decode()


def test_a_comment_is_required(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    before = ledger_snapshot()
    response = as_user(operator_a).post(url("comment", attempt), {"text": "  "}, follow=True)
    assert "Comment: This field is required." in response.content.decode()
    assert ledger_snapshot() == before


def test_verifying_needs_evidence(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.MANUAL_REVIEW, tenant_a)
    response = as_user(operator_a).post(url("verify", attempt), {"evidence": "", "fence": attempt.fence}, follow=True)
    assert "Evidence: This field is required." in response.content.decode()
    assert Attempt.objects.get(pk=attempt.pk).state == S.MANUAL_REVIEW


def test_an_attempt_never_sent_cannot_be_rechecked_or_verified(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a)
    before = ledger_snapshot()
    client = as_user(approver_a)
    response = client.post(url("recheck", retry), {}, follow=True)
    assert "was never sent" in response.content.decode()
    response = client.post(url("verify", retry), {"evidence": "x", "fence": retry.fence}, follow=True)
    assert "was never sent" in response.content.decode()
    assert ledger_snapshot() == before


@pytest.mark.parametrize("who", ["operator", "approver"])
def test_nobody_marks_failed_a_retry_that_awaits_approval(
    tenant_a: Tenant, operator_a: Any, approver_a: Any, who: str
) -> None:
    retry = linked_retry(tenant_a, operator_a)
    before = ledger_snapshot()
    person = operator_a if who == "operator" else approver_a
    response = as_user(person).post(url("mark_failed", retry), {"reason": "no", "fence": retry.fence}, follow=True)
    assert "rejected by an approver" in response.content.decode()
    assert ledger_snapshot() == before


def test_approving_supersedes_the_original(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> None:
    retry = linked_retry(tenant_a, operator_a)
    as_user(approver_a).post(url("approve", retry), {"comment": "provider says not found", "fence": retry.fence})
    retry.refresh_from_db()
    assert retry.state == S.INTENT_RECORDED
    assert retry.approved_by_id == approver_a.pk
    assert Attempt.objects.get(pk=retry.parent_id).state == S.RECONCILED


def test_an_approval_needs_a_comment(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> None:
    retry = linked_retry(tenant_a, operator_a)
    before = ledger_snapshot()
    response = as_user(approver_a).post(url("approve", retry), {"comment": "", "fence": retry.fence}, follow=True)
    assert "Comment: This field is required." in response.content.decode()
    assert ledger_snapshot() == before


def test_it_refuses_approval_when_the_policy_changed_and_says_what_changed(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a)
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"), note="v2")
    response = as_user(approver_a).post(url("approve", retry), {"comment": "ok", "fence": retry.fence}, headers=HTMX)
    page = response.content.decode()
    assert (
        "Approval refused: scope email:send is not allowed for send_email by policy v2 "
        "(it allows: none) (attempt recorded under v1)" in page
    )
    # The refusal is in the ledger, and on the timeline with what changed.
    assert AttemptEvent.objects.filter(attempt=retry, kind="approval_refused").count() == 1
    assert '<li class="event event-approval_refused">' in page
    assert Attempt.objects.get(pk=retry.pk).state == S.MANUAL_REVIEW


def test_a_decision_on_a_page_that_changed_is_refused(
    tenant_a: Tenant, operator_a: Any, approver_a: Any, make_user: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a)
    seen = retry.fence
    other = member(make_user, "approver-2", tenant_a, "approver")
    moves.retry_reject(attempt=retry, actor=Actor.user(other), comment="duplicate")  # decided meanwhile
    response = as_user(approver_a).post(url("approve", retry), {"comment": "ok", "fence": seen}, follow=True)
    assert "changed since you loaded it" in response.content.decode()
    assert Attempt.objects.get(pk=retry.pk).state == S.FAILED


def test_an_approver_cannot_approve_their_own_request(tenant_a: Tenant, approver_a: Any) -> None:
    retry = linked_retry(tenant_a, approver_a)
    page = as_user(approver_a).get(url("attempt", retry)).content.decode()
    assert "You requested this retry" in page
    assert "Approve retry" not in page  # the form is not offered to who asked for it
    response = as_user(approver_a).post(url("approve", retry), {"comment": "ok", "fence": retry.fence}, follow=True)
    assert "you requested this retry; another approver must decide it" in response.content.decode()
    assert Attempt.objects.get(pk=retry.pk).state == S.MANUAL_REVIEW


def test_approving_while_the_original_may_have_happened_needs_a_reason(
    tenant_a: Tenant, operator_a: Any, approver_a: Any
) -> None:
    retry = linked_retry(tenant_a, operator_a, lookup="unavailable")
    client = as_user(approver_a)
    refused = client.post(url("approve", retry), {"comment": "ok", "fence": retry.fence}, follow=True)
    assert "record why it is safe to approve anyway" in refused.content.decode()
    retry.refresh_from_db()
    client.post(
        url("approve", retry),
        {"comment": "ok", "safe_because": "provider support: no such message", "fence": retry.fence},
    )
    assert Attempt.objects.get(pk=retry.pk).state == S.INTENT_RECORDED


def test_a_decision_is_single_use(tenant_a: Tenant, operator_a: Any, approver_a: Any, admin_a: Any) -> None:
    retry = linked_retry(tenant_a, operator_a)
    data = {"comment": "ok", "fence": retry.fence}
    as_user(approver_a).post(url("approve", retry), data)
    second = as_user(admin_a).post(url("approve", retry), data, follow=True)
    assert "changed since you loaded it" in second.content.decode()
    assert AttemptEvent.objects.filter(attempt=retry, to_state=S.INTENT_RECORDED).count() == 1


def test_a_retry_request_names_the_new_linked_attempt(tenant_a: Tenant, operator_a: Any) -> None:
    original = attempt_in(S.MANUAL_REVIEW, tenant_a)
    response = as_user(operator_a).post(url("retry_request", original), {"reason": "resend"}, follow=True)
    retry = Attempt.objects.get(parent=original)
    assert f"Linked retry #{retry.pk} recorded" in response.content.decode()
    assert retry.requested_by_id == operator_a.pk


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_approvers_deciding_at_once_through_the_page_make_one_approval(
    tenant_a: Tenant, operator_a: Any, make_user: Any
) -> None:

    from tests.conftest import member

    retry = linked_retry(tenant_a, operator_a)
    clients = [as_user(member(make_user, f"approver-{n}", tenant_a, "approver")) for n in range(20)]
    pages: list[str] = []

    def decide(client: Client) -> None:
        response = client.post(url("approve", retry), {"comment": "ok", "fence": retry.fence}, follow=True)
        pages.append(response.content.decode())

    together(decide, clients)
    assert len(pages) == 20
    assert sum(f"Retry #{retry.pk} approved" in page for page in pages) == 1
    assert sum("changed since you loaded it" in page for page in pages) == 19
    assert AttemptEvent.objects.filter(attempt=retry, to_state=S.INTENT_RECORDED).count() == 1
    assert AttemptEvent.objects.filter(attempt_id=retry.parent_id, to_state=S.RECONCILED).count() == 1


def test_refusals_explain_themselves_on_a_page_of_the_dashboard(tenant_a: Tenant, viewer_a: Any) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a)
    forbidden = as_user(viewer_a).post(url("claim", attempt), {"owner_seen": attempt.owner_id})
    assert "viewer-a is a viewer of acme and needs to be an operator" in forbidden.content.decode()
    missing = as_user(viewer_a).get("/attempts/987654/")
    assert "nothing you can see" in missing.content.decode()

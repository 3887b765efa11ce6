"""Approval before the first call, end to end in a real browser: an agent
over the HTTP API is told to wait, an approver finds the call in the
approvals queue and approves it, and the agent's next call goes out once.
Screenshots of the overview and the approvals queue go to ``test-artifacts/``."""

from __future__ import annotations

from typing import Any

import pytest

import ledgerdash_client as ledger_client
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.tokens import token_create
from tests.api_support import BOTH
from tests.conftest import TOOLS_V1
from tests.factories import attempt_in, linked_retry
from tests.test_browser import browser, people  # noqa: F401 - the browser and its people

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
S = State


def test_an_agent_waits_an_approver_approves_and_the_call_goes_out_once(
    people: Any,  # noqa: F811
    live_server: Any,
    tenant_a: Tenant,
    operator_a: Any,
    approver_a: Any,
) -> None:
    from playwright.sync_api import expect

    policy_publish(
        tenant=tenant_a,
        tools=TOOLS_V1,
        approvals={"charge_card": "amount_cents > `50000`"},
        actor=Actor.system("security"),
        note="large charges need a person",
    )
    # Some other work, so the overview and the queue show a day's mix.
    attempt_in(S.UNKNOWN, tenant_a, key="invoice:7:send")
    linked_retry(tenant_a, operator_a, key="invoice:8:send")

    # The operator's agent, over HTTP with the operator's token: four eyes
    # means the operator cannot approve its call; the approver can.
    _, token = token_create(tenant=tenant_a, name="shop agent", scopes=BOTH, actor=Actor.user(operator_a))
    agent = ledger_client.LedgerClient(live_server.url, token, agent="shop-agent")
    charges: list[int] = []

    @ledger_client.tool("charge_card", key="order:{order}:charge")
    def charge_card(call: Any, *, order: int, amount_cents: int) -> dict[str, Any]:
        charges.append(amount_cents)
        call.record_request_id(f"ch-{order}")
        return {"charged": amount_cents}

    with agent.task(task_id="checkout-42"), pytest.raises(ledger_client.AwaitingApproval) as waiting:
        charge_card(order=42, amount_cents=120000)
    assert waiting.value.retry_after == 30
    held_id = waiting.value.attempt_id
    assert held_id is not None
    assert charges == []

    approver = people("approver-a")
    page = approver.page
    expect(page.locator("#count-approvals")).to_have_text("2")
    expect(page.locator("#first-my-approvals")).to_contain_text("2 awaiting your approval")
    approver.shot("overview")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Awaiting approval").click()
    expect(page.get_by_role("heading", name="Awaiting approval")).to_be_visible()
    row = page.locator(f"#approval-{held_id}")
    expect(row).to_contain_text("no original: the first call of this key")
    expect(row).to_contain_text("amount_cents > `50000`")
    expect(row).to_contain_text("approvable")
    approver.shot("approvals-queue")
    row.get_by_role("link", name="Decide").click()
    page.wait_for_url(f"**/attempts/{held_id}/**")
    expect(page.get_by_role("heading", name="This call waits for an approver before it is sent")).to_be_visible()
    approver.shot("first-call-before-approval")
    page.get_by_label("Comment").first.fill("customer confirmed the order by phone")
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#flash")).to_contain_text(f"#{held_id} approved: its agent's next call sends it.")
    expect(page.locator("h1 .state")).to_have_text("INTENT_RECORDED")
    approver.shot("first-call-approved")

    # The operator who triggered it is not offered the decision on another one.
    with agent.task(task_id="checkout-43"), pytest.raises(ledger_client.AwaitingApproval) as second:
        charge_card(order=43, amount_cents=90000)
    operator = people("operator-a")
    operator.page.goto(f"{operator.base_url}/attempts/{second.value.attempt_id}/")
    expect(operator.page.get_by_role("button", name="Approve", exact=True)).to_have_count(0)

    with agent.task(task_id="checkout-42"):
        assert charge_card(order=42, amount_cents=120000) == {"charged": 120000}
        assert charge_card(order=42, amount_cents=120000) == {"charged": 120000}  # replayed
    assert charges == [120000]
    held = Attempt.objects.get(pk=held_id)
    assert held.state == S.OUTCOME_CONFIRMED
    assert held.dispatch_count == 1
    assert held.approved_by_id == approver_a.pk

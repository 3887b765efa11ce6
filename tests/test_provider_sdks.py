"""Each provider's official Python SDK, pointed at its replica: the replicas
answer in the shapes real clients parse, and what a preset writes into a
call is what the SDK reads back."""

from __future__ import annotations

import uuid

import pytest

from ledgerdash.ledger.providers.presets import PRESETS
from ledgerdash.ledger.providers.presets.common import ref
from tests.replicas import ACCOUNT_SID, SECRETS, Replicas, adapter_for, provider_secrets, replicas

__all__ = ["provider_secrets", "replicas"]


def new_key(name: str) -> str:
    return f"{name}:{uuid.uuid4().hex[:12]}"


def test_stripe_sdk(replicas: Replicas) -> None:
    import stripe

    client = stripe.StripeClient(SECRETS["STRIPE_SECRET_KEY"], base_addresses={"api": replicas.url("stripe")})
    key = new_key("stripe")
    adapter = adapter_for("stripe.payment_intent", replicas.url("stripe"))
    sent = adapter.dispatch(key=key, args=PRESETS["stripe.payment_intent"].example_args(key))

    intent = client.v1.payment_intents.retrieve(sent.request_id)
    found = client.v1.payment_intents.search(params={"query": f"metadata['ledgerdash_ref']:'{ref(key)}'"})
    made = client.v1.payment_intents.create(
        params={"amount": 700, "currency": "eur", "metadata": {"order": "7"}}, options={"idempotency_key": key + "/sdk"}
    )
    again = client.v1.payment_intents.create(
        params={"amount": 700, "currency": "eur", "metadata": {"order": "7"}}, options={"idempotency_key": key + "/sdk"}
    )
    refund = client.v1.refunds.create(params={"payment_intent": made.id, "amount": 200})
    refunds = client.v1.refunds.list(params={"payment_intent": made.id})

    assert isinstance(intent, stripe.PaymentIntent)
    assert intent.metadata["ledgerdash_ref"] == ref(key)
    assert [i.id for i in found.data] == [sent.request_id]
    assert again.id == made.id
    assert made.amount == 700
    assert [r.id for r in refunds.data] == [refund.id]
    with pytest.raises(stripe.IdempotencyError):
        client.v1.payment_intents.create(
            params={"amount": 701, "currency": "eur"}, options={"idempotency_key": key + "/sdk"}
        )
    with pytest.raises(stripe.CardError):
        client.v1.payment_intents.create(
            params={"amount": 5, "currency": "usd", "payment_method": "pm_card_chargeDeclined", "confirm": True}
        )
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.payment_intents.retrieve("pi_missing")


def test_slack_sdk(replicas: Replicas) -> None:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    client = WebClient(token=SECRETS["SLACK_BOT_TOKEN"], base_url=replicas.url("slack") + "/api/")
    key = new_key("slack")
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    sent = adapter.dispatch(key=key, args={"channel": "C9", "text": "from the ledger"})

    posted = client.chat_postMessage(
        channel="C9", text="from the SDK", metadata={"event_type": "order", "event_payload": {"id": "7"}}
    )
    history = client.conversations_history(channel="C9", include_all_metadata=True, limit=10)

    assert posted["ok"]
    assert posted["ts"]
    by_ts = {m["ts"]: m for m in history["messages"]}
    assert by_ts[sent.request_id.split(":")[1]]["metadata"]["event_payload"]["ref"] == ref(key)
    assert by_ts[posted["ts"]]["metadata"]["event_type"] == "order"
    with pytest.raises(SlackApiError) as refused:
        client.chat_postMessage(channel="C0ARCHIVED", text="x")
    assert refused.value.response["error"] == "is_archived"


def test_github_sdk(replicas: Replicas) -> None:
    from github import Auth, Github, GithubException

    client = Github(auth=Auth.Token(SECRETS["GITHUB_TOKEN"]), base_url=replicas.url("github"))
    key = new_key("github")
    adapter = adapter_for("github.issue", replicas.url("github"))
    sent = adapter.dispatch(key=key, args={"title": "From the ledger", "body": "hello"})
    repo = client.get_repo("acme/shop")

    issue = repo.get_issue(int(sent.request_id))
    made = repo.create_issue(title="From the SDK", body="by hand")
    comment = made.create_comment("a comment")
    listed = [i.number for i in repo.get_issues(state="all")]

    assert issue.title == "From the ledger"
    assert ref(key) in issue.body
    assert made.number in listed
    assert int(sent.request_id) in listed
    assert [c.id for c in made.get_comments()] == [comment.id]
    with pytest.raises(GithubException) as gone:
        client.get_repo("acme/no-issues").create_issue(title="x")
    assert gone.value.status == 410


def test_postmark_sdk(replicas: Replicas) -> None:
    from postmarker.core import PostmarkClient

    client = PostmarkClient(server_token=SECRETS["POSTMARK_SERVER_TOKEN"], root_api_url=replicas.url("postmark") + "/")
    key = new_key("postmark")
    adapter = adapter_for("postmark.email", replicas.url("postmark"))
    sent = adapter.dispatch(key=key, args=PRESETS["postmark.email"].example_args(key))

    answer = client.emails.send(From="a@example.com", To="b@example.com", Subject="hi", TextBody="by hand")
    outbound = client.messages.outbound.all(count=50)
    details = client.messages.outbound.get(sent.request_id)

    assert answer["ErrorCode"] == 0
    assert answer["MessageID"]
    assert {m.MessageID for m in outbound} >= {sent.request_id, answer["MessageID"]}
    assert details.Metadata["ledgerdash_ref"] == ref(key)


def test_twilio_sdk(replicas: Replicas) -> None:
    from twilio.base.exceptions import TwilioRestException
    from twilio.rest import Client

    client = Client(ACCOUNT_SID, SECRETS["TWILIO_AUTH_TOKEN"])
    client.api.base_url = replicas.url("twilio")
    key = new_key("twilio")
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    sent = adapter.dispatch(key=key, args=PRESETS["twilio.message"].example_args(key))

    fetched = client.messages(sent.request_id).fetch()
    made = client.messages.create(to="+15550002222", from_="+15017122661", body="by hand")
    listed = client.messages.list(to="+15550002222", limit=20)

    assert fetched.sid == sent.request_id
    assert key in fetched.body
    assert made.sid.startswith("SM")
    assert made.sid in [m.sid for m in listed]
    with pytest.raises(TwilioRestException) as refused:
        client.messages.create(to="+15550000000", from_="+15017122661", body="x")
    assert refused.value.code == 21211


def test_jira_sdk(replicas: Replicas) -> None:
    from jira import JIRA, JIRAError

    client = JIRA(
        server=replicas.url("jira"),
        basic_auth=("agent@example.com", SECRETS["JIRA_API_TOKEN"]),
        options={"rest_api_version": "3"},
    )
    key = new_key("jira")
    adapter = adapter_for("jira.issue", replicas.url("jira"))
    sent = adapter.dispatch(key=key, args=PRESETS["jira.issue"].example_args(key))

    issue = client.issue(sent.request_id)
    made = client.create_issue(fields={"project": {"key": "OPS"}, "summary": "by hand", "issuetype": {"name": "Task"}})
    found = client.enhanced_search_issues(f'labels = "{ref(key)}"', properties="ledgerdash")

    assert ref(key) in issue.fields.labels
    assert made.key.startswith("OPS-")
    assert [i.id for i in found] == [sent.request_id]
    assert found[0].raw["properties"]["ledgerdash"]["ref"] == ref(key)
    with pytest.raises(JIRAError) as refused:
        client.create_issue(fields={"project": {"key": "GONE"}, "summary": "x", "issuetype": {"name": "Task"}})
    assert refused.value.status_code == 400

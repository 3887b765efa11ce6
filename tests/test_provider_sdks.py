"""Each provider's Python SDK, pointed at its replica: the replicas answer
in the shapes real clients parse, and what a preset writes into a call is
what the SDK reads back. Then with the replicas' unkind modes on: what the
SDK makes of a search that is not offered, a page cap and a rate limit, an
issue deleted or edited, mail past its retention, a redacted message, a
property deleted and a field the create screen lacks."""

from __future__ import annotations

import uuid

import pytest

from ledgerdash.ledger.providers.presets import PRESETS
from ledgerdash.ledger.providers.presets.common import ref
from tests.replicas import ACCOUNT_SID, SECRETS, Replicas, adapter_for, kind_again, provider_secrets, replicas

__all__ = ["kind_again", "provider_secrets", "replicas"]
pytestmark = pytest.mark.usefixtures("kind_again")


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


# --- the SDKs against the providers as they behave -------------------------------------------


def test_stripe_sdk_with_search_unavailable_and_conflicts_typed_as_invalid_requests(replicas: Replicas) -> None:
    import stripe

    replicas.control("stripe").modes(search_unavailable=True, conflict_as_invalid_request=True)
    client = stripe.StripeClient(SECRETS["STRIPE_SECRET_KEY"], base_addresses={"api": replicas.url("stripe")})
    key = new_key("stripe")
    sent = adapter_for("stripe.payment_intent", replicas.url("stripe")).dispatch(
        key=key, args=PRESETS["stripe.payment_intent"].example_args(key)
    )

    listed = client.v1.payment_intents.list(params={"limit": 100})

    assert sent.request_id in [i.id for i in listed.data]  # the list endpoints answer where search does not
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.payment_intents.search(params={"query": f"metadata['ledgerdash_ref']:'{ref(key)}'"})


def test_slack_sdk_reads_messages_whose_metadata_was_deleted_and_meets_the_one_read_a_minute(
    replicas: Replicas,
) -> None:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    replicas.control("slack").modes(metadata_deleted_every=1, non_marketplace=True)
    client = WebClient(token=SECRETS["SLACK_BOT_TOKEN"], base_url=replicas.url("slack") + "/api/")
    channel = f"C{uuid.uuid4().hex[:8].upper()}"
    for n in range(16):
        client.chat_postMessage(channel=channel, text=f"m{n}", metadata={"event_type": "o", "event_payload": {"n": n}})

    first = client.conversations_history(channel=channel, include_all_metadata=True, limit=100)

    assert len(first["messages"]) == 15  # at most 15 a page
    assert first["has_more"]
    assert all("metadata" not in m for m in first["messages"])
    with pytest.raises(SlackApiError) as limited:
        client.conversations_history(channel=channel, cursor=first["response_metadata"]["next_cursor"])
    assert limited.value.response.status_code == 429
    assert int(limited.value.response.headers["Retry-After"]) > 0


@pytest.mark.parametrize(("mode", "status"), [("delete_every", 410), ("transfer_away_every", 404)])
def test_github_sdk_meets_issues_deleted_or_moved_out_of_reach(mode: str, status: int, replicas: Replicas) -> None:
    from github import Auth, Github, GithubException

    replicas.control("github").modes(**{mode: 1})
    repository = f"acme/r{uuid.uuid4().hex[:8]}"
    client = Github(auth=Auth.Token(SECRETS["GITHUB_TOKEN"]), base_url=replicas.url("github"))
    sent = adapter_for("github.issue", replicas.url("github"), repository=repository).dispatch(
        key=new_key("github"), args={"title": "From the ledger", "body": "hello"}
    )

    with pytest.raises(GithubException) as gone:
        client.get_repo(repository).get_issue(int(sent.request_id))
    assert gone.value.status == status


def test_github_sdk_reads_an_issue_whose_marker_was_edited_out(replicas: Replicas) -> None:
    from github import Auth, Github

    replicas.control("github").modes(marker_removed_every=1)
    repository = f"acme/r{uuid.uuid4().hex[:8]}"
    client = Github(auth=Auth.Token(SECRETS["GITHUB_TOKEN"]), base_url=replicas.url("github"))
    key = new_key("github")
    sent = adapter_for("github.issue", replicas.url("github"), repository=repository).dispatch(
        key=key, args={"title": "From the ledger", "body": "hello"}
    )

    issue = client.get_repo(repository).get_issue(int(sent.request_id))

    assert issue.body == "hello"
    assert ref(key) not in issue.body
    assert issue.updated_at > issue.created_at


def test_postmark_sdk_no_longer_finds_an_email_past_the_retention_it_was_sent_under(replicas: Replicas) -> None:
    from postmarker.core import PostmarkClient
    from postmarker.exceptions import ClientError

    control = replicas.control("postmark")
    control.modes(retention_days=7)
    client = PostmarkClient(server_token=SECRETS["POSTMARK_SERVER_TOKEN"], root_api_url=replicas.url("postmark") + "/")
    answer = client.emails.send(From="a@example.com", To="b@example.com", Subject="hi", TextBody="by hand")
    control.modes(retention_days=45)  # lengthened afterwards: it applies to later mail only
    control.advance(8 * 86400)
    try:
        with pytest.raises(ClientError) as gone:
            client.messages.outbound.get(answer["MessageID"])
    finally:
        control.advance(-8 * 86400)
    assert gone.value.error_code == 701


def test_twilio_sdk_reads_a_redacted_message(replicas: Replicas) -> None:
    from twilio.rest import Client

    replicas.control("twilio").modes(redact_body=True, redact_number=True)
    client = Client(ACCOUNT_SID, SECRETS["TWILIO_AUTH_TOKEN"])
    client.api.base_url = replicas.url("twilio")
    made = client.messages.create(to="+15550003333", from_="+15017122661", body="your code is 1234")

    fetched = client.messages(made.sid).fetch()

    assert fetched.body == ""
    assert fetched.to == "+1555000XXXX"


def test_jira_sdk_meets_a_property_deleted_and_a_create_screen_without_labels(replicas: Replicas) -> None:
    from jira import JIRA, JIRAError

    control = replicas.control("jira")
    control.modes(property_removed_every=1)
    client = JIRA(
        server=replicas.url("jira"),
        basic_auth=("agent@example.com", SECRETS["JIRA_API_TOKEN"]),
        options={"rest_api_version": "3"},
    )
    key = new_key("jira")
    sent = adapter_for("jira.issue", replicas.url("jira")).dispatch(
        key=key, args=PRESETS["jira.issue"].example_args(key)
    )

    found = client.enhanced_search_issues(f'labels = "{ref(key)}"', properties="ledgerdash")

    assert [i.id for i in found] == [sent.request_id]
    assert not found[0].raw.get("properties")
    control.modes(no_labels_on_create_screen=True)
    with pytest.raises(JIRAError) as refused:
        client.create_issue(
            fields={"project": {"key": "OPS"}, "summary": "x", "issuetype": {"name": "Task"}, "labels": ["a"]}
        )
    assert refused.value.status_code == 400

"""Each preset against its provider's replica: what it sends, what its
lookup can and cannot prove, and the provider's own refusals, limits and
faults."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection, Iterator
from typing import Any

import pytest
from django.utils import timezone

from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import NothingHappened, PermanentFailure
from ledgerdash.ledger.models import Tool
from ledgerdash.ledger.providers import factory
from ledgerdash.ledger.providers.base import LookupStatus, ProviderAmbiguous, RateLimited, Sought
from ledgerdash.ledger.providers.presets import PRESETS, PROVIDERS, preset
from ledgerdash.ledger.providers.presets.common import ref
from tests.replicas import Replicas, adapter_for, config_for, provider_secrets, replicas

__all__ = ["provider_secrets", "replicas"]

ALL = sorted(PRESETS)


def new_key(name: str) -> str:
    return f"{name}:{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def clean_faults(replicas: Replicas) -> Iterator[None]:
    yield
    for provider in replicas.urls:
        replicas.control(provider).clear()


def args_for(name: str, replicas: Replicas, key: str) -> dict[str, Any]:
    """A call's arguments for ``name``, with what it needs made first (a payment intent to refund, an issue)."""
    args = PRESETS[name].example_args(key)
    if name == "stripe.refund":
        intent = adapter_for("stripe.payment_intent", replicas.url("stripe"))
        other = new_key("intent")
        made = intent.dispatch(key=other, args=PRESETS["stripe.payment_intent"].example_args(other))
        args["payment_intent"] = made.request_id
    if name == "github.issue_comment":
        issue = adapter_for("github.issue", replicas.url("github"))
        other = new_key("issue")
        made = issue.dispatch(key=other, args=PRESETS["github.issue"].example_args(other))
        args["issue_number"] = int(made.request_id)
    return args


def sought(key: str, args: dict[str, Any], request_id: str = "", elsewhere: Collection[str] = ()) -> Sought:
    """What a lookup looks for; ``elsewhere``: the ids the ledger recorded on other side effects."""
    return Sought(
        key=key, args_hash=normalize_args(args)[1], args=args, request_id=request_id, elsewhere=elsewhere.__contains__
    )


# --- every preset ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_a_call_is_sent_once_and_found_by_what_it_carries(name: str, replicas: Replicas) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    assert adapter.find(sought(key, args)).status == LookupStatus.NOT_FOUND

    ids: list[str] = []
    sent = adapter.dispatch(key=key, args=args, on_request_id=ids.append)

    assert sent.request_id
    assert ids == [sent.request_id]
    assert replicas.control(provider).count(key) == 1
    for request_id in ("", sent.request_id):  # by what the call carries, and by the provider's id
        found = adapter.find(sought(key, args, request_id))
        assert found.status == LookupStatus.FOUND, found.detail
        assert found.request_id == sent.request_id
        assert found.payload_hash == normalize_args(args)[1]


@pytest.mark.parametrize("name", ALL)
def test_a_call_whose_id_the_ledger_recorded_on_another_side_effect_is_not_found(name: str, replicas: Replicas) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    sent = adapter.dispatch(key=key, args=args)

    answer = adapter.find(sought(key, args, elsewhere={sent.request_id}))

    assert answer.status == LookupStatus.NOT_FOUND, answer.detail
    assert f"{sent.request_id} left out: the ledger recorded it on another side effect" in answer.detail
    assert answer.extra["left_out"] == [sent.request_id]
    assert adapter.find(sought(key, args, elsewhere={"another"})).request_id == sent.request_id


@pytest.mark.parametrize("name", ALL)
def test_a_response_lost_after_acting_is_found_by_the_lookup(name: str, replicas: Replicas) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    replicas.control(provider).faults("*", lose_response=True)

    with pytest.raises(Exception) as lost:  # noqa: PT011 - what a dropped connection raises varies
        adapter.dispatch(key=key, args=args)

    assert not isinstance(lost.value, NothingHappened | PermanentFailure)
    found = adapter.find(sought(key, args))
    assert found.status == LookupStatus.FOUND
    assert found.payload_hash == normalize_args(args)[1]


@pytest.mark.parametrize("name", ALL)
def test_a_5xx_after_acting_is_not_a_refusal(name: str, replicas: Replicas) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    replicas.control(provider).faults("*", server_error="after_acting")

    with pytest.raises(ProviderAmbiguous):
        adapter.dispatch(key=key, args=args)

    assert adapter.find(sought(key, args)).status == LookupStatus.FOUND


@pytest.mark.parametrize("name", ALL)
def test_a_429_is_nothing_happened_with_the_providers_retry_after(name: str, replicas: Replicas) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    replicas.control(provider).faults("*", reject=True, retry_after=7)

    with pytest.raises(RateLimited) as limited:
        adapter.dispatch(key=key, args=args)

    assert limited.value.retry_after == 7
    assert replicas.control(provider).count(key) == 0
    replicas.control(provider).faults("*", reject=False, lookup_429=True)
    answer = adapter.find(sought(key, args))
    assert answer.status == LookupStatus.UNAVAILABLE
    assert answer.retry_after == 7


@pytest.mark.parametrize("name", ALL)
def test_an_unreachable_or_broken_lookup_decides_nothing(name: str, replicas: Replicas) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    replicas.control(provider).faults("*", lookup_5xx=True)
    assert adapter.find(sought(key, args)).status == LookupStatus.UNAVAILABLE
    gone = adapter_for(name, "http://127.0.0.1:9")
    assert gone.find(sought(key, args)).status == LookupStatus.UNAVAILABLE
    with pytest.raises(NothingHappened):
        gone.dispatch(key=key, args=args)


@pytest.mark.parametrize("name", ALL)
def test_a_missing_secret_sends_nothing_and_names_the_secret(
    name: str, replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    secret = next(o.default for o in PRESETS[name].options.values() if o.default.startswith("${"))[2:-1]
    monkeypatch.delenv(secret)
    key = new_key(name)
    with pytest.raises(NothingHappened, match=secret):
        adapter.dispatch(key=key, args=PRESETS[name].example_args(key))
    assert replicas.control(provider).count(key) == 0


@pytest.mark.parametrize("name", ALL)
def test_the_preset_states_its_providers_facts(name: str) -> None:
    cls = PRESETS[name]
    assert (cls.title and cls.provider and cls.__doc__) or cls.__module__
    assert name in PROVIDERS[name.split(".")[0]]
    assert cls.deduplicates == (name.startswith("stripe."))
    assert (cls.retention_seconds is not None) == cls.deduplicates


# --- configuration ------------------------------------------------------------------------------


def test_a_preset_config_is_checked_with_every_problem_named() -> None:
    with pytest.raises(ValueError, match=r"no preset 'stripe\.charge'; there are: stripe\.payment_intent"):
        preset("stripe.charge")
    with pytest.raises(ValueError, match=r"unknown settings for preset stripe\.payment_intent: api_key"):
        PRESETS["stripe.payment_intent"].parse_config({"api_key": "x"})
    with pytest.raises(ValueError, match="never hold one"):
        PRESETS["stripe.payment_intent"].parse_config({"secret_key": "sk_live_123"})
    with pytest.raises(ValueError, match="needs repository"):
        PRESETS["github.issue"].parse_config({})
    with pytest.raises(ValueError, match="owner/name"):
        PRESETS["github.issue"].parse_config({"repository": "just-a-name"})
    with pytest.raises(ValueError, match="needs base_url"):
        PRESETS["jira.issue"].parse_config({"email": "a@example.com"})
    with pytest.raises(ValueError, match="base_url must be an http"):
        PRESETS["slack.post_message"].parse_config({"base_url": "ftp://slack.com"})


@pytest.mark.django_db
def test_a_tool_may_not_contradict_its_presets_facts(replicas: Replicas) -> None:
    from django.core.exceptions import ValidationError

    def tool(name: str, **values: Any) -> Tool:
        return Tool(name="t", adapter=Tool.Adapter.PRESET, config=config_for(name, "https://api.example.com"), **values)

    with pytest.raises(ValidationError, match="does not deduplicate: idempotent must be false"):
        tool("slack.post_message", idempotent=True).full_clean()
    with pytest.raises(ValidationError, match="deduplicates by key for 24 h: idempotent must be true"):
        tool("stripe.payment_intent", idempotent=False).full_clean()
    with pytest.raises(ValidationError, match="keeps keys for 86400 s"):
        tool("stripe.payment_intent", idempotent=True, key_retention_seconds=90000).full_clean()
    tool("stripe.payment_intent", idempotent=True, key_retention_seconds=86400).full_clean()
    slack = tool("slack.post_message")
    slack.full_clean()
    assert factory.lookup_lag(slack) == PRESETS["slack.post_message"].documented_lag_seconds
    slack.lookup_lag_seconds = 2.5
    assert factory.build_adapter(slack).lookup_lag_seconds == 2.5


# --- what only some providers do --------------------------------------------------------------


def test_stripe_deduplicates_and_refuses_a_reused_key_with_other_parameters(replicas: Replicas) -> None:
    adapter = adapter_for("stripe.payment_intent", replicas.url("stripe"))
    key = new_key("stripe")
    args = PRESETS["stripe.payment_intent"].example_args(key)

    first = adapter.dispatch(key=key, args=args)
    again = adapter.dispatch(key=key, args=args)

    assert again.request_id == first.request_id
    assert replicas.control("stripe").count(key) == 1
    with pytest.raises(PermanentFailure, match="already used with other parameters"):
        adapter.dispatch(key=key, args={**args, "amount": args["amount"] + 1})
    assert replicas.control("stripe").count(key) == 1


def test_stripe_reads_its_list_first_and_its_search_lag_does_not_hide_a_call(replicas: Replicas) -> None:
    adapter = adapter_for("stripe.payment_intent", replicas.url("stripe"))
    control = replicas.control("stripe")
    key = new_key("stripe")
    args = PRESETS["stripe.payment_intent"].example_args(key)
    control.faults("*", search_lag_seconds=600)
    control.modes(account_api_version="2019-12-03")  # older than search: the preset names its own
    try:
        sent = adapter.dispatch(key=key, args=args)
        listed = adapter.find(sought(key, args))
    finally:
        control.kind()

    assert listed.status == LookupStatus.FOUND, listed.detail
    assert listed.request_id == sent.request_id


def test_stripe_search_lags_and_its_not_found_is_only_a_hint(replicas: Replicas, monkeypatch: Any) -> None:
    """More intents made while the call could land than the listing reads: the search decides."""
    from ledgerdash.ledger.providers.presets import stripe

    monkeypatch.setattr(stripe, "PAGES", 0)
    adapter = adapter_for("stripe.payment_intent", replicas.url("stripe"))
    control = replicas.control("stripe")
    key = new_key("stripe")
    args = PRESETS["stripe.payment_intent"].example_args(key)
    control.faults("*", search_lag_seconds=600)
    control.modes(account_api_version="2019-12-03")
    try:
        sent = adapter.dispatch(key=key, args=args)
    finally:
        control.kind()

    behind = adapter.find(sought(key, args))
    by_id = adapter.find(sought(key, args, sent.request_id))
    control.advance(601)
    caught_up = adapter.find(sought(key, args))

    assert behind.status == LookupStatus.NOT_FOUND
    assert "lag" in behind.detail
    assert by_id.status == LookupStatus.FOUND  # reading by id is read-after-write
    assert caught_up.status == LookupStatus.FOUND


def test_stripe_without_search_where_the_list_cannot_reach_is_a_blind_spot(
    replicas: Replicas, monkeypatch: Any
) -> None:
    from ledgerdash.ledger.providers.presets import stripe

    monkeypatch.setattr(stripe, "PAGES", 0)
    control = replicas.control("stripe")
    control.modes(search_unavailable=True)
    try:
        answer = adapter_for("stripe.payment_intent", replicas.url("stripe")).find(
            sought(new_key("stripe"), PRESETS["stripe.payment_intent"].example_args("x"))
        )
    finally:
        control.kind()
    assert answer.status == LookupStatus.NOT_EVIDENCE, answer.detail
    assert answer.extra["blind_spot"] == "search_unavailable"


def test_stripe_a_409_is_nothing_done_whatever_its_type() -> None:
    """Stripe answers 409 while the first request with a key still runs; typed invalid_request_error
    as it has come back, it is still nothing done by this request."""
    from ledgerdash.replicas.core import ReplicaServer
    from ledgerdash.replicas.stripe import Stripe

    stripe = Stripe()
    stripe.set_modes({"conflict_as_invalid_request": True})
    server = ReplicaServer(("127.0.0.1", 0), stripe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        adapter = adapter_for("stripe.payment_intent", f"http://127.0.0.1:{server.server_port}")
        key = new_key("stripe")
        args = PRESETS["stripe.payment_intent"].example_args(key)
        adapter.dispatch(key=key, args=args)
        params, _answer, first_seen = stripe.keys[key]
        stripe.keys[key] = (params, None, first_seen)  # as while the first request still ran
        with pytest.raises(NothingHappened, match="HTTP 409"):
            adapter.dispatch(key=key, args=args)
    finally:
        server.shutdown()
        server.server_close()


def test_stripe_metadata_past_its_limit_is_refused_before_sending(replicas: Replicas) -> None:
    adapter = adapter_for("stripe.payment_intent", replicas.url("stripe"))
    key = new_key("stripe")
    args = {**PRESETS["stripe.payment_intent"].example_args(key), "metadata": {f"k{n}": "v" for n in range(49)}}
    with pytest.raises(PermanentFailure, match="Stripe takes 50 and the ledger writes 2"):
        adapter.dispatch(key=key, args=args)
    assert replicas.control("stripe").count(key) == 0


def test_stripe_card_decline_is_a_definitive_refusal(replicas: Replicas) -> None:
    adapter = adapter_for("stripe.payment_intent", replicas.url("stripe"))
    args = {"amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined", "confirm": True}
    with pytest.raises(PermanentFailure, match="HTTP 402"):
        adapter.dispatch(key=new_key("stripe"), args=args)


def test_slack_refusals_in_a_200_are_definitive_and_others_are_not(replicas: Replicas) -> None:
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    with pytest.raises(PermanentFailure, match="is_archived"):
        adapter.dispatch(key=new_key("slack"), args={"channel": "C0ARCHIVED", "text": "hello"})
    replicas.control("slack").faults("*", server_error="before_acting")
    with pytest.raises(ProviderAmbiguous):
        adapter.dispatch(key=new_key("slack"), args={"channel": "C1", "text": "hello"})


def test_slack_finds_a_reply_in_its_thread(replicas: Replicas) -> None:
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    parent = adapter.dispatch(key=new_key("slack"), args={"channel": "C2", "text": "deploying"})
    key = new_key("slack")
    reply = {"channel": "C2", "text": "done", "thread_ts": parent.request_id.split(":")[1]}
    replicas.control("slack").faults("*", lose_response=True)
    with pytest.raises(OSError):  # noqa: PT011
        adapter.dispatch(key=key, args=reply)
    assert adapter.find(sought(key, reply)).status == LookupStatus.FOUND


def test_github_refusals_name_what_was_wrong(replicas: Replicas) -> None:
    url = replicas.url("github")
    with pytest.raises(PermanentFailure, match="HTTP 410"):
        adapter_for("github.issue", url, repository="acme/no-issues").dispatch(key="k", args={"title": "x"})
    with pytest.raises(PermanentFailure, match="HTTP 404"):
        adapter_for("github.issue_comment", url).dispatch(key="k", args={"issue_number": 99999, "body": "x"})
    with pytest.raises(PermanentFailure, match="already holds a ledger marker"):
        adapter_for("github.issue", url).dispatch(
            key="k", args={"title": "x", "body": f"<!-- ledgerdash:ref={ref('k')} args_sha256={'0' * 64} -->"}
        )


def test_twilio_matches_by_content_and_two_alike_are_for_a_person(replicas: Replicas) -> None:
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    args = {"to": "+15550001111", "from": "+15017122661", "body": f"code {uuid.uuid4().hex[:6]}"}
    first = new_key("twilio")
    adapter.dispatch(key=first, args=args)
    assert adapter.find(sought(first, args)).status == LookupStatus.FOUND
    other = {**args, "body": args["body"] + "!"}
    assert adapter.find(sought(new_key("twilio"), other)).status == LookupStatus.NOT_FOUND

    adapter.dispatch(key=new_key("twilio"), args=args)  # the same text to the same number again

    answer = adapter.find(sought(first, args))
    assert answer.status == LookupStatus.AMBIGUOUS
    assert "2 messages" in answer.detail


def test_twilio_of_two_alike_messages_takes_the_one_no_other_side_effect_holds(replicas: Replicas) -> None:
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    args = {"to": "+15550002222", "from": "+15017122661", "body": f"code {uuid.uuid4().hex[:6]}"}
    ours, theirs = new_key("twilio"), new_key("twilio")
    sent = adapter.dispatch(key=ours, args=args)
    other = adapter.dispatch(key=theirs, args=args)  # another side effect, recorded with its sid

    answer = adapter.find(sought(ours, args, elsewhere={other.request_id}))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id
    assert f"{other.request_id} left out" in answer.detail
    assert adapter.find(sought(ours, args)).status == LookupStatus.AMBIGUOUS
    both = adapter.find(sought(ours, args, elsewhere={sent.request_id, other.request_id}))
    assert both.status == LookupStatus.NOT_FOUND
    assert sorted(both.extra["left_out"]) == sorted([sent.request_id, other.request_id])


@pytest.mark.parametrize("name", ["twilio.message", "slack.post_message", "github.issue"])
@pytest.mark.parametrize(("margin", "status"), [(300, LookupStatus.FOUND), (60, LookupStatus.NOT_FOUND)])
def test_a_search_by_the_providers_times_allows_for_its_clock_within_the_margin(
    name: str, margin: int, status: LookupStatus, replicas: Replicas, settings: Any
) -> None:
    """The provider's clock four minutes behind the ledger's: within the default margin the
    search still finds the call; past a margin set tighter it misses it (outside the promise)."""
    settings.LEDGER_PROVIDER_CLOCK_SKEW_SECONDS = margin
    provider = name.split(".")[0]
    adapter = adapter_for(name, replicas.url(provider))
    key = new_key(name)
    args = args_for(name, replicas, key)
    control = replicas.control(provider)
    control.advance(-240)
    try:
        sent_after = timezone.now()
        adapter.dispatch(key=key, args=args)
        answer = adapter.find(Sought(key=key, args_hash=normalize_args(args)[1], args=args, sent_after=sent_after))
    finally:
        control.advance(240)
    assert answer.status == status, answer.detail


def test_twilio_takes_only_what_it_can_compare(replicas: Replicas) -> None:
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    with pytest.raises(PermanentFailure, match="not status_callback"):
        adapter.dispatch(key="k", args={"to": "+15550001111", "from": "+1", "body": "x", "status_callback": "u"})
    with pytest.raises(PermanentFailure, match=r"error 21211"):
        adapter.dispatch(key="k", args={"to": "+15550000000", "from": "+15017122661", "body": "x"})


def test_jira_search_lags_and_reading_by_id_does_not(replicas: Replicas) -> None:
    adapter = adapter_for("jira.issue", replicas.url("jira"))
    control = replicas.control("jira")
    key = new_key("jira")
    args = PRESETS["jira.issue"].example_args(key)
    control.faults("*", search_lag_seconds=120)
    sent = adapter.dispatch(key=key, args=args)

    assert adapter.find(sought(key, args)).status == LookupStatus.NOT_FOUND
    assert adapter.find(sought(key, args, sent.request_id)).status == LookupStatus.FOUND
    # Atlassian states no bound on the lag: where the tool states none either, a search proves nothing.
    unstated = adapter_for("jira.issue", replicas.url("jira"), lag_stated=False).find(sought(key, args))
    assert unstated.status == LookupStatus.NOT_EVIDENCE
    assert unstated.extra["blind_spot"] == "search_lag_unbounded"
    control.advance(121)
    assert adapter.find(sought(key, args)).status == LookupStatus.FOUND
    with pytest.raises(PermanentFailure, match="valid project is required"):
        adapter.dispatch(key=new_key("jira"), args={"fields": {"project": {"key": "GONE"}, "summary": "x"}})


def test_postmark_refuses_an_inactive_recipient_for_good(replicas: Replicas) -> None:
    adapter = adapter_for("postmark.email", replicas.url("postmark"))
    args = {**PRESETS["postmark.email"].example_args("k"), "To": "inactive@example.com"}
    with pytest.raises(PermanentFailure, match="ErrorCode 406"):
        adapter.dispatch(key=new_key("postmark"), args=args)


@pytest.mark.django_db
def test_a_tenant_binds_a_presets_secret_like_a_header_placeholder(
    tenant_a: Any, replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.core.exceptions import ValidationError

    from ledgerdash.ledger.models import ToolCredential
    from ledgerdash.ledger.providers import registry

    tool = Tool.objects.create(
        name="charge",
        adapter=Tool.Adapter.PRESET,
        config=config_for("stripe.payment_intent", replicas.url("stripe")),
        idempotent=True,
        key_retention_seconds=86400,
    )
    with pytest.raises(ValidationError, match=r"uses no \$\{API_KEY\} in its credential settings"):
        ToolCredential(tenant=tenant_a, tool=tool, placeholder="API_KEY", secret_name="ACME_STRIPE").full_clean()
    binding = ToolCredential(tenant=tenant_a, tool=tool, placeholder="STRIPE_SECRET_KEY", secret_name="ACME_STRIPE")
    binding.full_clean()
    binding.save()
    monkeypatch.delenv("STRIPE_SECRET_KEY")

    profile = registry.profile_for("charge", tenant_a.pk)
    assert profile is not None
    key = new_key("tenant")
    with pytest.raises(NothingHappened, match="ACME_STRIPE"):
        profile.adapter.dispatch(key=key, args=PRESETS["stripe.payment_intent"].example_args(key))
    monkeypatch.setenv("ACME_STRIPE", "sk_test_acme")
    assert profile.adapter.dispatch(key=key, args=PRESETS["stripe.payment_intent"].example_args(key)).request_id
    other = registry.profile_for("charge", None)
    assert other is not None
    with pytest.raises(NothingHappened, match="per-tenant credential"):
        other.adapter.dispatch(key=new_key("x"), args=PRESETS["stripe.payment_intent"].example_args("x"))


def test_a_secret_a_header_cannot_carry_is_refused_before_sending_and_never_shown(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-secret-value\n")
    key = new_key("slack")
    with pytest.raises(NothingHappened, match="SLACK_BOT_TOKEN") as refused:
        adapter.dispatch(key=key, args={"channel": "C1", "text": "hello"})
    assert "secret-value" not in str(refused.value)
    answer = adapter.find(sought(key, {"channel": "C1", "text": "hello"}))
    assert answer.status == LookupStatus.UNAVAILABLE
    assert "secret-value" not in answer.detail
    assert replicas.control("slack").count(key) == 0


def test_postmark_searches_the_stream_the_email_went_to(replicas: Replicas) -> None:
    adapter = adapter_for("postmark.email", replicas.url("postmark"), message_stream="broadcast")
    key = new_key("postmark")
    args = PRESETS["postmark.email"].example_args(key)
    replicas.control("postmark").faults("*", lose_response=True)
    with pytest.raises(OSError):  # noqa: PT011
        adapter.dispatch(key=key, args=args)
    assert adapter.find(sought(key, args)).status == LookupStatus.FOUND
    on_default = adapter_for("postmark.email", replicas.url("postmark"))
    assert on_default.find(sought(key, args)).status == LookupStatus.NOT_FOUND
    with pytest.raises(ValueError, match="retention_days must be a number of days from 7 to 365"):
        PRESETS["postmark.email"].parse_config({"retention_days": "3"})
    assert adapter_for("postmark.email", replicas.url("postmark"), retention_days="90").lookup_retention is not None

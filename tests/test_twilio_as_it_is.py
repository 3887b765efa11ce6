"""Twilio as its own pages describe it, against the replica with the account
set up the unkind way (Message Redaction, Smart Encoding, a shortened
retention, long queues, numbers written the local way): the lookup never
answers "not found" for a message Twilio sent, and the reconciler and the
standing shown to approvers read what it answers instead."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from ledgerdash.ledger import recording, rules
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers.base import LookupStatus, Sought
from ledgerdash.ledger.providers.presets import PRESETS, twilio
from ledgerdash.ledger.reconciler import Reconciler
from tests.conftest import AGENT, record
from tests.replicas import Replicas, adapter_for, config_for, kind_again, provider_secrets, replicas
from tests.test_presets import sought

__all__ = ["kind_again", "provider_secrets", "replicas"]
pytestmark = pytest.mark.usefixtures("kind_again")

SENDER = "+15017122661"


def a_number() -> str:
    """A recipient of its own per test, so no other test's messages are in the window."""
    return f"+1555{uuid.uuid4().int % 10**7:07d}".replace("0000", "0001")


def call(**overrides: str) -> dict[str, Any]:
    return {"to": a_number(), "from": SENDER, "body": f"code {uuid.uuid4().hex[:6]}", **overrides}


def test_a_message_redacted_after_sending_is_found_by_the_sid_the_ledger_recorded(replicas: Replicas) -> None:
    replicas.control("twilio").modes(redact_body=True, redact_number=True)
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    args, key = call(), f"sms:{uuid.uuid4().hex[:8]}"
    sent = adapter.dispatch(key=key, args=args)

    answer = adapter.find(sought(key, args, request_id=sent.request_id))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id
    assert answer.payload_hash == ""  # nothing left to compare: the recorded sid settles it
    assert "Twilio changed what it shows" in answer.detail


@pytest.mark.parametrize("mode", ["redact_body", "smart_encoding"])
def test_a_body_twilio_emptied_or_rewrote_is_for_a_person_never_not_found(mode: str, replicas: Replicas) -> None:
    replicas.control("twilio").modes(**{mode: True})
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    args = {"to": a_number(), "messaging_service_sid": "MG" + "1" * 32, "body": "“Your order” — ready… "}
    key = f"sms:{uuid.uuid4().hex[:8]}"
    adapter.dispatch(key=key, args=args)

    answer = adapter.find(sought(key, args))

    assert answer.status == LookupStatus.AMBIGUOUS, answer.detail
    assert "Twilio changed what it shows" in answer.detail
    # Rewritten, another body is still told apart; emptied, it cannot be.
    other = {**args, "body": "Something else entirely"}
    expected = LookupStatus.NOT_FOUND if mode == "smart_encoding" else LookupStatus.AMBIGUOUS
    assert adapter.find(sought(f"sms:{uuid.uuid4().hex[:8]}", other)).status == expected


def test_with_numbers_redacted_the_lookup_reads_the_senders_messages(replicas: Replicas) -> None:
    replicas.control("twilio").modes(redact_number=True)
    args, key = call(), f"sms:{uuid.uuid4().hex[:8]}"
    adapter_for("twilio.message", replicas.url("twilio")).dispatch(key=key, args=args)
    told = adapter_for("twilio.message", replicas.url("twilio"), number_redaction="on")

    answer = told.find(sought(key, args))

    assert answer.status == LookupStatus.AMBIGUOUS, answer.detail
    assert "number masked" in answer.detail
    # Another recipient's masked number is not this call's.
    elsewhere = {**args, "to": "+1444" + args["to"][5:]}
    assert told.find(sought(f"sms:{uuid.uuid4().hex[:8]}", elsewhere)).status == LookupStatus.NOT_FOUND


def test_a_recipient_written_the_local_way_is_found_as_twilio_stored_it(replicas: Replicas) -> None:
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    number = a_number()
    local = f"({number[2:5]}) {number[5:8]}-{number[8:]}"
    args, key = call(to=local), f"sms:{uuid.uuid4().hex[:8]}"
    sent = adapter.dispatch(key=key, args=args)
    assert replicas.control("twilio").effects()[-1]["to"] == number

    answer = adapter.find(sought(key, args))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id
    assert answer.payload_hash == sought(key, args).args_hash


def test_a_message_sent_before_one_queued_long_is_still_read(replicas: Replicas, monkeypatch: Any) -> None:
    """The listing is sorted by when each message was sent: a message made before the call but held in
    Twilio's queue until after it ends a page; the call's own message comes on the next one."""
    monkeypatch.setattr(twilio, "PAGE_SIZE", 5)
    control, adapter = replicas.control("twilio"), adapter_for("twilio.message", replicas.url("twilio"))
    to = a_number()
    control.modes(queue_seconds=3 * 3600.0)
    adapter.dispatch(key="early", args=call(to=to, body="made first, queued for three hours"))
    control.modes(queue_seconds=0.0)
    control.advance(3600)
    try:
        sent_after = adapter_now(control)
        args, key = call(to=to), f"sms:{uuid.uuid4().hex[:8]}"
        sent = adapter.dispatch(key=key, args=args)
        control.advance(2.5 * 3600)
        for n in range(4):
            adapter.dispatch(key=f"later-{n}", args=call(to=to, body=f"later {n}"))

        answer = adapter.find(Sought(key=key, args_hash=sought(key, args).args_hash, args=args, sent_after=sent_after))
    finally:
        control.advance(-6.5 * 3600)
    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id


def adapter_now(control: Any) -> Any:
    """The replica's now, as the ledger's clock would read it at the call's first dispatch."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(control._call("POST", "/clock", {"advance": 0})["now"], UTC)


def test_more_messages_than_the_lookup_reads_is_a_blind_spot_not_a_not_found(
    replicas: Replicas, monkeypatch: Any
) -> None:
    monkeypatch.setattr(twilio, "PAGE_SIZE", 2)
    monkeypatch.setattr(twilio, "PAGES", 2)
    adapter = adapter_for("twilio.message", replicas.url("twilio"))
    to = a_number()
    for n in range(5):
        adapter.dispatch(key=f"busy-{n}", args=call(to=to, body=f"busy {n}"))

    answer = adapter.find(sought("never-sent", call(to=to)))

    assert answer.status == LookupStatus.NOT_EVIDENCE, answer.detail
    assert answer.extra["blind_spot"] == "page_cap"
    assert "not evidence that it was not sent" in answer.detail


def test_retention_is_the_accounts_choice(replicas: Replicas) -> None:
    assert adapter_for("twilio.message", replicas.url("twilio")).lookup_retention == timedelta(days=400)
    shortened = adapter_for("twilio.message", replicas.url("twilio"), retention_days="7")
    assert shortened.lookup_retention == timedelta(days=7)
    with pytest.raises(ValueError, match="retention_days must be a number of days from 7 to 400"):
        PRESETS["twilio.message"].parse_config({"account_sid": "AC1", "retention_days": "401"})
    with pytest.raises(ValueError, match='number_redaction is "on" or "off"'):
        PRESETS["twilio.message"].parse_config({"account_sid": "AC1", "number_redaction": "yes"})


# --- what the reconciler and the approvers make of it -------------------------------------


@pytest.fixture
def sms_tool(tenant_a: Tenant, replicas: Replicas) -> str:
    Tool.objects.create(
        name="sms",
        adapter=Tool.Adapter.PRESET,
        config=config_for("twilio.message", replicas.url("twilio")),
        max_request_seconds=1.0,
        dispatch_lease_seconds=1.5,
    )
    policy_publish(tenant=tenant_a, tools={"sms": []}, actor=Actor.system("test"), note="sms")
    return "sms"


def sent_and_lost(tenant: Tenant, tool: str, replicas: Replicas, args: dict[str, Any]) -> Attempt:
    """The agent sent the SMS, Twilio sent it, the answer was lost and the agent died."""
    key = f"sms:{uuid.uuid4().hex[:10]}"
    attempt = recording.mark_dispatched(record(tenant, key, tool_name=tool, args=args), actor=AGENT)
    adapter_for("twilio.message", replicas.url("twilio")).dispatch(key=key, args=args)
    return attempt


def reconcile_long_after(attempt: Attempt) -> Any:
    """One reconciler pass ten minutes after the call; the instant it ran at."""
    assert attempt.first_dispatched_at is not None
    instant = attempt.first_dispatched_at + timedelta(minutes=10)
    Reconciler(label="twilio-test", clock=lambda: instant).run_pass()
    attempt.refresh_from_db()
    return instant


@pytest.mark.django_db
def test_a_redacted_message_goes_to_a_person_without_proof_it_was_not_sent(
    tenant_a: Tenant, sms_tool: str, replicas: Replicas
) -> None:
    replicas.control("twilio").modes(redact_body=True)
    attempt = sent_and_lost(tenant_a, sms_tool, replicas, call())

    instant = reconcile_long_after(attempt)

    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.last_lookup == "ambiguous"
    standing = rules.original_standing(attempt, now=instant)
    assert standing.proof is None
    assert standing.risk


@pytest.mark.django_db
def test_a_blind_spot_goes_to_a_person_at_once_and_approvers_are_told_it_proves_nothing(
    tenant_a: Tenant, sms_tool: str, replicas: Replicas, monkeypatch: Any
) -> None:
    monkeypatch.setattr(twilio, "PAGE_SIZE", 1)
    monkeypatch.setattr(twilio, "PAGES", 1)
    args = call()
    adapter_for("twilio.message", replicas.url("twilio")).dispatch(key="another", args={**args, "body": "other"})
    key = f"sms:{uuid.uuid4().hex[:10]}"
    attempt = recording.mark_dispatched(record(tenant_a, key, tool_name=sms_tool, args=args), actor=AGENT)
    adapter_for("twilio.message", replicas.url("twilio")).dispatch(key="later", args={**args, "body": "later"})

    instant = reconcile_long_after(attempt)

    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.check_count <= 1
    assert attempt.last_lookup == "not_evidence"
    event = AttemptEvent.objects.filter(attempt=attempt).order_by("seq").last()
    assert event is not None
    assert "could not have seen this call" in event.reason
    standing = rules.original_standing(attempt, now=instant)
    assert standing.proof is None
    assert "not evidence" in (standing.risk or "")

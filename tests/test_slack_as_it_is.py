"""Slack as its own pages describe it, against the replica with the limits an
app outside the Marketplace meets and what people and apps do to a message
after it was posted (its metadata changed or deleted, the message deleted),
and a channel named the way chat.postMessage takes but history does not: the
lookup never answers "not found" for a message Slack posted, and a busy
window is read to its end over several checks."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledgerdash.ledger.providers.base import LookupStatus, Sought
from tests.replicas import Replicas, adapter_for, kind_again, provider_secrets, replicas
from tests.test_presets import sought

__all__ = ["kind_again", "provider_secrets", "replicas"]
pytestmark = pytest.mark.usefixtures("kind_again")


def a_channel() -> str:
    return f"C{uuid.uuid4().hex[:9].upper()}"


def call(channel: str, text: str = "") -> dict[str, Any]:
    return {"channel": channel, "text": text or f"Deploy finished ({uuid.uuid4().hex[:6]})"}


def nth_message(replicas: Replicas) -> int:
    """How many messages the replica holds: the next one posted is this plus one."""
    return len([e for e in replicas.control("slack").effects() if e["kind"] == "message"])


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("metadata_deleted_every", "its metadata was changed or removed since"),
        ("metadata_edited_every", "its metadata was changed or removed since"),
        ("deleted_every", "it was deleted since"),
    ],
)
def test_the_timestamp_slack_answered_with_finds_the_message_whatever_became_of_it(
    mode: str, said: str, replicas: Replicas
) -> None:
    control = replicas.control("slack")
    control.modes(**{mode: nth_message(replicas) + 1})
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    key, args = f"slack:{uuid.uuid4().hex[:8]}", call(a_channel())
    sent = adapter.dispatch(key=key, args=args)

    answer = adapter.find(sought(key, args, request_id=sent.request_id))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id
    assert said in answer.detail


@pytest.mark.parametrize("mode", ["metadata_deleted_every", "metadata_edited_every"])
def test_a_message_with_the_calls_text_whose_metadata_changed_is_for_a_person(mode: str, replicas: Replicas) -> None:
    control = replicas.control("slack")
    control.modes(**{mode: nth_message(replicas) + 1})
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    key, args = f"slack:{uuid.uuid4().hex[:8]}", call(a_channel())
    adapter.dispatch(key=key, args=args)

    answer = adapter.find(sought(key, args))

    assert answer.status == LookupStatus.AMBIGUOUS, answer.detail
    assert "metadata was changed or removed" in answer.detail


def test_a_channel_named_by_name_is_read_by_the_id_slack_answered_with(replicas: Replicas) -> None:
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    key, args = f"slack:{uuid.uuid4().hex[:8]}", call("#deploys")
    sent = adapter.dispatch(key=key, args=args)
    assert sent.request_id.startswith("C")

    by_receipt = adapter.find(sought(key, args, request_id=sent.request_id))
    without = adapter.find(sought(key, args))

    assert by_receipt.status == LookupStatus.FOUND, by_receipt.detail
    assert by_receipt.payload_hash == sought(key, args).args_hash
    assert without.status == LookupStatus.NOT_EVIDENCE, without.detail
    assert without.extra["blind_spot"] == "channel_by_name"


def test_outside_the_marketplace_a_busy_window_is_read_to_its_end_over_several_checks(replicas: Replicas) -> None:
    """One read a minute, 15 messages a page: the call's message is the oldest of 40 in a window that
    closed long ago; each check reads on from where the last stopped."""
    control = replicas.control("slack")
    adapter = adapter_for("slack.post_message", replicas.url("slack"))
    channel, key = a_channel(), f"slack:{uuid.uuid4().hex[:8]}"
    args = call(channel)
    control.advance(-3600)
    try:
        sent_at = datetime.fromtimestamp(control._call("POST", "/clock", {"advance": 0})["now"], UTC)
        adapter.dispatch(key=key, args=args)
        for n in range(39):
            adapter.dispatch(key=f"other-{n}", args=call(channel, f"other {n}"))
    finally:
        control.advance(3600)
    control.modes(non_marketplace=True)
    looked_for = Sought(
        key=key,
        args_hash=sought(key, args).args_hash,
        args=args,
        sent_after=sent_at - timedelta(seconds=5),
        lands_by=sent_at + timedelta(seconds=30),
    )

    answers = []
    for _ in range(4):
        answers.append(adapter.find(looked_for))
        if answers[-1].status == LookupStatus.FOUND:
            break
        control.advance(60)

    assert [a.status for a in answers] == [LookupStatus.UNAVAILABLE] * 2 + [LookupStatus.FOUND], [
        a.detail for a in answers
    ]
    assert "15 messages of" in answers[0].detail
    assert answers[0].retry_after is not None

"""Notifications: the outbox, the delivery worker, the channels, the timed rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import override_settings

from ledgerdash.ledger import clock, moves, recording, workers
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainCheck, ReconcilerWorker, Tenant
from ledgerdash.notify import outbox, services, signing, worker
from ledgerdash.notify.models import Channel, Delivery, DeliveryStatus, DeliveryTry, Rule, RuleEvent
from tests.conftest import AGENT, RECONCILER, record
from tests.factories import recorded_in_chain
from tests.live import free_port
from tests.notify_receiver import Receiver
from tests.test_incident_views import duplicate  # noqa: F401 - a fixture

ADMIN = Actor.system("tests")
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def webhook(tenant: Tenant, receiver: Receiver, event: str = RuleEvent.ENTERED_MANUAL_REVIEW, **rule: Any) -> Rule:
    channel = services.channel_create(tenant=tenant, name="ops hook", kind="webhook", target=receiver.url, actor=ADMIN)
    receiver.secret = channel.secret
    return services.rule_create(tenant=tenant, actor=ADMIN, event=event, channel_id=channel.pk, **rule)


def to_review(tenant: Tenant, key: str) -> Attempt:
    attempt = recording.mark_dispatched(record(tenant, key), actor=AGENT)
    attempt = recording.mark_unknown(attempt, reason="timeout", actor=AGENT)
    return moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="not idempotent")


def test_an_attempt_entering_review_becomes_one_delivery(tenant_a: Tenant, receiver: Receiver) -> None:
    before = to_review(tenant_a, "before-the-rule")
    rule = webhook(tenant_a, receiver)
    attempt = to_review(tenant_a, "after-the-rule")
    assert outbox.collect_events() == 1
    (delivery,) = Delivery.objects.all()
    assert delivery.rule == rule
    assert delivery.attempt_id == attempt.pk != before.pk  # history is not replayed
    assert delivery.payload["delivery_id"] == str(delivery.pk)
    assert delivery.payload["attempt"]["state"] == "MANUAL_REVIEW"
    assert delivery.payload["url"].endswith(f"/attempts/{attempt.pk}/")
    # The cursor moved with the deliveries: a second pass writes nothing.
    assert outbox.collect_events() == 0
    assert Delivery.objects.count() == 1


def test_events_that_match_no_rule_write_nothing(tenant_a: Tenant, tenant_b: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver)
    recording.mark_dispatched(record(tenant_a, "confirmed-only"), actor=AGENT)
    to_review(tenant_b, "other-tenant")
    assert outbox.collect_events() == 0


def test_the_webhook_is_signed_and_carries_the_delivery_id(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver)
    to_review(tenant_a, "signed")
    summary = worker.run_pass(worker="test")
    assert (summary.collected, summary.sent) == (1, 1)
    (got,) = receiver.received
    assert receiver.refused == []
    assert got["signed"]
    delivery = Delivery.objects.get()
    assert got["delivery"] == got["body"]["delivery_id"] == str(delivery.pk)
    assert delivery.status == DeliveryStatus.SENT
    (attempt_made,) = DeliveryTry.objects.filter(delivery=delivery)
    assert attempt_made.ok
    assert attempt_made.status_code == 204


def test_a_receiver_refuses_a_wrong_stale_or_tampered_signature() -> None:
    body = b'{"delivery_id":"x"}'
    now = 1_900_000_000
    good = signing.sign("s3cret", now, body)
    signing.verify("s3cret", timestamp=str(now), body=body, signature=good, now=now + 10)
    with pytest.raises(signing.SignatureError, match="does not match"):
        signing.verify("s3cret", timestamp=str(now), body=body + b" ", signature=good, now=now)
    with pytest.raises(signing.SignatureError, match="does not match"):
        signing.verify("other", timestamp=str(now), body=body, signature=good, now=now)
    with pytest.raises(signing.SignatureError, match="outside the 300s window"):
        signing.verify("s3cret", timestamp=str(now), body=body, signature=good, now=now + 301)
    with pytest.raises(signing.SignatureError, match="does not match"):
        # The timestamp is signed: moving it forward breaks the signature.
        signing.verify("s3cret", timestamp=str(now + 5), body=body, signature=good, now=now)
    with pytest.raises(signing.SignatureError, match="whole number"):
        signing.verify("s3cret", timestamp="soon", body=body, signature=good, now=now)


@override_settings(NOTIFY_MAX_TRIES=3, NOTIFY_BACKOFF_SECONDS=10, NOTIFY_MAX_BACKOFF_SECONDS=3600)
def test_failed_sends_back_off_exponentially_then_die(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver)
    receiver.mode = "fail"
    with clock.frozen_at(T0):
        to_review(tenant_a, "failing")
        assert worker.run_pass(worker="test").failed == 1
    delivery = Delivery.objects.get()
    assert delivery.tries == 1
    assert delivery.next_try_at == T0 + timedelta(seconds=10)
    assert "HTTP 503" in delivery.last_error
    with clock.frozen_at(T0 + timedelta(seconds=9)):
        assert worker.run_pass(worker="test").failed == 0  # not due yet
    with clock.frozen_at(T0 + timedelta(seconds=10)):
        assert worker.run_pass(worker="test").failed == 1
    delivery.refresh_from_db()
    assert delivery.tries == 2
    assert delivery.next_try_at == T0 + timedelta(seconds=30)
    with clock.frozen_at(T0 + timedelta(seconds=30)):
        assert worker.run_pass(worker="test").dead == 1
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DEAD
    assert list(delivery.attempts_made.values_list("number", "ok")) == [(1, False), (2, False), (3, False)]
    # Sent again by an admin: pending at once, the same delivery id, an event in the chain.
    receiver.mode = "ok"
    with clock.frozen_at(T0 + timedelta(hours=1)):
        worker.delivery_resend(delivery=delivery, actor=ADMIN)
        assert worker.run_pass(worker="test").sent == 1
    assert receiver.received[-1]["delivery"] == str(delivery.pk)
    event = AttemptEvent.objects.filter(tenant=tenant_a, kind=EventKind.NOTIFY_RESEND).get()
    assert event.details["delivery_id"] == str(delivery.pk)
    with pytest.raises(worker.NotDead):
        worker.delivery_resend(delivery=delivery, actor=ADMIN)


@override_settings(NOTIFY_SEND_TIMEOUT_SECONDS=1, NOTIFY_CLAIM_SECONDS=5)
def test_a_hanging_receiver_is_a_failed_try(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver)
    receiver.mode, receiver.hang_seconds = "hang", 2.0
    to_review(tenant_a, "hangs")
    assert worker.run_pass(worker="test").failed == 1
    assert "timed out" in Delivery.objects.get().last_error


@override_settings(LEDGERDASH_BASE_URL="https://ledger.example.com")
def test_slack_gets_a_readable_message_with_a_link(tenant_a: Tenant, receiver: Receiver) -> None:
    channel = services.channel_create(tenant=tenant_a, name="slack", kind="slack", target=receiver.url, actor=ADMIN)
    assert channel.secret == ""
    services.rule_create(tenant=tenant_a, actor=ADMIN, event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk)
    attempt = to_review(tenant_a, "slack")
    assert worker.run_pass(worker="test").sent == 1
    (got,) = receiver.received
    text = got["body"]["text"]
    assert f"Attempt #{attempt.pk} entered manual review" in text
    assert f"<https://ledger.example.com/attempts/{attempt.pk}/|Open in ledgerdash>" in text
    assert str(Delivery.objects.get().pk) in text


def test_slack_text_from_an_agent_cannot_mention_everyone_or_link(tenant_a: Tenant, receiver: Receiver) -> None:
    channel = services.channel_create(tenant=tenant_a, name="slack", kind="slack", target=receiver.url, actor=ADMIN)
    services.rule_create(tenant=tenant_a, actor=ADMIN, event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk)
    attempt = recording.mark_unknown(
        recording.mark_dispatched(record(tenant_a, "hostile"), actor=AGENT), reason="x", actor=AGENT
    )
    moves.attempt_escalate(
        attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="<!channel> <https://evil.example|click> & co"
    )
    worker.run_pass(worker="test")
    text = receiver.received[0]["body"]["text"]
    assert "&lt;!channel&gt; &lt;https://evil.example|click&gt; &amp; co" in text
    assert "<!channel>" not in text


def test_email_goes_through_the_email_backend_to_the_owner(tenant_a: Tenant, operator_a: Any) -> None:
    operator_a.email = "operator@example.com"
    operator_a.save(update_fields=["email"])
    channel = services.channel_create(tenant=tenant_a, name="mail", kind="email", target="ops@example.com", actor=ADMIN)
    services.rule_create(
        tenant=tenant_a, actor=ADMIN, event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk, audience="owner"
    )
    attempt = to_review(tenant_a, "mail")
    Attempt.objects.filter(pk=attempt.pk).update(owner=operator_a)
    # The owner is read when the delivery is made: set it before the pass.
    assert worker.run_pass(worker="test").sent == 1
    (message,) = mail.outbox
    delivery = Delivery.objects.get()
    assert message.to == ["operator@example.com"]
    assert message.extra_headers["Message-ID"] == f"<{delivery.pk}@ledgerdash>"
    assert f"/attempts/{attempt.pk}/" in message.body


def test_a_linked_retry_awaiting_approval_goes_to_approvers(tenant_a: Tenant, operator_a: Any, approver_a: Any) -> None:
    approver_a.email = "approver@example.com"
    approver_a.save(update_fields=["email"])
    channel = services.channel_create(tenant=tenant_a, name="mail", kind="email", target="ops@example.com", actor=ADMIN)
    services.rule_create(
        tenant=tenant_a,
        actor=ADMIN,
        event=RuleEvent.RETRY_AWAITING_APPROVAL,
        channel_id=channel.pk,
        audience="approvers",
    )
    original = to_review(tenant_a, "retry-me")
    retry = moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="provider says not found")
    assert outbox.collect_events() == 1
    delivery = Delivery.objects.get()
    assert delivery.attempt_id == retry.pk
    assert delivery.recipients == ["approver@example.com"]


def held_call(tenant: Tenant, key: str = "order:1:charge") -> Attempt:
    """A first call its policy holds for an approver."""
    held = recording.record_intent(
        tenant=tenant,
        task_id="t",
        tool_name="charge_card",
        idempotency_key=key,
        args={"amount_cents": 90000},
        actor=AGENT,
    ).attempt
    assert held.state == "MANUAL_REVIEW"
    return held


def test_a_first_call_held_for_approval_fires_its_own_event(guarded: Tenant, receiver: Receiver) -> None:
    """What awaits approval is the ledger's one answer (rules.awaiting_approval): a first call its policy
    held reaches the awaiting_approval rule, neither the linked retries' rule on the same channel nor
    the rule for work that entered manual review."""
    awaiting = webhook(guarded, receiver, RuleEvent.AWAITING_APPROVAL)
    retries = services.rule_create(
        tenant=guarded, actor=ADMIN, event=RuleEvent.RETRY_AWAITING_APPROVAL, channel_id=awaiting.channel_id
    )
    review = services.rule_create(
        tenant=guarded, actor=ADMIN, event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=awaiting.channel_id
    )
    held_call(guarded)
    assert outbox.collect_events() == 1
    delivery = Delivery.objects.get()
    assert delivery.rule_id == awaiting.pk
    assert delivery.rule_id not in (retries.pk, review.pk)
    assert "awaits approval" in json.dumps(delivery.payload)


def test_a_linked_retry_is_not_a_held_first_call(tenant_a: Tenant, operator_a: Any, receiver: Receiver) -> None:
    awaiting = webhook(tenant_a, receiver, RuleEvent.AWAITING_APPROVAL)
    retries = services.rule_create(
        tenant=tenant_a, actor=ADMIN, event=RuleEvent.RETRY_AWAITING_APPROVAL, channel_id=awaiting.channel_id
    )
    original = to_review(tenant_a, "retry-me")
    moves.retry_request(attempt=original, actor=Actor.user(operator_a), reason="provider says not found")
    assert outbox.collect_events() == 1
    assert Delivery.objects.get().rule_id == retries.pk


def test_the_retries_rule_alone_still_hears_of_held_first_calls_for_a_release(
    guarded: Tenant, receiver: Receiver
) -> None:
    """A channel that only has the older rule, which covered both, keeps hearing of held first calls
    until the next release; a rule for awaiting_approval on it takes them over at once."""
    retries = webhook(guarded, receiver, RuleEvent.RETRY_AWAITING_APPROVAL)
    held_call(guarded, "order:1:charge")
    assert outbox.collect_events() == 1
    assert Delivery.objects.get().rule_id == retries.pk
    awaiting = services.rule_create(
        tenant=guarded, actor=ADMIN, event=RuleEvent.AWAITING_APPROVAL, channel_id=retries.channel_id
    )
    second = held_call(guarded, "order:2:charge")
    assert outbox.collect_events() == 1
    assert Delivery.objects.get(attempt_id=second.pk).rule_id == awaiting.pk


def test_sla_overdue_repeats_until_the_attempt_moves_on(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver, RuleEvent.SLA_OVERDUE, sla_minutes=60, tool_sla={"send_email": 30}, repeat_minutes=15)
    with clock.frozen_at(T0):
        attempt = recording.mark_unknown(
            recording.mark_dispatched(record(tenant_a, "slow"), actor=AGENT), reason="timeout", actor=AGENT
        )
    with clock.frozen_at(T0 + timedelta(minutes=10)):  # a back-off does not restart the SLA clock
        attempt = moves.attempt_check_later(
            attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="lookup timed out", lookup={}
        )
    assert outbox.collect_timed(now=T0 + timedelta(minutes=29)) == 0
    assert outbox.collect_timed(now=T0 + timedelta(minutes=30)) == 1
    assert outbox.collect_timed(now=T0 + timedelta(minutes=40)) == 1  # the same reminder: not written again
    assert Delivery.objects.count() == 1
    outbox.collect_timed(now=T0 + timedelta(minutes=45))
    assert Delivery.objects.count() == 2
    # Someone acts (here: the reconciler gives up): the UNKNOWN reminders stop,
    # and the new state has an SLA clock of its own.
    with clock.frozen_at(T0 + timedelta(minutes=50)):
        moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="checks exhausted")
    outbox.collect_timed(now=T0 + timedelta(minutes=79))
    assert Delivery.objects.count() == 2
    outbox.collect_timed(now=T0 + timedelta(minutes=80))
    assert Delivery.objects.count() == 3
    assert Delivery.objects.order_by("created_at").last().payload["details"]["state"] == "MANUAL_REVIEW"


def reconciler_passed(label: str, at: datetime) -> None:
    ReconcilerWorker.objects.update_or_create(label=label, defaults={"started_at": T0, "last_pass_at": at})


def test_a_rule_without_an_sla_of_its_own_uses_the_tenants(tenant_a: Tenant, receiver: Receiver) -> None:
    Tenant.objects.filter(pk=tenant_a.pk).update(sla_minutes=120)
    webhook(tenant_a, receiver, RuleEvent.SLA_OVERDUE, repeat_minutes=0)
    with clock.frozen_at(T0):
        recording.mark_unknown(
            recording.mark_dispatched(record(tenant_a, "slow"), actor=AGENT), reason="timeout", actor=AGENT
        )
    assert outbox.collect_timed(now=T0 + timedelta(minutes=119)) == 0
    assert outbox.collect_timed(now=T0 + timedelta(minutes=120)) == 1


def test_a_stalled_reconciler_is_reported_once_per_stall(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver, RuleEvent.RECONCILER_STALLED, stalled_minutes=10, repeat_minutes=0)
    reconciler_passed("reconciler@a", T0)
    outbox.collect_timed(now=T0 + timedelta(minutes=9))
    assert Delivery.objects.count() == 0
    outbox.collect_timed(now=T0 + timedelta(minutes=10))
    outbox.collect_timed(now=T0 + timedelta(minutes=50))
    assert Delivery.objects.count() == 1
    reconciler_passed("reconciler@a", T0 + timedelta(minutes=51))
    outbox.collect_timed(now=T0 + timedelta(minutes=52))
    assert Delivery.objects.count() == 1


def test_an_audit_break_is_reported_once(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver, RuleEvent.AUDIT_BREAK)
    ChainCheck.objects.create(tenant=tenant_a, checked_at=T0, ok=False, problem="edited", break_seq=3, message="m")
    outbox.collect_timed(now=T0)
    outbox.collect_timed(now=T0 + timedelta(hours=2))
    (delivery,) = Delivery.objects.all()
    assert delivery.payload["details"]["break_seq"] == 3


def test_channel_and_rule_changes_are_events_without_the_secret(tenant_a: Tenant, receiver: Receiver) -> None:
    rule = webhook(tenant_a, receiver)
    channel = rule.channel
    services.channel_update(channel=channel, actor=ADMIN, enabled=False, rotate_secret=True)
    services.rule_update(rule=rule, actor=ADMIN, enabled=False)
    kinds = list(
        AttemptEvent.objects.filter(tenant=tenant_a, kind__startswith="notify_").values_list("kind", "details")
    )
    assert [k for k, _ in kinds] == ["notify_channel", "notify_rule", "notify_channel", "notify_rule"]
    assert kinds[2][1]["action"] == "disabled"
    assert kinds[2][1]["secret_rotated"]
    assert all("whsec_" not in json.dumps(details) for _, details in kinds)
    to_review(tenant_a, "disabled")
    assert outbox.collect_events() == 0


def test_bad_targets_are_refused_and_nothing_is_written(tenant_a: Tenant) -> None:
    from django.core.exceptions import ValidationError

    for kind, target in [("webhook", "ftp://x"), ("slack", "not a url"), ("email", "nobody")]:
        with pytest.raises(ValidationError):
            services.channel_create(tenant=tenant_a, name=kind, kind=kind, target=target, actor=ADMIN)
    assert not Channel.objects.exists()
    assert not AttemptEvent.objects.filter(kind="notify_channel").exists()


def test_a_receiver_with_another_secret_refuses_and_the_try_is_recorded(tenant_a: Tenant, receiver: Receiver) -> None:
    webhook(tenant_a, receiver)
    receiver.secret = "not-the-channel-secret"
    to_review(tenant_a, "wrong-secret")
    assert worker.run_pass(worker="test").failed == 1
    assert receiver.refused == [signing.BAD_SIGNATURE]
    assert DeliveryTry.objects.get().status_code == 401


def test_a_duplicate_incident_is_announced(
    tenant_a: Tenant, receiver: Receiver, request: pytest.FixtureRequest
) -> None:
    webhook(tenant_a, receiver, RuleEvent.DUPLICATE_INCIDENT)
    incident = request.getfixturevalue("duplicate")  # raised after the rule was made
    assert worker.run_pass(worker="test").sent == 1
    (got,) = receiver.received
    assert got["body"]["details"]["incident_id"] == incident.pk
    assert got["body"]["attempt"]["id"] == incident.attempt_id


def test_email_reaches_a_real_smtp_server(tenant_a: Tenant) -> None:
    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Message

    class Inbox(Message):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[Any] = []

        def handle_message(self, message: Any) -> None:
            self.messages.append(message)

    inbox = Inbox()
    server = Controller(inbox, hostname="127.0.0.1", port=free_port())
    server.start()
    try:
        smtp = {"host": "127.0.0.1", "port": server.port, "timeout": 5}
        with override_settings(MAILERS={"default": {"BACKEND": SMTP_BACKEND, "OPTIONS": smtp}}):
            channel = services.channel_create(
                tenant=tenant_a, name="mail", kind="email", target="ops@example.com, lead@example.com", actor=ADMIN
            )
            services.rule_create(
                tenant=tenant_a, actor=ADMIN, event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk
            )
            attempt = to_review(tenant_a, "smtp")
            assert worker.run_pass(worker="test").sent == 1
    finally:
        server.stop()
    (message,) = inbox.messages
    delivery = Delivery.objects.get()
    assert message["Message-ID"] == f"<{delivery.pk}@ledgerdash>"
    assert message["X-Ledgerdash-Delivery"] == str(delivery.pk)
    assert message["To"] == "ops@example.com, lead@example.com"
    assert f"Attempt #{attempt.pk} entered manual review" in message["Subject"]


def test_an_unreachable_smtp_server_is_a_failed_try(tenant_a: Tenant) -> None:
    smtp = {"host": "127.0.0.1", "port": free_port(), "timeout": 2}
    with override_settings(MAILERS={"default": {"BACKEND": SMTP_BACKEND, "OPTIONS": smtp}}):
        channel = services.channel_create(tenant=tenant_a, name="m", kind="email", target="a@example.com", actor=ADMIN)
        services.rule_create(tenant=tenant_a, actor=ADMIN, event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk)
        to_review(tenant_a, "smtp-down")
        assert worker.run_pass(worker="test").failed == 1
    assert "ConnectionRefusedError" in Delivery.objects.get().last_error


def test_each_reconcile_pass_records_a_heartbeat(tenant_a: Tenant) -> None:
    from django.core.management import call_command

    with clock.frozen_at(T0):
        call_command("reconcile", "--once", "--label", "beat-test")
    assert workers.last_pass() == T0


def test_a_transition_rolled_back_leaves_nothing_to_send(tenant_a: Tenant, receiver: Receiver) -> None:
    from django.db import transaction

    webhook(tenant_a, receiver)
    attempt = recording.mark_unknown(
        recording.mark_dispatched(record(tenant_a, "rolled-back"), actor=AGENT), reason="timeout", actor=AGENT
    )

    class Undo(Exception):
        pass

    def escalate_then_fail() -> None:
        with transaction.atomic():
            moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="x")
            raise Undo

    with pytest.raises(Undo):
        escalate_then_fail()
    assert outbox.collect_events() == 0
    # Committed, the same move is announced: the outbox row is its event.
    attempt = Attempt.objects.get(pk=attempt.pk)
    moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="x")
    assert outbox.collect_events() == 1


def test_what_happens_while_everything_is_disabled_is_not_replayed(tenant_a: Tenant, receiver: Receiver) -> None:
    rule = webhook(tenant_a, receiver)
    to_review(tenant_a, "heard")
    assert outbox.collect_events() == 1
    services.rule_update(rule=rule, actor=ADMIN, enabled=False)
    to_review(tenant_a, "while-disabled")
    outbox.collect_events()
    services.rule_update(rule=rule, actor=ADMIN, enabled=True)
    assert outbox.collect_events() == 0
    to_review(tenant_a, "heard-again")
    assert outbox.collect_events() == 1


def review_in_chain(tenant: Tenant, stripe: int, key: str) -> Attempt:
    """An attempt of ``tenant`` whose events go to chain ``stripe``, taken to review."""
    attempt = recording.mark_dispatched(recorded_in_chain(tenant, stripe, key), actor=AGENT)
    attempt = recording.mark_unknown(attempt, reason="t", actor=AGENT)
    return moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="review")


def review_seq(attempt: Attempt) -> int:
    return AttemptEvent.objects.get(attempt=attempt, to_state="MANUAL_REVIEW").seq


def test_a_tenant_with_several_chains_is_heard_in_each_even_a_quiet_one(
    tenant_striped: Tenant, receiver: Receiver
) -> None:
    # A busy chain numbers far ahead of a quiet one.
    for n in range(4):
        review_in_chain(tenant_striped, 3, f"busy-{n}")
    rule = webhook(tenant_striped, receiver)
    assert len(rule.from_seqs) == 4
    assert rule.from_seqs[3] > rule.from_seqs[1]
    busy = review_in_chain(tenant_striped, 3, "busy-after")
    quiet = review_in_chain(tenant_striped, 1, "quiet-after")
    # A single position would have taken the quiet chain's new event for history.
    assert review_seq(quiet) < rule.from_seqs[3]
    assert outbox.collect_events() == 2
    assert set(Delivery.objects.values_list("attempt_id", flat=True)) == {busy.pk, quiet.pk}
    # The cursor moved past the busy chain's event; the quiet chain's next one is still heard.
    later = review_in_chain(tenant_striped, 1, "quiet-later")
    assert review_seq(later) < review_seq(busy)
    assert outbox.collect_events() == 1
    assert Delivery.objects.filter(attempt_id=later.pk).count() == 1
    assert outbox.collect_events() == 0

"""How long a provider keeps a call is the account's choice, and the choice
in force when the call was made is not always today's: Postmark applies a
change only to mail processed afterwards; Twilio's is a window over what its
API shows, and a shorter one may hide what was kept. A "not found" counts as
evidence only while the setting that keeps the call says the provider still
has it; every change of the setting is audited and remembered from when it
holds."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from ledgerdash.ledger import clock, recording, retention
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant, Tool, ToolRetention
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers.base import LookupStatus
from ledgerdash.ledger.reconciler import PAST_RETENTION, Reconciler
from ledgerdash.ledger.retention import BEGINNING
from tests.conftest import AGENT, record
from tests.replicas import Replicas, adapter_for, config_for, kind_again, provider_secrets, replicas
from tests.test_presets import sought

__all__ = ["kind_again", "provider_secrets", "replicas"]
pytestmark = pytest.mark.usefixtures("kind_again")

DAY = 86400.0
EMAIL = {"From": "agent@example.com", "To": "customer@example.com", "Subject": "Receipt", "TextBody": "Thanks"}
SMS = {"to": "+15558675310", "from": "+15017122661", "body": "Your code"}


def test_postmark_keeps_each_email_as_long_as_the_setting_it_was_processed_under(replicas: Replicas) -> None:
    control = replicas.control("postmark")
    adapter = adapter_for("postmark.email", replicas.url("postmark"))
    before, after = f"mail:{uuid.uuid4().hex[:8]}", f"mail:{uuid.uuid4().hex[:8]}"
    first = adapter.dispatch(key=before, args=EMAIL)
    control.modes(retention_days=7)
    second = adapter.dispatch(key=after, args=EMAIL)
    control.advance(8 * DAY)
    try:
        kept = adapter.find(sought(before, EMAIL))
        gone = adapter.find(sought(after, EMAIL))
        by_receipt = adapter.find(sought(after, EMAIL, request_id=second.request_id))
    finally:
        control.advance(-8 * DAY)
    assert kept.status == LookupStatus.FOUND, kept.detail
    assert kept.request_id == first.request_id
    assert gone.status == LookupStatus.NOT_FOUND, gone.detail
    # The id Postmark answered the call with is its receipt: the email was taken, whatever it shows now.
    assert by_receipt.status == LookupStatus.FOUND, by_receipt.detail
    assert "no longer shows it" in by_receipt.detail


# --- what the reconciler makes of it --------------------------------------------------------


def make_tool(tenant: Tenant, replicas: Replicas, preset: str, days: str) -> Tool:
    provider = preset.split(".")[0]
    tool = Tool.objects.create(
        name=f"{provider}-{uuid.uuid4().hex[:6]}",
        adapter=Tool.Adapter.PRESET,
        config=config_for(preset, replicas.url(provider), retention_days=days),
        max_request_seconds=1.0,
        dispatch_lease_seconds=1.5,
        lookup_lag_seconds=0.0,
    )
    policy_publish(tenant=tenant, tools={tool.name: []}, actor=Actor.system("test"), note=tool.name)
    return tool


def change_retention(tool: Tool, days: str, at: Any) -> None:
    """A person sets the tool's retention to ``days`` at the instant ``at``."""
    with clock.frozen_at(at):
        tool.refresh_from_db()
        tool.config = {**tool.config, "retention_days": days}
        tool.save()


def sent_then_lost(tenant: Tenant, tool: Tool, args: dict[str, Any]) -> Attempt:
    """The agent recorded the call and claimed its dispatch, then died: the provider never got it."""
    attempt = record(tenant, f"call:{uuid.uuid4().hex[:10]}", tool_name=tool.name, args=args)
    return recording.mark_dispatched(attempt, actor=AGENT)


def reconcile(attempt: Attempt, after_days: float) -> Attempt:
    assert attempt.first_dispatched_at is not None
    instant = attempt.first_dispatched_at + timedelta(days=after_days)
    Reconciler(label="retention-test", clock=lambda: instant).run_pass()
    attempt.refresh_from_db()
    return attempt


@pytest.mark.django_db
def test_postmark_shortened_after_the_email_still_keeps_it_so_not_found_counts(
    tenant_a: Tenant, replicas: Replicas
) -> None:
    tool = make_tool(tenant_a, replicas, "postmark.email", "45")
    attempt = sent_then_lost(tenant_a, tool, EMAIL)
    assert attempt.first_dispatched_at is not None
    change_retention(tool, "7", attempt.first_dispatched_at + timedelta(days=1))

    attempt = reconcile(attempt, after_days=10)

    assert attempt.last_lookup == "not_found", attempt.last_note


@pytest.mark.parametrize(("preset", "args"), [("postmark.email", EMAIL), ("twilio.message", SMS)])
@pytest.mark.django_db
def test_lengthened_after_the_call_the_shorter_setting_still_rules_it(
    preset: str, args: dict[str, Any], tenant_a: Tenant, replicas: Replicas
) -> None:
    tool = make_tool(tenant_a, replicas, preset, "7")
    attempt = sent_then_lost(tenant_a, tool, args)
    assert attempt.first_dispatched_at is not None
    change_retention(tool, "300", attempt.first_dispatched_at + timedelta(days=1))

    attempt = reconcile(attempt, after_days=10)

    assert attempt.state == State.MANUAL_REVIEW
    assert attempt.last_lookup == PAST_RETENTION
    assert "7 days" in attempt.last_note


@pytest.mark.parametrize(
    ("preset", "args", "kept", "answer"),
    [
        # Twilio does not say a shorter window spares what was kept: the day at 7 may have hidden it.
        ("twilio.message", SMS, "400", PAST_RETENTION),
        # Postmark applies a change to mail processed afterwards: the email keeps the 45 it was sent under.
        ("postmark.email", EMAIL, "45", "not_found"),
    ],
)
@pytest.mark.django_db
def test_a_retention_shortened_for_a_day_after_the_call(
    preset: str, args: dict[str, Any], kept: str, answer: str, tenant_a: Tenant, replicas: Replicas
) -> None:
    tool = make_tool(tenant_a, replicas, preset, kept)
    attempt = sent_then_lost(tenant_a, tool, args)
    first = attempt.first_dispatched_at
    assert first is not None
    change_retention(tool, "7", first + timedelta(days=1))
    change_retention(tool, kept, first + timedelta(days=2))

    attempt = reconcile(attempt, after_days=10)

    assert attempt.last_lookup == answer, attempt.last_note


@pytest.mark.django_db
def test_every_change_is_audited_and_remembered_from_when_it_holds(tenant_a: Tenant, replicas: Replicas) -> None:
    tool = make_tool(tenant_a, replicas, "postmark.email", "45")
    made = ToolRetention.objects.get(tool_name=tool.name)
    assert made.days == 45
    at = clock.now() + timedelta(hours=1)
    change_retention(tool, "90", at)
    tool.refresh_from_db()
    tool.max_checks = 5
    tool.save()  # another setting: nothing to remember

    rows = list(ToolRetention.objects.filter(tool_name=tool.name).values_list("days", "since"))
    assert rows == [(45, made.since), (90, at)]
    event = AttemptEvent.objects.filter(tenant=tenant_a, kind=EventKind.TOOL).order_by("seq")
    changed = [e.details for e in event if e.details.get("change") == "changed"]
    assert changed[0]["config_changed"] == ["retention_days"]


@pytest.mark.django_db
def test_a_tool_older_than_its_history_keeps_what_it_said_before_its_first_change(
    tenant_a: Tenant, replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as before_history:  # made before the history was kept
        before_history.setattr(retention, "note", lambda *args, **kwargs: None)
        tool = make_tool(tenant_a, replicas, "twilio.message", "30")
    assert not ToolRetention.objects.filter(tool_name=tool.name).exists()
    at = clock.now() + timedelta(hours=1)
    change_retention(tool, "20", at)

    rows = list(ToolRetention.objects.filter(tool_name=tool.name).values_list("days", "since"))
    assert rows == [(30, BEGINNING), (20, at)]

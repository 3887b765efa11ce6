"""A lookup through a search index that lags: its "not found" settles
nothing until the request could no longer land plus the tool's lookup lag.
The reconciler waits it out, the standing shown to approvers says so, and
once past it a provider that deduplicates is sent the same key again, one
that does not is found when its index catches up."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from ledgerdash.ledger import clock, recording, rules
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers import registry
from ledgerdash.ledger.providers.presets import PRESETS
from ledgerdash.ledger.reconciler import Reconciler
from tests.conftest import AGENT, record
from tests.replicas import Replicas, config_for, provider_secrets, replicas

__all__ = ["provider_secrets", "replicas"]

S = State
LAG = 300.0
#: The replica's index lags an hour behind: longer than the tool says, to show what each provider does then.
INDEX_LAG = 3600.0


@pytest.fixture
def lagging(tenant_a: Tenant, replicas: Replicas) -> dict[str, str]:
    """A Stripe tool (deduplicates) and a Jira tool (does not), each with a lookup lag of five minutes."""
    tools = {"charge": "stripe.payment_intent", "escalate": "jira.issue"}
    for name, preset in tools.items():
        cls = PRESETS[preset]
        Tool.objects.create(
            name=name,
            adapter=Tool.Adapter.PRESET,
            config=config_for(preset, replicas.url(preset.split(".")[0])),
            idempotent=cls.deduplicates,
            key_retention_seconds=cls.retention_seconds,
            lookup_lag_seconds=LAG,
            max_request_seconds=1.0,
            dispatch_lease_seconds=1.5,
            backoff_base_seconds=1.0,
        )
        replicas.control(preset.split(".")[0]).faults("*", search_lag_seconds=INDEX_LAG)
    policy_publish(
        tenant=tenant_a, tools={name: [] for name in tools}, actor=Actor.system("test"), note="lagging tools"
    )
    yield tools
    for preset in tools.values():
        replicas.control(preset.split(".")[0]).clear()


def crashed_after_acting(tenant: Tenant, tool: str, replicas: Replicas, preset: str) -> Attempt:
    """An agent sent the call, the provider acted, the answer was lost and the agent died."""
    key = f"{tool}:{uuid.uuid4().hex[:10]}"
    attempt = recording.mark_dispatched(
        record(tenant, key, tool_name=tool, args=PRESETS[preset].example_args(key)), actor=AGENT
    )
    control = replicas.control(preset.split(".")[0])
    control.faults("*", lose_response=True)
    profile = registry.profile_for(tool, tenant.pk)
    assert profile is not None
    with pytest.raises(OSError):  # noqa: PT011 - the connection dropped after the provider acted
        profile.adapter.dispatch(key=attempt.provider_key, args=attempt.args)
    control.faults("*", lose_response=False)
    assert control.count(key) == 1
    return attempt


def reconcile_at(instant: Any) -> Any:
    return Reconciler(label="lag-test", clock=lambda: instant).run_pass()


def last_event(attempt: Attempt) -> AttemptEvent:
    event = AttemptEvent.objects.filter(attempt=attempt).order_by("seq").last()
    assert event is not None
    return event


@pytest.mark.django_db
def test_not_found_inside_the_lag_waits_and_a_deduplicating_provider_is_sent_the_same_key_after(
    tenant_a: Tenant, lagging: dict[str, str], replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More payment intents made while the call could land than Stripe's preset lists: its search
    decides, and the search lags."""
    from ledgerdash.ledger.providers.presets import stripe

    monkeypatch.setattr(stripe, "PAGES", 0)
    attempt = crashed_after_acting(tenant_a, "charge", replicas, lagging["charge"])
    assert attempt.lands_by is not None
    inside = attempt.lands_by + timedelta(seconds=10)

    reconcile_at(inside)

    attempt.refresh_from_db()
    waited = last_event(attempt)
    assert attempt.state == S.UNKNOWN
    assert attempt.dispatch_count == 1
    assert waited.details["counts_as_evidence"] is False
    assert "may lag 300 s" in waited.reason
    assert attempt.next_check_at > attempt.lands_by + timedelta(seconds=LAG)

    # Past the lag the "not found" counts; the index still lags (longer than the tool says), and
    # Stripe's deduplication is what keeps the second send from charging twice.
    reconcile_at(attempt.lands_by + timedelta(seconds=LAG + 1))

    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.dispatch_count == 2
    assert replicas.control("stripe").count(attempt.idempotency_key) == 1


@pytest.mark.django_db
def test_not_found_inside_the_lag_waits_and_is_found_when_the_index_catches_up(
    tenant_a: Tenant, lagging: dict[str, str], replicas: Replicas
) -> None:
    attempt = crashed_after_acting(tenant_a, "escalate", replicas, lagging["escalate"])
    assert attempt.lands_by is not None

    for seconds in (0.5, 10.0, LAG - 1):  # while it may land, then inside the lag
        reconcile_at(attempt.lands_by + timedelta(seconds=seconds))
        attempt.refresh_from_db()
        assert attempt.state == S.UNKNOWN
        assert last_event(attempt).details.get("counts_as_evidence") is False
    replicas.control("jira").advance(INDEX_LAG)
    reconcile_at(attempt.lands_by + timedelta(seconds=LAG + 1))

    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.dispatch_count == 1
    assert replicas.control("jira").count(attempt.idempotency_key) == 1


@pytest.mark.django_db
def test_approvers_see_a_not_found_inside_the_lag_as_no_evidence(tenant_a: Tenant, replicas: Replicas) -> None:
    Tool.objects.create(
        name="escalate",
        adapter=Tool.Adapter.PRESET,
        config=config_for("jira.issue", replicas.url("jira")),
        lookup_lag_seconds=LAG,
    )
    landed = clock.now() - timedelta(hours=1)
    original = Attempt(
        pk=41,
        tenant=tenant_a,
        tool_name="escalate",
        state=S.MANUAL_REVIEW,
        dispatch_count=1,
        lands_by=landed,
        last_lookup="not_found",
        last_lookup_at=landed + timedelta(seconds=10),
    )

    inside = rules.original_standing(original)
    original.last_lookup_at = landed + timedelta(seconds=LAG)
    after = rules.original_standing(original)

    assert inside.risk is not None
    assert "within its lookup's lag (300 s" in inside.risk
    assert after.proof is not None
    assert "its lookup's lag (300 s) had passed" in after.proof


@pytest.mark.django_db
def test_recovery_waits_as_long_as_the_providers_retry_after(
    tenant_a: Tenant, lagging: dict[str, str], replicas: Replicas
) -> None:
    looked = crashed_after_acting(tenant_a, "escalate", replicas, lagging["escalate"])
    key = f"charge:{uuid.uuid4().hex[:10]}"
    never_sent = recording.mark_dispatched(
        record(tenant_a, key, tool_name="charge", args=PRESETS["stripe.payment_intent"].example_args(key)), actor=AGENT
    )
    for provider in ("jira", "stripe"):
        replicas.control(provider).faults("*", lookup_429=provider == "jira", reject=True, retry_after=900)
    assert looked.lands_by is not None
    assert never_sent.lands_by is not None
    instant = max(looked.lands_by, never_sent.lands_by) + timedelta(seconds=LAG + 1)

    reconcile_at(instant)

    looked.refresh_from_db()
    never_sent.refresh_from_db()
    assert looked.state == S.UNKNOWN
    assert looked.next_check_at >= instant + timedelta(seconds=900)
    assert never_sent.state == S.FAILED_RETRYABLE
    assert never_sent.next_check_at >= instant + timedelta(seconds=900)
    assert replicas.control("stripe").count(key) == 0


@pytest.mark.django_db
def test_not_found_past_what_the_provider_keeps_proves_nothing(tenant_a: Tenant, replicas: Replicas) -> None:
    Tool.objects.create(
        name="mail",
        adapter=Tool.Adapter.PRESET,
        config=config_for("postmark.email", replicas.url("postmark"), retention_days="7"),
        max_request_seconds=1.0,
        dispatch_lease_seconds=1.5,
    )
    policy_publish(tenant=tenant_a, tools={"mail": []}, actor=Actor.system("test"), note="mail")
    key = f"mail:{uuid.uuid4().hex[:10]}"
    attempt = recording.mark_dispatched(
        record(tenant_a, key, tool_name="mail", args=PRESETS["postmark.email"].example_args(key)), actor=AGENT
    )
    assert attempt.first_dispatched_at is not None

    reconcile_at(attempt.first_dispatched_at + timedelta(days=8))

    attempt.refresh_from_db()
    assert attempt.state == S.MANUAL_REVIEW
    assert attempt.last_lookup == "past_retention"
    assert "longer ago than the provider keeps what it did" in last_event(attempt).reason
    assert rules.original_standing(attempt).proof is None


@pytest.mark.django_db
def test_a_read_after_write_list_needs_no_wait_for_the_search_lag(
    tenant_a: Tenant, lagging: dict[str, str], replicas: Replicas
) -> None:
    """Stripe's preset reads the payment intents made while the call could land before it searches: a
    list is read-after-write consistent, so its "not found" counts once the request can no longer land,
    however long the tool's search lag, and the same key is sent again at once."""
    key = f"charge:{uuid.uuid4().hex[:10]}"
    attempt = recording.mark_dispatched(
        record(tenant_a, key, tool_name="charge", args=PRESETS["stripe.payment_intent"].example_args(key)),
        actor=AGENT,
    )  # the agent died before its request left
    assert attempt.lands_by is not None

    reconcile_at(attempt.lands_by + timedelta(seconds=1))

    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.dispatch_count == 2
    assert replicas.control("stripe").count(key) == 1
    looked = AttemptEvent.objects.filter(attempt=attempt, details__lookup__consistent=True)
    assert looked.exists()

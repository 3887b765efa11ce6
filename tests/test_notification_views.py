"""The notification pages: only a tenant's admins, every change an event."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import AttemptEvent, Tenant
from ledgerdash.notify import services
from ledgerdash.notify.models import Channel, Delivery, DeliveryStatus, Rule, RuleEvent
from tests.conftest import as_user

ADMIN = Actor.system("tests")


@pytest.fixture
def hook(tenant_a: Tenant) -> Channel:
    return services.channel_create(
        tenant=tenant_a, name="ops", kind="webhook", target="https://hooks.example.com/x", actor=ADMIN
    )


@pytest.fixture
def dead(hook: Channel) -> Delivery:
    from django.utils import timezone

    now = timezone.now()
    return Delivery.objects.create(
        tenant=hook.tenant,
        channel=hook,
        event=RuleEvent.ENTERED_MANUAL_REVIEW,
        dedup_key="x",
        payload={"title": "Attempt #1 entered manual review"},
        status=DeliveryStatus.DEAD,
        tries=8,
        last_error="HTTP 500",
        next_try_at=now,
        created_at=now,
    )


def test_an_admin_sees_channels_rules_and_dead_deliveries(admin_a: Any, hook: Channel, dead: Delivery) -> None:
    response = as_user(admin_a).get(reverse("reviews:notifications"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "ops" in body
    assert "https://hooks.example.com/x" in body
    assert str(dead.pk) in body
    assert "HTTP 500" in body
    assert hook.secret not in body  # never shown after creation


@pytest.mark.parametrize("who", ["viewer_a", "operator_a", "approver_a"])
def test_members_who_are_not_admins_are_refused(request: pytest.FixtureRequest, who: str, hook: Channel) -> None:
    client = as_user(request.getfixturevalue(who))
    assert client.get(reverse("reviews:notifications")).status_code == 403
    assert client.get(reverse("reviews:channel_create")).status_code == 403
    assert client.get(reverse("reviews:channel_edit", args=[hook.pk])).status_code == 403


def test_another_tenants_rows_are_not_found(outsider_b: Any, hook: Channel, dead: Delivery) -> None:
    client = as_user(outsider_b)
    assert client.get(reverse("reviews:channel_edit", args=[hook.pk])).status_code == 404
    assert client.post(reverse("reviews:delivery_resend", args=[dead.pk])).status_code == 404


def test_creating_a_webhook_shows_its_secret_once_and_records_an_event(admin_a: Any, tenant_a: Tenant) -> None:
    client = as_user(admin_a)
    response = client.post(
        reverse("reviews:channel_create"),
        {"tenant": tenant_a.pk, "name": "pager", "kind": "webhook", "target": "https://pager.example.com/in"},
    )
    assert response.status_code == 200
    channel = Channel.objects.get(name="pager")
    assert channel.secret in response.content.decode()
    assert channel.secret not in client.get(reverse("reviews:channel_edit", args=[channel.pk])).content.decode()
    event = AttemptEvent.objects.filter(tenant=tenant_a, kind=EventKind.NOTIFY_CHANNEL).get()
    assert event.actor_user_id == admin_a.pk
    assert channel.secret not in str(event.details)


def test_a_bad_target_is_a_form_error_and_nothing_is_written(admin_a: Any, tenant_a: Tenant) -> None:
    response = as_user(admin_a).post(
        reverse("reviews:channel_create"), {"tenant": tenant_a.pk, "name": "x", "kind": "email", "target": "nobody"}
    )
    assert response.status_code == 200
    assert "valid email" in response.content.decode()
    assert not Channel.objects.exists()


def test_an_admin_cannot_create_a_channel_for_another_tenant(admin_a: Any, tenant_b: Tenant) -> None:
    response = as_user(admin_a).post(
        reverse("reviews:channel_create"),
        {"tenant": tenant_b.pk, "name": "x", "kind": "slack", "target": "https://hooks.slack.example/x"},
    )
    assert response.status_code == 200  # the form refuses the choice
    assert not Channel.objects.exists()


def test_disabling_a_channel_is_an_event(admin_a: Any, hook: Channel) -> None:
    response = as_user(admin_a).post(
        reverse("reviews:channel_edit", args=[hook.pk]), {"name": "ops", "target": hook.target}
    )
    assert response.status_code == 302
    hook.refresh_from_db()
    assert not hook.enabled
    last = AttemptEvent.objects.filter(kind=EventKind.NOTIFY_CHANNEL).order_by("-seq").first()
    assert last is not None
    assert last.details["action"] == "disabled"


def test_rules_are_created_and_edited_through_the_pages(admin_a: Any, hook: Channel) -> None:
    client = as_user(admin_a)
    response = client.post(
        reverse("reviews:rule_create"),
        {
            "event": "sla_overdue",
            "channel": hook.pk,
            "audience": "channel",
            "enabled": "on",
            "sla_minutes": 60,
            "tool_sla": '{"send_email": 30}',
            "repeat_minutes": 15,
            "stalled_minutes": 10,
        },
    )
    assert response.status_code == 302
    rule = Rule.objects.get()
    assert rule.tool_sla == {"send_email": 30}
    bad = client.post(
        reverse("reviews:rule_edit", args=[rule.pk]),
        {
            "event": "sla_overdue",
            "channel": hook.pk,
            "audience": "channel",
            "sla_minutes": 60,
            "tool_sla": "{send_email: 30}",
            "repeat_minutes": 15,
            "stalled_minutes": 10,
        },
    )
    assert "not JSON" in bad.content.decode()
    client.post(
        reverse("reviews:rule_edit", args=[rule.pk]),
        {
            "event": "sla_overdue",
            "channel": hook.pk,
            "audience": "channel",
            "sla_minutes": 45,
            "tool_sla": "",
            "repeat_minutes": 15,
            "stalled_minutes": 10,
        },
    )
    rule.refresh_from_db()
    assert (rule.enabled, rule.sla_minutes, rule.tool_sla) == (False, 45, {})
    actions = list(
        AttemptEvent.objects.filter(kind=EventKind.NOTIFY_RULE)
        .order_by("seq")
        .values_list("details__action", flat=True)
    )
    assert actions == ["created", "disabled"]


def test_resending_a_dead_delivery_with_htmx_swaps_the_list(admin_a: Any, dead: Delivery) -> None:
    client = as_user(admin_a)
    response = client.post(reverse("reviews:delivery_resend", args=[dead.pk]), headers={"HX-Request": "true"})
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="dead-deliveries">')
    assert "will be sent again" in body
    dead.refresh_from_db()
    assert dead.status == DeliveryStatus.PENDING
    assert AttemptEvent.objects.filter(kind=EventKind.NOTIFY_RESEND).count() == 1
    again = client.post(reverse("reviews:delivery_resend", args=[dead.pk]))
    assert again.status_code == 302
    assert AttemptEvent.objects.filter(kind=EventKind.NOTIFY_RESEND).count() == 1


def test_wrong_methods_are_refused(admin_a: Any, dead: Delivery) -> None:
    client = as_user(admin_a)
    assert client.get(reverse("reviews:delivery_resend", args=[dead.pk])).status_code == 405
    assert client.post(reverse("reviews:notifications")).status_code == 405
    assert client.delete(reverse("reviews:channel_create")).status_code == 405


def test_anonymous_visitors_are_sent_to_sign_in() -> None:
    response = Client().get(reverse("reviews:notifications"))
    assert response.status_code == 302


def test_the_admin_site_shows_deliveries_and_never_a_secret(
    django_user_model: Any, hook: Channel, dead: Delivery
) -> None:
    staff = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = as_user(staff)
    page = client.get(reverse("admin:notify_channel_change", args=[hook.pk])).content.decode()
    assert hook.secret not in page
    assert client.get(reverse("admin:notify_delivery_change", args=[dead.pk])).status_code == 200
    assert client.get(reverse("admin:notify_delivery_changelist")).status_code == 200


def test_an_admin_sets_an_agents_callback_for_one_of_its_tokens(
    admin_a: Any, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    from ledgerdash.ledger.tokens import token_create

    mine, _ = token_create(tenant=tenant_a, name="agent", scopes=["attempts:write"], actor=ADMIN)
    theirs, _ = token_create(tenant=tenant_b, name="agent", scopes=["attempts:write"], actor=ADMIN)
    client = as_user(admin_a)
    form = {"tenant": tenant_a.pk, "name": "cb", "kind": "agent", "target": "https://agent.example.com/cb"}
    refused = client.post(reverse("reviews:channel_create"), {**form, "token": theirs.pk})
    assert "Select a valid choice" in refused.content.decode()
    response = client.post(reverse("reviews:channel_create"), {**form, "token": mine.pk})
    channel = Channel.objects.get()
    assert channel.token == mine
    assert channel.secret in response.content.decode()
    listing = client.get(reverse("reviews:notifications")).content.decode()
    assert f"token <code>{mine.prefix}</code>" in listing

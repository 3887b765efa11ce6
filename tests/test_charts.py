"""The pictures: the overview's last 24 hours, counted back from now, and an attempt's states
over time, from the same events the timeline lists."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledgerdash.ledger import clock, moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import State, Tenant
from reviews import charts
from tests.conftest import as_user
from tests.factories import attempt_in

S = State
pytestmark = pytest.mark.django_db


def test_a_queue_is_counted_back_hour_by_hour_from_now(tenant_a: Tenant, operator_a: Any) -> None:
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    with clock.frozen_at(now - timedelta(hours=5)):
        waiting = attempt_in(S.UNKNOWN, tenant_a, key="five-hours")
    with clock.frozen_at(now - timedelta(hours=3)):
        settled = attempt_in(S.MANUAL_REVIEW, tenant_a, key="three-hours")
    with clock.frozen_at(now - timedelta(hours=1)):
        moves.attempt_verify(
            attempt=settled, actor=Actor.user(operator_a), evidence="the provider log shows it", fence=settled.fence
        )
    with clock.frozen_at(now):
        trends = charts.trends([tenant_a.pk])
    unknown, review = trends.queues
    assert waiting.state == S.UNKNOWN
    assert unknown.values[-7:] == [0, 1, 1, 1, 1, 1, 1]  # from the hour it entered, and still now
    assert review.values[-5:] == [0, 1, 1, 0, 0]  # from three hours ago until it was verified
    assert trends.decisions.values[-2] == 1  # the person's verification, an hour ago
    assert unknown.said == "now 1, at most 1"
    assert trends.since is None


def test_a_busier_day_than_the_events_read_says_from_when_it_is_drawn(
    tenant_a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(charts, "RECENT_EVENTS", 3)
    for n in range(3):
        attempt_in(S.UNKNOWN, tenant_a, key=f"busy-{n}")
    trends = charts.trends([tenant_a.pk])
    assert trends.since is not None


def test_an_attempts_strip_has_one_stay_per_state_with_who_moved_it(tenant_a: Tenant) -> None:
    attempt = attempt_in(S.UNKNOWN, tenant_a, key="strip")
    strip = charts.strip(attempt)
    assert strip is not None
    assert [s.state for s in strip.segments] == ["INTENT_RECORDED", "DISPATCHED", "UNKNOWN"]
    assert strip.segments[0].moved_by
    assert round(sum(s.width for s in strip.segments)) == charts.STRIP_WIDTH
    assert all(a.x + a.width == pytest.approx(b.x) for a, b in zip(strip.segments, strip.segments[1:], strict=False))


def test_the_pages_draw_them_and_say_them_in_words(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(S.MANUAL_REVIEW, tenant_a, key="drawn")
    client = as_user(operator_a)
    overview = client.get("/").content.decode()
    assert 'hx-get="/trends/"' in overview  # fetched after the page
    section = client.get("/trends/", headers={"HX-Request": "true"}).content.decode()
    assert section.lstrip().startswith('<section class="panel" id="trends"')
    assert section.count('<svg class="bars') >= 3
    assert "MANUAL_REVIEW waiting, at each hour&#x27;s end" in section
    assert "now 1, at most 1" in section
    page = client.get("/trends/").content.decode()  # without JavaScript: a page of its own
    assert "<h1>The last 24 hours</h1>" in page
    detail = client.get(f"/attempts/{attempt.pk}/").content.decode()
    assert '<svg class="strip"' in detail
    assert 'aria-label="States over time: INTENT_RECORDED from' in detail

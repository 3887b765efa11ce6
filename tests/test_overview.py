"""The overview says what to do first: the oldest item of each queue, work
past the tenant's SLA, my work, what awaits my approval, what nobody owns,
duplicate incidents; each a link to the list it counts."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledgerdash.ledger import moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, DrillRun, Incident, State, Tenant
from reviews import queries
from tests.conftest import as_user
from tests.factories import attempt_in, linked_retry

S = State
HOME = reverse("reviews:home")


def _age(attempt: Attempt, delta: timedelta) -> None:
    Attempt.objects.filter(pk=attempt.pk).update(created_at=timezone.now() - delta)


def _follow(client: Client, page: str, element_id: str) -> str:
    """The list behind the link inside ``element_id``."""
    match = re.search(rf'id="{element_id}"[^>]*>\s*<a href="([^"]+)"', page)
    assert match, element_id
    return client.get(match.group(1).replace("&amp;", "&")).content.decode()


def test_oldest_item_of_each_queue_with_its_age(tenant_a: Tenant, operator_a: Any) -> None:
    old = attempt_in(S.UNKNOWN, tenant_a, key="old")
    attempt_in(S.UNKNOWN, tenant_a, key="new")
    _age(old, timedelta(hours=5))
    page = as_user(operator_a).get(HOME).content.decode()
    row = page.split('id="oldest-unknown"')[1].split("</tr>")[0]
    assert f'href="/attempts/{old.pk}/"' in row
    assert ">5h<" in row
    assert "<td>2</td>" in row
    assert "none" in page.split('id="oldest-open-incidents"')[1].split("</tr>")[0]


def test_work_past_the_tenants_own_sla_is_counted_and_listed(tenant_a: Tenant, operator_a: Any) -> None:
    late = attempt_in(S.MANUAL_REVIEW, tenant_a, key="late")
    fresh = attempt_in(S.UNKNOWN, tenant_a, key="fresh")
    _age(late, timedelta(minutes=90))
    client = as_user(operator_a)
    # The default SLA (4 hours) is not passed yet.
    assert 'id="late-acme"' not in client.get(HOME).content.decode()
    Tenant.objects.filter(pk=tenant_a.pk).update(sla_minutes=60)
    page = client.get(HOME).content.decode()
    assert "1</strong> item past" in page
    assert "waiting longer than 1 hour" in page
    listed = _follow(client, page, "late-acme")
    assert f'id="row-{late.pk}"' in listed
    assert f'id="row-{fresh.pk}"' not in listed
    # the filter stays on when the list is filtered further
    assert '<input type="checkbox" name="sla" id="id_sla" checked>' in listed
    filters = listed.split('id="filters"')[1].split("</form>")[0]
    assert filters.count('name="sla"') == 1  # one checkbox, the form's


def test_mine_unowned_awaiting_my_approval_and_duplicates(
    tenant_a: Tenant, operator_a: Any, approver_a: Any, make_user: Any
) -> None:
    mine = attempt_in(S.MANUAL_REVIEW, tenant_a, key="mine")
    moves.attempt_assign(attempt=mine, owner=approver_a, actor=Actor.user(approver_a))
    theirs = linked_retry(tenant_a, operator_a, key="theirs")
    own_request = linked_retry(tenant_a, approver_a, key="own-request")
    Tenant.objects.filter(pk=tenant_a.pk).update(default_owner=None)
    unowned = attempt_in(S.UNKNOWN, tenant_a, key="nobody")
    assert unowned.owner_id is None
    Incident.objects.create(
        tenant=tenant_a, attempt=mine, kind=Incident.Kind.DUPLICATE, summary="twice", opened_at=timezone.now()
    )
    client = as_user(approver_a)
    first = queries.first_things(approver_a, [tenant_a])
    assert (first.mine, first.unowned, first.my_approvals, first.duplicates) == (1, 1, 1, 1)
    page = client.get(HOME).content.decode()
    assert 'id="count-mine">1<' in page
    assert f'id="row-{mine.pk}"' in _follow(client, page, "first-mine")
    assert f'id="row-{unowned.pk}"' in _follow(client, page, "first-unowned")
    decide = _follow(client, page, "first-my-approvals")
    assert f'id="approval-{theirs.pk}"' in decide
    assert f'id="approval-{own_request.pk}"' not in decide  # four eyes: not theirs to decide
    assert "twice" in _follow(client, page, "first-duplicates")


def test_an_operator_has_nothing_awaiting_their_approval(tenant_a: Tenant, operator_a: Any, make_user: Any) -> None:
    from tests.conftest import member

    other = member(make_user, "operator-2", tenant_a, "operator")
    linked_retry(tenant_a, other, key="r")
    assert queries.first_things(operator_a, [tenant_a]).my_approvals == 0
    page = as_user(operator_a).get(reverse("reviews:approvals") + "?for=me").content.decode()
    assert "Nothing awaits approval" in page


def test_a_running_crash_drill_shows_its_progress_until_it_ends(tenant_a: Tenant, operator_a: Any) -> None:
    """A drill that runs (the demo's, after make run serves) shows cases done of cases planned, and its
    section fetches itself again while it runs; once it ends the answer stops the polling."""
    run = DrillRun.objects.create(tenant=tenant_a, database="sqlite", iterations=21, cases_total=5)
    client = as_user(operator_a)
    page = client.get(HOME).content.decode()
    section = page.split('id="drills"')[1].split("</section>")[0]
    assert '<progress max="21" value="5"' in section
    assert "5 of 21" in section
    assert 'hx-trigger="every 2s"' in section
    DrillRun.objects.filter(pk=run.pk).update(cases_total=6, cases_failed=1)
    region = client.get(HOME + "?region=drills", headers={"HX-Request": "true"}).content.decode()
    assert region.lstrip().startswith("<section")  # the region alone, not the page
    assert "6 of 21" in region
    assert "(1 failed)" in region
    DrillRun.objects.filter(pk=run.pk).update(ok=False, cases_total=21, cases_failed=1, finished_at=timezone.now())
    region = client.get(HOME + "?region=drills", headers={"HX-Request": "true"}).content.decode()
    assert "hx-trigger" not in region
    assert "<progress" not in region
    assert "FAILED" in region

"""The overview, the queues and the search: scoped to the user's tenants,
all list state in the query string, keyset pages, htmx regions."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy
from hypothesis import given
from hypothesis import strategies as st

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, State, Tenant
from reviews import display, queries
from reviews.queries import Cursor, ListQuery
from tests.conftest import AGENT, as_user, ledger_snapshot, record
from tests.factories import attempt_in

S = State
HTMX = {"HX-Request": "true"}
UNKNOWN_QUEUE = reverse("reviews:queue", args=["unknown"])
REVIEW_QUEUE = reverse("reviews:queue", args=["review"])
SEARCH = reverse("reviews:search")


# --- every list view: method, scope, role, partial, page -------------------------------

LIST_URLS = [reverse("reviews:home"), UNKNOWN_QUEUE, REVIEW_QUEUE, SEARCH]


@pytest.mark.parametrize("url", LIST_URLS)
def test_list_pages_refuse_posts(url: str, operator_a: Any) -> None:
    assert as_user(operator_a).post(url).status_code == 405


@pytest.mark.parametrize("url", LIST_URLS)
def test_list_pages_need_a_log_in(url: str, client: Client, tenant_a: Tenant) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("url", LIST_URLS)
def test_a_user_in_no_tenant_is_forbidden(url: str, make_user: Any, tenant_a: Tenant) -> None:
    assert as_user(make_user("drifter")).get(url).status_code == 403


def test_the_queue_shows_only_the_users_tenants(stuck: dict[str, Attempt], operator_a: Any) -> None:
    page = as_user(operator_a).get(UNKNOWN_QUEUE).content.decode()
    assert "a-unknown" in page
    assert "b-unknown" not in page
    assert "a-review" not in page  # another queue


def test_another_tenants_name_in_the_filter_is_refused(stuck: dict[str, Attempt], outsider_b: Any) -> None:
    response = as_user(outsider_b).get(UNKNOWN_QUEUE, {"tenant": "acme"})
    page = response.content.decode()
    assert response.status_code == 200
    assert "Select a valid choice" in page
    assert "a-unknown" not in page
    assert "b-unknown" in page


def test_the_full_page_has_filters_counts_and_keys(stuck: dict[str, Attempt], operator_a: Any) -> None:
    page = as_user(operator_a).get(UNKNOWN_QUEUE).content.decode()
    assert "<html" in page
    assert 'id="filters"' in page
    assert 'id="count-unknown">1<' in page
    assert 'id="count-review">1<' in page
    assert "ledgerdash/dashboard.js" in page
    # Every column an operator triages by.
    for column in ["Tenant", "Tool", "Task", "Idempotency key", "Args hash", "Provider request ID", "Owner", "State"]:
        assert f">{column}</th>" in page
    assert "Age" in page
    assert "Last note" in page
    attempt = stuck["a_unknown"]
    assert f'title="{attempt.args_hash}"' in page  # full hash on hover
    assert f'data-copy="{attempt.args_hash}"' in page


def test_under_htmx_the_queue_renders_only_its_results_with_live_counts(
    stuck: dict[str, Attempt], operator_a: Any
) -> None:
    response = as_user(operator_a).get(UNKNOWN_QUEUE, {"owner": "anyone"}, headers=HTMX)
    page = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in page
    assert page.lstrip().startswith('<div id="results"')
    # It polls its own URL, so a refresh keeps the filters and the page.
    assert f'hx-get="{UNKNOWN_QUEUE}?owner=anyone"' in page
    assert 'hx-trigger="every 10s' in page
    assert 'id="count-unknown" hx-swap-oob="true">1<' in page
    assert "HX-Request" in response.get("Vary", "")


def test_the_refresh_can_be_paused_and_the_pause_is_kept_by_the_filters(
    stuck: dict[str, Attempt], operator_a: Any
) -> None:
    """WCAG 2.2.2: a page that updates itself has a way to stop it, and
    stopping it is in the address, so it survives filtering and a reload."""
    client = as_user(operator_a)
    live = client.get(UNKNOWN_QUEUE).content.decode()
    assert 'hx-trigger="every 10s, ledgerdash:refresh from:body"' in live
    assert '<a href="?refresh=off" id="refresh-toggle">Pause auto-refresh</a>' in live
    paused = client.get(UNKNOWN_QUEUE, {"refresh": "off", "owner": "anyone"}).content.decode()
    assert "every 10s" not in paused
    assert 'hx-trigger="ledgerdash:refresh from:body"' in paused  # an action of the user's still shows its effect
    assert '<input type="hidden" name="refresh" value="off">' in paused  # the filters keep the pause
    assert '<a href="?owner=anyone" id="refresh-toggle">Resume auto-refresh</a>' in paused
    assert 'name="refresh"' not in paused.split('class="exports"')[1].split("</form>")[0]  # nor does an export
    home = client.get(reverse("reviews:home"), {"refresh": "off"}).content.decode()
    assert "every 15s" not in home
    assert "Resume auto-refresh" in home


def test_the_lists_own_refresh_sends_the_ticked_rows_and_gets_them_back_ticked(
    stuck: dict[str, Attempt], operator_a: Any
) -> None:
    attempt = stuck["a_unknown"]
    page = as_user(operator_a).get(UNKNOWN_QUEUE, {"ids": [attempt.pk, "x"]}, headers=HTMX).content.decode()
    assert f'value="{attempt.pk}" form="bulk" aria-label="Select #{attempt.pk}" checked>' in page
    # The poller asks for the list without them (each refresh sends what is ticked then) and includes the ticks.
    assert f'hx-get="{UNKNOWN_QUEUE}?"' in page or f'hx-get="{UNKNOWN_QUEUE}"' in page
    assert 'hx-include="#results input[name=ids]:checked, #results-poller"' in page
    unticked = as_user(operator_a).get(UNKNOWN_QUEUE, headers=HTMX).content.decode()
    assert f'aria-label="Select #{attempt.pk}" checked' not in unticked


def test_the_keys_can_be_turned_off(stuck: dict[str, Attempt], operator_a: Any) -> None:
    """WCAG 2.1.4: single-key shortcuts have a switch (shown by the script that adds them)."""
    page = as_user(operator_a).get(UNKNOWN_QUEUE).content.decode()
    assert 'id="shortcuts-toggle" aria-pressed="true" hidden>Turn keyboard shortcuts off</button>' in page
    script = (Path(__file__).resolve().parent.parent / "static/ledgerdash/dashboard.js").read_text()
    assert "!shortcutsOn()" in script.split('addEventListener("keydown"')[1].split("\n")[1]


def test_a_history_restore_gets_the_whole_page(stuck: dict[str, Attempt], operator_a: Any) -> None:
    headers = {**HTMX, "HX-History-Restore-Request": "true"}
    assert "<html" in as_user(operator_a).get(UNKNOWN_QUEUE, headers=headers).content.decode()


def test_an_unknown_queue_name_is_404(operator_a: Any) -> None:
    assert as_user(operator_a).get("/queues/everything/").status_code == 404


def test_the_overview_counts_and_refreshes_itself(stuck: dict[str, Attempt], operator_a: Any) -> None:
    client = as_user(operator_a)
    page = client.get(reverse("reviews:home")).content.decode()
    assert '<span class="card-count">1</span>' in page
    partial = client.get(reverse("reviews:home"), headers=HTMX).content.decode()
    assert "<html" not in partial
    assert partial.lstrip().startswith('<div id="counts"')
    assert 'hx-trigger="every 15s"' in partial


def test_counts_stop_at_a_cap(stuck: dict[str, Attempt], tenant_a: Tenant, operator_a: Any, monkeypatch: Any) -> None:
    attempt_in(S.UNKNOWN, tenant_a, key="a-unknown-2")
    monkeypatch.setattr(queries, "COUNT_CAP", 1)
    counts = {S.UNKNOWN: 2, S.MANUAL_REVIEW: 1, "APPROVALS": 0, "MINE": 0, "INCIDENTS": 0}
    assert queries.queue_counts(operator_a) == counts
    page = as_user(operator_a).get(reverse("reviews:home")).content.decode()
    assert 'id="count-unknown">1+<' in page
    assert '<span class="card-count">1+</span>' in page


def test_a_bad_query_string_is_reported_and_ignored(stuck: dict[str, Attempt], operator_a: Any) -> None:
    response = as_user(operator_a).get(UNKNOWN_QUEUE, {"owner": "everyone", "after": "yesterday", "sort": "x"})
    page = response.content.decode()
    assert response.status_code == 200
    assert "not a position in this list" in page
    assert "a-unknown" in page  # the rest of the list still shows


@pytest.mark.parametrize("cursor", ["1-9999999999999999999", "9999999999999999-1", "0-0"])
def test_extreme_cursors_and_ids_are_harmless(stuck: dict[str, Attempt], operator_a: Any, cursor: str) -> None:
    client = as_user(operator_a)
    assert client.get(UNKNOWN_QUEUE, {"after": cursor}).status_code == 200
    assert client.get(UNKNOWN_QUEUE, {"before": cursor}).status_code == 200
    assert client.get(SEARCH, {"q": "#999999999999999999"}).status_code == 200


def test_listing_writes_nothing(stuck: dict[str, Attempt], operator_a: Any) -> None:
    before = ledger_snapshot()
    client = as_user(operator_a)
    for url in LIST_URLS:
        client.get(url)
        client.get(url, headers=HTMX)
    assert ledger_snapshot() == before


def test_viewers_see_the_queue_without_claim_buttons(stuck: dict[str, Attempt], viewer_a: Any) -> None:
    page = as_user(viewer_a).get(UNKNOWN_QUEUE).content.decode()
    assert "a-unknown" in page
    assert 'class="claim"' not in page
    assert 'name="ids"' not in page
    assert 'id="bulk"' not in page


def test_operators_get_claim_buttons_and_bulk_selection(stuck: dict[str, Attempt], operator_a: Any) -> None:
    page = as_user(operator_a).get(UNKNOWN_QUEUE).content.decode()
    attempt = stuck["a_unknown"]
    assert f'aria-label="Claim #{attempt.pk}"' in page
    assert f'name="ids" value="{attempt.pk}" form="bulk"' in page


def test_a_row_carries_its_claim_form_and_says_whose_it_is(stuck: dict[str, Attempt], operator_a: Any) -> None:
    attempt = stuck["a_unknown"]
    client = as_user(operator_a)
    url = f"{UNKNOWN_QUEUE}?sort=newest"
    page = client.get(url).content.decode()
    row = page[page.index(f'<tr id="row-{attempt.pk}"') :].split("</tr>", 1)[0]
    claim = reverse("reviews:claim", args=[attempt.pk])
    assert f'action="{claim}" hx-post="{claim}" hx-target="#row-{attempt.pk}"' in row
    assert 'name="csrfmiddlewaretoken" value="' in row
    assert '<input type="hidden" name="next" value="/queues/unknown/?sort=newest">' in row
    assert f'<time datetime="{attempt.created_at.isoformat()}"' in row
    # The claim form posts as the template's did: the owner seen, and back to the list.
    response = client.post(claim, {"owner_seen": attempt.owner_id or "", "next": url})
    assert response.status_code == 303
    assert response["Location"] == url
    page = client.get(url).content.decode()
    row = page[page.index(f'<tr id="row-{attempt.pk}"') :].split("</tr>", 1)[0]
    assert '<span class="mine">yours</span>' in row
    assert 'class="claim"' not in row


# --- the pages themselves: keyset pagination ------------------------------------------


def _walk(user: Any, query: ListQuery) -> list[int]:
    seen: list[int] = []
    page = queries.list_page(user, query)
    seen += [a.pk for a in page.rows]
    while page.next_cursor is not None:
        query = ListQuery(**{**query.__dict__, "after": page.next_cursor, "before": None})
        page = queries.list_page(user, query)
        seen += [a.pk for a in page.rows]
    return seen


@pytest.fixture
def many(tenant_a: Tenant, tenant_b: Tenant, admin_a: Any) -> list[Attempt]:
    """Seven UNKNOWN attempts across two tenants, some sharing a timestamp."""
    from ledgerdash.ledger.models import Membership

    Membership.objects.create(user=admin_a, tenant=tenant_b, role="admin")
    made = []
    for n in range(7):
        made.append(attempt_in(S.UNKNOWN, tenant_a if n % 2 else tenant_b, key=f"many-{n}"))
    # Three share one created_at: the id breaks the tie.
    same = timezone.now() - timedelta(hours=2)
    Attempt.objects.filter(pk__in=[made[1].pk, made[2].pk, made[3].pk]).update(created_at=same)
    return list(Attempt.objects.filter(pk__in=[a.pk for a in made]).order_by("created_at", "id"))


def test_keyset_pages_visit_every_row_once_in_order_across_tenants(many: list[Attempt], admin_a: Any) -> None:
    tenant_ids = tuple(sorted({a.tenant_id for a in many}))
    oldest = ListQuery(tenant_ids=tenant_ids, state=S.UNKNOWN, page_size=2)
    assert _walk(admin_a, oldest) == [a.pk for a in many]
    newest = ListQuery(tenant_ids=tenant_ids, state=S.UNKNOWN, page_size=2, oldest_first=False)
    assert _walk(admin_a, newest) == [a.pk for a in reversed(many)]


def test_going_back_a_page_returns_the_same_rows(many: list[Attempt], admin_a: Any) -> None:
    tenant_ids = tuple(sorted({a.tenant_id for a in many}))
    first = queries.list_page(admin_a, ListQuery(tenant_ids=tenant_ids, state=S.UNKNOWN, page_size=3))
    assert first.prev_cursor is None
    second = queries.list_page(
        admin_a, ListQuery(tenant_ids=tenant_ids, state=S.UNKNOWN, page_size=3, after=first.next_cursor)
    )
    assert second.prev_cursor is not None
    back = queries.list_page(
        admin_a, ListQuery(tenant_ids=tenant_ids, state=S.UNKNOWN, page_size=3, before=second.prev_cursor)
    )
    assert [a.pk for a in back.rows] == [a.pk for a in first.rows]
    assert back.prev_cursor is None
    assert back.next_cursor == first.next_cursor


def test_a_page_stays_put_when_new_work_arrives(many: list[Attempt], admin_a: Any, tenant_a: Tenant) -> None:
    tenant_ids = tuple(sorted({a.tenant_id for a in many}))
    query = ListQuery(tenant_ids=tenant_ids, state=S.UNKNOWN, page_size=3, after=Cursor.of(many[2]))
    before = [a.pk for a in queries.list_page(admin_a, query).rows]
    attempt_in(S.UNKNOWN, tenant_a, key="new-arrival")  # newest: lands at the end, not on this page
    assert [a.pk for a in queries.list_page(admin_a, query).rows] == before


def test_the_pager_links_keep_the_filters(many: list[Attempt], admin_a: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    client = as_user(admin_a)
    page = client.get(UNKNOWN_QUEUE, {"tool": "send_email", "sort": "oldest"}).content.decode()
    assert 'rel="next"' in page
    assert 'rel="prev"' not in page
    assert "?tool=send_email&amp;sort=oldest&amp;after=" in page
    after = str(Cursor.of(many[1]))
    second = client.get(UNKNOWN_QUEUE, {"tool": "send_email", "sort": "oldest", "after": after}).content.decode()
    assert f'data-attempt="{many[2].pk}"' in second
    assert f'data-attempt="{many[1].pk}"' not in second
    assert 'rel="prev"' in second
    assert "First page" in second


def test_a_cursor_survives_its_round_trip_through_the_url(many: list[Attempt]) -> None:
    cursor = Cursor.of(many[0])
    assert Cursor.parse(str(cursor)) == cursor
    assert Cursor.parse("12-x") is None
    assert Cursor.parse("99999999999999999999-1") is None


# --- filters and search -----------------------------------------------------------------


def test_owner_filter_me_and_unassigned(tenant_a: Tenant, operator_a: Any) -> None:
    mine = attempt_in(S.UNKNOWN, tenant_a, key="mine")
    moves.attempt_assign(attempt=mine, owner=operator_a, actor=Actor.user(operator_a))
    theirs = attempt_in(S.UNKNOWN, tenant_a, key="theirs")  # the tenant's default owner
    Tenant.objects.filter(pk=tenant_a.pk).update(default_owner=None)
    nobody = attempt_in(S.UNKNOWN, tenant_a, key="nobody")
    client = as_user(operator_a)

    def keys(**params: str) -> set[str]:
        page = client.get(UNKNOWN_QUEUE, params).content.decode()
        return {k for k in ("mine", "theirs", "nobody") if f'<bdi class="u">{k}</bdi></code>' in page}

    assert keys(owner="me") == {"mine"}
    assert keys(owner="unassigned") == {"nobody"}
    assert keys(owner="anyone") == {"mine", "theirs", "nobody"}
    assert theirs.owner_id is not None
    assert nobody.owner_id is None


def test_tool_and_age_filters(tenant_a: Tenant, operator_a: Any) -> None:
    old = attempt_in(S.UNKNOWN, tenant_a, key="old-mail")
    Attempt.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    attempt_in(S.UNKNOWN, tenant_a, key="new-mail")
    ticket = record(tenant_a, "ticket-1", tool_name="open_ticket", args={"title": "x"})
    ticket = recording.mark_unknown(recording.mark_dispatched(ticket, actor=AGENT), reason="timeout", actor=AGENT)
    client = as_user(operator_a)

    def keys(**params: str) -> set[str]:
        page = client.get(UNKNOWN_QUEUE, params).content.decode()
        return {k for k in ("old-mail", "new-mail", "ticket-1") if f'<bdi class="u">{k}</bdi></code>' in page}

    assert keys(tool="open_ticket") == {"ticket-1"}
    assert keys(age="gt1d") == {"old-mail"}
    assert keys(age="lt1h") == {"new-mail", "ticket-1"}
    assert keys(tool="send_email", age="gt1h") == {"old-mail"}


def test_search_finds_by_id_key_task_request_id_and_hash_prefix(tenant_a: Tenant, operator_a: Any) -> None:
    done = attempt_in(S.OUTCOME_CONFIRMED, tenant_a, key="invoice-77")  # provider request "req-invoice-77"
    other = record(tenant_a, "other-key", task_id="task-other", args={"n": 2})
    client = as_user(operator_a)

    def found(q: str) -> set[int]:
        page = client.get(SEARCH, {"q": q}).content.decode()
        return {a.pk for a in (done, other) if f'data-attempt="{a.pk}"' in page}

    assert found("invoice-77") == {done.pk}
    assert found("task-other") == {other.pk}
    assert found("req-invoice-77") == {done.pk}
    assert found(done.args_hash[:10]) == {done.pk}
    assert found(f"#{other.pk}") == {other.pk}
    assert found("nothing-like-it") == set()


def test_search_filters_by_state(tenant_a: Tenant, operator_a: Any, stuck: dict[str, Attempt]) -> None:
    page = as_user(operator_a).get(SEARCH, {"state": S.OUTCOME_CONFIRMED}).content.decode()
    assert "a-done" in page
    assert "a-unknown" not in page


def test_search_never_crosses_tenants(stuck: dict[str, Attempt], outsider_b: Any) -> None:
    a = stuck["a_unknown"]
    page = as_user(outsider_b).get(SEARCH, {"q": f"#{a.pk}"}).content.decode()
    assert f'data-attempt="{a.pk}"' not in page
    page = as_user(outsider_b).get(SEARCH, {"q": "a-unknown"}).content.decode()
    assert "Nothing here" in page


class _Markup:
    """Markup of another library (markupsafe's convention): ``__html__`` only."""

    def __html__(self) -> str:
        return "<em>kept</em>"


@given(value=st.one_of(st.text(), st.integers(), st.none(), st.floats(allow_nan=False)))
def test_a_rows_markup_is_escaped_as_format_html_escapes_it(value: Any) -> None:
    template = '<td title="{0}" data-n="{n}">{0}</td>{safe}{lazy}{other}'
    values = {"n": value, "safe": mark_safe("<b>&amp;</b>"), "lazy": gettext_lazy("<i>'x'</i>"), "other": _Markup()}
    ours = display.format_markup(template, value, **values)
    assert ours == format_html(template, value, **values)
    assert isinstance(ours, SafeString)

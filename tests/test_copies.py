"""The API acts on the copy of an attempt its process wrote last, only when
the write confirms the row is still that copy (ledgerdash.ledger.store.copies).

Each test changes the row behind the copy's back, the way another process
would (a person, the reconciler, an in-process step), and checks that the
answer is the one a fresh read gives."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.store import copies
from tests.api_support import Api, issue_token
from tests.conftest import RECONCILER

pytestmark = pytest.mark.postgres

S = State


@pytest.fixture
def api_a(tenant_a: Tenant) -> Api:
    return Api(issue_token(tenant_a))


def statements(run: Any) -> tuple[Any, list[str]]:
    """What ``run()`` returned, and the statements it sent that read or wrote
    an attempt row (the token's check, say, aside)."""
    with CaptureQueriesContext(connection) as captured:
        result = run()
    table = Attempt._meta.db_table
    return result, [q["sql"] for q in captured.captured_queries if f'"{table}" ' in q["sql"] or f"{table} " in q["sql"]]


def test_a_tool_calls_next_steps_send_one_statement_each(api_a: Api) -> None:
    attempt = api_a.record("k")
    dispatched, sent = statements(lambda: api_a.dispatch(attempt["id"], fence=attempt["fence"]))
    assert dispatched.status_code == 200, dispatched.content
    assert len(sent) == 1  # the compare-and-set: no read of the attempt first
    fence = dispatched.json()["fence"]
    confirmed, sent = statements(lambda: api_a.outcome(attempt["id"], "confirmed", fence, provider_request_id="r-1"))
    assert confirmed.status_code == 200, confirmed.content
    assert len(sent) == 1
    assert Attempt.objects.get(pk=attempt["id"]).state == S.OUTCOME_CONFIRMED


def test_without_a_copy_each_step_reads_the_attempt_first(api_a: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copies, "MAX_AGE", -1.0)  # every copy is too old to use
    attempt = api_a.record("k")
    dispatched, sent = statements(lambda: api_a.dispatch(attempt["id"], fence=attempt["fence"]))
    assert dispatched.status_code == 200
    assert len(sent) == 2
    assert sent[0].startswith("SELECT")


def test_a_request_id_recorded_elsewhere_is_not_overwritten_by_a_report_on_the_copy(api_a: Api) -> None:
    attempt = api_a.record("k")
    fence = api_a.dispatch(attempt["id"]).json()["fence"]
    # Another process records the provider's request id: the row changes, its fence does not.
    recording.record_request_id(Attempt.objects.get(pk=attempt["id"]), "req-A", fence=fence)
    response = api_a.outcome(attempt["id"], "confirmed", fence, provider_request_id="req-B")
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "request_id_conflict"
    row = Attempt.objects.get(pk=attempt["id"])
    assert (row.state, row.provider_request_id) == (S.DISPATCHED, "req-A")


def test_a_refusal_is_the_rows_not_the_copys(api_a: Api) -> None:
    attempt = api_a.record("k")
    fence = api_a.dispatch(attempt["id"]).json()["fence"]
    unknown = api_a.outcome(attempt["id"], "unknown", fence, reason="timed out")
    assert unknown.json()["state"] == S.UNKNOWN  # the process's copy says UNKNOWN
    # The reconciler sends it again meanwhile: the row is DISPATCHED, by someone else.
    moves.attempt_dispatch(attempt=Attempt.objects.get(pk=attempt["id"]), actor=RECONCILER)
    response = api_a.dispatch(attempt["id"])
    assert response.status_code == 409
    assert response.json()["code"] == "attempt_in_flight"  # not the copy's outcome_unknown
    assert response.json()["state"] == S.DISPATCHED


def test_a_report_after_the_lease_moved_the_row_is_late_evidence(api_a: Api) -> None:
    attempt = api_a.record("k")
    fence = api_a.dispatch(attempt["id"]).json()["fence"]
    moves.attempt_expire_lease(attempt=Attempt.objects.get(pk=attempt["id"]), actor=RECONCILER, fence=fence)
    response = api_a.outcome(attempt["id"], "confirmed", fence, provider_request_id="r-1")
    assert response.status_code == 200, response.content
    assert response["Ledgerdash-Late-Report"] == "true"
    assert Attempt.objects.get(pk=attempt["id"]).state == S.OUTCOME_CONFIRMED


def test_an_owner_given_meanwhile_is_kept(api_a: Api, operator_a: Any) -> None:
    attempt = api_a.record("k")
    fence = api_a.dispatch(attempt["id"]).json()["fence"]
    row = Attempt.objects.get(pk=attempt["id"])
    moves.attempt_assign(attempt=row, owner=operator_a, actor=RECONCILER)
    response = api_a.outcome(attempt["id"], "confirmed", fence, provider_request_id="r-1")
    assert response.status_code == 200
    row.refresh_from_db()
    assert (row.state, row.owner_id) == (S.OUTCOME_CONFIRMED, operator_a.pk)


def test_another_tenants_token_never_reaches_a_copy(api_a: Api, tenant_b: Tenant) -> None:
    attempt = api_a.record("k")
    other = Api(issue_token(tenant_b))
    assert other.dispatch(attempt["id"]).status_code == 404
    assert other.outcome(attempt["id"], "confirmed", 1, provider_request_id="r").status_code == 404
    assert Attempt.objects.get(pk=attempt["id"]).state == S.INTENT_RECORDED
    assert api_a.dispatch(attempt["id"]).status_code == 200  # its own agent goes on


def test_after_a_stale_copy_the_next_step_uses_the_copy_again(api_a: Api, operator_a: Any) -> None:
    attempt = api_a.record("k")
    moves.attempt_assign(attempt=Attempt.objects.get(pk=attempt["id"]), owner=operator_a, actor=RECONCILER)
    dispatched, sent = statements(lambda: api_a.dispatch(attempt["id"], fence=attempt["fence"]))
    assert dispatched.status_code == 200
    assert len(sent) == 3  # the copy's compare-and-set found the row changed; the row read; the claim
    fence = dispatched.json()["fence"]
    confirmed, sent = statements(lambda: api_a.outcome(attempt["id"], "confirmed", fence, provider_request_id="r-1"))
    assert confirmed.status_code == 200
    assert len(sent) == 1
    assert Attempt.objects.get(pk=attempt["id"]).owner_id == operator_a.pk


@pytest.mark.parametrize("tenant", ["tenant_a", "tenant_striped"])
def test_the_steps_on_a_copy_are_statements_psycopg_keeps_parsed(
    tenant: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row version the copy carries is one more parameter: the claim and
    the report stay within psycopg's limits for keeping a parsed statement."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

    from ledgerdash.ledger.store import statements as events

    api = Api(issue_token(request.getfixturevalue(tenant)))
    warm = api.record("warm")
    api.dispatch(warm["id"])  # the process now knows the tenant's authority: the claim is guarded
    sent: list[tuple[str, int, int]] = []
    execute = events._execute_append

    def measured(sql: str, params: list[Any], rows: list[Any]) -> Any:
        sent.append((sql, len(sql.encode()), len(params)))
        return execute(sql, params, rows)

    attempt = api.record("k")
    monkeypatch.setattr(events, "_execute_append", measured)
    fence = api.dispatch(attempt["id"], fence=attempt["fence"]).json()["fence"]
    assert api.outcome(attempt["id"], "confirmed", fence, provider_request_id="r-1").status_code == 200
    assert len(sent) == 2
    for sql, size, params in sent:
        assert "xmin::text = " in sql  # each was made on the copy
        assert params <= MAX_CACHED_STATEMENT_PARAMS
        assert size <= MAX_CACHED_STATEMENT_LENGTH

"""The store's fast paths change round trips, never answers: with any one
of them switched off (``LEDGER_FAST_PATHS_OFF``), a tool call in process
and over the API, a replay, a lost claim, a policy change between intent
and dispatch and a reused key give the same results, the chains verify, and
the round trips are the plain way's."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledgerdash.ledger import audit, recording, store
from ledgerdash.ledger.errors import AuthorizationChanged, ClaimLost, IdempotencyConflict
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from tests.api_support import Api, intent, issue_token
from tests.conftest import AGENT, TOOLS_V1, record

S = State
OFF = [(), *((name,) for name in store.FAST_PATHS), tuple(store.FAST_PATHS)]


def _named(off: tuple[str, ...]) -> str:
    return "all on" if not off else "all off" if len(off) > 1 else f"{off[0]} off"


@pytest.fixture(params=OFF, ids=_named)
def switched(request: pytest.FixtureRequest, settings: Any) -> tuple[str, ...]:
    settings.LEDGER_FAST_PATHS_OFF = frozenset(request.param)
    store.forget()  # nothing remembered from another setting
    return request.param


@pytest.mark.postgres
def test_the_answers_are_the_same_with_any_fast_path_off(switched: tuple[str, ...], tenant_a: Tenant) -> None:
    api_a = Api(issue_token(tenant_a))
    # In process: intent, claim, outcome; the same intent again is the same attempt.
    attempt = record(tenant_a, "k-in-process")
    assert record(tenant_a, "k-in-process").pk == attempt.pk
    stale = Attempt.objects.get(pk=attempt.pk)
    claimed = recording.mark_dispatched(attempt, actor=AGENT)
    with pytest.raises(ClaimLost):
        recording.mark_dispatched(stale, actor=AGENT)  # a copy from before the claim: it lost
    done = recording.confirm(claimed, provider_request_id="req-1", actor=AGENT)
    assert done.state == S.OUTCOME_CONFIRMED
    # The same key with other arguments: a linked attempt for review, not a call.
    with pytest.raises(IdempotencyConflict):
        record(tenant_a, "k-in-process", args={"to": "someone-else@example.com"})
    # A policy change between intent and dispatch: the claim is refused and reviewed.
    waiting = record(tenant_a, "k-policy")
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("t"), note="v2")
    with pytest.raises(AuthorizationChanged):
        recording.mark_dispatched(waiting, actor=AGENT)
    assert Attempt.objects.get(pk=waiting.pk).state == S.MANUAL_REVIEW
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, actor=Actor.system("t"), note="v3")
    # Over the API: record, claim, report; a replayed report is answered as the first.
    created = api_a.record("k-over-http")
    fence = api_a.dispatch(created["id"]).json()["fence"]
    first = api_a.outcome(created["id"], "confirmed", fence, provider_request_id="req-2")
    again = api_a.outcome(created["id"], "confirmed", fence, provider_request_id="req-2")
    assert first.status_code == again.status_code == 200
    assert first.json()["state"] == again.json()["state"] == S.OUTCOME_CONFIRMED
    replay = api_a.post("/attempts", intent("k-over-http"))
    assert replay.status_code == 200
    assert replay.json()["id"] == created["id"]
    assert all(result.ok for result in audit.verify())


@pytest.mark.postgres
def test_switched_off_the_round_trips_are_the_plain_ways(settings: Any, tenant_a: Tenant) -> None:
    record(tenant_a, "k-warm")  # the tenant's chain exists; the authority is remembered
    with CaptureQueriesContext(connection) as fast:
        recording.mark_dispatched(record(tenant_a, "k-fast"), actor=AGENT)
    settings.LEDGER_FAST_PATHS_OFF = frozenset({"one_statement", "remembered_authority"})
    with CaptureQueriesContext(connection) as plain:
        recording.mark_dispatched(record(tenant_a, "k-plain"), actor=AGENT)

    def statements(captured: CaptureQueriesContext) -> list[str]:
        return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]

    assert len(statements(fast)) == 2  # the intent, the claim
    assert len(statements(plain)) > 2 * len(statements(fast))


def test_an_unknown_fast_path_is_refused_by_the_checks(settings: Any, db: None) -> None:
    settings.LEDGER_FAST_PATHS_OFF = frozenset({"copys"})
    (error,) = [e for e in run_checks() if e.id == "ledgerdash.E012"]
    assert "copys" in error.msg
    assert "one_statement" in (error.hint or "")


def test_a_fast_path_taken_out_is_named_with_a_warning_not_refused(settings: Any, db: None) -> None:
    settings.LEDGER_FAST_PATHS_OFF = frozenset({"quiet_health_check"})
    found = [e for e in run_checks() if e.id.startswith("ledgerdash.") and "FAST_PATHS" in e.msg]
    assert [e.id for e in found] == ["ledgerdash.W012"]
    assert "taken out" in found[0].msg


def _sql_of_a_call(tenant: Tenant, api: Api, key: str) -> list[str]:
    """The statements of one tool call over the API (record, claim), warm."""
    with CaptureQueriesContext(connection) as captured:
        created = api.record(key)
        api.dispatch(created["id"])
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


@pytest.mark.postgres
@pytest.mark.parametrize("name", list(store.FAST_PATHS))
def test_each_fast_path_switched_off_takes_the_plain_way(name: str, settings: Any, tenant_a: Tenant) -> None:
    # The compiled read is the read of an attempt this process kept no copy of.
    also_off = {"remembered_attempt"} if name == "compiled_read" else set()
    settings.LEDGER_FAST_PATHS_OFF = frozenset(also_off)
    api = Api(issue_token(tenant_a))
    _sql_of_a_call(tenant_a, api, "k-warm-1")
    _sql_of_a_call(tenant_a, api, "k-warm-2")  # the id block, the authority and the token are known now
    fast = _sql_of_a_call(tenant_a, api, "k-fast")
    settings.LEDGER_FAST_PATHS_OFF = frozenset({name, *also_off})
    store.forget()
    _sql_of_a_call(tenant_a, api, "k-warm-3")
    plain = _sql_of_a_call(tenant_a, api, "k-plain")
    if name == "compiled_read":  # the same round trips: the read built once, or the ORM's query
        built = 'FROM "ledger_attempt" WHERE "id" = '
        assert any(built in sql for sql in fast), fast
        assert not any(built in sql for sql in plain), plain
        orm = 'WHERE "ledger_attempt"."id" = '
        assert any(orm in sql and sql.endswith("LIMIT 1") for sql in plain), plain
    else:
        assert len(plain) > len(fast), (name, fast, plain)


@pytest.mark.parametrize("of_tenant", [True, False], ids=["of its tenant", "by id alone"])
def test_the_compiled_read_makes_the_attempt_the_orm_makes(of_tenant: bool, settings: Any, tenant_a: Tenant) -> None:
    """Every field as a query set would give it: JSON decoded, datetimes aware, and on SQLite booleans."""
    from ledgerdash.ledger.store import reads

    api = Api(issue_token(tenant_a))
    created = api.record("k-read", args={"to": "ap@example.com", "n": [1, 2.5, None], "ok": True})
    api.dispatch(created["id"])
    api.outcome(created["id"], "confirmed", 1, provider_request_id="req-1", result={"id": "ch_1", "paid": True})
    tenant_id = tenant_a.pk if of_tenant else None
    compiled = store.read_attempt(created["id"], tenant_id)
    assert compiled is not None
    assert compiled == reads.read_attempt(created["id"])
    settings.LEDGER_FAST_PATHS_OFF = frozenset({"compiled_read"})
    plain = store.read_attempt(created["id"], tenant_id)
    assert plain is not None
    fields = [f.attname for f in Attempt._meta.concrete_fields]
    assert {f: getattr(compiled, f) for f in fields} == {f: getattr(plain, f) for f in fields}
    assert compiled.args == {"to": "ap@example.com", "n": [1, 2.5, None], "ok": True}
    assert compiled.first_dispatched_at is not None
    assert compiled.first_dispatched_at.tzinfo is not None
    assert compiled._state.adding is False
    assert compiled._state.db == plain._state.db
    # Another tenant's attempt, and none at all, read as none, either way.
    assert reads.read_attempt(created["id"] + 10_000) is None
    for off in (frozenset({"compiled_read"}), frozenset()):
        settings.LEDGER_FAST_PATHS_OFF = off
        assert store.read_attempt(created["id"], tenant_a.pk + 10_000) is None
        assert store.read_attempt(created["id"] + 10_000, tenant_id) is None


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "orm"])
def test_an_attempt_is_read_by_its_primary_key_alone(compiled: bool, settings: Any, tenant_a: Tenant) -> None:
    """The read names the id and nothing else, so no statistics can lead the
    planner to the tenant's index (``store/reads.py``); the tenant is checked after."""
    if not compiled:
        settings.LEDGER_FAST_PATHS_OFF = frozenset({"compiled_read"})
    attempt = record(tenant_a, "k-by-pk")
    with CaptureQueriesContext(connection) as captured:
        assert store.read_attempt(attempt.pk, tenant_a.pk) == attempt
    (sql,) = [q["sql"] for q in captured.captured_queries]
    where = sql.split(" WHERE ", 1)[1]
    assert "tenant_id" not in where, sql
    assert '"id" = ' in where, sql

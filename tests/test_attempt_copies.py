"""The attempt a process wrote last, kept for the agent's next request on it
(``remembered_attempt``, :mod:`ledgerdash.ledger.store.copies`): a dispatch
and an outcome over the API send no read, and a copy that another process
made stale, by any write at all, changes no answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from ledgerdash.ledger.store import copies
from tests.api_support import Api, issue_token
from tests.conftest import AGENT

pytestmark = pytest.mark.postgres

S = State
READ = 'FROM "ledger_attempt" WHERE "id" = '


def _sql(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def _events(attempt_id: int) -> list[tuple[str, str]]:
    return list(AttemptEvent.objects.filter(attempt_id=attempt_id).order_by("seq").values_list("kind", "to_state"))


@pytest.fixture
def api(tenant_a: Tenant) -> Api:
    api = Api(issue_token(tenant_a))
    api.record("k-warm")  # the token, the authority and the tenant's chains are known from here on
    return api


def test_the_dispatch_and_the_outcome_send_their_change_only(api: Api) -> None:
    created = api.record("k-1")
    with CaptureQueriesContext(connection) as dispatch:
        claimed = api.dispatch(created["id"])
    with CaptureQueriesContext(connection) as outcome:
        done = api.outcome(created["id"], "confirmed", claimed.json()["fence"], provider_request_id="req-1")
    assert claimed.status_code == done.status_code == 200, (claimed.content, done.content)
    assert done.json()["state"] == S.OUTCOME_CONFIRMED
    for captured in (dispatch, outcome):
        (change,) = _on_attempts(captured)  # the token's statements aside
        assert "xmin = " in change


def _on_attempts(captured: CaptureQueriesContext) -> list[str]:
    return [sql for sql in _sql(captured) if "ledger_attempt" in sql]


def test_an_intent_is_abandoned_from_the_copy(api: Api) -> None:
    created = api.record("k-abandon")
    with CaptureQueriesContext(connection) as captured:
        abandoned = api.post(f"/attempts/{created['id']}/abandon", {"reason": "re-ran", "fence": 0})
    assert abandoned.status_code == 200, abandoned.content
    assert abandoned.json()["state"] == S.FAILED
    (change,) = _on_attempts(captured)
    assert "xmin = " in change


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(lambda api, pk, fence: api.post(f"/attempts/{pk}/heartbeat", {"fence": fence}), id="heartbeat"),
        pytest.param(
            lambda api, pk, fence: api.post(f"/attempts/{pk}/request-id", {"provider_request_id": "r", "fence": fence}),
            id="request id",
        ),
    ],
)
def test_a_write_that_leaves_no_version_drops_the_copy(api: Api, step: Callable[..., Any]) -> None:
    """A heartbeat or a request id is written by the ORM, which reads back no
    version: the outcome after it reads the row rather than send a change the
    version would refuse."""
    created = api.record("k-drop")
    fence = api.dispatch(created["id"]).json()["fence"]
    assert step(api, created["id"], fence).status_code == 200
    with CaptureQueriesContext(connection) as captured:
        done = api.outcome(created["id"], "confirmed", fence, provider_request_id="r")
    assert done.status_code == 200, done.content
    read, change = _on_attempts(captured)
    assert READ in read
    assert "xmin = " not in change


def test_a_request_id_another_process_recorded_is_not_overwritten(api: Api) -> None:
    """The request id moves no fence: only the row's version tells the copy is stale."""
    created = api.record("k-2")
    fence = api.dispatch(created["id"]).json()["fence"]
    elsewhere = Attempt.objects.get(pk=created["id"])
    recording.record_request_id(elsewhere, "req-A", fence=fence, actor=AGENT)
    refused = api.outcome(created["id"], "confirmed", fence, provider_request_id="req-B")
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "request_id_conflict"
    row = Attempt.objects.get(pk=created["id"])
    assert (row.state, row.provider_request_id) == (S.DISPATCHED, "req-A")


def test_a_report_after_the_lease_expired_is_late_as_without_a_copy(api: Api) -> None:
    created = api.record("k-4")
    fence = api.dispatch(created["id"]).json()["fence"]
    expired = moves.attempt_expire_lease(
        attempt=Attempt.objects.get(pk=created["id"]), actor=Actor.reconciler("test"), fence=fence
    )
    assert expired.state == S.UNKNOWN
    late = api.outcome(created["id"], "confirmed", fence, provider_request_id="req-1")
    assert late.status_code == 200, late.content
    assert late.headers.get("Ledgerdash-Late-Report") == "true"
    assert late.json()["state"] == S.OUTCOME_CONFIRMED
    confirmations = [event for event in _events(created["id"]) if event[1] == S.OUTCOME_CONFIRMED]
    assert len(confirmations) == 1


def test_a_late_unknown_is_kept_as_evidence_once(api: Api) -> None:
    """From the copy the report would be a plain change; the row says it is
    late evidence, which is written once, from the row read now."""
    created = api.record("k-late-unknown")
    fence = api.dispatch(created["id"]).json()["fence"]
    moves.attempt_expire_lease(
        attempt=Attempt.objects.get(pk=created["id"]), actor=Actor.reconciler("test"), fence=fence
    )
    late = api.outcome(created["id"], "unknown", fence, reason="timed out")
    assert late.status_code == 200, late.content
    assert late.headers.get("Ledgerdash-Late-Report") == "true"
    assert [kind for kind, _ in _events(created["id"])].count("late_report") == 1


def test_a_refusal_rests_on_the_row_read_now(api: Api) -> None:
    """The copy says INTENT_RECORDED; another worker claimed it since: in flight, as the row says."""
    created = api.record("k-5")
    recording.mark_dispatched(Attempt.objects.get(pk=created["id"]), actor=AGENT)
    refused = api.dispatch(created["id"])
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "attempt_in_flight"
    assert [kind for kind, to_state in _events(created["id"]) if to_state == S.DISPATCHED] == ["transition"]


def test_another_tenants_token_finds_nothing(api: Api, tenant_b: Tenant) -> None:
    created = api.record("k-6")
    other = Api(issue_token(tenant_b))
    refused = other.dispatch(created["id"])
    assert refused.status_code == 404
    assert refused.json()["code"] == "attempt_not_found"
    with CaptureQueriesContext(connection) as captured:
        assert api.dispatch(created["id"]).status_code == 200
    assert not any(READ in sql for sql in _sql(captured))  # the copy stayed for its own tenant


def test_a_copy_is_kept_for_a_while_only(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(copies, "monotonic", lambda: now[0])
    created = api.record("k-7")
    now[0] += copies.KEEP_SECONDS + 1
    with CaptureQueriesContext(connection) as captured:
        assert api.dispatch(created["id"]).status_code == 200
    assert any(READ in sql for sql in _sql(captured))


def test_an_attempt_with_large_arguments_is_not_kept(api: Api) -> None:
    created = api.record("k-large", args={"body": "x" * (copies.KEPT_ARGS_BYTES + 1)})
    for step in ("dispatch", "outcome"):
        with CaptureQueriesContext(connection) as captured:
            if step == "dispatch":
                fence = api.dispatch(created["id"]).json()["fence"]
            else:
                assert api.outcome(created["id"], "unknown", fence, reason="timed out").status_code == 200
        assert any(READ in sql for sql in _sql(captured)), step


def test_a_process_keeps_so_many_copies_only(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copies, "KEPT", 2)
    first, second, third = (api.record(f"k-kept-{n}") for n in range(3))
    for created, kept in ((third, True), (second, True), (first, False)):  # the oldest went first
        with CaptureQueriesContext(connection) as captured:
            assert api.dispatch(created["id"]).status_code == 200
        assert any(READ in sql for sql in _sql(captured)) is not kept, created["idempotency_key"]


def _failing(statement: str, error: Exception) -> Callable[..., Any]:
    sent: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if statement in sql:
            sent.append(sql)
            raise error
        return execute(sql, params, many, context)

    wrapper.sent = sent  # type: ignore[attr-defined]
    return wrapper


def test_a_change_whose_answer_never_came_is_not_sent_again(api: Api) -> None:
    """The connection broke while the guarded change ran: it may have been
    written, so it is not made again from the row; the agent is told the
    ledger is unavailable and asks again."""
    created = api.record("k-8")
    broken = _failing("UPDATE ledger_attempt SET", OperationalError("server closed the connection unexpectedly"))
    with connection.execute_wrapper(broken):
        answer = api.dispatch(created["id"])
    assert answer.status_code == 503, answer.content
    assert answer.json()["code"] == "ledger_unavailable"
    assert len(broken.sent) == 1  # type: ignore[attr-defined]


def test_switched_off_every_move_reads_first(api: Api, settings: Any) -> None:
    settings.LEDGER_FAST_PATHS_OFF = frozenset({"remembered_attempt"})
    created = api.record("k-9")
    with CaptureQueriesContext(connection) as captured:
        assert api.dispatch(created["id"]).status_code == 200
    assert any(READ in sql for sql in _sql(captured))

"""The ingest API's semantics: each endpoint, its statuses, and what it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from ledgerdash.ledger import api as ledger_api
from ledgerdash.ledger import clock, errors, moves, recording, tokens
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken, Attempt, AttemptEvent, Incident, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from tests.api_support import BASE, READ, WRITE, Api, intent, issue_token
from tests.conftest import RECONCILER, TOOLS_V1, ledger_snapshot

S = State


@pytest.fixture
def api_a(tenant_a: Tenant) -> Api:
    return Api(issue_token(tenant_a))


def _dispatched(api: Api, key: str = "k") -> dict[str, Any]:
    attempt = api.record(key)
    response = api.dispatch(attempt["id"])
    assert response.status_code == 200, response.content
    return response.json()


# --- record intent -------------------------------------------------------------------


def test_recording_an_intent_answers_201_with_the_attempt(api_a: Api, tenant_a: Tenant) -> None:
    response = api_a.post("/attempts", intent("invoice:7:send", credential_scope=["email:send"]))
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == S.INTENT_RECORDED
    assert body["idempotency_key"] == "invoice:7:send"
    assert body["provider_key"] == "invoice:7:send"
    assert body["args"] == {"invoice": 7, "to": "ap@example.com"}
    assert body["credential_scope"] == ["email:send"]
    attempt = Attempt.objects.get(pk=body["id"])
    assert attempt.tenant == tenant_a
    (event,) = AttemptEvent.objects.filter(attempt=attempt)
    assert event.actor_kind == "agent"
    assert "via token" in event.actor_label


def test_an_answer_states_the_ledger_times_exactly_and_text_as_utf8(api_a: Api) -> None:
    at = datetime(2026, 12, 6, 20, 12, 1, 757041, tzinfo=UTC)
    with clock.frozen_at(at):
        response = api_a.post("/attempts", intent("résumé:1", args={"to": "zoë@example.com"}))
    assert response.status_code == 201, response.content
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert "zoë@example.com".encode() in response.content  # as UTF-8, not a \u escape
    body = response.json()
    # to the microsecond, as recorded: RFC 3339 in UTC, which the clients parse back to the same instant
    assert body["created_at"] == "2026-12-06T20:12:01.757041Z"
    assert datetime.fromisoformat(body["next_check_at"]) == Attempt.objects.get(pk=body["id"]).next_check_at


def test_the_agent_header_names_the_agent_in_the_events(api_a: Api) -> None:
    response = api_a.post("/attempts", intent(), headers={"Ledgerdash-Agent": "billing-worker-3"})
    event = AttemptEvent.objects.get(attempt_id=response.json()["id"])
    assert event.actor_label.startswith("billing-worker-3 via token ")


def test_the_same_key_and_args_answer_200_with_the_same_attempt_and_write_nothing(api_a: Api) -> None:
    first = api_a.post("/attempts", intent("k", args={"a": 1, "b": [1, 2]}))
    snapshot = ledger_snapshot()
    again = api_a.post("/attempts", intent("k", args={"b": [1, 2], "a": 1}, task_id="task-1-restarted"))
    assert first.status_code == 201
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert ledger_snapshot() == snapshot


def test_the_same_key_with_other_args_answers_409_naming_the_linked_attempt(api_a: Api) -> None:
    original = api_a.record("k", args={"amount": 10})
    response = api_a.post("/attempts", intent("k", args={"amount": 11}))
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "idempotency_key_reused"
    assert body["original_id"] == original["id"]
    linked = Attempt.objects.get(pk=body["attempt_id"])
    assert linked.parent_id == original["id"]
    assert linked.state == S.MANUAL_REVIEW
    assert body["state"] == S.MANUAL_REVIEW
    assert str(linked.pk) in body["message"]


def test_a_second_reworded_call_still_names_the_first_attempt_as_the_original(api_a: Api) -> None:
    original = api_a.record("k", args={"amount": 10})
    first = api_a.post("/attempts", intent("k", args={"amount": 11})).json()
    second = api_a.post("/attempts", intent("k", args={"amount": 12})).json()
    assert second["code"] == "idempotency_key_reused"
    assert second["attempt_id"] not in (original["id"], first["attempt_id"])
    assert (first["original_id"], second["original_id"]) == (original["id"], original["id"])


def test_a_replayed_confirmed_key_carries_the_stored_result(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="req-1", result={"id": "m-1"})
    again = api_a.post("/attempts", intent("k"))
    assert again.status_code == 200
    assert again.json()["state"] == S.OUTCOME_CONFIRMED
    assert again.json()["result"] == {"id": "m-1"}


# --- dispatch ----------------------------------------------------------------------------


def test_claiming_dispatch_returns_the_fence_to_report_with(api_a: Api) -> None:
    attempt = api_a.record("k")
    response = api_a.dispatch(attempt["id"], fence=attempt["fence"])
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == S.DISPATCHED
    assert body["fence"] == attempt["fence"] + 1
    assert body["dispatch_fence"] == body["fence"]


def test_a_second_claim_loses_with_409_and_writes_nothing(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    snapshot = ledger_snapshot()
    response = api_a.dispatch(attempt["id"])
    assert response.status_code == 409
    assert response.json()["code"] == "attempt_in_flight"
    # wait for the dispatcher's lease: after it, recovery takes the attempt over
    lease_end = Attempt.objects.get(pk=attempt["id"]).next_check_at
    assert 1 <= int(response["Retry-After"]) <= (lease_end - timezone.now()).total_seconds() + 1
    assert response.json()["retry_after"] == int(response["Retry-After"])  # for clients that read the body
    assert ledger_snapshot() == snapshot


def test_a_claim_with_a_stale_fence_loses(api_a: Api) -> None:
    attempt = api_a.record("k")
    snapshot = ledger_snapshot()
    response = api_a.dispatch(attempt["id"], fence=attempt["fence"] + 5)
    assert response.status_code == 409
    assert response.json()["code"] == "claim_lost"
    assert (response.json()["attempt_id"], response.json()["state"]) == (attempt["id"], S.INTENT_RECORDED)
    # nobody raced it: the caller sent a fence the attempt is not at
    assert "another worker" not in response.json()["message"]
    assert f"not at the fence {attempt['fence'] + 5} you sent" in response.json()["message"]
    assert ledger_snapshot() == snapshot


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("unknown", "outcome_unknown"),
        ("review", "under_review"),
        ("failed", "attempt_failed"),
        ("retry_later", "retry_pending"),
        ("confirmed", "illegal_transition"),
    ],
)
def test_dispatch_says_why_the_tool_must_not_be_called(api_a: Api, setup: str, code: str) -> None:
    attempt = _dispatched(api_a)
    stored = Attempt.objects.get(pk=attempt["id"])
    if setup == "confirmed":
        recording.confirm(stored, provider_request_id="r", actor=Actor.agent())
    elif setup == "failed":
        recording.fail(stored, reason="refused", actor=Actor.agent())
    elif setup == "retry_later":
        recording.fail_retryable(stored, reason="rate limited", actor=Actor.agent())
    else:
        stored = recording.mark_unknown(stored, reason="timeout", actor=Actor.agent())
        if setup == "review":
            moves.attempt_escalate(attempt=stored, actor=RECONCILER, fence=stored.fence, reason="ambiguous")
    snapshot = ledger_snapshot()
    response = api_a.dispatch(attempt["id"])
    assert response.status_code == 409
    assert response.json()["code"] == code
    if code == "retry_pending":
        assert int(response["Retry-After"]) >= 1
    assert ledger_snapshot() == snapshot


def test_a_policy_change_since_the_intent_refuses_dispatch_and_puts_it_under_review(
    api_a: Api, tenant_a: Tenant
) -> None:
    attempt = api_a.record("k")
    policy_publish(tenant=tenant_a, tools={"open_ticket": ["tickets:write"]}, actor=Actor.system("tests"))
    response = api_a.dispatch(attempt["id"])
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "authorization_changed"
    # The tool is not allowed at all now: no linked attempt can be
    # authorized, so the never-sent original waits for a person.
    assert (body["attempt_id"], body["original_id"], body["state"]) == (attempt["id"], attempt["id"], "MANUAL_REVIEW")
    original = Attempt.objects.get(pk=attempt["id"])
    assert (original.state, original.dispatch_count) == (State.MANUAL_REVIEW, 0)


def test_a_scope_change_since_the_intent_names_the_linked_attempt_to_follow(api_a: Api, tenant_a: Tenant) -> None:
    attempt = api_a.record("k")
    policy_publish(tenant=tenant_a, tools={**TOOLS_V1, "send_email": []}, actor=Actor.system("tests"))
    body = api_a.dispatch(attempt["id"]).json()
    linked = Attempt.objects.get(parent_id=attempt["id"])
    assert (body["code"], body["attempt_id"], body["original_id"]) == (
        "authorization_changed",
        linked.pk,
        attempt["id"],
    )
    # The agent's re-run with the same key and arguments is told it is under review.
    again = api_a.record("k")
    assert again["id"] == linked.pk


# --- request id and outcome -------------------------------------------------------------


def test_the_request_id_is_recorded_and_repeating_it_writes_nothing(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    path = f"/attempts/{attempt['id']}/request-id"
    first = api_a.post(path, {"fence": attempt["fence"], "provider_request_id": "req-9"})
    assert first.status_code == 200
    assert first.json()["provider_request_id"] == "req-9"
    snapshot = ledger_snapshot()
    assert api_a.post(path, {"fence": attempt["fence"], "provider_request_id": "req-9"}).status_code == 200
    assert ledger_snapshot() == snapshot
    other = api_a.post(path, {"fence": attempt["fence"], "provider_request_id": "req-10"})
    assert other.status_code == 409
    assert other.json()["code"] == "request_id_conflict"
    assert (other.json()["attempt_id"], other.json()["state"]) == (attempt["id"], S.DISPATCHED)
    assert ledger_snapshot() == snapshot


@pytest.mark.parametrize(
    ("outcome", "fields", "state"),
    [
        (
            "confirmed",
            {"provider_request_id": "req-1", "result_ref": "msg/1", "result": {"ok": True}},
            S.OUTCOME_CONFIRMED,
        ),
        ("failed", {"reason": "mailbox does not exist"}, S.FAILED),
        ("failed_retryable", {"reason": "rate limited before acting"}, S.FAILED_RETRYABLE),
        ("unknown", {"reason": "timed out"}, S.UNKNOWN),
    ],
)
def test_each_outcome_moves_the_attempt(api_a: Api, outcome: str, fields: dict[str, Any], state: str) -> None:
    attempt = _dispatched(api_a)
    response = api_a.outcome(attempt["id"], outcome, attempt["fence"], **fields)
    assert response.status_code == 200, response.content
    assert response.json()["state"] == state
    assert Attempt.objects.get(pk=attempt["id"]).state == state


def test_confirming_without_a_receipt_is_refused(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    snapshot = ledger_snapshot()
    response = api_a.outcome(attempt["id"], "confirmed", attempt["fence"])
    assert response.status_code == 422
    assert response.json()["code"] == "missing_evidence"
    assert ledger_snapshot() == snapshot


def test_a_stale_fence_is_refused_with_409(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    snapshot = ledger_snapshot()
    response = api_a.outcome(attempt["id"], "failed", attempt["fence"] - 1, reason="x")
    assert response.status_code == 409
    assert response.json()["code"] == "stale_fence"
    assert (response.json()["attempt_id"], response.json()["state"]) == (attempt["id"], S.DISPATCHED)
    assert ledger_snapshot() == snapshot


def test_an_outcome_for_an_attempt_never_dispatched_is_an_illegal_transition(api_a: Api) -> None:
    attempt = api_a.record("k")
    snapshot = ledger_snapshot()
    response = api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="r")
    assert response.status_code == 409
    assert response.json()["code"] == "illegal_transition"
    assert (response.json()["attempt_id"], response.json()["state"]) == (attempt["id"], S.INTENT_RECORDED)
    assert ledger_snapshot() == snapshot


def test_repeating_a_report_that_landed_answers_200_and_writes_nothing(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    first = api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="req-1")
    assert first.status_code == 200
    snapshot = ledger_snapshot()
    again = api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="req-1")
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert ledger_snapshot() == snapshot


def test_a_report_that_contradicts_the_recorded_one_is_kept_as_evidence_and_opens_an_incident(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="req-1")
    other = api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="req-2")
    assert other.status_code == 200
    assert other["Ledgerdash-Late-Report"] == "true"
    assert other.json()["provider_request_id"] == "req-1"  # the attempt keeps what it had
    kinds = list(AttemptEvent.objects.filter(attempt_id=attempt["id"]).order_by("seq").values_list("kind", flat=True))
    assert kinds[-2:] == ["late_report", "incident"]
    incident = Incident.objects.get(attempt_id=attempt["id"])
    assert incident.kind == Incident.Kind.CONTRADICTION
    assert "second receipt" in incident.summary


def test_a_late_report_after_the_lease_expired_is_accepted_as_evidence(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    stored = Attempt.objects.get(pk=attempt["id"])
    moves.attempt_expire_lease(attempt=stored, actor=RECONCILER, fence=stored.fence)
    response = api_a.outcome(attempt["id"], "confirmed", attempt["fence"], provider_request_id="req-late")
    assert response.status_code == 200
    assert response.json()["state"] == S.OUTCOME_CONFIRMED
    last = AttemptEvent.objects.filter(attempt_id=attempt["id"]).order_by("-seq").first()
    assert last is not None
    assert last.details["late_report"]["provider_request_id"] == "req-late"


def test_a_late_retryable_failure_of_an_unknown_attempt_is_recorded_never_refused(api_a: Api) -> None:
    # The dispatcher was paused past its lease; the reconciler made the attempt UNKNOWN and
    # its lookups found the provider unavailable. Then the dispatcher reports what it heard.
    attempt = _dispatched(api_a)
    stored = Attempt.objects.get(pk=attempt["id"])
    unknown = moves.attempt_expire_lease(attempt=stored, actor=RECONCILER, fence=stored.fence)
    moves.attempt_check_later(
        attempt=unknown, actor=RECONCILER, fence=unknown.fence, reason="503", lookup={"status": "unavailable"}
    )
    response = api_a.outcome(attempt["id"], "failed_retryable", attempt["fence"], reason="rejected before acting")
    assert response.status_code == 200, response.json()
    assert response["Ledgerdash-Late-Report"] == "true"
    assert response.json()["state"] == S.FAILED_RETRYABLE
    last = AttemptEvent.objects.filter(attempt_id=attempt["id"]).order_by("-seq").first()
    assert last is not None
    assert (last.from_state, last.to_state, last.actor_kind) == (S.UNKNOWN, S.FAILED_RETRYABLE, "agent")


# --- reads --------------------------------------------------------------------------------


def test_reading_an_attempt_shows_its_events(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    response = api_a.get(f"/attempts/{attempt['id']}")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == S.DISPATCHED
    assert [e["to_state"] for e in body["events"]] == [S.INTENT_RECORDED, S.DISPATCHED]
    assert all(len(e["hash"]) == 64 for e in body["events"])


def test_a_long_poll_answers_as_soon_as_the_attempt_moves(api_a: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerdash.ledger.api import attempts as attempt_endpoints

    attempt = _dispatched(api_a)
    naps: list[float] = []

    def recovery_moves_it_meanwhile(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:  # another process settles it while the agent waits
            stored = Attempt.objects.get(pk=attempt["id"])
            moves.attempt_expire_lease(attempt=stored, actor=RECONCILER, fence=stored.fence)

    monkeypatch.setattr(attempt_endpoints, "_sleep", recovery_moves_it_meanwhile)
    response = api_a.get(f"/attempts/{attempt['id']}?wait=20&fence={attempt['fence']}")
    assert response.status_code == 200
    assert response.json()["state"] == S.UNKNOWN
    assert response.json()["fence"] != attempt["fence"]
    assert len(naps) == 2  # answered on the first read after the move, not at the end of the wait


def test_a_long_poll_answers_at_once_when_the_caller_saw_an_older_fence(
    api_a: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerdash.ledger.api import attempts as attempt_endpoints

    attempt = _dispatched(api_a)
    monkeypatch.setattr(attempt_endpoints, "_sleep", lambda seconds: pytest.fail("waited for a change it had"))
    response = api_a.get(f"/attempts/{attempt['id']}?wait=20&fence={attempt['fence'] - 1}")
    assert response.json()["fence"] == attempt["fence"]


def test_a_long_poll_with_nothing_changing_ends_with_the_attempt_as_it_is(api_a: Api) -> None:
    attempt = _dispatched(api_a)
    response = api_a.get(f"/attempts/{attempt['id']}?wait=0.3")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["fence"]) == (S.DISPATCHED, attempt["fence"])


@pytest.mark.parametrize("query", ["wait=26", "wait=-1", "wait=soon", "fence=-1", "held=1"])
def test_a_long_poll_refuses_a_wait_it_cannot_keep(api_a: Api, query: str) -> None:
    attempt = _dispatched(api_a)
    response = api_a.get(f"/attempts/{attempt['id']}?{query}")
    assert response.status_code == 422
    assert response.json()["code"] in ("validation_error", "unknown_field")


def test_the_attempt_names_its_owner(api_a: Api, operator_a: Any) -> None:
    attempt = _dispatched(api_a)
    assert api_a.get(f"/attempts/{attempt['id']}").json()["owner"] is None
    moves.attempt_assign(attempt=Attempt.objects.get(pk=attempt["id"]), owner=operator_a, actor=Actor.user(operator_a))
    assert api_a.get(f"/attempts/{attempt['id']}").json()["owner"] == operator_a.get_username()
    listed = api_a.get("/attempts?idempotency_key=k").json()["items"]
    assert [item["owner"] for item in listed] == [operator_a.get_username()]


def test_finding_by_key_returns_the_whole_chain(api_a: Api) -> None:
    original = api_a.record("k", args={"n": 1})
    linked = api_a.post("/attempts", intent("k", args={"n": 2})).json()["attempt_id"]
    api_a.record("other")
    response = api_a.get("/attempts", {"idempotency_key": "k"})
    assert response.status_code == 200
    assert [a["id"] for a in response.json()["items"]] == [linked, original["id"]]
    assert response.json()["next_before"] is None


def test_needs_attention_lists_unknown_and_review_work_only(api_a: Api) -> None:
    unknown = _dispatched(api_a, "u")
    api_a.outcome(unknown["id"], "unknown", unknown["fence"], reason="timeout")
    api_a.record("fresh")
    api_a.record("c", args={"n": 1})
    review = api_a.post("/attempts", intent("c", args={"n": 2})).json()["attempt_id"]
    response = api_a.get("/attempts", {"needs_attention": "true"})
    assert response.status_code == 200
    items = response.json()["items"]
    assert [a["id"] for a in items] == [review, unknown["id"]]
    assert {a["state"] for a in items} == {S.UNKNOWN, S.MANUAL_REVIEW}
    assert "args" not in items[0]  # lists stay small; read one attempt for its arguments


def test_lists_page_with_before(api_a: Api) -> None:
    ids = [api_a.record(f"k-{i}")["id"] for i in range(5)]
    first = api_a.get("/attempts", {"limit": 2}).json()
    assert [a["id"] for a in first["items"]] == ids[:-3:-1]
    second = api_a.get("/attempts", {"limit": 2, "before": first["next_before"]}).json()
    assert [a["id"] for a in second["items"]] == [ids[2], ids[1]]
    last = api_a.get("/attempts", {"limit": 2, "before": second["next_before"]}).json()
    assert [a["id"] for a in last["items"]] == [ids[0]]
    assert last["next_before"] is None


# --- tokens -------------------------------------------------------------------------------


def test_a_read_token_cannot_write_and_a_write_token_cannot_read(tenant_a: Tenant) -> None:
    reader, writer = Api(issue_token(tenant_a, READ)), Api(issue_token(tenant_a, WRITE))
    snapshot = ledger_snapshot()
    refused = reader.post("/attempts", intent())
    assert refused.status_code == 403
    assert refused.json()["code"] == "insufficient_scope"
    assert ledger_snapshot() == snapshot
    attempt = writer.record("k")
    assert writer.get(f"/attempts/{attempt['id']}").json()["code"] == "insufficient_scope"
    assert reader.get(f"/attempts/{attempt['id']}").status_code == 200


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_token"),
        ("Basic dXNlcjpwdw==", "missing_token"),
        ("Bearer ", "missing_token"),
        ("Bearer not-a-token", "invalid_token"),
        ("Bearer ldk_0123456789ab_" + "x" * 43, "invalid_token"),
    ],
)
def test_a_missing_or_bad_token_answers_401(tenant_a: Tenant, header: str | None, code: str) -> None:
    headers = {"Authorization": header} if header is not None else {}
    response = Client().post(f"{BASE}/attempts", intent(), content_type="application/json", headers=headers)
    assert response.status_code == 401
    assert response.json()["code"] == code
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_token_with_a_tampered_secret_is_refused(tenant_a: Tenant) -> None:
    raw = issue_token(tenant_a)
    tampered = raw[:-1] + ("A" if raw[-1] != "A" else "B")
    assert Api(tampered).post("/attempts", intent()).json()["code"] == "invalid_token"


def test_a_revoked_token_and_an_expired_token_answer_401(tenant_a: Tenant) -> None:
    from ledgerdash.ledger.tokens import token_revoke

    revoked = issue_token(tenant_a, name="revoked")
    token_revoke(token=ApiToken.objects.get(name="revoked"), actor=Actor.system("tests"))
    expired = issue_token(tenant_a, expires_at=timezone.now() - timedelta(seconds=1))
    snapshot = ledger_snapshot()
    assert Api(revoked).post("/attempts", intent()).json()["code"] == "token_revoked"
    assert Api(expired).post("/attempts", intent()).json()["code"] == "token_expired"
    assert Api(expired).get("/attempts").status_code == 401
    assert ledger_snapshot() == snapshot


def test_a_worker_checks_a_token_once_per_cache_period_and_a_revocation_here_at_once(
    tenant_a: Tenant, kept_for_5s: list[float], django_assert_num_queries: Any
) -> None:
    raw = issue_token(tenant_a, READ)
    api = Api(raw)
    api.get("/attempts")  # the first request looks the token up and notes its use
    with django_assert_num_queries(1):  # the page of attempts, and nothing about the token
        assert api.get("/attempts").status_code == 200
    tokens.token_revoke(token=ApiToken.objects.get(prefix=raw.split("_")[1]), actor=Actor.system("tests"))
    assert api.get("/attempts").json()["code"] == "token_revoked"


def test_a_token_of_an_inactive_tenant_is_refused(tenant_a: Tenant, api_a: Api) -> None:
    Tenant.objects.filter(pk=tenant_a.pk).update(is_active=False)
    response = api_a.get("/attempts")
    assert response.status_code == 403
    assert response.json()["code"] == "tenant_inactive"


def test_using_a_token_notes_when_cheaply(tenant_a: Tenant, api_a: Api) -> None:
    token = ApiToken.objects.get(tenant=tenant_a)
    assert token.last_used_at is None
    api_a.get("/attempts")
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    api_a.get("/attempts")
    token.refresh_from_db()
    assert token.last_used_at == first  # not written again within the minute


def test_a_session_cookie_never_authenticates_and_csrf_does_not_apply(tenant_a: Tenant, make_user: Any) -> None:
    admin = make_user("boss", is_staff=True, is_superuser=True)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin)
    response = browser.post(f"{BASE}/attempts", intent(), content_type="application/json")
    assert response.status_code == 401
    assert response.json()["code"] == "missing_token"
    with_token = Api(issue_token(tenant_a), client=browser)
    assert with_token.post("/attempts", intent()).status_code == 201  # no CSRF token needed


def test_api_requests_take_the_apis_own_middleware_not_the_dashboards(
    tenant_a: Tenant, operator_a: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.sessions.backends.base import SessionBase

    from tests.conftest import as_user

    def no_session(self: Any, *args: Any) -> None:
        raise AssertionError("an API request read the session")

    browser = as_user(operator_a)  # a signed-in person's cookie goes with the request
    page = browser.get("/")
    monkeypatch.setattr(SessionBase, "_get_session", no_session)
    answer = Api(issue_token(tenant_a), client=browser).record("k")
    response = Api(issue_token(tenant_a), client=browser).get(f"/attempts/{answer['id']}")
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]  # still never cached,
    assert response["X-Content-Type-Options"] == "nosniff"  # still the security headers,
    assert response["X-Request-ID"]  # still logged with a request id
    for header in ("Set-Cookie", "Vary", "X-Frame-Options", "Content-Security-Policy"):
        assert header not in response, header  # but no session, CSRF cookie or page headers
    assert "X-Frame-Options" in page  # which pages keep


# --- the document ----------------------------------------------------------------------


def test_the_openapi_document_is_generated_and_public(db: None) -> None:
    response = Client().get(f"{BASE}/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert set(doc["paths"]) == {
        "/api/v1/attempts/{attempt_id}/heartbeat",
        "/api/v1/attempts/{attempt_id}/abandon",
        f"{BASE}/attempts",
        f"{BASE}/attempts/{{attempt_id}}",
        f"{BASE}/attempts/{{attempt_id}}/dispatch",
        f"{BASE}/attempts/{{attempt_id}}/request-id",
        f"{BASE}/attempts/{{attempt_id}}/outcome",
        f"{BASE}/approvals",
        f"{BASE}/approvals/{{attempt_id}}/approve",
        f"{BASE}/approvals/{{attempt_id}}/reject",
    }
    assert doc["components"]["schemas"]["IntentIn"]["additionalProperties"] is False
    assert doc["components"]["securitySchemes"] == {"BearerToken": {"type": "http", "scheme": "bearer"}}


def test_every_ledger_error_has_an_http_status() -> None:
    codes = {cls.code for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.LedgerError)}
    assert codes <= set(ledger_api.STATUS_BY_CODE), codes - set(ledger_api.STATUS_BY_CODE)

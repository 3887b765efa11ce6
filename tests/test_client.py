"""The HTTP client: its retry policy and typed errors against a scripted
stub server (any database), and the whole tool wrapper against the real app
on a live server (PostgreSQL: a live server needs transactional tests, and
SQLite's append-only trigger refuses the flush that ends them)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import ledgerdash_client as ledger
from ledgerdash.ledger import api as ledger_api
from ledgerdash.ledger import errors, moves
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ApiToken, Attempt, State, Tenant
from ledgerdash.ledger.tokens import token_revoke
from tests.api_support import READ, issue_token
from tests.conftest import RECONCILER
from tests.live import free_port

S = State

# --- typed errors -------------------------------------------------------------------------

#: Ledger errors only people's decisions raise; the API never answers with them.
NOT_FROM_THE_API = {
    "ownership",
    "approval_refused",
    "self_approval",
    "unknown_tenant",
    "ledger_error",
    "incident",  # people's decisions on incidents are made in the dashboard
    "inside_transaction",  # no API request runs inside a caller's transaction
}


def test_every_code_the_api_answers_with_has_a_client_exception() -> None:
    codes = (set(ledger_api.STATUS_BY_CODE) | set(ledger_api.API_CODES)) - NOT_FROM_THE_API
    # 503 ledger_unavailable is retried, then raised as LedgerUnavailable (like a transport failure)
    missing = codes - set(ledger.ERRORS) - {ledger.LedgerUnavailable.code}
    assert not missing, missing
    for code in codes - {ledger.LedgerUnavailable.code}:
        assert ledger.ERRORS[code].code == code


def test_client_exceptions_mirror_the_ledgers_names() -> None:
    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.LedgerError) and cls.code not in NOT_FROM_THE_API:
            if cls.code in ("invalid_token", "token_revoked", "token_expired", "insufficient_scope") or name in (
                "LedgerError",
                "TokenError",
            ):
                continue
            assert getattr(ledger, name).code == cls.code, name


def test_an_error_answer_becomes_its_typed_exception() -> None:
    exc = ledger.error_for(409, {"code": "idempotency_key_reused", "message": "m", "attempt_id": 7, "original_id": 3})
    assert isinstance(exc, ledger.IdempotencyConflict)
    assert isinstance(exc, ledger.AttemptBlocked)
    assert (exc.status, exc.attempt_id, exc.original_id, str(exc)) == (409, 7, 3, "m")
    unknown = ledger.error_for(409, {"code": "something_new", "message": "m"})
    assert type(unknown) is ledger.AttemptBlocked
    assert unknown.code == "something_new"
    assert isinstance(ledger.error_for(502, {}), ledger.ServerError)


def test_the_client_is_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEDGERDASH_URL", raising=False)
    monkeypatch.delenv("LEDGERDASH_TOKEN", raising=False)
    with pytest.raises(ledger.ConfigurationError, match="LEDGERDASH_URL"):
        ledger.LedgerClient()
    monkeypatch.setenv("LEDGERDASH_URL", "http://127.0.0.1:8000/")
    with pytest.raises(ledger.ConfigurationError, match="LEDGERDASH_TOKEN"):
        ledger.LedgerClient()
    monkeypatch.setenv("LEDGERDASH_TOKEN", "ldk_x")
    monkeypatch.setenv("LEDGERDASH_AGENT", "worker-9")
    client = ledger.LedgerClient()
    assert client.base_url == "http://127.0.0.1:8000/api/v1"
    assert client.agent == "worker-9"
    assert ledger.LedgerClient("http://h:1/api/v1", "t").base_url == "http://h:1/api/v1"
    with pytest.raises(ledger.ConfigurationError):
        ledger.LedgerClient("ftp://h", "t")


def test_tools_need_a_task() -> None:
    @ledger.tool("send_email", key="k")
    def send(call: Any) -> None:
        raise AssertionError("not called")

    with pytest.raises(ledger.NoTask):
        send()


# --- the retry policy, against a scripted stub -----------------------------------------------

ATTEMPT = {
    "id": 1,
    "state": "INTENT_RECORDED",
    "fence": 0,
    "task_id": "t",
    "tool_name": "send_email",
    "idempotency_key": "k",
    "provider_key": "k",
    "args_hash": "0" * 64,
}


class Stub(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), StubHandler)
        #: what to do with each request in turn: "drop", or (status, body, headers)
        self.script: list[Any] = []
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class StubHandler(BaseHTTPRequestHandler):
    server: Stub

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, dict(self.headers), body))
        action = self.server.script.pop(0) if self.server.script else (200, ATTEMPT, {})
        if action == "drop":
            self.close_connection = True
            return  # read, never answered: the client cannot tell whether it landed
        status, payload, headers = action
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _answer


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _client(url: str, **kwargs: Any) -> ledger.LedgerClient:
    return ledger.LedgerClient(url, "ldk_test", agent="stub-test", backoff=0.001, timeout=5, **kwargs)


def test_record_intent_is_retried_when_the_answer_is_lost(stub: Stub) -> None:
    stub.script = ["drop", "drop", (201, ATTEMPT, {})]
    recorded = _client(stub.url).record_intent(task_id="t", tool_name="send_email", idempotency_key="k", args={})
    assert recorded.created is True
    assert len(stub.seen) == 3
    assert len({body for *_, body in stub.seen}) == 1  # the same request each time
    method, path, headers, _ = stub.seen[0]
    assert (method, path) == ("POST", "/api/v1/attempts")
    assert headers["Authorization"] == "Bearer ldk_test"
    assert headers["Ledgerdash-Agent"] == "stub-test"


def test_a_dispatch_claim_whose_answer_is_lost_is_not_sent_again(stub: Stub) -> None:
    stub.script = ["drop", (200, ATTEMPT, {})]
    with pytest.raises(ledger.LedgerUnavailable) as caught:
        _client(stub.url).dispatch(1, fence=0)
    assert caught.value.sent is None  # it may have landed
    assert len(stub.seen) == 1


def test_a_request_that_never_left_is_retried_even_for_dispatch() -> None:
    client = _client(f"http://127.0.0.1:{free_port()}", retries=2)
    with pytest.raises(ledger.LedgerUnavailable) as caught:
        client.dispatch(1)
    assert caught.value.sent is False


def test_outcome_reports_and_reads_are_retried_on_503_but_dispatch_is_not(stub: Stub) -> None:
    unavailable = (503, {"code": "ledger_unavailable", "message": "db down"}, {"Retry-After": "1"})
    stub.script = [unavailable, (200, {**ATTEMPT, "state": "OUTCOME_CONFIRMED"}, {})]
    assert _client(stub.url).confirm(1, fence=1, provider_request_id="r").state == "OUTCOME_CONFIRMED"
    stub.script = [unavailable, (200, ATTEMPT, {})]
    assert _client(stub.url).get(1).id == 1
    stub.script = [unavailable, (200, ATTEMPT, {})]
    with pytest.raises(ledger.LedgerUnavailable):
        _client(stub.url).dispatch(1)
    assert len(stub.seen) == 5


def test_retries_give_up_after_the_configured_number(stub: Stub) -> None:
    stub.script = ["drop"] * 10
    with pytest.raises(ledger.LedgerUnavailable):
        _client(stub.url, retries=2).get(1)
    assert len(stub.seen) == 3


def test_errors_are_not_retried(stub: Stub) -> None:
    stub.script = [(409, {"code": "stale_fence", "message": "moved"}, {})]
    with pytest.raises(ledger.StaleFence):
        _client(stub.url).fail(1, fence=3, reason="x")
    assert len(stub.seen) == 1


def test_a_redirect_is_refused_rather_than_followed(stub: Stub) -> None:
    stub.script = [(301, b"", {"Location": "https://elsewhere/api/v1/attempts"})]
    with pytest.raises(ledger.ConfigurationError, match="elsewhere"):
        _client(stub.url).record_intent(task_id="t", tool_name="x", idempotency_key="k", args={})
    assert len(stub.seen) == 1


def test_a_proxys_html_error_page_is_still_an_error(stub: Stub) -> None:
    stub.script = [(500, b"<html>oops</html>", {"Content-Type": "text/html"})]
    with pytest.raises(ledger.ServerError):
        _client(stub.url).get(1)


def test_arguments_that_are_not_json_are_refused_before_sending(stub: Stub) -> None:
    client = _client(stub.url)
    with pytest.raises(ledger.InvalidArgs):
        client.record_intent(task_id="t", tool_name="x", idempotency_key="k", args={"n": float("nan")})
    with pytest.raises(ledger.InvalidArgs):
        client.record_intent(task_id="t", tool_name="x", idempotency_key="k", args={"when": object()})
    assert stub.seen == []


def test_a_body_over_the_limit_is_refused_before_sending(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server refuses a body over its limit by closing the connection while it is being sent,
    which would read as a server down: the client refuses it first, saying what to raise."""
    big = {"text": "x" * (600 * 1024)}
    with pytest.raises(ledger.BodyTooLarge) as refused:
        _client(stub.url).record_intent(task_id="t", tool_name="x", idempotency_key="k", args=big)
    assert stub.seen == []
    assert refused.value.status == 413
    assert "over the limit of 524288" in str(refused.value)
    assert "max_body_bytes" in str(refused.value)
    assert "LEDGERDASH_MAX_BODY_BYTES" in str(refused.value)
    assert "nothing was sent" in str(refused.value)
    # Where the ledger allows more, the client is told so.
    _client(stub.url, max_body_bytes=1024 * 1024).record_intent(
        task_id="t", tool_name="x", idempotency_key="k", args=big
    )
    monkeypatch.setenv("LEDGERDASH_MAX_BODY_BYTES", str(1024 * 1024))
    _client(stub.url).record_intent(task_id="t", tool_name="x", idempotency_key="k", args=big)
    assert len(stub.seen) == 2
    monkeypatch.setenv("LEDGERDASH_MAX_BODY_BYTES", "a lot")
    with pytest.raises(ledger.ConfigurationError, match="LEDGERDASH_MAX_BODY_BYTES='a lot': a whole number of bytes"):
        _client(stub.url)


# --- against the real app -------------------------------------------------------------------


class Provider:
    """A stand-in provider that counts its effects."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, **fields: Any) -> dict[str, Any]:
        self.sent.append(fields)
        return {"id": f"msg-{len(self.sent)}"}


@pytest.fixture
def live(live_server: Any, tenant_a: Tenant) -> ledger.LedgerClient:
    return ledger.LedgerClient(live_server.url, issue_token(tenant_a), agent="live-test", backoff=0.01)


def _send_email_tool(provider: Provider, name: str = "send_email") -> Any:
    @ledger.tool(name, key="invoice:{invoice_id}:send")
    def send_email(call: ledger.ToolCall, *, invoice_id: str, to: str) -> dict[str, Any]:
        response = provider.send(to=to, idempotency_key=call.key)
        call.record_request_id(response["id"])
        return response

    return send_email


@pytest.mark.postgres
def test_ten_megabytes_of_arguments_are_refused_as_too_large_not_as_a_server_down(
    live: ledger.LedgerClient,
) -> None:
    with pytest.raises(ledger.BodyTooLarge):
        live.record_intent(task_id="t", tool_name="send_email", idempotency_key="k", args={"x": "y" * 10_000_000})
    assert not Attempt.objects.exists()


@pytest.mark.postgres
def test_a_wrapped_tool_runs_once_and_replays_its_result(live: ledger.LedgerClient) -> None:
    provider = Provider()
    send_email = _send_email_tool(provider)
    with live.task(task_id="billing-run-1"):
        first = send_email(invoice_id="INV-7", to="ap@example.com")
    with ledger.task(task_id="billing-run-1-restarted", client=live):
        again = send_email(invoice_id="INV-7", to="ap@example.com")
    assert first == again == {"id": "msg-1"}
    assert len(provider.sent) == 1
    assert provider.sent[0]["idempotency_key"] == "invoice:INV-7:send"
    attempt = Attempt.objects.get()
    assert (attempt.state, attempt.provider_request_id, attempt.result) == (S.OUTCOME_CONFIRMED, "msg-1", first)
    assert attempt.events.filter(actor_label__startswith="live-test via token").count() == 4


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("raised", "state"),
    [
        (ledger.NothingHappened("rate limited before acting"), S.FAILED_RETRYABLE),
        (ledger.PermanentFailure("no such mailbox"), S.FAILED),
        (TimeoutError("read timed out"), S.UNKNOWN),
    ],
)
def test_a_tools_exception_is_reported_as_its_outcome(live: ledger.LedgerClient, raised: Exception, state: str) -> None:
    @ledger.tool("send_email", key="k")
    def send(call: ledger.ToolCall) -> None:
        raise raised

    with live.task(task_id="t"), pytest.raises(type(raised)):
        send()
    assert Attempt.objects.get().state == state


@pytest.mark.postgres
def test_a_tool_that_returns_without_a_receipt_leaves_the_outcome_unknown(live: ledger.LedgerClient) -> None:
    @ledger.tool("send_email", key="k")
    def send(call: ledger.ToolCall) -> str:
        return "HTTP 200"

    with live.task(task_id="t"):
        assert send() == "HTTP 200"
    assert Attempt.objects.get().state == S.UNKNOWN


@pytest.mark.postgres
def test_a_reused_key_with_other_args_raises_and_does_not_call_the_tool(live: ledger.LedgerClient) -> None:
    provider = Provider()
    send_email = _send_email_tool(provider)
    with live.task(task_id="t"):
        send_email(invoice_id="INV-7", to="ap@example.com")
        with pytest.raises(ledger.IdempotencyConflict) as caught:
            send_email(invoice_id="INV-7", to="someone-else@example.com")
    assert len(provider.sent) == 1
    linked = Attempt.objects.get(pk=caught.value.attempt_id)
    assert linked.state == S.MANUAL_REVIEW
    assert caught.value.original_id == linked.parent_id


@pytest.mark.postgres
def test_a_rerun_is_told_why_it_must_not_call_the_tool(live: ledger.LedgerClient) -> None:
    provider = Provider()
    send_email = _send_email_tool(provider)
    attempt_id = live.record_intent(
        task_id="t",
        tool_name="send_email",
        idempotency_key="invoice:INV-7:send",
        args={"invoice_id": "INV-7", "to": "ap@example.com"},
    ).attempt.id
    claimed = live.dispatch(attempt_id)
    with live.task(task_id="t"), pytest.raises(ledger.AttemptInFlight):
        send_email(invoice_id="INV-7", to="ap@example.com")
    live.mark_unknown(attempt_id, fence=claimed.fence, reason="timeout")
    with live.task(task_id="t"), pytest.raises(ledger.OutcomeUnknown):
        send_email(invoice_id="INV-7", to="ap@example.com")
    stored = Attempt.objects.get(pk=attempt_id)
    moves.attempt_escalate(attempt=stored, actor=RECONCILER, fence=stored.fence, reason="ambiguous")
    with live.task(task_id="t"), pytest.raises(ledger.UnderReview):
        send_email(invoice_id="INV-7", to="ap@example.com")
    assert provider.sent == []


@pytest.mark.postgres
def test_the_steps_and_reads_over_http(live: ledger.LedgerClient) -> None:
    recorded = live.record_intent(
        task_id="t",
        tool_name="charge_card",
        idempotency_key="pay:1",
        args={"cents": 500},
        credential_scope="payments:charge",
    )
    assert recorded.created is True
    again = live.record_intent(
        task_id="t",
        tool_name="charge_card",
        idempotency_key="pay:1",
        args={"cents": 500},
        credential_scope=["payments:charge"],
    )
    assert (again.created, again.attempt.id) == (False, recorded.attempt.id)
    claimed = live.dispatch(recorded.attempt.id, fence=recorded.attempt.fence)
    live.record_request_id(claimed.id, "ch_1", fence=claimed.fence)
    confirmed = live.confirm(claimed.id, fence=claimed.fence, result={"charge": "ch_1"})
    # a retry of a report whose answer was lost: answered, not refused
    assert live.confirm(claimed.id, fence=claimed.fence, result={"charge": "ch_1"}).fence == confirmed.fence
    with pytest.raises(ledger.StaleFence):
        live.fail(claimed.id, fence=claimed.fence - 1, reason="late and wrong")
    read = live.get(claimed.id)
    assert read.state == S.OUTCOME_CONFIRMED
    # a long poll of an attempt that moved past the fence the caller saw answers at once
    assert live.get(claimed.id, wait=20, fence=claimed.fence - 1).fence == confirmed.fence
    assert read.events is not None
    assert [e["to_state"] for e in read.events][-1] == S.OUTCOME_CONFIRMED
    assert [a.id for a in live.find("pay:1")] == [claimed.id]
    assert live.needs_attention() == []
    with pytest.raises(ledger.AttemptNotFound):
        live.get(10**9)
    with pytest.raises(ledger.ToolNotAllowed):
        live.record_intent(task_id="t", tool_name="launch", idempotency_key="x", args={})


@pytest.mark.postgres
def test_a_revoked_or_read_only_token_raises_typed_errors(live_server: Any, tenant_a: Tenant) -> None:
    reader = ledger.LedgerClient(live_server.url, issue_token(tenant_a, READ, name="reader"))
    with pytest.raises(ledger.InsufficientScope):
        reader.record_intent(task_id="t", tool_name="send_email", idempotency_key="k", args={})
    token_revoke(token=ApiToken.objects.get(name="reader"), actor=Actor.system("tests"))
    with pytest.raises(ledger.TokenRevoked):
        reader.needs_attention()


@pytest.mark.postgres
def test_concurrent_claims_over_http_have_one_winner(live: ledger.LedgerClient) -> None:
    attempt = live.record_intent(task_id="t", tool_name="send_email", idempotency_key="race", args={}).attempt
    barrier = threading.Barrier(6)
    results: list[str] = []

    def claim() -> None:
        barrier.wait()
        try:
            live.dispatch(attempt.id, fence=attempt.fence)
            results.append("won")
        except (ledger.ClaimLost, ledger.AttemptInFlight) as exc:
            results.append(exc.code)

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results).count("won") == 1, results
    assert len(results) == 6
    stored = Attempt.objects.get(pk=attempt.id)
    assert (stored.state, stored.dispatch_count) == (S.DISPATCHED, 1)

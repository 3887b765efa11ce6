"""The bad-input matrix: every malformed, oversized, unauthorized or
disallowed request answers its documented status and code, with a
``{code, message}`` body, and the ledger is unchanged afterwards."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from ledgerdash.ledger.models import Tenant
from tests.api_support import READ, Api, intent, issue_token
from tests.conftest import ledger_snapshot

KIB = 1024


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    code: str
    path: str = "/attempts"
    method: str = "post"
    body: Any = None
    raw: bytes | str | None = None
    content_type: str = "application/json"
    extra: dict[str, str] = field(default_factory=dict)
    token: str = "write"  # write (both scopes), read, none


def _intent_raw(args_json: str) -> str:
    return '{"task_id": "t", "tool_name": "send_email", "idempotency_key": "k", "args": ' + args_json + "}"


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


OUTCOME = "/attempts/{id}/outcome"
CASES = [
    # --- not JSON at all
    Case("non-json", 400, "malformed_json", raw="hello"),
    Case("truncated-json", 400, "malformed_json", raw='{"task_id": '),
    Case("trailing-garbage", 400, "malformed_json", raw='{"a": 1} x'),
    Case("utf8-bom", 400, "malformed_json", raw=b"\xef\xbb\xbf" + json.dumps(intent()).encode()),
    Case("invalid-utf8", 400, "invalid_utf8", raw=b'{"task_id": "\xff\xfe"}'),
    Case("lone-surrogate", 400, "invalid_unicode", raw=_intent_raw('{"to": "\\ud800"}')),
    Case("lone-surrogate-upper-hex-in-a-key", 400, "invalid_unicode", raw=_intent_raw('{"\\uDFFF": 1}')),
    Case(
        "lone-surrogate-in-the-task", 400, "invalid_unicode", raw=json.dumps(intent()).replace('": "', '": "\\udc00', 1)
    ),
    Case("nan", 400, "malformed_json", raw=_intent_raw('{"amount": NaN}')),
    Case("infinity", 400, "malformed_json", raw=_intent_raw('{"amount": Infinity}')),
    Case("minus-infinity", 400, "malformed_json", raw=_intent_raw('{"amount": -Infinity}')),
    Case("float-overflow", 400, "malformed_json", raw=_intent_raw('{"amount": 1e400}')),
    Case("five-thousand-digit-int", 400, "malformed_json", raw=_intent_raw('{"amount": %s}' % ("9" * 5000))),
    Case("duplicate-keys", 400, "malformed_json", raw=_intent_raw('{"to": "a", "to": "b"}')),
    Case("nested-beyond-parsing", 400, "malformed_json", raw="[" * 100_000 + "]" * 100_000),
    # --- the wrong kind of body
    Case("text-plain", 415, "unsupported_media_type", body=intent(), content_type="text/plain"),
    Case(
        "form-encoded", 415, "unsupported_media_type", raw="task_id=t", content_type="application/x-www-form-urlencoded"
    ),
    Case("no-content-type", 415, "unsupported_media_type", body=intent(), content_type=""),
    Case(
        "latin1-charset", 415, "unsupported_media_type", body=intent(), content_type="application/json; charset=latin-1"
    ),
    # --- sizes
    Case("body-over-limit", 413, "body_too_large", raw='{"x": "%s"}' % ("a" * 600 * KIB)),
    Case("body-over-djangos-own-limit", 413, "body_too_large", raw='{"x": "%s"}' % ("a" * 3 * KIB * KIB)),
    Case("declared-length-over-limit", 413, "body_too_large", body=intent(), extra={"CONTENT_LENGTH": str(10**9)}),
    Case("declared-length-not-a-number", 400, "invalid_content_length", body=intent(), extra={"CONTENT_LENGTH": "abc"}),
    Case(
        "chunked-without-length",
        411,
        "length_required",
        body=intent(),
        extra={"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked"},
    ),
    Case("huge-args", 422, "invalid_args", body=intent(args={"blob": "a" * 100 * KIB})),
    Case("deeply-nested-args", 422, "invalid_args", body=intent(args=_nested(40))),
    Case("oversized-key", 422, "validation_error", body=intent("k" * 256)),
    Case("oversized-task-id", 422, "validation_error", body=intent(task_id="t" * 256)),
    # --- the schema
    Case("empty-body", 422, "validation_error", raw=""),
    Case("json-array", 422, "validation_error", body=[intent()]),
    Case("json-string", 422, "validation_error", body="intent"),
    Case("json-null", 422, "validation_error", raw="null"),
    Case("unknown-field", 422, "unknown_field", body={**intent(), "colour": "blue"}),
    Case("missing-field", 422, "validation_error", body={k: v for k, v in intent().items() if k != "args"}),
    Case("args-not-object", 422, "validation_error", body=intent(args=[1, 2])),
    Case("task-id-not-string", 422, "validation_error", body=intent(task_id=123)),
    Case("empty-task-id", 422, "validation_error", body=intent(task_id="")),
    Case("scope-not-list", 422, "validation_error", body=intent(credential_scope="email:send")),
    Case("query-on-post", 422, "unknown_field", path="/attempts?dry_run=1", body=intent()),
    # --- the ledger's own validation
    Case("key-with-newline", 422, "invalid_idempotency_key", body=intent("k\nk")),
    Case("blank-key", 422, "invalid_idempotency_key", body=intent("   ")),
    Case("nul-in-task-id", 422, "invalid_field", body=intent(task_id="t\x00")),
    Case("nul-in-args", 422, "invalid_args", body=intent(args={"to": "a\x00b"})),
    Case("int-beyond-2-53", 422, "invalid_args", body=intent(args={"amount": 2**60})),
    Case("scope-with-space", 422, "invalid_field", body=intent(credential_scope=["email send"])),
    # --- the policy
    Case("unknown-tool", 403, "tool_not_allowed", body=intent(tool_name="launch_rocket")),
    Case("disallowed-scope", 403, "scope_not_allowed", body=intent(credential_scope=["payments:charge"])),
    # --- tokens and scopes
    Case("no-token", 401, "missing_token", body=intent(), token="none"),
    Case("read-token-writes", 403, "insufficient_scope", body=intent(), token="read"),
    # --- routes and methods
    Case("wrong-method", 405, "method_not_allowed", method="put", body=intent()),
    Case("delete-attempt", 405, "method_not_allowed", method="delete", path="/attempts/{id}"),
    Case("unknown-path", 404, "not_found", path="/nothing-here", body=intent()),
    Case("trailing-slash", 404, "not_found", path="/attempts/", body=intent()),
    Case("non-numeric-id", 422, "validation_error", path="/attempts/abc/dispatch"),
    Case("no-such-attempt", 404, "attempt_not_found", path="/attempts/999999/dispatch"),
    Case("id-beyond-bigint", 422, "validation_error", path="/attempts/99999999999999999999/dispatch"),
    # --- dispatch, request id, outcome
    Case("dispatch-fence-as-string", 422, "validation_error", path="/attempts/{id}/dispatch", body={"fence": "1"}),
    Case("dispatch-unknown-field", 422, "unknown_field", path="/attempts/{id}/dispatch", body={"worker": "w"}),
    Case(
        "request-id-empty",
        422,
        "validation_error",
        path="/attempts/{id}/request-id",
        body={"fence": 1, "provider_request_id": ""},
    ),
    Case(
        "request-id-control",
        422,
        "invalid_field",
        path="/attempts/{id}/request-id",
        body={"fence": 1, "provider_request_id": "r\x07"},
    ),
    Case("outcome-unknown-kind", 422, "validation_error", path=OUTCOME, body={"outcome": "maybe", "fence": 1}),
    Case(
        "outcome-extra-field",
        422,
        "unknown_field",
        path=OUTCOME,
        body={"outcome": "confirmed", "fence": 1, "provider_request_id": "r", "reason": "x"},
    ),
    Case("outcome-no-fence", 422, "validation_error", path=OUTCOME, body={"outcome": "failed", "reason": "x"}),
    Case(
        "outcome-negative-fence",
        422,
        "validation_error",
        path=OUTCOME,
        body={"outcome": "failed", "fence": -1, "reason": "x"},
    ),
    Case(
        "outcome-fence-as-bool",
        422,
        "validation_error",
        path=OUTCOME,
        body={"outcome": "failed", "fence": True, "reason": "x"},
    ),
    Case(
        "outcome-huge-fence",
        422,
        "validation_error",
        path=OUTCOME,
        body={"outcome": "failed", "fence": 2**64, "reason": "x"},
    ),
    Case(
        "outcome-float-fence",
        422,
        "validation_error",
        path=OUTCOME,
        body={"outcome": "failed", "fence": 1.0, "reason": "x"},
    ),
    Case(
        "outcome-empty-reason",
        422,
        "validation_error",
        path=OUTCOME,
        body={"outcome": "failed", "fence": 1, "reason": ""},
    ),
    Case(
        "outcome-long-reason",
        422,
        "validation_error",
        path=OUTCOME,
        body={"outcome": "unknown", "fence": 1, "reason": "r" * 4001},
    ),
    Case(
        "outcome-result-with-nul",
        422,
        "invalid_field",
        path=OUTCOME,
        body={"outcome": "confirmed", "fence": 1, "provider_request_id": "r", "result": {"a": "\x00"}},
    ),
    Case("outcome-no-receipt", 422, "missing_evidence", path=OUTCOME, body={"outcome": "confirmed", "fence": 1}),
    Case(
        "outcome-stale-fence", 409, "stale_fence", path=OUTCOME, body={"outcome": "failed", "fence": 0, "reason": "x"}
    ),
    # --- reads
    Case("list-unknown-param", 422, "unknown_field", method="get", path="/attempts?idempotency_kye=k"),
    Case("list-limit-zero", 422, "validation_error", method="get", path="/attempts?limit=0"),
    Case("list-limit-word", 422, "validation_error", method="get", path="/attempts?limit=many"),
    Case("list-needs-attention-word", 422, "validation_error", method="get", path="/attempts?needs_attention=maybe"),
    Case("list-key-with-nul", 422, "invalid_idempotency_key", method="get", path="/attempts?idempotency_key=a%00b"),
    Case("list-key-empty", 422, "invalid_idempotency_key", method="get", path="/attempts?idempotency_key="),
    Case("get-no-token", 401, "missing_token", method="get", path="/attempts/{id}", token="none"),
    Case("get-unknown-param", 422, "unknown_field", method="get", path="/attempts/{id}?expand=all", token="read"),
]


@pytest.fixture
def setup(tenant_a: Tenant) -> dict[str, Any]:
    """A tenant with a dispatched attempt (fence 1) for the per-attempt endpoints."""
    tokens = {"write": issue_token(tenant_a), "read": issue_token(tenant_a, READ), "none": ""}
    api = Api(tokens["write"])
    attempt = api.record("existing")
    assert api.dispatch(attempt["id"]).json()["fence"] == 1
    return {"tokens": tokens, "attempt_id": attempt["id"]}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_answers_its_documented_status_and_writes_nothing(case: Case, setup: dict[str, Any]) -> None:
    api = Api(setup["tokens"][case.token])
    path = case.path.replace("{id}", str(setup["attempt_id"]))
    snapshot = ledger_snapshot()

    response = api.request(case.method, path, case.body, raw=case.raw, content_type=case.content_type, **case.extra)

    assert response.status_code == case.status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == case.code, body
    assert isinstance(body["message"], str)
    assert body["message"]
    assert ledger_snapshot() == snapshot


def test_the_body_limit_is_a_setting(setup: dict[str, Any], settings: Any) -> None:
    # settings.py keeps Django's own limit at least as high as the API's
    settings.LEDGER_API_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * KIB * KIB
    api = Api(setup["tokens"]["write"])
    snapshot = ledger_snapshot()
    response = api.post("/attempts", raw='{"x": "%s"}' % ("a" * 3 * KIB * KIB))
    assert response.status_code == 422  # read and parsed
    assert response.json()["code"] == "validation_error"
    response = api.post("/attempts", raw='{"x": "%s"}' % ("a" * 5 * KIB * KIB))
    assert response.status_code == 413
    assert ledger_snapshot() == snapshot


def test_djangos_own_limit_answers_413_too(setup: dict[str, Any], settings: Any) -> None:
    settings.LEDGER_API_MAX_BODY_BYTES = 4 * KIB * KIB
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * KIB * KIB
    response = Api(setup["tokens"]["write"]).post("/attempts", raw='{"x": "%s"}' % ("a" * 3 * KIB * KIB))
    assert response.status_code == 413
    assert response.json()["code"] == "body_too_large"


def test_the_matrix_covers_every_documented_client_error_status() -> None:
    statuses = {c.status for c in CASES}
    assert statuses >= {400, 401, 403, 404, 405, 409, 411, 413, 415, 422}

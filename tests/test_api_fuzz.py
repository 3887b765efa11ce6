"""Fuzzing the ingest API from its own OpenAPI document (schemathesis), and
its body parser with arbitrary bytes (Hypothesis), in bounded time.

Schema-valid requests and schema-violating ones, with a valid token, against
the app in this process: no answer is a 5xx, every answer's status and body
are the ones the document declares, and schema-violating requests are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from ledgerdash.ledger.api import attempts as attempt_endpoints
from ledgerdash.ledger.models import Tenant
from tests.api_support import BASE, Api, issue_token

pytestmark = pytest.mark.slow  # hypothesis: hundreds of requests

OPERATIONS = [
    ("POST", f"{BASE}/attempts"),
    ("GET", f"{BASE}/attempts"),
    ("GET", f"{BASE}/attempts/{{attempt_id}}"),
    ("POST", f"{BASE}/attempts/{{attempt_id}}/dispatch"),
    ("POST", f"{BASE}/attempts/{{attempt_id}}/request-id"),
    ("POST", f"{BASE}/attempts/{{attempt_id}}/outcome"),
]
#: Bounded by count, not by the clock, so a busy machine runs the same cases
#: (derandomized: the same ones every run) and the module stays well inside a minute.
EXAMPLES = 30
CONFORMANCE = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def token(tenant_a: Tenant) -> str:
    raw = issue_token(tenant_a)
    api = Api(raw)
    # A few real attempts so that ids 1..n sometimes exist.
    for i in range(3):
        attempt = api.record(f"seed-{i}")
        if i:
            api.dispatch(attempt["id"])
    return raw


@pytest.fixture
def app(token: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real WSGI app, run in this thread inside the test's transaction:
    as Django's test client does, requests must not close the connection.
    (After ``token``, whose test-client requests reconnect the signals.)"""
    # A long poll of an attempt nothing moves waits on a clock of its own:
    # each nap moves it on at once, so a generated `wait` costs no real time.
    now = [0.0]
    monkeypatch.setattr(attempt_endpoints, "_monotonic", lambda: now[0])
    monkeypatch.setattr(attempt_endpoints, "_sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_the_api_conforms_to_its_document(app: Any, token: str, method: str, path: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_wsgi(f"{BASE}/openapi.json", app)
    operation = schema[path][method]
    checks = CONFORMANCE + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
    headers = {"Authorization": f"Bearer {token}"}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(headers=headers)
        calls.append(response.status_code)
        case.validate_response(response, checks=checks)

    calls: list[int] = []
    run()
    assert len(calls) >= 10, "the fuzzer hardly ran"


@pytest.fixture
def fuzz_api(tenant_a: Tenant) -> Api:
    return Api(issue_token(tenant_a))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=20,
        ).map(lambda v: json.dumps(v, allow_nan=True).encode()),
        st.fixed_dictionaries(
            {
                "task_id": st.text(max_size=10),
                "tool_name": st.sampled_from(["send_email", "charge_card", "nope", ""]),
                "idempotency_key": st.text(max_size=10),
                "args": st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(), max_size=3),
            }
        ).map(lambda v: json.dumps(v).encode()),
    ),
    endpoint=st.sampled_from(["/attempts", "/attempts/1/dispatch", "/attempts/1/outcome", "/attempts/1/request-id"]),
)
def test_no_body_makes_the_api_fail(fuzz_api: Api, body: bytes, endpoint: str) -> None:
    # The fixtures are made once for all examples: the ledger fills up as it would.
    response = fuzz_api.post(endpoint, raw=body)
    assert response.status_code < 500, response.content[:300]
    payload = response.json()
    assert {"code", "message"} <= set(payload) or "id" in payload

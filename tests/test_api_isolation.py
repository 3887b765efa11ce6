"""Tenant isolation: a token acts only inside its tenant. Tenant A's token,
pointed at tenant B's attempts and keys through every endpoint, sees nothing
of them and changes nothing of B's."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from tests.api_support import Api, intent, issue_token

S = State


def _tenant_snapshot(tenant: Tenant) -> tuple[Any, ...]:
    return (
        list(Attempt.objects.filter(tenant=tenant).order_by("id").values_list("id", "state", "fence", "owner_id")),
        list(AttemptEvent.objects.filter(tenant=tenant).order_by("seq").values_list("seq", "hash")),
    )


@pytest.fixture
def b_world(tenant_b: Tenant) -> dict[str, Any]:
    """Tenant B's attempts in several states, recorded through B's own token."""
    api = Api(issue_token(tenant_b))
    fresh = api.record("globex:secret:fresh", args={"to": "cfo@globex.example"})
    dispatched = api.record("globex:secret:dispatched")
    dispatched = api.dispatch(dispatched["id"]).json()
    unknown = api.record("globex:secret:unknown")
    unknown = api.dispatch(unknown["id"]).json()
    api.outcome(unknown["id"], "unknown", unknown["fence"], reason="timeout")
    return {"fresh": fresh, "dispatched": dispatched, "unknown": unknown}


@pytest.fixture
def api_a(tenant_a: Tenant) -> Api:
    return Api(issue_token(tenant_a))


def _per_attempt_calls(target: dict[str, Any]) -> list[tuple[str, str, Any]]:
    i, fence = target["id"], target["fence"]
    return [
        ("get", f"/attempts/{i}", None),
        ("post", f"/attempts/{i}/dispatch", None),
        ("post", f"/attempts/{i}/dispatch", {"fence": fence}),
        ("post", f"/attempts/{i}/request-id", {"fence": fence, "provider_request_id": "req-evil"}),
        ("post", f"/attempts/{i}/outcome", {"outcome": "confirmed", "fence": fence, "provider_request_id": "r"}),
        ("post", f"/attempts/{i}/outcome", {"outcome": "failed", "fence": fence, "reason": "x"}),
        ("post", f"/attempts/{i}/outcome", {"outcome": "failed_retryable", "fence": fence, "reason": "x"}),
        ("post", f"/attempts/{i}/outcome", {"outcome": "unknown", "fence": fence, "reason": "x"}),
    ]


@pytest.mark.parametrize("which", ["fresh", "dispatched", "unknown"])
def test_another_tenants_attempt_is_404_on_every_endpoint_and_unchanged(
    api_a: Api, b_world: dict[str, Any], tenant_b: Tenant, which: str
) -> None:
    before = _tenant_snapshot(tenant_b)
    target = b_world[which]
    for method, path, body in _per_attempt_calls(target):
        response = api_a.get(path) if method == "get" else api_a.post(path, body)
        assert response.status_code == 404, (path, response.content)
        assert response.json() == {"code": "attempt_not_found", "message": f"no attempt {target['id']}"}
        assert b"globex" not in response.content
    assert _tenant_snapshot(tenant_b) == before


def test_another_tenants_attempt_looks_exactly_like_no_attempt(api_a: Api, b_world: dict[str, Any]) -> None:
    theirs = api_a.get(f"/attempts/{b_world['fresh']['id']}")
    missing = api_a.get("/attempts/987654321")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["code"] == missing.json()["code"]
    assert set(theirs.headers) == set(missing.headers)


def test_lists_and_key_lookups_show_only_the_tokens_tenant(
    api_a: Api, b_world: dict[str, Any], tenant_b: Tenant
) -> None:
    before = _tenant_snapshot(tenant_b)
    mine = api_a.record("acme:mine")
    for params in (
        {},
        {"needs_attention": "true"},
        {"idempotency_key": "globex:secret:fresh"},
        {"idempotency_key": "globex:secret:unknown", "needs_attention": "true"},
        {"before": str(b_world["unknown"]["id"] + 1)},
    ):
        response = api_a.get("/attempts", params)
        assert response.status_code == 200
        ids = [a["id"] for a in response.json()["items"]]
        assert ids in ([], [mine["id"]]), (params, ids)
        assert b"globex" not in response.content
    assert _tenant_snapshot(tenant_b) == before


def test_recording_another_tenants_key_records_in_ones_own_tenant(
    api_a: Api, b_world: dict[str, Any], tenant_a: Tenant, tenant_b: Tenant
) -> None:
    before = _tenant_snapshot(tenant_b)
    same = api_a.post("/attempts", intent("globex:secret:fresh", args={"to": "cfo@globex.example"}))
    other = api_a.post("/attempts", intent("globex:secret:dispatched", args={"anything": True}))
    assert same.status_code == 201  # a new attempt of A's, not B's replayed
    assert other.status_code == 201  # no conflict with B's key: keys are per tenant
    assert Attempt.objects.get(pk=same.json()["id"]).tenant == tenant_a
    assert same.json()["id"] != b_world["fresh"]["id"]
    assert _tenant_snapshot(tenant_b) == before


def test_tokens_work_both_ways(b_world: dict[str, Any], tenant_a: Tenant, tenant_b: Tenant) -> None:
    api_b = Api(issue_token(tenant_b))
    a_attempt = Api(issue_token(tenant_a)).record("acme:1")
    assert api_b.get(f"/attempts/{a_attempt['id']}").status_code == 404
    assert api_b.get(f"/attempts/{b_world['fresh']['id']}").status_code == 200

"""What the MCP gateway answers a resent call whose attempt is already
confirmed: the tool's recorded answer, or, when recovery confirmed it by
asking the provider (the gateway died before it recorded the upstream's
answer), what the provider said, marked as such. Never a second call."""

from __future__ import annotations

import pytest

from ledgerdash.ledger import moves, recording
from ledgerdash.ledger.models import ResultSource, State, Tenant
from tests.conftest import AGENT, RECONCILER, record

pytest.importorskip("mcp")
from ledgerdash.ledger.gateway.config import GatewayConfig
from ledgerdash.ledger.gateway.keys import META_ATTEMPT, META_ERROR, META_RECOVERED, META_REPLAYED
from ledgerdash.ledger.gateway.server import Gateway


def _gateway(tenant: Tenant) -> Gateway:
    return Gateway(GatewayConfig(tenant=tenant.slug, task_id="t", upstreams=(), tools={}))


def test_a_call_recovery_confirmed_by_lookup_replays_what_the_provider_said(tenant_a: Tenant) -> None:
    attempt = recording.mark_dispatched(record(tenant_a, "invoice:9:send"), actor=AGENT)
    found = {"id": "msg_9", "payload_hash": "ab" * 32}
    confirmed = moves.attempt_confirm(
        attempt=attempt,
        fence=attempt.fence,
        actor=RECONCILER,
        provider_request_id="msg_9",
        result=found,
        result_source=ResultSource.LOOKUP,
        reason="provider has it and its payload hash matches",
    )
    assert confirmed.state == State.OUTCOME_CONFIRMED
    replay = _gateway(tenant_a)._replay(confirmed)
    assert replay.is_error is False
    assert replay.structured_content == found
    assert replay.meta is not None
    assert (replay.meta[META_REPLAYED], replay.meta[META_RECOVERED], replay.meta[META_ATTEMPT]) == (
        True,
        True,
        confirmed.pk,
    )


def test_a_confirmed_call_with_nothing_to_replay_says_so(tenant_a: Tenant) -> None:
    attempt = recording.mark_dispatched(record(tenant_a, "invoice:10:send"), actor=AGENT)
    confirmed = recording.confirm(attempt, provider_request_id="msg_10", actor=AGENT)
    replay = _gateway(tenant_a)._replay(confirmed)
    assert replay.is_error is True
    assert replay.meta is not None
    assert replay.meta[META_ERROR]["code"] == "result_unavailable"

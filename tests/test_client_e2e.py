"""End to end: an agent in a separate process talks to a live server through
the client, is killed at each crash point, is started again, and the side
effect happens exactly once (counted in a file, as a provider would).

The lead's variant against the sandbox provider replaces the effects file
with the sandbox's own count; the agent process and the crash points are the
same. (PostgreSQL only: a live server needs transactional tests.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ledgerdash.ledger import crashpoints, transitions
from ledgerdash.ledger.models import Attempt, State, Tenant
from tests.api_support import issue_token
from tests.conftest import RECONCILER
from tests.live import PYTHON, ROOT

pytestmark = pytest.mark.postgres
S = State


class Agent:
    def __init__(self, url: str, token: str, effects: Path) -> None:
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LEDGERDASH_"))},
            "LEDGERDASH_URL": url,
            "LEDGERDASH_TOKEN": token,
            "LEDGERDASH_AGENT": "e2e-agent",
            "E2E_EFFECTS": str(effects),
            "PYTHONPATH": str(ROOT),
        }
        self.effects = effects

    def run(self, crash_at: str | None = None) -> dict[str, Any] | None:
        """Run the agent once; None when it died at the crash point (SIGKILL)."""
        env = dict(self.env)
        if crash_at:
            env.update({crashpoints.ENV: crash_at, "LEDGERDASH_CRASH_WAIT": "0"})
        proc = subprocess.run(
            [PYTHON, "-m", "tests.e2e_agent"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        if crash_at:
            assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)
            assert f"{crashpoints.ANNOUNCE} {crash_at}" in proc.stdout
            return None
        assert proc.returncode == 0, proc.stderr
        outcome: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert outcome.pop("django_imported") is False  # the client needs no Django
        return outcome

    def effect_count(self) -> int:
        return len(self.effects.read_text().splitlines()) if self.effects.exists() else 0


@pytest.fixture
def agent(live_server: Any, tenant_a: Tenant, tmp_path: Path) -> Agent:
    return Agent(live_server.url, issue_token(tenant_a), tmp_path / "effects.jsonl")


def _the_attempt() -> Attempt:
    return Attempt.objects.get(idempotency_key="invoice:INV-7:send")


def test_a_clean_run_and_a_rerun_send_once(agent: Agent) -> None:
    assert agent.run() == {"result": {"message_id": "msg-INV-7"}}
    assert agent.run() == {"result": {"message_id": "msg-INV-7"}}  # replayed from the ledger
    assert agent.effect_count() == 1
    assert _the_attempt().state == S.OUTCOME_CONFIRMED


def test_killed_after_the_intent_the_restart_sends_once(agent: Agent) -> None:
    agent.run(crash_at=crashpoints.AFTER_INTENT)
    assert agent.effect_count() == 0
    assert _the_attempt().state == S.INTENT_RECORDED
    assert agent.run() == {"result": {"message_id": "msg-INV-7"}}
    assert agent.effect_count() == 1
    assert _the_attempt().state == S.OUTCOME_CONFIRMED


@pytest.mark.parametrize("point", [crashpoints.AFTER_SEND, crashpoints.AFTER_RESPONSE])
def test_killed_after_dispatch_the_restart_never_repeats_the_effect(agent: Agent, point: str) -> None:
    agent.run(crash_at=point)
    assert agent.effect_count() == 1
    attempt = _the_attempt()
    assert attempt.state == S.DISPATCHED
    assert attempt.provider_request_id == ("msg-INV-7" if point == crashpoints.AFTER_RESPONSE else "")

    # Restarted while the dispatch lease runs: someone holds it; the tool is not called.
    assert agent.run() == {"raised": "AttemptInFlight", "code": "attempt_in_flight"}
    # The lease expires with no outcome: UNKNOWN. A restart is told so; still not called.
    transitions.attempt_expire_lease(attempt=attempt, actor=RECONCILER, fence=attempt.fence)
    assert agent.run() == {"raised": "OutcomeUnknown", "code": "outcome_unknown"}
    assert agent.effect_count() == 1

    # The reconciler finds the message at the provider and confirms it; a
    # restart now replays the stored outcome.
    attempt.refresh_from_db()
    transitions.attempt_confirm(
        attempt=attempt,
        fence=attempt.fence,
        actor=RECONCILER,
        provider_request_id="msg-INV-7",
        result={"message_id": "msg-INV-7"},
    )
    assert agent.run() == {"result": {"message_id": "msg-INV-7"}}
    assert agent.effect_count() == 1

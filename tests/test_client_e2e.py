"""End to end: an agent in a separate process talks to a live server through
the HTTP client and to the sandbox provider, is killed at each crash point,
is started again, and recovery (the real reconciler, looking the effect up
at the sandbox) settles it: the sandbox performed the effect exactly once.

PostgreSQL only: a live server needs transactional tests.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledgerdash.ledger.models import Attempt, State, Tenant
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash_client import crashpoints
from tests.api_support import issue_token
from tests.live import PYTHON, ROOT
from tests.sandboxes import Sandbox, unique_key

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
S = State


class Agent:
    def __init__(self, url: str, token: str, sandbox: Sandbox) -> None:
        invoice = unique_key("INV")
        self.key = f"invoice:{invoice}:send"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LEDGERDASH_"))},
            "LEDGERDASH_URL": url,
            "LEDGERDASH_TOKEN": token,
            "LEDGERDASH_AGENT": "e2e-agent",
            "SANDBOX_URL": sandbox.url,
            "E2E_INVOICE": invoice,
            "PYTHONPATH": str(ROOT),
        }

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


@pytest.fixture
def agent(live_server: Any, tenant_a: Tenant, sandbox_tools: Sandbox) -> Agent:
    sandbox_tools.clear()
    return Agent(live_server.url, issue_token(tenant_a), sandbox_tools)


def _the_attempt(agent: Agent) -> Attempt:
    return Attempt.objects.get(idempotency_key=agent.key)


def _recover(agent: Agent) -> None:
    """Let the dispatch lease run out, then run the real reconciler twice."""
    Attempt.objects.filter(idempotency_key=agent.key).update(next_check_at=timezone.now() - timedelta(seconds=1))
    Reconciler(label="e2e-reconciler").run_pass()
    assert Reconciler(label="e2e-reconciler").run_pass().claimed == 0


def test_a_clean_run_and_a_rerun_send_once(agent: Agent, sandbox_tools: Sandbox) -> None:
    first = agent.run()
    assert first is not None
    assert agent.run() == first  # replayed from the ledger
    assert sandbox_tools.count(agent.key) == 1
    assert _the_attempt(agent).state == S.OUTCOME_CONFIRMED


def test_killed_after_the_intent_the_restart_sends_once(agent: Agent, sandbox_tools: Sandbox) -> None:
    agent.run(crash_at=crashpoints.AFTER_INTENT)
    assert sandbox_tools.count(agent.key) == 0
    assert _the_attempt(agent).state == S.INTENT_RECORDED
    assert agent.run() is not None
    assert sandbox_tools.count(agent.key) == 1
    assert _the_attempt(agent).state == S.OUTCOME_CONFIRMED


@pytest.mark.parametrize("point", [crashpoints.AFTER_SEND, crashpoints.AFTER_RESPONSE])
def test_killed_after_dispatch_the_restart_never_repeats_the_effect(
    agent: Agent, sandbox_tools: Sandbox, point: str
) -> None:
    agent.run(crash_at=point)
    assert sandbox_tools.count_once_landed(agent.key) == 1
    attempt = _the_attempt(agent)
    assert attempt.state == S.DISPATCHED
    assert bool(attempt.provider_request_id) is (point == crashpoints.AFTER_RESPONSE)

    # Restarted while the dispatch lease runs: someone holds it; the tool is not called.
    assert agent.run() == {"raised": "AttemptInFlight", "code": "attempt_in_flight"}
    assert sandbox_tools.count(agent.key) == 1

    # Recovery looks the effect up at the provider and confirms it.
    _recover(agent)
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.provider_request_id.startswith("eff_")

    # The restarted agent is told it happened; it does not send again.
    outcome = agent.run()
    assert outcome is not None
    assert "raised" not in outcome
    assert sandbox_tools.count(agent.key) == 1

"""The reconcile command as operators run it: real processes, PostgreSQL, the sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledgerdash.ledger import recording
from ledgerdash.ledger.drill.runner import database_url
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from tests.conftest import AGENT, ledger_snapshot, record
from tests.live import PYTHON, ROOT
from tests.sandboxes import Sandbox, unique_key

S = State


def test_once_prints_a_summary_line(tenant_a: Tenant, sandbox_tools: Sandbox, capsys: Any) -> None:
    attempt = recording.mark_dispatched(record(tenant_a, unique_key()), actor=AGENT)
    recording.mark_unknown(attempt, reason="timeout", actor=AGENT)
    Attempt.objects.filter(pk=attempt.pk).update(lands_by=timezone.now())  # it can no longer land
    call_command("reconcile", "--once", "--label", "cmd-test")
    out = capsys.readouterr().out
    assert out.startswith("reconcile pass: claimed=1 ")
    assert "resent=1" in out
    assert "errors=0" in out


def _command(*args: str) -> list[str]:
    return [PYTHON, "manage.py", "reconcile", *args]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DATABASE_URL": database_url(), "DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path)})
    return env


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_reconcilers_over_a_thousand_attempts_decide_each_once(
    tenant_a: Tenant, sandbox_tools: Sandbox, tmp_path: Path
) -> None:
    sandbox = sandbox_tools
    prefix = unique_key("bulk")
    attempts = []
    for n in range(1000):
        attempt = recording.mark_dispatched(
            record(tenant_a, f"{prefix}-{n}", args={"n": n}), actor=Actor.agent(f"agent-{n % 8}")
        )
        if n % 2 == 0:  # the provider got half of them before the agent lost its answer
            assert sandbox.perform("send_email", attempt.provider_key, {"n": n})[0] == 201
        attempts.append(recording.mark_unknown(attempt, reason="agent crashed", actor=Actor.agent(f"agent-{n % 8}")))
    ids = [a.pk for a in attempts]
    # The agents gave up long ago: their requests can no longer land.
    Attempt.objects.filter(pk__in=ids).update(lands_by=timezone.now())
    workers = [
        subprocess.Popen(
            _command("--once", "--batch-size", "20", "--label", f"worker-{w}"),
            cwd=ROOT,
            env=_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for w in (1, 2)
    ]
    outputs = [w.communicate(timeout=300)[0].decode() for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert Counter(Attempt.objects.filter(pk__in=ids).values_list("state", flat=True)) == {S.OUTCOME_CONFIRMED: 1000}
    deciders: dict[int, set[str]] = defaultdict(set)
    confirmations: Counter[int] = Counter()
    for attempt_id, label, to_state in AttemptEvent.objects.filter(
        attempt_id__in=ids, actor_kind="reconciler"
    ).values_list("attempt_id", "actor_label", "to_state"):
        deciders[attempt_id].add(label)
        if to_state == S.OUTCOME_CONFIRMED:
            confirmations[attempt_id] += 1
    assert all(len(labels) == 1 for labels in deciders.values()), "an attempt was decided by both workers"
    assert set(confirmations.values()) == {1}
    assert len(confirmations) == 1000
    counts = {
        key: sandbox.count(key) for key in Attempt.objects.filter(pk__in=ids).values_list("provider_key", flat=True)
    }
    assert set(counts.values()) == {1}, "some key was performed more than once, or never"
    worked = Counter(label for labels in deciders.values() for label in labels)
    assert sum(worked.values()) == 1000
    # A second pass over the same data writes nothing.
    snapshot = ledger_snapshot()
    again = subprocess.run(
        _command("--once"), cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "claimed=0" in again.stdout
    assert ledger_snapshot() == snapshot


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_loop_stops_cleanly_on_sigterm(tenant_a: Tenant, sandbox_tools: Sandbox, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _command("--interval", "0.2", "--label", "looper"),
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        attempt = recording.mark_dispatched(record(tenant_a, unique_key()), actor=AGENT)
        recording.mark_unknown(attempt, reason="timeout", actor=AGENT)
        Attempt.objects.filter(pk=attempt.pk).update(lands_by=timezone.now())  # it can no longer land
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            attempt.refresh_from_db()
            if attempt.state == S.OUTCOME_CONFIRMED:
                break
            time.sleep(0.2)
        assert attempt.state == S.OUTCOME_CONFIRMED
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "SIGTERM received" in out
    assert "stopped" in out


def test_once_exits_1_when_a_pass_hit_errors(
    tenant_a: Tenant, sandbox_tools: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from ledgerdash.ledger.reconciler import Reconciler

    def broken(self: Reconciler, attempt: Attempt, tool: Any) -> str:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(Reconciler, "reconcile_one", broken)
    attempt = recording.mark_dispatched(record(tenant_a, unique_key()), actor=AGENT)
    recording.mark_unknown(attempt, reason="timeout", actor=AGENT)
    with pytest.raises(SystemExit) as exited:
        call_command("reconcile", "--once")
    assert exited.value.code == 1
    assert "errors=1" in capsys.readouterr().out

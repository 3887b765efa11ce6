"""The crash drill as a deployment gate: it passes on both databases, it can
fail (a blind-retry reconciler makes it name the duplicate), and its random
mode reproduces from its seed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from ledgerdash.ledger import crashpoints
from ledgerdash.ledger.drill.runner import CASES, Drill, Planned, fixed_plan, random_plan
from ledgerdash.ledger.models import Attempt, AttemptEvent, DrillRun
from ledgerdash.ledger.providers.registry import ToolProfile
from ledgerdash.ledger.reconciler import Reconciler
from tests.live import PYTHON, ROOT


def test_the_fixed_plan_is_six_cases_for_both_kinds_of_tool() -> None:
    plan = fixed_plan()
    assert [(p.letter, p.idempotent) for p in plan] == [(c, i) for c in "ABCDEF" for i in (True, False)]
    assert {p.letter: p.crash_at for p in plan} == {c.letter: c.crash_at for c in CASES.values()}


def test_the_random_plan_reproduces_from_its_seed() -> None:
    assert random_plan(50, seed=7) == random_plan(50, seed=7)
    assert random_plan(50, seed=7) != random_plan(50, seed=8)
    plan = random_plan(300, seed=1)
    assert {p.letter for p in plan} == set("ABCDEF")
    assert {p.idempotent for p in plan} == {True, False}
    assert {p.crash_at for p in plan if p.letter == "F"} == {crashpoints.BEFORE_SEND, crashpoints.AFTER_SEND}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the SQLite run")
def test_the_drill_passes_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path), "DATABASE_URL": ""})
    subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    result = subprocess.run(
        [PYTHON, "manage.py", "crashdrill", "--json-out", str(tmp_path / "drill.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 of 12 cases held every assertion" in result.stdout
    report = json.loads((tmp_path / "drill.json").read_text())
    assert report["ok"] is True
    assert report["database"] == "sqlite"
    assert len(report["cases"]) == 12
    for case in report["cases"]:
        assert case["at_provider"]
        assert case["in_ledger"]
        assert {a["name"] for a in case["assertions"]} >= {
            "no_duplicate_effect",
            "every_attempt_settled",
            "operator_sees_hash_and_request_id",
            "no_retry_widened_credentials_or_crossed_tenants",
            "unknown_work_is_queued_and_owned",
            "second_pass_changed_nothing",
        }


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_drill_passes_on_postgres_and_stores_its_report(tmp_path: Path, capsys: Any) -> None:
    call_command("crashdrill", "--workdir", str(tmp_path), "--json-out", str(tmp_path / "drill.json"))
    out = capsys.readouterr().out
    assert "12 of 12 cases held every assertion" in out
    run = DrillRun.objects.get()
    assert run.ok is True
    assert run.database == "postgresql"
    assert (run.cases_total, run.cases_failed) == (12, 0)
    assert json.loads((tmp_path / "drill.json").read_text())["run"] == run.pk
    assert AttemptEvent.objects.filter(kind="drill", details__drill_run=run.pk).count() == 1


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.django_db(transaction=True)
def test_two_hundred_random_cases_pass_on_postgres(tmp_path: Path, capsys: Any) -> None:
    call_command("crashdrill", "--iterations", "200", "--seed", "20261130", "--workdir", str(tmp_path))
    out = capsys.readouterr().out
    assert "seed 20261130" in out
    assert "200 of 200 cases held every assertion" in out


class BlindRetry(Reconciler):
    """A broken recovery: it "just retries" whatever it does not know."""

    def _unknown(self, attempt: Attempt, tool: ToolProfile | None) -> str:
        assert tool is not None
        return self._dispatch(attempt, tool, "blind retry: sending it again without asking the provider")


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_blind_retry_makes_the_drill_fail_and_name_the_duplicate(tmp_path: Path) -> None:
    plan = [Planned("B", idempotent=False, crash_at=crashpoints.AFTER_SEND)]
    with Drill(workdir=tmp_path, reconciler_factory=lambda label: BlindRetry(label=label)) as drill:
        run = drill.run(plan, mode="fixed", seed=None)
    assert run.ok is False
    (case,) = run.report["cases"]
    failed = {c["name"]: c["evidence"] for c in case["assertions"] if not c["held"]}
    assert "no_duplicate_effect" in failed
    assert f"duplicate effect: key {case['key']} was performed 2 times at the provider" in failed["no_duplicate_effect"]
    assert "performed 2 times" in case["at_provider"]

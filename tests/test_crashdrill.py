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

from ledgerdash.ledger.drill.cases import CLAIMED_TOOL
from ledgerdash.ledger.drill.runner import CASES, Drill, Planned, fixed_plan, random_plan
from ledgerdash.ledger.models import Attempt, AttemptEvent, DrillRun
from ledgerdash.ledger.providers.registry import ToolProfile
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash_client import crashpoints
from tests.live import PYTHON, manage

#: Under `--dist loadgroup` (make test) the drills run one after another on
#: one worker: each starts agents, a provider and reconcilers of its own, and
#: one of them takes both cores with busy loops on purpose. The rest of the
#: suite, slow tests included, spreads over the workers beside them.
pytestmark = pytest.mark.xdist_group("drill")


def test_the_fixed_plan_is_every_case_for_both_kinds_of_tool_and_the_crash_points_over_http() -> None:
    plan = fixed_plan()
    in_process = [(p.letter, p.idempotent) for p in plan if p.via == "process" and not p.claimed]
    assert in_process == [(c, i) for c in "ABCDEFGHIJKL" for i in (True, False)]
    over_http = [(p.letter, p.idempotent) for p in plan if p.via == "http" and not p.claimed]
    assert over_http == [(c, i) for c in "ABCD" for i in (True, False)]
    through_the_gateway = [(p.letter, p.idempotent) for p in plan if p.via == "mcp"]
    assert through_the_gateway == [(c, i) for c in "AC" for i in (True, False)]
    # A tool that claims its dispatch with the intent: the crashes around the send, in process and over HTTP.
    claimed = [(p.letter, p.via, p.tool) for p in plan if p.claimed]
    assert claimed == [(c, via, CLAIMED_TOOL) for via in ("process", "http") for c in "ABC"]
    assert all(p.idempotent for p in plan if p.claimed)
    assert {p.letter: p.crash_at for p in plan} == {c.letter: c.crash_at for c in CASES.values()}
    assert len({p.label for p in plan}) == len(plan) == 42


def test_only_an_idempotent_tool_outside_the_gateway_is_planned_as_claiming_with_the_intent() -> None:
    for letter, idempotent, via in (("A", False, "process"), ("A", True, "mcp"), ("D", True, "process")):
        with pytest.raises(ValueError, match="claims with the intent"):
            Planned(letter, idempotent, crashpoints.AFTER_INTENT, via, claimed=True)


def test_the_random_plan_reproduces_from_its_seed_and_mixes_every_case_in() -> None:
    assert random_plan(50, seed=7) == random_plan(50, seed=7)
    assert random_plan(50, seed=7) != random_plan(50, seed=8)
    plan = random_plan(300, seed=1)
    assert {p.letter for p in plan} == set("ABCDEFGHIJKL")
    assert {p.idempotent for p in plan} == {True, False}
    assert {p.via for p in plan} == {"process", "http", "mcp"}
    assert {p.letter for p in plan if p.via == "http"} == set("ABCD")
    assert {p.letter for p in plan if p.via == "mcp"} == set("AC")
    assert {(p.letter, p.via) for p in plan if p.claimed} == {(c, v) for c in "ABC" for v in ("process", "http")}
    assert {p.crash_at for p in plan if p.letter == "F"} == {crashpoints.BEFORE_SEND, crashpoints.AFTER_SEND}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the SQLite run")
def test_the_drill_passes_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path), "DATABASE_URL": ""})
    result = manage(env, "crashdrill", "--json-out", str(tmp_path / "drill.json"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "42 of 42 cases held every assertion" in result.stdout
    report = json.loads((tmp_path / "drill.json").read_text())
    assert report["ok"] is True
    assert report["database"] == "sqlite"
    assert len(report["cases"]) == 42
    assert report["keys"]["prefix"].startswith(f"drill:{report['run']}-")
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
            "every_effect_known_to_the_ledger",
        }
        assert all(key.startswith(report["keys"]["prefix"]) for key in case["keys"])


@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the SQLite run")
def test_a_drill_in_a_fresh_database_is_not_fooled_by_an_earlier_runs_effects(tmp_path: Path) -> None:
    """Two fresh databases, one var directory: both runs are #1, but no key
    of the second can meet an effect of the first at the provider."""
    plan = ["--iterations", "6", "--seed", "11"]
    prefixes = []
    for name in ("first", "second"):
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(
            {"DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path}/{name}.db"}
        )
        out = tmp_path / f"{name}.json"
        result = manage(env, "crashdrill", *plan, "--json-out", str(out), timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(out.read_text())
        assert report["run"] == 1
        prefixes.append(report["keys"]["prefix"])
    assert prefixes[0] != prefixes[1]


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_drill_passes_on_postgres_and_stores_its_report(tmp_path: Path, capsys: Any) -> None:
    call_command("crashdrill", "--workdir", str(tmp_path), "--json-out", str(tmp_path / "drill.json"))
    out = capsys.readouterr().out
    assert "42 of 42 cases held every assertion" in out
    run = DrillRun.objects.get()
    assert run.ok is True
    assert run.database == "postgresql"
    assert (run.cases_total, run.cases_failed) == (42, 0)
    assert json.loads((tmp_path / "drill.json").read_text())["run"] == run.pk
    assert AttemptEvent.objects.filter(kind="drill", details__drill_run=run.pk).count() == 1


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.django_db(transaction=True)
def test_random_cases_pass_on_postgres(tmp_path: Path, capsys: Any) -> None:
    call_command("crashdrill", "--iterations", "40", "--seed", "20261130", "--workdir", str(tmp_path))
    out = capsys.readouterr().out
    assert "seed 20261130" in out
    assert "40 of 40 cases held every assertion" in out


@pytest.mark.postgres
# Its busy loops take both cores: the other worker's tests share a loaded
# machine for a minute, which their verdicts, like this drill's, must bear.
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_drill_gives_the_same_verdict_on_a_loaded_machine(tmp_path: Path) -> None:
    """The cases that wait on leases, back-offs and processes, run while two
    busy loops take both cores: time is the ledger's clock, decided once
    per recovery round, so a slow machine changes how long it takes, not
    what it finds."""
    plan = [p for p in fixed_plan() if p.letter in "BFHKL" and p.via == "process"]
    hogs = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(2)]
    try:
        with Drill(workdir=tmp_path) as drill:
            run = drill.run(plan, mode="fixed", seed=None)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    failed = {
        c["id"]: [a["name"] for a in c["assertions"] if not a["held"]] for c in run.report["cases"] if not c["ok"]
    }
    assert run.ok, failed


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


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the SQLite run")
def test_the_drill_runs_under_production_settings(tmp_path: Path) -> None:
    """DEBUG off, HTTPS redirect on, only the public host allowed: the drill's own web server (plain
    HTTP on loopback, as behind the TLS proxy) still serves its HTTP agents."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        {
            "DEBUG": "false",
            "SECRET_KEY": "drill-production-" + "p" * 40,
            "ALLOWED_HOSTS": "ledger.example.com",
            "SECURE_SSL_REDIRECT": "true",
            "LEDGERDASH_VAR_DIR": str(tmp_path),
            "DATABASE_URL": f"sqlite:///{tmp_path}/drill.db",
        }
    )
    out = tmp_path / "drill.json"
    result = manage(env, "crashdrill", "--iterations", "8", "--seed", "5", "--json-out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert any(case.get("via") == "http" for case in report["cases"]), [c.get("via") for c in report["cases"]]

"""The failover drill (ledgerdash.ha): its verdict, and a whole run.

The run starts a cluster of its own (etcd and two PostgreSQL servers under
Patroni, from Debian's packages, which scripts/ha-packages.sh installs as
the browser is), never the suite's server; it is marked ``postgres`` so it
runs in the PostgreSQL pass, beside the SQLite pass's longest tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from ledgerdash.ha import agent as ha_agent
from ledgerdash.ha.agent import Agent
from ledgerdash.ha.cluster import missing_programs, process_tree
from ledgerdash.ha.drill import FailoverDrill, Fault, judge
from ledgerdash.settings import database_config
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parent.parent


def _call(key: str, **fields: object) -> dict[str, object]:
    return {"key": key, "tool": "ha.charge_card", "acked": True, **fields}


def test_a_clean_history_is_judged_clean() -> None:
    calls = [_call("a"), _call("b"), _call("c", acked=False, refused=None)]
    attempts = [("a", "OUTCOME_CONFIRMED", 1), ("b", "OUTCOME_CONFIRMED", 2), ("c", "FAILED", 3)]
    assert judge(calls, attempts, {"a": 1, "b": 1}) == ([], [], [])


def test_an_acknowledged_call_the_ledger_no_longer_confirms_is_lost() -> None:
    lost, _, stuck = judge([_call("a")], [("a", "DISPATCHED", 1)], {"a": 1})
    assert lost == ["a: acknowledged; the ledger says DISPATCHED, the provider performed it 1x"]
    assert stuck == ["attempt 1 (a): DISPATCHED"]


def test_an_acknowledged_call_missing_from_the_ledger_or_the_provider_is_lost() -> None:
    lost, _, _ = judge([_call("a"), _call("b")], [("b", "OUTCOME_CONFIRMED", 2)], {"a": 1})
    assert lost == [
        "a: acknowledged; the ledger says None, the provider performed it 1x",
        "b: acknowledged; the ledger says OUTCOME_CONFIRMED, the provider performed it 0x",
    ]


def test_a_refusal_for_good_of_what_the_provider_did_is_lost() -> None:
    lost, _, _ = judge([_call("a", acked=False, refused="attempt_failed")], [("a", "FAILED", 1)], {"a": 1})
    assert lost == ["a: refused for good (attempt_failed), yet the provider performed it"]


def test_an_effect_performed_twice_is_duplicated_and_the_last_attempt_counts() -> None:
    attempts = [("a", "UNKNOWN", 1), ("a", "OUTCOME_CONFIRMED", 2)]
    lost, duplicated, stuck = judge([_call("a")], attempts, {"a": 2})
    assert (lost, duplicated) == ([], ["a: performed 2x"])
    assert stuck == ["attempt 1 (a): UNKNOWN"]


def test_a_call_the_drill_stopped_mid_way_and_the_ledger_handed_to_people_is_not_stuck() -> None:
    """The agents stop when the drill ends: a call of a tool that does not deduplicate, stopped after
    its dispatch claim and before its request left, goes to a person (the provider did nothing); that
    is recovery doing its work, whatever the machine's load made the timing. A call an agent was told
    about, or one the provider performed, before a person is still stuck."""
    given_up = _call("g", acked=False)
    attempts = [("g", "MANUAL_REVIEW", 1), ("a", "MANUAL_REVIEW", 2), ("p", "MANUAL_REVIEW", 3), ("u", "UNKNOWN", 4)]
    calls = [given_up, _call("a"), _call("p", acked=False), _call("u", acked=False)]
    lost, _, stuck = judge(calls, attempts, {"p": 1})
    assert stuck == ["attempt 2 (a): MANUAL_REVIEW", "attempt 3 (p): MANUAL_REVIEW", "attempt 4 (u): UNKNOWN"]
    assert lost == ["a: acknowledged; the ledger says MANUAL_REVIEW, the provider performed it 0x"]


def test_the_ledgers_own_word_counts_for_keys_no_agent_reported() -> None:
    attempts = [("gave-up", "FAILED", 1), ("phantom", "OUTCOME_CONFIRMED", 2), ("fine", "FAILED", 3)]
    lost, _, _ = judge([], attempts, {"gave-up": 1})
    assert lost == [
        "gave-up: the ledger settled it as failed, yet the provider performed it 1x",
        "phantom: the ledger confirmed it, yet the provider never performed it",
    ]


def test_a_drill_in_which_nothing_recovered_does_not_pass() -> None:
    drill = FailoverDrill(Path("/nonexistent"), say=lambda _line: None)
    drill.verdict.faults = [Fault("kill", "node1", 0.0, writes_again=10.0, calls_again=11.0)]
    drill.verdict.faults.append(Fault("freeze", "node2", 30.0, writes_again=12.0, calls_again=None))
    drill.verdict.calls = [_call("a")]
    drill.verdict.audit_ok = True
    drill._progress()
    assert drill.verdict.no_progress == ["no call was acknowledged after the freeze of node2"]
    assert not drill.verdict.passed
    drill.verdict.faults[1].calls_again = 14.0
    drill.verdict.no_progress = []
    drill._progress()
    assert drill.verdict.passed
    assert drill.verdict.last_line() == "ha-drill: lost 0, duplicated 0, stuck 0, recovered in 12.0 s"


def test_a_multi_host_url_becomes_libpqs_host_and_port_lists() -> None:
    config = database_config(
        "postgres://app:secret@db1:5433,db2,[::1]:5434/ledger?target_session_attrs=read-write&connect_timeout=3"
    )
    assert (config["HOST"], config["PORT"], config["NAME"], config["USER"]) == (
        "db1,db2,::1",
        "5433,5432,5434",
        "ledger",
        "app",
    )
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    assert options["target_session_attrs"] == "read-write"
    assert options["connect_timeout"] == 3  # the URL's, over the default


def test_a_multi_host_url_takes_socket_folders_and_refuses_what_libpq_would_not() -> None:
    from django.core.exceptions import ImproperlyConfigured

    config = database_config("postgres://app@%2Fvar%2Frun%2Fpostgresql,db2:6432/ledger")
    assert (config["HOST"], config["PORT"]) == ("/var/run/postgresql,db2", "5432,6432")
    for bad in ("db1:5432,,db2", "db1:five,db2", "[::1,db2", "db1,[::1]x"):
        with pytest.raises(ImproperlyConfigured, match="is not HOST or HOST:PORT"):
            database_config(f"postgres://app@{bad}/ledger")


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.longest
def test_the_failover_drill_loses_duplicates_and_strands_nothing() -> None:
    """The whole drill, run by this process (its cluster, web server, agents
    and workers are processes of their own). Kept, with every log, when it
    fails; pytest's own folders are closed to the postgres OS user the
    cluster runs as, so the drill's is in /tmp."""
    missing = missing_programs()
    if missing:
        reason = f"needs Debian's {', '.join(missing)}: run scripts/ha-packages.sh (as root it installs them)"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    workdir = Path(tempfile.mkdtemp(prefix="ledgerdash-ha-drill-"))
    out = io.StringIO()
    before = set(process_tree(os.getpid()))
    try:
        # One agent each way and shorter spells of load than make ha-drill: the
        # faults and the verdict are the same, at less CPU beside the other tests.
        call_command(
            "ha_drill",
            "--http-agents=1",
            "--process-agents=1",
            "--load-seconds=3",
            "--keep",
            str(workdir),
            stdout=out,
        )
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        # Whatever the drill left running (it stops everything it started, unless it was interrupted).
        for pid in set(process_tree(os.getpid())) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    output = out.getvalue()
    assert code == 0, f"{output}\n(the cluster's and processes' logs: {workdir})"
    last = output.strip().splitlines()[-1]
    assert re.fullmatch(r"ha-drill: lost 0, duplicated 0, stuck 0, recovered in \d+\.\d s", last), output
    # Both faults happened, on different nodes, and each time another server took the writes.
    kill = re.search(r"SIGKILL (node\d) \(the leader\); writes again after", output)
    freeze = re.search(r"SIGSTOP (node\d) \(the leader\); writes again after", output)
    assert kill, output
    assert freeze, output
    assert kill.group(1) != freeze.group(1), output
    assert "verify_audit on the new primary: passed" in output
    acknowledged = re.search(r"(\d+) calls: (\d+) acknowledged", output)
    assert acknowledged, output
    assert int(acknowledged.group(2)) > 0, output
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_production_guides_cluster_commands_work_in_order() -> None:
    """docs/production.md's "High availability" ``sh`` block, run as written
    (in a folder of the run's own): start prints a URL that finds the
    primary, status names a leader and a synchronous standby, stop ends it."""
    if missing_programs():
        pytest.skip("needs Debian's patroni and etcd-server: run scripts/ha-packages.sh")
    guide = (ROOT / "docs" / "production.md").read_text()
    section = guide.split("## High availability", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    workdir = Path(tempfile.mkdtemp(prefix="ledgerdash-ha-guide-"))
    workdir.chmod(0o755)  # the cluster runs as the postgres OS user under root
    script = block.replace("/tmp/ledgerdash-ha", str(workdir / "cluster"))  # noqa: S108 - the page's own path, replaced
    try:
        done = subprocess.run(["sh", "-ec", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        url, *members = done.stdout.strip().splitlines()
        assert re.fullmatch(
            r"postgres://postgres@127\.0\.0\.1:\d+,127\.0\.0\.1:\d+/postgres\?target_session_attrs=read-write.*", url
        )
        roles = sorted(json.loads(line)["role"] for line in members)
        assert roles == ["leader", "sync_standby"], done.stdout
    finally:
        subprocess.run([str(ROOT / "deploy" / "ha" / "cluster"), "stop", str(workdir / "cluster")], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_drills_children_reach_the_same_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash drill hands its own database to its agent processes as a URL: a multi-host one stays one."""
    from django.db import connection

    from ledgerdash.ledger.drill import processes

    monkeypatch.setattr(connection, "vendor", "postgresql")
    monkeypatch.setattr(
        connection, "settings_dict", database_config("postgres://app:pw@db1:5432,[::1]:5433/ledger?sslmode=require")
    )
    url = processes.database_url()
    assert url == "postgres://app:pw@db1:5432,[::1]:5433/ledger?sslmode=require"
    assert database_config(url)["HOST"] == "db1,::1"


class _Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"the ledger answered {code}")
        self.code = code


def _agent(monkeypatch: pytest.MonkeyPatch, answers: list[object]) -> tuple[Agent, list[str]]:
    """An in-process drill agent whose calls answer ``answers`` in turn (an exception is raised)."""
    monkeypatch.setattr(ha_agent, "PAUSE", 0)
    agent = Agent(via="process", tenant="acme", tools=[{"name": "ha.send_email"}], prefix="p", out=io.StringIO())
    keys: list[str] = []

    def once(_spec: dict[str, object], key: str, _args: dict[str, object]) -> object:
        keys.append(key)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(agent, "_once", once)
    return agent, keys


def test_an_agent_calls_again_with_the_same_key_until_the_ledger_acknowledges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent, keys = _agent(
        monkeypatch,
        [_Refused("ledger_unavailable"), ConnectionResetError("cut"), _Refused("attempt_in_flight"), {"id": "e1"}],
    )
    report = agent.call(7)
    assert keys == ["p-000007"] * 4
    assert (report["acked"], report["id"], report["tries"]) == (True, "e1", 4)
    assert report["errors"] == {"ledger_unavailable": 1, "ConnectionResetError": 1, "attempt_in_flight": 1}


def test_an_agent_stops_at_a_refusal_for_good_and_gives_up_after_its_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    agent, _ = _agent(monkeypatch, [_Refused("invalid_input")])
    report = agent.call(1)
    assert (report["acked"], report["refused"], report["tries"]) == (False, "invalid_input", 1)
    agent, _ = _agent(monkeypatch, [_Refused("ledger_unavailable")] * 3)
    agent.grace, agent.stopped_at = 0.0, time.monotonic() - 1
    report = agent.call(2)
    assert (report["acked"], report["refused"], report["tries"]) == (False, None, 1)
    assert report["last_error"].startswith("ledger_unavailable: ")


def test_an_agent_reports_each_call_as_a_line_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    agent, keys = _agent(monkeypatch, [{"id": "e1"}, {"id": "e2"}])
    original = agent.call

    def call_then_stop(n: int) -> dict[str, object]:
        report = original(n)
        if n == 1:
            agent.stop.set()
        return report

    monkeypatch.setattr(agent, "call", call_then_stop)
    monkeypatch.setattr(ha_agent.signal, "signal", lambda *_args: None)
    agent.run()
    lines = [json.loads(line) for line in agent.out.getvalue().splitlines()]  # type: ignore[attr-defined]
    assert [(line["key"], line["id"]) for line in lines] == [("p-000000", "e1"), ("p-000001", "e2")]
    assert keys == ["p-000000", "p-000001"]

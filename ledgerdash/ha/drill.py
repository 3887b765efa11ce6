"""The failover drill: the ledger under load while its PostgreSQL primary
dies, then while the next one freezes; nothing acknowledged may be lost,
nothing performed twice, nothing left stuck.

``manage.py ha_drill`` (``make ha-drill``) starts a cluster of its own
(:mod:`.cluster`: etcd, a primary and a synchronous standby under Patroni),
points every process of the app at it through one multi-host URL
(``target_session_attrs=read-write``: each connection finds the writable
server), and runs, each a real process:

- agents over the HTTP API (the Python client, against gunicorn as
  deployed) and agents in process (:mod:`.agent`), calling an idempotent
  and a non-idempotent tool of the sandbox provider, key after key;
- two reconcilers and the notifier, as deployed (``manage.py reconcile``,
  ``manage.py notify``), which reconnect by themselves;
- a probe that writes to the cluster every tenth of a second, to time when
  writes succeed again.

The faults, each on the node that leads at that moment: SIGKILL to its
Patroni and every PostgreSQL process (a host that dies); the killed node is
started again and rejoins as the synchronous standby; then SIGSTOP to the
new leader's processes (a host that hangs, its clients' connections left
open, unanswered), SIGCONT once the standby has taken over (Patroni then
demotes it). The agents are stopped, the reconcilers left to settle what is
in flight, and the drill counts:

- **lost**: calls the ledger acknowledged to an agent (the tool returned)
  whose attempt is not confirmed afterwards or whose effect the provider
  never performed; calls the ledger refused for good although the provider
  performed them; any key the ledger settled as failed that the provider
  performed, or confirmed that it never performed; and the probe's
  acknowledged writes that are gone;
- **duplicated**: keys the provider performed more than once;
- **stuck**: attempts not settled (confirmed, failed, reconciled) once the
  reconcilers have had ``settle`` seconds, except a call the agents gave up
  when the drill stopped them that recovery put before a person and the
  provider never performed (a tool that does not deduplicate, stopped
  between its dispatch claim and its request: recovery's hand-off, not a
  failover's damage);
- **recovered in**: seconds from each fault until the probe's writes
  succeed again (the worst of the two is on the last line).

It then runs ``verify_audit`` against the new primary: every tenant's chain
must be whole. The last line is ``ha-drill: lost N, duplicated N, stuck N,
recovered in S s``; the drill fails unless the three counts are 0, the
audit passes, every worker is still running and every agent exited
cleanly, calls were acknowledged after each fault, and another node took
the lead each time.

The verdict does not depend on timing: the faults land wherever the calls
happen to be, and whatever they interrupt must still end acknowledged once
or not at all. Only the recovery time is a measurement.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import tomli_w

from ledgerdash.ha.cluster import Cluster, free_base_port
from ledgerdash.ledger.drill.processes import MANAGE, SandboxControl, child_environment, sandbox_service, web_service
from ledgerdash.ledger.models import TERMINAL_STATES
from ledgerdash.processes import stop_group
from ledgerdash.sandbox import http_adapter_config

TENANT = "ha-drill"
IDEMPOTENT = "ha.send_email"
NON_IDEMPOTENT = "ha.charge_card"
#: The sandbox's latency per request: wide enough that a fault often lands mid-call.
LATENCY_MS = 20


@dataclass
class Fault:
    kind: str  # "kill" or "freeze"
    node: str
    at: float
    writes_again: float | None = None  # seconds after ``at``
    calls_again: float | None = None  # seconds until an agent's call started after the fault was acknowledged
    rejoined: float | None = None  # seconds until the node was a synchronous standby again

    def line(self) -> str:
        what = {"kill": "SIGKILL", "freeze": "SIGSTOP"}[self.kind]
        parts = [f"{what} {self.node} (the leader)"]
        parts.append(
            f"writes again after {self.writes_again:.1f} s" if self.writes_again is not None else "writes never resumed"
        )
        if self.calls_again is not None:
            parts.append(f"a new call acknowledged after {self.calls_again:.1f} s")
        if self.rejoined is not None:
            parts.append(f"{self.node} rejoined as the synchronous standby after {self.rejoined:.1f} s")
        return "; ".join(parts)


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    audit_ok: bool = False
    workers_down: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    #: What shows the drill exercised nothing: no call acknowledged at all, or none after a fault.
    no_progress: list[str] = field(default_factory=list)

    @property
    def recovered(self) -> float | None:
        times = [fault.writes_again for fault in self.faults]
        return None if not times or None in times else max(t for t in times if t is not None)

    @property
    def passed(self) -> bool:
        return (
            not (self.lost or self.duplicated or self.stuck or self.workers_down or self.no_progress)
            and self.audit_ok
            and self.recovered is not None
        )

    def last_line(self) -> str:
        recovered = f"{self.recovered:.1f} s" if self.recovered is not None else "never"
        return (
            f"ha-drill: lost {len(self.lost)}, duplicated {len(self.duplicated)}, "
            f"stuck {len(self.stuck)}, recovered in {recovered}"
        )


class Probe:
    """Writes a row to a database of its own on the cluster every ``every``
    seconds, each on a fresh connection from a thread of its own (a write
    stuck on a frozen server is left behind, not waited for). Remembers
    when each acknowledged write started, and which rows it wrote: every
    one must still be there at the end, on whichever server then leads
    (a write acknowledged by a primary that lost its place, then rewound
    away, is a lost write)."""

    def __init__(self, url: str, every: float = 0.1) -> None:
        self.url, self.every = url, every
        self.acknowledged: list[tuple[float, int]] = []  # (started, row)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = 0
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS beats (n bigint PRIMARY KEY, at timestamptz DEFAULT now())")
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _write(self, n: int) -> None:
        started = time.monotonic()
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("INSERT INTO beats (n) VALUES (%s)", [n])
            with self._lock:
                self.acknowledged.append((started, n))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._next += 1
            writer = threading.Thread(target=self._write, args=(self._next,), daemon=True)
            writer.start()
            writer.join(timeout=2.0)
            self._stop.wait(self.every)

    def first_success_after(self, moment: float) -> float | None:
        """When the first write started after ``moment`` was (it has since been acknowledged)."""
        with self._lock:
            return min((started for started, _ in self.acknowledged if started > moment), default=None)

    def missing(self) -> list[int]:
        """Acknowledged writes that are not on the cluster now."""
        with self._lock:
            wanted = [n for _, n in self.acknowledged]
        with psycopg.connect(self.url, autocommit=True) as conn:
            present = {row[0] for row in conn.execute("SELECT n FROM beats WHERE n = ANY(%s)", [wanted])}
        return [n for n in wanted if n not in present]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class AgentProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = log.stem
        self.calls: list[dict[str, Any]] = []
        self._log = log.open("w")
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
            [sys.executable, str(MANAGE), "ha_agent", *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.calls.append(json.loads(line))

    def stop(self, grace: float) -> int | None:
        code = stop_group(self.proc, timeout=grace)
        self._reader.join(timeout=10)
        self._log.close()
        return code


class FailoverDrill:
    def __init__(
        self,
        workdir: Path,
        *,
        http_agents: int = 2,
        process_agents: int = 2,
        load_seconds: float = 5.0,
        settle_seconds: float = 300.0,
        grace_seconds: float = 90.0,
        say: Callable[[str], None] = print,
    ) -> None:
        self.workdir = Path(workdir)
        self.http_agents, self.process_agents = http_agents, process_agents
        self.load_seconds, self.settle_seconds, self.grace_seconds = load_seconds, settle_seconds, grace_seconds
        self.say = say
        self.verdict = Verdict()

    # -- setting up -----------------------------------------------------------------------------

    def _manage(self, *args: str, env: dict[str, str]) -> str:
        done = subprocess.run(  # noqa: S603 - our own interpreter and manage.py
            [sys.executable, str(MANAGE), *args], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def _tools(self, sandbox: str) -> list[dict[str, Any]]:
        config = http_adapter_config(sandbox, lookup_timeout=0.5)
        return [
            {"name": IDEMPOTENT, "adapter": "http", "config": config, "idempotent": True},
            {"name": NON_IDEMPOTENT, "adapter": "http", "config": config, "idempotent": False},
        ]

    def _configure(self, tools: list[dict[str, Any]], env: dict[str, str]) -> str:
        """Tools, tenant and policy as a team sets them up (``ledger_config apply``); an agent's token."""
        settings = {
            "max_request_seconds": 2.0,
            "dispatch_lease_seconds": 3.0,
            "backoff_base_seconds": 0.2,
            "max_checks": 3,
            "max_dispatches": 3,
            "enabled": True,
        }
        document = {
            "tools": {
                spec["name"]: {
                    "adapter": spec["adapter"],
                    "idempotent": spec["idempotent"],
                    "key_retention_seconds": 3600 if spec["idempotent"] else "",
                    "config": spec["config"],
                    **settings,
                }
                for spec in tools
            },
            "tenants": {
                TENANT: {
                    "name": "Failover drill",
                    "is_active": True,
                    "policy": {"note": "failover drill", "tools": {spec["name"]: ["ha:call"] for spec in tools}},
                }
            },
        }
        path = self.workdir / "ledger.toml"
        path.write_text(tomli_w.dumps(document))
        self._manage("ledger_config", "apply", str(path), env=env)
        token = self._manage("create_api_token", "--tenant", TENANT, "--name", "failover drill", "--days", "1", env=env)
        return token.strip()

    # -- running --------------------------------------------------------------------------------

    def run(self) -> Verdict:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)  # Patroni runs as the postgres OS user under root
        with contextlib.ExitStack() as stack:
            cluster = Cluster(self.workdir / "cluster", free_base_port())
            stack.callback(cluster.stop)
            cluster.start()
            self.say(f"ha-drill: {cluster.leader()} leads, {cluster.sync_standby()} is its synchronous standby")
            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE ledgerdash")
                conn.execute("CREATE DATABASE probe")
            url = cluster.url("ledgerdash")
            env = child_environment() | {"DATABASE_URL": url}
            self._manage("migrate", "--noinput", env=env)
            sandbox = stack.enter_context(sandbox_service(self.workdir))
            control = SandboxControl(sandbox)
            control.faults(IDEMPOTENT, latency_ms=LATENCY_MS)
            control.faults(NON_IDEMPOTENT, latency_ms=LATENCY_MS, non_idempotent=True)
            tools = self._tools(sandbox)
            token = self._configure(tools, env)
            web = stack.enter_context(web_service(self.workdir, env={"DATABASE_URL": url}))
            workers = self._workers(env)
            stack.callback(lambda: [stop_group(proc, timeout=30) for proc in workers.values()])
            probe = Probe(cluster.url("probe"))
            stack.callback(probe.stop)
            agents = self._agents(env, tools, web, token)
            self.say(
                f"ha-drill: load: {self.http_agents} agents over HTTP, {self.process_agents} in process, "
                f"2 reconcilers, the notifier"
            )
            time.sleep(self.load_seconds)
            self._fault(cluster, probe, agents, "kill")
            time.sleep(self.load_seconds)
            self._fault(cluster, probe, agents, "freeze")
            time.sleep(self.load_seconds)
            for agent in agents:
                agent.proc.terminate()
            for agent in agents:
                code = agent.stop(self.grace_seconds + 30)
                if code != 0:
                    self.verdict.workers_down.append(f"{agent.name} (exit {code}; see its log)")
                self.verdict.calls += agent.calls
            self._progress()
            self._settle(url)
            self.verdict.lost += [f"probe write {n}: acknowledged, then gone" for n in probe.missing()]
            self.verdict.workers_down = [name for name, proc in workers.items() if proc.poll() is not None]
            audit = subprocess.run(  # noqa: S603 - our own interpreter and manage.py
                [sys.executable, str(MANAGE), "verify_audit"], env=env, capture_output=True, text=True, check=False
            )
            self.verdict.audit_ok = audit.returncode == 0
            (self.workdir / "verify_audit.log").write_text(audit.stdout + audit.stderr)
            self._count(url, control)
            self._report(audit.stdout + audit.stderr)
        return self.verdict

    def _workers(self, env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
        workers: dict[str, subprocess.Popen[bytes]] = {}
        every = ["--interval", "0.5", "--max-backoff", "2"]
        for name, command in (
            ("reconciler-1", ["reconcile", "--label", "ha-reconciler-1", *every]),
            ("reconciler-2", ["reconcile", "--label", "ha-reconciler-2", *every]),
            ("notifier", ["notify", "--label", "ha-notifier", *every]),
        ):
            with (self.workdir / f"{name}.log").open("w") as log:
                workers[name] = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
                    [sys.executable, str(MANAGE), *command],
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )
        return workers

    def _agents(self, env: dict[str, str], tools: list[dict[str, Any]], web: str, token: str) -> list[AgentProcess]:
        specs = json.dumps(tools)
        common = ["--tenant", TENANT, "--tools", specs, "--grace", str(self.grace_seconds)]
        agents = []
        for n in range(self.http_agents):
            agents.append(
                AgentProcess(
                    ["--via", "http", "--url", web, "--prefix", f"http{n}", *common],
                    env | {"LEDGERDASH_API_TOKEN": token},
                    self.workdir / f"agent-http{n}.log",
                )
            )
        for n in range(self.process_agents):
            agents.append(
                AgentProcess(
                    ["--via", "process", "--prefix", f"proc{n}", *common], env, self.workdir / f"agent-proc{n}.log"
                )
            )
        return agents

    def _fault(self, cluster: Cluster, probe: Probe, agents: list[AgentProcess], kind: str) -> None:
        leader = cluster.leader()
        if leader is None:
            raise RuntimeError(f"no leader to {kind}: {cluster.members()}")
        node = cluster.node(leader)
        (cluster.kill if kind == "kill" else cluster.freeze)(node)
        # Timed from when every process of the node is down or stopped: a
        # write that began while the signals went out may still succeed.
        fault = Fault(kind, leader, time.monotonic())
        self.verdict.faults.append(fault)
        deadline = fault.at + 120
        while (written := probe.first_success_after(fault.at)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if written is not None:
            fault.writes_again = written - fault.at
        # Back only once another node leads: a host that returns within the
        # leader key's lifetime keeps its place, and nothing has failed over.
        try:
            cluster.wait_for(lambda: cluster.leader() not in (None, leader), 120, f"a leader other than {leader}")
        except RuntimeError:
            self.verdict.no_progress.append(f"no other node took the lead after the {kind} of {leader}")
        if kind == "kill":
            cluster.start_node(node)
        else:
            time.sleep(2.0)  # a while longer frozen, its clients still waiting on it
            cluster.thaw(node)
        with contextlib.suppress(RuntimeError):
            cluster.wait_for(lambda: cluster.sync_standby() == leader, 180, f"{leader} to rejoin")
            fault.rejoined = time.monotonic() - fault.at
        acknowledged = [
            call["ended"] - fault.at
            for agent in agents
            for call in list(agent.calls)
            if call.get("acked") and call["started"] > fault.at
        ]
        fault.calls_again = min(acknowledged) if acknowledged else None
        self.say(f"ha-drill: {fault.line()}")

    def _progress(self) -> None:
        """A drill in which nothing was acknowledged, or nothing after a
        fault, proves nothing: the app never recovered, or never ran."""
        verdict = self.verdict
        if not any(call.get("acked") for call in verdict.calls):
            verdict.no_progress.append("no call was acknowledged at all")
        for fault in verdict.faults:
            if fault.calls_again is None:
                verdict.no_progress.append(f"no call was acknowledged after the {fault.kind} of {fault.node}")

    def _settle(self, url: str) -> None:
        """Wait until every attempt of the drill's tenant is settled or before a person (recovery has
        nothing more to do with it), or ``settle`` seconds."""
        started = time.monotonic()
        unsettled = -1
        while time.monotonic() - started < self.settle_seconds:
            unsettled = len(self._unsettled(url))
            if unsettled == 0:
                break
            time.sleep(0.5)
        took = time.monotonic() - started
        if unsettled:
            self.say(f"ha-drill: {unsettled} attempts still unsettled {took:.0f} s after the agents stopped")
        else:
            self.say(f"ha-drill: every attempt settled or before a person {took:.1f} s after the agents stopped")

    @staticmethod
    def _attempts(url: str) -> list[tuple[str, str, int]]:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT a.idempotency_key, a.state, a.id FROM ledger_attempt a "
                "JOIN ledger_tenant t ON t.id = a.tenant_id WHERE t.slug = %s ORDER BY a.id",
                [TENANT],
            ).fetchall()
        return [(str(key), str(state), int(pk)) for key, state, pk in rows]

    def _unsettled(self, url: str) -> list[tuple[str, str, int]]:
        return [row for row in self._attempts(url) if row[1] not in TERMINAL_STATES and row[1] != "MANUAL_REVIEW"]

    def _count(self, url: str, control: SandboxControl) -> None:
        lost, duplicated, stuck = judge(self.verdict.calls, self._attempts(url), control.counts())
        self.verdict.lost += lost
        self.verdict.duplicated, self.verdict.stuck = duplicated, stuck

    def _report(self, audit: str) -> None:
        verdict = self.verdict
        calls = verdict.calls
        answers: Counter[str] = Counter()
        for call in calls:
            answers.update(call.get("errors", {}))
        acked = sum(1 for call in calls if call.get("acked"))
        again = sum(1 for call in calls if call.get("acked") and call.get("tries", 1) > 1)
        refused = Counter(call["refused"] for call in calls if call.get("refused"))
        given_up = sum(1 for call in calls if not call.get("acked") and not call.get("refused"))
        seen = ", ".join(f"{code} {n}" for code, n in answers.most_common()) or "none"
        self.say(
            f"ha-drill: {len(calls)} calls: {acked} acknowledged ({again} after calling again with the same key), "
            f"{sum(refused.values())} refused for good, {given_up} given up when the agents stopped; "
            f"retryable answers on the way: {seen}"
        )
        for line in (verdict.lost + verdict.duplicated + verdict.stuck)[:20]:
            self.say(f"ha-drill:   {line}")
        if verdict.workers_down:
            self.say(f"ha-drill: workers that stopped: {', '.join(verdict.workers_down)}")
        for line in verdict.no_progress:
            self.say(f"ha-drill: {line}")
        summary = audit.strip().splitlines()[-1] if audit.strip() else ""
        self.say(f"ha-drill: verify_audit on the new primary: {'passed' if verdict.audit_ok else 'FAILED'} ({summary})")
        self.say(verdict.last_line())


def judge(
    calls: list[dict[str, Any]], attempts: list[tuple[str, str, int]], performed: dict[str, int]
) -> tuple[list[str], list[str], list[str]]:
    """What was lost, duplicated and left stuck, from the agents' calls, the
    ledger's attempts of the drill's tenant (key, state, id; in id order) and
    the provider's effects per key."""
    latest = {key: state for key, state, _pk in attempts}  # a key's last attempt wins
    lost = []
    for call in calls:
        key, done = call["key"], performed.get(call["key"], 0)
        now = latest.get(key)
        if call.get("acked") and (now != "OUTCOME_CONFIRMED" or done == 0):
            lost.append(f"{key}: acknowledged; the ledger says {now}, the provider performed it {done}x")
        if call.get("refused") and done > 0:
            lost.append(f"{key}: refused for good ({call['refused']}), yet the provider performed it")
    # The ledger's own word, for every key (an agent that gave up reported none):
    # settled as failed yet performed, or confirmed yet never performed.
    reported = {line.split(":", 1)[0] for line in lost}
    for key, state in latest.items():
        done = performed.get(key, 0)
        if key in reported:
            continue
        if state == "FAILED" and done > 0:
            lost.append(f"{key}: the ledger settled it as failed, yet the provider performed it {done}x")
        elif state == "OUTCOME_CONFIRMED" and done == 0:
            lost.append(f"{key}: the ledger confirmed it, yet the provider never performed it")
    duplicated = [f"{key}: performed {n}x" for key, n in performed.items() if n > 1]
    given_up = {call["key"] for call in calls if not call.get("acked") and not call.get("refused")}
    stuck = [
        f"attempt {pk} ({key}): {state}"
        for key, state, pk in attempts
        if state not in TERMINAL_STATES
        and not (state == "MANUAL_REVIEW" and key in given_up and performed.get(key, 0) == 0)
    ]
    return lost, duplicated, stuck


@contextlib.contextmanager
def scratch(parent: Path | None = None) -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ledgerdash-ha-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

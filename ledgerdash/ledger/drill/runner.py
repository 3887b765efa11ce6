"""The crash drill: the seed's failure-injection test as a deployment gate.

For each case a real agent worker (:mod:`.agent`) runs a task through the
recording API against the sandbox provider and is SIGKILLed at the case's
crash point; the worker restarts and re-runs the task as an agent would; then
recovery runs in rounds, each a reconciler pass followed at once by a second
pass that must change nothing. Finally the worker runs the task once more.

Every case is then checked against the ledger and the sandbox's own effect
counts:

- no side effect was performed twice at the provider;
- every attempt ended OUTCOME_CONFIRMED, FAILED or MANUAL_REVIEW;
- the operator can see the arguments hash (and it is the hash of the
  arguments) and the provider request id wherever the provider gave one;
- no linked retry widened credentials or crossed a tenant;
- UNKNOWN work was in the attention queue with an owner whenever seen;
- the second recovery pass changed nothing.

The cases (each for an idempotent and a non-idempotent tool):

    A  kill after the intent commit, before dispatch
    B  kill after the request left, before its response was read
    C  kill after the provider responded, before the outcome commit
    D  the same task delivered to two workers at once
    E  the authority changes while the attempt is UNKNOWN
    F  the provider's lookup times out

The drill owns a tenant (``crashdrill`` by default), two tools
(``drill.send_email``, idempotent, and ``drill.charge_card``, not) and a
sandbox it starts itself. Run one drill at a time per database.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from ledgerdash.ledger import crashpoints
from ledgerdash.ledger.authority import current_policy
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    DrillRun,
    State,
    Tenant,
    Tool,
)
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.queries import needs_attention
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.ledger.transitions import Actor, event_record
from ledgerdash.sandbox import http_adapter_config

S = State
SETTLED = frozenset({S.OUTCOME_CONFIRMED, S.FAILED, S.MANUAL_REVIEW})
IDEMPOTENT_TOOL = "drill.send_email"
NON_IDEMPOTENT_TOOL = "drill.charge_card"
BASE_SCOPES = ["drill:send", "drill:notify"]
NARROWED_SCOPES = ["drill:send"]
#: The drill tenant's policy between cases: both tools, the base scopes.
BASELINE_TOOLS = {IDEMPOTENT_TOOL: BASE_SCOPES, NON_IDEMPOTENT_TOOL: BASE_SCOPES}
MAX_ROUNDS = 8
ROUND_DEADLINE = 45.0
JOB_TIMEOUT = 60.0


@dataclass(frozen=True)
class Case:
    letter: str
    title: str
    crash_at: str | None


CASES = {
    "A": Case("A", "kill after the intent commit, before dispatch", crashpoints.AFTER_INTENT),
    "B": Case("B", "kill after the request left, before its response was read", crashpoints.AFTER_SEND),
    "C": Case("C", "kill after the provider responded, before the outcome commit", crashpoints.AFTER_RESPONSE),
    "D": Case("D", "the same task delivered to two workers at once", None),
    "E": Case("E", "the authority changes while the attempt is UNKNOWN", crashpoints.BEFORE_SEND),
    "F": Case("F", "the provider's lookup times out", crashpoints.AFTER_SEND),
}


@dataclass(frozen=True)
class Planned:
    """One case to run: which, for which kind of tool, with which crash point."""

    letter: str
    idempotent: bool
    crash_at: str | None

    @property
    def tool(self) -> str:
        return IDEMPOTENT_TOOL if self.idempotent else NON_IDEMPOTENT_TOOL

    @property
    def label(self) -> str:
        return f"{self.letter}-{'idempotent' if self.idempotent else 'non-idempotent'}"


def fixed_plan() -> list[Planned]:
    """The six cases, each for both kinds of tool."""
    return [Planned(c.letter, idem, c.crash_at) for c in CASES.values() for idem in (True, False)]


def random_plan(iterations: int, seed: int) -> list[Planned]:
    """``iterations`` cases picked from ``seed``: the same seed, the same plan."""
    rng = random.Random(seed)  # noqa: S311 - reproducible choice of cases, not security
    plan = []
    for _ in range(iterations):
        case = CASES[rng.choice(sorted(CASES))]
        idempotent = rng.choice((True, False))
        crash_at = case.crash_at
        if case.letter in ("E", "F"):
            # Whether the request reached the provider before the crash.
            crash_at = rng.choice((crashpoints.BEFORE_SEND, crashpoints.AFTER_SEND))
        plan.append(Planned(case.letter, idempotent, crash_at))
    return plan


# --- processes the drill runs -------------------------------------------------------------


def database_url() -> str:
    """This process's database as a URL, for the agent processes to use the very same one."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db.get("USER") or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{db['NAME']}"


def child_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", crashpoints.ENV)}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "ledgerdash.settings",
            "DATABASE_URL": database_url(),
            "DEBUG": "true" if settings.DEBUG else "false",
            "SECRET_KEY": settings.SECRET_KEY,
            "ALLOWED_HOSTS": ",".join(settings.ALLOWED_HOSTS) or "localhost",
            "LEDGERDASH_VAR_DIR": str(settings.VAR_DIR),
        }
    )
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AgentServer:
    """One drill_agent process and a thread reading its output."""

    def __init__(self, manage: Path) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py, fixed arguments
            [sys.executable, str(manage), "drill_agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_environment(),
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def send(self, job: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def collect(self, job_id: str, *, timeout: float = JOB_TIMEOUT) -> dict[str, Any]:
        """Follow one job to its end, killing the worker at its crash point."""
        result: dict[str, Any] = {"job": job_id}
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                result["error"] = f"the worker did not finish within {timeout:.0f}s"
                return result
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line.startswith(crashpoints.ANNOUNCE):
                _, point, pid_part = line.split()
                pid = int(pid_part.removeprefix("pid="))
                os.kill(pid, signal.SIGKILL)
                result.update({"crashed_at": point, "killed_pid": pid})
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("job") != job_id:
                continue
            if "exit" in message:
                result.update({"pid": message["pid"], "exit": message["exit"], "signal": message["signal"]})
                return result
            result.update({k: v for k, v in message.items() if k not in ("job",)})

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class SandboxControl:
    """The drill's view of the sandbox: switch faults, count effects."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310 - loopback sandbox
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return json.loads(response.read() or b"null")

    def faults(self, tool: str, **faults: Any) -> None:
        self._call("PUT", f"/faults/{tool}", faults)

    def clear(self) -> None:
        self._call("DELETE", "/faults")

    def count(self, key: str) -> int:
        return int(self._call("GET", "/effects/count?key=" + urllib.parse.quote(key, safe=""))["count"])

    def healthy(self) -> bool:
        try:
            self._call("GET", "/health")
        except OSError:
            return False
        return True


@contextlib.contextmanager
def sandbox_service(directory: Path) -> Iterator[str]:
    """Start a sandbox provider of the drill's own; yield its URL."""
    port = _free_port()
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module, fixed arguments
        [sys.executable, "-m", "ledgerdash.sandbox", "--port", str(port), "--db", str(directory / "sandbox.sqlite3")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        control = SandboxControl(url)
        deadline = time.monotonic() + 20
        while not control.healthy():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the sandbox provider did not start")
            time.sleep(0.05)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


# --- the report ----------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    held: bool
    evidence: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "held": self.held, "evidence": self.evidence}


@dataclass
class CaseReport:
    id: str
    planned: Planned
    key: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    effects: dict[str, int] = field(default_factory=dict)
    at_provider: str = ""
    in_ledger: str = ""

    @property
    def ok(self) -> bool:
        return all(check.held for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        case = CASES[self.planned.letter]
        return {
            "id": self.id,
            "case": case.letter,
            "title": case.title,
            "tool": self.planned.tool,
            "idempotent": self.planned.idempotent,
            "crash_point": self.planned.crash_at,
            "key": self.key,
            "ok": self.ok,
            "at_provider": self.at_provider,
            "in_ledger": self.in_ledger,
            "steps": self.steps,
            "observations": self.observations,
            "assertions": [check.as_dict() for check in self.checks],
            "provider_effects": self.effects,
            "attempts": self.attempts,
            "events": self.events,
        }


# --- the drill ---------------------------------------------------------------------------------


class Drill:
    """Runs planned cases against a sandbox and a pair of agent workers."""

    def __init__(
        self,
        *,
        tenant: str = "crashdrill",
        workdir: Path | None = None,
        sandbox_url: str | None = None,
        reconciler_factory: Callable[[str], Reconciler] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.tenant_slug = tenant
        self.workdir = workdir or Path(settings.VAR_DIR) / "crashdrill"
        self.sandbox_url = sandbox_url
        self.reconciler_factory = reconciler_factory or (lambda label: Reconciler(label=label, batch_size=20))
        self.progress = progress or (lambda _line: None)
        self._stack = contextlib.ExitStack()
        self.agents: list[AgentServer] = []

    # set-up -------------------------------------------------------------------------------

    def __enter__(self) -> Drill:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.sandbox_url is None:
            self.sandbox_url = self._stack.enter_context(sandbox_service(self.workdir))
        self.sandbox = SandboxControl(self.sandbox_url)
        self.sandbox.clear()
        self._prepare_ledger()
        manage = Path(settings.BASE_DIR) / "manage.py"
        self.agents = [AgentServer(manage), AgentServer(manage)]
        return self

    def __exit__(self, *exc: object) -> None:
        for agent in self.agents:
            agent.close()
        with contextlib.suppress(OSError):
            self.sandbox.clear()
        self._stack.close()

    def _prepare_ledger(self) -> None:
        tenant, _ = Tenant.objects.get_or_create(slug=self.tenant_slug, defaults={"name": "Crash drill"})
        if not tenant.is_active:
            raise RuntimeError(f"tenant {tenant.slug} is not active")
        if tenant.default_owner_id is None:
            user_model = get_user_model()
            owner, created = user_model.objects.get_or_create(username=f"{self.tenant_slug}-oncall")
            if created:
                owner.set_unusable_password()
                owner.save(update_fields=["password"])
            Tenant.objects.filter(pk=tenant.pk).update(default_owner=owner)
            tenant.refresh_from_db()
        self.tenant = tenant
        assert self.sandbox_url is not None
        config = http_adapter_config(self.sandbox_url, lookup_timeout=0.5, timeout=5.0)
        for name, idempotent in ((IDEMPOTENT_TOOL, True), (NON_IDEMPOTENT_TOOL, False)):
            Tool.objects.update_or_create(
                name=name,
                defaults={
                    "adapter": Tool.Adapter.HTTP,
                    "config": config,
                    "idempotent": idempotent,
                    "key_retention_seconds": 3600,
                    "dispatch_lease_seconds": 0.5,
                    "backoff_base_seconds": 0.2,
                    "max_checks": 2,
                    "max_dispatches": 3,
                    "enabled": True,
                },
            )
        self._baseline_policy()

    def _baseline_policy(self) -> None:
        policy = current_policy(self.tenant.pk)
        if policy is None or {k: sorted(v) for k, v in policy.tools.items()} != {
            k: sorted(v) for k, v in BASELINE_TOOLS.items()
        }:
            policy_publish(
                tenant=self.tenant, tools=BASELINE_TOOLS, actor=Actor.system("crashdrill"), note="crash drill baseline"
            )

    # running ----------------------------------------------------------------------------------

    def run(self, plan: list[Planned], *, mode: str, seed: int | None) -> DrillRun:
        run = DrillRun.objects.create(
            tenant=self.tenant,
            mode=mode,
            seed=seed,
            iterations=len(plan),
            database=connection.vendor,
            host=socket.gethostname(),
        )
        reports = []
        for number, planned in enumerate(plan, start=1):
            report = self.run_case(planned, case_id=f"{number:03d}-{planned.label}", run_id=run.pk)
            reports.append(report)
            verdict = "ok" if report.ok else "FAILED: " + "; ".join(c.name for c in report.checks if not c.held)
            self.progress(f"{report.id:<28} {planned.crash_at or '-':<15} {verdict}")
        failed = [r for r in reports if not r.ok]
        run.finished_at = timezone.now()
        run.ok = not failed
        run.cases_total = len(reports)
        run.cases_failed = len(failed)
        run.report = {
            "run": run.pk,
            "tenant": self.tenant.slug,
            "mode": mode,
            "seed": seed,
            "database": connection.vendor,
            "host": run.host,
            "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat(),
            "ok": run.ok,
            "cases": [r.as_dict() for r in reports],
        }
        run.save(update_fields=["finished_at", "ok", "cases_total", "cases_failed", "report"])
        event_record(
            tenant=self.tenant,
            kind="drill",
            actor=Actor.system("crashdrill"),
            reason=f"crash drill #{run.pk}: {len(reports) - len(failed)} of {len(reports)} cases held every assertion",
            details={"drill_run": run.pk, "ok": run.ok, "seed": seed, "failed": [r.id for r in failed]},
        )
        return run

    def run_case(self, planned: Planned, *, case_id: str, run_id: int) -> CaseReport:
        self._baseline_policy()
        self.sandbox.clear()
        if not planned.idempotent:
            self.sandbox.faults(NON_IDEMPOTENT_TOOL, non_idempotent=True)
        key = f"drill:{run_id}:{case_id}"
        report = CaseReport(id=case_id, planned=planned, key=key)
        job = {
            "tenant": self.tenant.slug,
            "task_id": f"drill-{run_id}-{case_id}",
            "tool": planned.tool,
            "key": key,
            "args": {"case": planned.letter, "to": "drill@example.com", "amount_cents": 100, "run": run_id},
        }
        if planned.letter == "E":
            self.sandbox.faults(planned.tool, lookup_5xx=True)
        if planned.letter == "F":
            self.sandbox.faults(planned.tool, lookup_timeout=True, lookup_timeout_seconds=2.0)

        if planned.letter == "D":
            for agent, n in zip(self.agents, (1, 2), strict=True):
                agent.send({**job, "id": f"{case_id}-w{n}"})
            runs = [agent.collect(f"{case_id}-w{n}") for agent, n in zip(self.agents, (1, 2), strict=True)]
            report.steps += [{"step": f"worker {n} (same message)", **r} for n, r in zip((1, 2), runs, strict=True)]
        else:
            first = self._job(0, {**job, "id": f"{case_id}-crash", "crash_at": planned.crash_at})
            report.steps.append({"step": f"worker runs the task, killed at {planned.crash_at}", **first})
            restart = self._job(1, {**job, "id": f"{case_id}-restart"})
            report.steps.append({"step": "worker restarts and re-runs the task", **restart})

        report.steps += self._recover(planned, report)
        final = self._job(0, {**job, "id": f"{case_id}-final"})
        report.steps.append({"step": "worker runs the task once more", **final})
        self.sandbox.clear()
        self._collect(report)
        report.checks = self._check(report)
        return report

    def _job(self, worker: int, job: dict[str, Any]) -> dict[str, Any]:
        agent = self.agents[worker]
        agent.send(job)
        return agent.collect(job["id"])

    def _case_attempts(self, key: str) -> list[Attempt]:
        return list(Attempt.objects.filter(tenant=self.tenant, idempotency_key=key).order_by("id"))

    def _snapshot(self, key: str) -> tuple[Any, ...]:
        attempts = self._case_attempts(key)
        return (
            [(a.pk, a.state, a.fence, a.owner_id, a.next_check_at) for a in attempts],
            AttemptEvent.objects.filter(attempt__in=attempts).count(),
        )

    def _observe(self, report: CaseReport, moment: str) -> None:
        queue_ids = set(needs_attention([self.tenant.pk]).values_list("id", flat=True))
        for attempt in self._case_attempts(report.key):
            if attempt.state in OWNED_STATES:
                report.observations.append(
                    {
                        "moment": moment,
                        "attempt": attempt.pk,
                        "state": attempt.state,
                        "in_queue": attempt.pk in queue_ids,
                        "owner_id": attempt.owner_id,
                    }
                )

    def _recover(self, planned: Planned, report: CaseReport) -> list[dict[str, Any]]:
        reconciler = self.reconciler_factory(f"crashdrill-reconciler:{os.getpid()}")
        rounds: list[dict[str, Any]] = []
        deadline = time.monotonic() + ROUND_DEADLINE
        authority_changed = False
        for number in range(1, MAX_ROUNDS + 1):
            waiting = [a for a in self._case_attempts(report.key) if a.state in IN_FLIGHT_STATES and a.next_check_at]
            if not waiting and number > 1:
                break
            # The first round runs even when nothing waits: recovery must be
            # safe to run over a case that needs none.
            due = min((a.next_check_at for a in waiting if a.next_check_at is not None), default=timezone.now())
            pause = (due - timezone.now()).total_seconds() + 0.02
            if time.monotonic() + max(pause, 0) > deadline:
                rounds.append({"step": f"recovery round {number}", "stopped": f"next check is {pause:.1f}s away"})
                break
            if pause > 0:
                time.sleep(pause)
            first = reconciler.run_pass()
            self._observe(report, f"after recovery round {number}")
            before = self._snapshot(report.key)
            second = reconciler.run_pass()
            after = self._snapshot(report.key)
            rounds.append(
                {
                    "step": f"recovery round {number}",
                    "first_pass": first.line(),
                    "second_pass": second.line(),
                    "second_pass_changed_case": before != after,
                }
            )
            if (
                planned.letter == "E"
                and not authority_changed
                and any(a.state == S.UNKNOWN for a in self._case_attempts(report.key))
            ):
                policy = policy_publish(
                    tenant=self.tenant,
                    tools={**BASELINE_TOOLS, planned.tool: NARROWED_SCOPES},
                    actor=Actor.system("crashdrill"),
                    note="crash drill case E: scope narrowed while the attempt is UNKNOWN",
                )
                self.sandbox.clear()
                if not planned.idempotent:
                    self.sandbox.faults(NON_IDEMPOTENT_TOOL, non_idempotent=True)
                authority_changed = True
                rounds.append(
                    {
                        "step": "authority changed while UNKNOWN",
                        "policy_version": policy.version,
                        "scopes": {planned.tool: NARROWED_SCOPES},
                    }
                )
        return rounds

    # evidence and assertions --------------------------------------------------------------------

    def _collect(self, report: CaseReport) -> None:
        attempts = self._case_attempts(report.key)
        report.attempts = [
            {
                "id": a.pk,
                "parent_id": a.parent_id,
                "tenant": self.tenant.slug,
                "tenant_id": a.tenant_id,
                "tool": a.tool_name,
                "state": a.state,
                "args": a.args,
                "args_hash": a.args_hash,
                "provider_key": a.provider_key,
                "provider_request_id": a.provider_request_id,
                "result_ref": a.result_ref,
                "policy_version": a.policy_version,
                "credential_scope": a.credential_scope,
                "owner_id": a.owner_id,
                "dispatch_count": a.dispatch_count,
                "last_note": a.last_note,
            }
            for a in attempts
        ]
        report.events = [
            {
                "seq": e.seq,
                "attempt_id": e.attempt_id,
                "kind": e.kind,
                "from": e.from_state,
                "to": e.to_state,
                "actor": f"{e.actor_kind} {e.actor_label}",
                "reason": e.reason,
                "lookup": e.details.get("lookup"),
                "at": e.created_at.isoformat(),
            }
            for e in AttemptEvent.objects.filter(attempt__in=attempts).order_by("seq")
        ]
        report.effects = {key: self.sandbox.count(key) for key in sorted({a.provider_key for a in attempts})}
        performed = ", ".join(f"{key} performed {n} time{'s' if n != 1 else ''}" for key, n in report.effects.items())
        report.at_provider = performed or "no request reached the provider"
        report.in_ledger = "; ".join(
            f"#{a['id']} {' -> '.join(self._path(a['id'], report.events))} ({a['last_note']})" for a in report.attempts
        )

    @staticmethod
    def _path(attempt_id: int, events: list[dict[str, Any]]) -> list[str]:
        states = [e["to"] for e in events if e["attempt_id"] == attempt_id and e["kind"] == "transition"]
        collapsed: list[str] = []
        for state in states:
            if not collapsed or collapsed[-1] != state:
                collapsed.append(state)
        return collapsed

    def _check(self, report: CaseReport) -> list[Check]:
        checks: list[Check] = []
        planned = report.planned
        crash = report.steps[0]
        if planned.crash_at:
            checks.append(
                Check(
                    "crashed_at_the_point",
                    crash.get("crashed_at") == planned.crash_at and crash.get("signal") == signal.SIGKILL,
                    f"worker pid {crash.get('killed_pid')} announced {crash.get('crashed_at')!r} and ended with "
                    f"signal {crash.get('signal')}",
                )
            )
        else:
            outcomes = sorted(str(step.get("outcome")) for step in report.steps if "same message" in step["step"])
            checks.append(
                Check(
                    "both_workers_ran",
                    len(outcomes) == 2 and "error" not in outcomes,
                    f"the two workers given the same message: {outcomes}",
                )
            )
        duplicates = {key: n for key, n in report.effects.items() if n > 1}
        checks.append(
            Check(
                "no_duplicate_effect",
                not duplicates,
                "duplicate effect: "
                + ", ".join(f"key {key} was performed {n} times at the provider" for key, n in duplicates.items())
                if duplicates
                else f"sandbox effect counts: {report.effects or 'none'}",
            )
        )
        unsettled = [a for a in report.attempts if a["state"] not in SETTLED]
        checks.append(
            Check(
                "every_attempt_settled",
                bool(report.attempts) and not unsettled,
                ", ".join(f"#{a['id']} {a['state']}" for a in report.attempts) or "no attempt was recorded",
            )
        )
        checks.append(self._check_visibility(report))
        checks.append(self._check_credentials(report))
        checks.append(self._check_unknown_owned(report))
        changed = [r["step"] for r in report.steps if r.get("second_pass_changed_case")]
        rounds = [r for r in report.steps if "second_pass" in r]
        checks.append(
            Check(
                "second_pass_changed_nothing",
                not changed,
                f"second pass changed the case in: {changed}"
                if changed
                else f"{len(rounds)} recovery rounds; each second pass: " + "; ".join(r["second_pass"] for r in rounds),
            )
        )
        final = report.steps[-1]
        resent = final.get("sent") is True
        checks.append(
            Check(
                "rerun_after_recovery_sent_nothing_new",
                not resent and final.get("outcome") in ("replayed", "blocked"),
                f"the last run of the task: {final.get('outcome')} {final.get('code', '')}".strip(),
            )
        )
        return checks

    def _check_visibility(self, report: CaseReport) -> Check:
        problems = []
        for attempt in report.attempts:
            expected = normalize_args(attempt["args"])[1]
            if attempt["args_hash"] != expected:
                problems.append(f"#{attempt['id']} shows hash {attempt['args_hash'][:12]}, not {expected[:12]}")
            performed = report.effects.get(attempt["provider_key"], 0)
            if attempt["state"] == S.OUTCOME_CONFIRMED and not (
                attempt["provider_request_id"] or attempt["result_ref"]
            ):
                problems.append(f"#{attempt['id']} is confirmed without a request id or receipt")
            if performed and attempt["state"] == S.OUTCOME_CONFIRMED and not attempt["provider_request_id"]:
                problems.append(f"#{attempt['id']} was performed but shows no provider request id")
        shown = ", ".join(
            f"#{a['id']} hash {a['args_hash'][:12]}… request {a['provider_request_id'] or '(none: provider key '}"
            + ("" if a["provider_request_id"] else f"{a['provider_key']})")
            for a in report.attempts
        )
        return Check("operator_sees_hash_and_request_id", not problems, "; ".join(problems) or shown)

    def _check_credentials(self, report: CaseReport) -> Check:
        by_id = {a["id"]: a for a in report.attempts}
        problems = []
        for attempt in report.attempts:
            parent = by_id.get(attempt["parent_id"])
            if parent is None:
                continue
            wider = set(attempt["credential_scope"].split()) - set(parent["credential_scope"].split())
            if wider:
                problems.append(f"#{attempt['id']} widened scope by {sorted(wider)} over #{parent['id']}")
            if attempt["tenant_id"] != parent["tenant_id"]:
                problems.append(f"#{attempt['id']} crossed from tenant {parent['tenant_id']} to {attempt['tenant_id']}")
        linked = [a for a in report.attempts if a["parent_id"]]
        evidence = "; ".join(problems) or (
            ", ".join(
                f"#{a['id']} scope '{a['credential_scope']}' within #{a['parent_id']}'s "
                f"'{by_id[a['parent_id']]['credential_scope']}', same tenant"
                for a in linked
            )
            or "no linked retry was created"
        )
        return Check("no_retry_widened_credentials_or_crossed_tenants", not problems, evidence)

    def _check_unknown_owned(self, report: CaseReport) -> Check:
        bad = [o for o in report.observations if not o["in_queue"] or o["owner_id"] is None]
        unowned_now = [a for a in report.attempts if a["state"] in OWNED_STATES and a["owner_id"] is None]
        seen_unknown = [o for o in report.observations if o["state"] == S.UNKNOWN]
        evidence = (
            f"not in the queue or without owner: {bad + unowned_now}"
            if bad or unowned_now
            else f"{len(seen_unknown)} UNKNOWN sightings, all queued with an owner"
            if seen_unknown
            else "no attempt was UNKNOWN when recovery looked; attempts under review all owned"
        )
        return Check("unknown_work_is_queued_and_owned", not bad and not unowned_now, evidence)


def leave_unknown(drill: Drill, *, count: int, run_id: int) -> list[int]:
    """Crash ``count`` agents after their requests left and let one recovery
    pass find the provider's lookup down: real crashes left UNKNOWN, owned,
    backing off. The demo uses this so its UNKNOWN queue is not empty."""
    ids = []
    drill.sandbox.faults(IDEMPOTENT_TOOL, lookup_5xx=True)
    Tool.objects.filter(name=IDEMPOTENT_TOOL).update(backoff_base_seconds=600.0, max_checks=50)
    try:
        for n in range(count):
            key = f"drill:{run_id}:unsettled-{n}"
            job = {
                "id": key,
                "tenant": drill.tenant.slug,
                "task_id": f"nightly-digest-{n}",
                "tool": IDEMPOTENT_TOOL,
                "key": key,
                "args": {"to": f"team-{n}@example.com", "digest": "nightly"},
                "crash_at": crashpoints.AFTER_SEND,
            }
            drill._job(0, job)
            ids += [a.pk for a in drill._case_attempts(key)]
        time.sleep(0.6)  # past the dispatch lease
        drill.reconciler_factory("crashdrill-reconciler").run_pass()
    finally:
        Tool.objects.filter(name=IDEMPOTENT_TOOL).update(backoff_base_seconds=0.2, max_checks=2)
    return ids

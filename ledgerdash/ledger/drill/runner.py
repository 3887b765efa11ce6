"""The crash drill: failure injection as a deployment gate.

For each case (:mod:`.cases`) real agent workers (:mod:`.agent`) run a task
through the recording API, in process or over the HTTP API, against the
sandbox provider, and are SIGKILLed at the case's crash point; the worker
restarts and re-runs the task as an agent would; people's steps (a retry
request, an approval, marking an attempt failed) are taken where the case
calls for them; reconcilers run as processes of their own where the case is
about them (killed mid-batch, or cut off from the database mid-pass); then
recovery runs in rounds, each a reconciler pass followed at once by a second
pass, both decided at one instant of the ledger's clock (so the second must
change nothing, however slow the machine). Finally the worker runs the task
once more. Every case is judged on the ledger and on the sandbox's own effect
counts (:mod:`.checks`). What a case does between the worker's first run
and the last is its script (:mod:`.scripts`); this module sets the drill
up, runs the cases through their scripts and gathers their evidence.

Every run's idempotency keys are ``drill:<run>-<nonce>:<case>``: no earlier
run (in this database, or in one restored or reset since) can have used
them, so only this run's effects are counted. The drill starts its own
sandbox with a store of its own unless given one.

With a provider (``crashdrill --provider stripe``), the drill starts that
provider's replica instead (:mod:`ledgerdash.replicas`), its tools use the
provider's preset (:mod:`.providers`), each call's arguments are the
preset's, and the drill runs the kinds of tool the provider can be: a
provider that deduplicates by key for the idempotent kinds, one that does
not for the non-idempotent kind. Its search index and the tools' lookups lag
a second (:data:`.providers.LOOKUP_LAG`), so recovery waits out a lag in
every case it looks something up.

The drill owns a tenant (``crashdrill`` by default), three tools
(``drill.send_email``, idempotent, ``drill.charge_card``, not, and
``drill.send_email_claimed``, idempotent with its dispatch claimed in the
intent's commit) and its
people (an operator and an approver, without passwords). Run one drill at a
time per database.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import tomli_w
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from ledgerdash.ledger import clock, config, moves
from ledgerdash.ledger.authority import current_policy
from ledgerdash.ledger.drill import providers as drill_providers
from ledgerdash.ledger.drill.cases import (
    BASELINE_TOOLS,
    CASES,
    CLAIMED_TOOL,
    HTTP,
    IDEMPOTENT_TOOL,
    MCP,
    NARROWED_SCOPES,
    NON_IDEMPOTENT_TOOL,
    Planned,
    fixed_plan,
    random_plan,
)
from ledgerdash.ledger.drill.checks import CaseReport, Check, expectation, judge
from ledgerdash.ledger.drill.processes import (
    AgentServer,
    ReplicaControl,
    SandboxControl,
    database_url,
    replica_service,
    sandbox_service,
    web_service,
)
from ledgerdash.ledger.drill.scripts import SCRIPTS, crash_and_restart
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    DrillRun,
    Membership,
    Role,
    State,
    Tenant,
    Tool,
)
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers.factory import ToolSpec
from ledgerdash.ledger.queries import events_of_attempts, needs_attention
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.ledger.store import event_record
from ledgerdash.ledger.tokens import token_create, token_revoke
from ledgerdash.sandbox import http_adapter_config
from ledgerdash_client import crashpoints

__all__ = ["CASES", "Drill", "Planned", "database_url", "fixed_plan", "leave_unknown", "random_plan"]

S = State
#: The drill's tools: a request takes at most this long, the lease a little longer.
MAX_REQUEST_SECONDS = 1.0
LEASE_SECONDS = 1.5
MAX_ROUNDS = 10
ROUND_DEADLINE = 60.0


class Drill:
    """Runs planned cases against a sandbox and a pair of agent workers."""

    def __init__(
        self,
        *,
        tenant: str = "crashdrill",
        workdir: Path | None = None,
        sandbox_url: str | None = None,
        provider: str | None = None,
        reconciler_factory: Callable[[str], Reconciler] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.tenant_slug = tenant
        self.workdir = workdir or Path(settings.VAR_DIR) / "crashdrill"
        self.sandbox_url = sandbox_url
        #: The provider whose replica the drill runs against (None: the sandbox).
        self.provider = drill_providers.provider(provider) if provider is not None else None
        if self.provider is not None and sandbox_url is not None:
            raise ValueError("a drill runs against a provider's replica or a sandbox, not both")
        self.reconciler_factory = reconciler_factory or (lambda label: Reconciler(label=label, batch_size=20))
        self.progress = progress or (lambda _line: None)
        self.nonce = secrets.token_hex(4)
        self._stack = contextlib.ExitStack()
        self.agents: list[AgentServer] = []
        self.web_url = ""
        self.web_token = ""

    # set-up -------------------------------------------------------------------------------

    def __enter__(self) -> Drill:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.provider is not None:
            self.provider.export_credentials()
            self.sandbox_url = self._stack.enter_context(replica_service(self.provider.name))
            replica = ReplicaControl(self.sandbox_url, baseline={"search_lag_seconds": drill_providers.LOOKUP_LAG})
            if self.provider.modes:
                replica.modes(**self.provider.modes)
            self.sandbox: SandboxControl = replica
        else:
            if self.sandbox_url is None:
                self.sandbox_url = self._stack.enter_context(
                    sandbox_service(self.workdir, name=f"sandbox-{self.nonce}")
                )
            self.sandbox = SandboxControl(self.sandbox_url)
        self.sandbox.clear()
        self._prepare_ledger()
        self.agents = [AgentServer(), AgentServer()]
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
        self.oncall = self._person("oncall")
        self.operator = self._person("operator")
        self.approver = self._person("approver")
        for person, role in ((self.operator, Role.OPERATOR), (self.approver, Role.APPROVER)):
            Membership.objects.update_or_create(user=person, tenant=tenant, defaults={"role": role})
        if tenant.default_owner_id is None:
            Tenant.objects.filter(pk=tenant.pk).update(default_owner=self.oncall)
            tenant.refresh_from_db()
        self.tenant = tenant
        assert self.sandbox_url is not None
        retention: int | None
        if self.provider is None:
            self.adapter_kind, lag, retention = Tool.Adapter.HTTP, None, 3600
            self.adapter_config = http_adapter_config(self.sandbox_url, lookup_timeout=0.5)
        else:
            self.adapter_kind, lag = Tool.Adapter.PRESET, drill_providers.LOOKUP_LAG
            self.adapter_config = self.provider.config(self.sandbox_url)
            retention = self.provider.adapter.retention_seconds
        tools: dict[str, dict[str, Any]] = {}
        for name, idempotent, claim in (
            (IDEMPOTENT_TOOL, True, False),
            (NON_IDEMPOTENT_TOOL, False, False),
            (CLAIMED_TOOL, True, True),
        ):
            if self.provider is not None and idempotent != self.provider.adapter.deduplicates:
                continue  # a kind the provider cannot be; the plan leaves it out
            tools[name] = {
                "adapter": self.adapter_kind,
                "config": self.adapter_config,
                "idempotent": idempotent,
                "claim_with_intent": claim,
                "key_retention_seconds": retention if idempotent else None,
                "lookup_lag_seconds": lag,
                "dispatch_lease_seconds": LEASE_SECONDS,
                "max_request_seconds": MAX_REQUEST_SECONDS,
                "backoff_base_seconds": 0.2,
                "max_checks": 2,
                "max_dispatches": 3,
                "enabled": True,
            }
        if self.provider is None:
            for name, values in tools.items():
                Tool.objects.update_or_create(name=name, defaults=values)
        else:
            # As a team sets a preset tool up: configuration as code (manage.py ledger_config apply).
            text = tomli_w.dumps(
                {"tools": {n: {k: "" if v is None else v for k, v in t.items()} for n, t in tools.items()}}
            )
            config.apply(config.parse(text, "the drill's tools"), actor=Actor.system("crashdrill"))
        self._baseline_policy()

    def _person(self, role: str) -> Any:
        """One of the drill's people: no password, so nobody logs in as them."""
        user, created = get_user_model().objects.get_or_create(username=f"{self.tenant_slug}-{role}")
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        return user

    def _baseline_policy(self) -> None:
        policy = current_policy(self.tenant.pk)
        if policy is None or {k: sorted(v) for k, v in policy.tools.items()} != {
            k: sorted(v) for k, v in BASELINE_TOOLS.items()
        }:
            policy_publish(
                tenant=self.tenant, tools=BASELINE_TOOLS, actor=Actor.system("crashdrill"), note="crash drill baseline"
            )

    def _web(self) -> None:
        """The app itself, served for agents that use the HTTP API, with a token of the drill's own."""
        if self.web_url:
            return
        self.web_url = self._stack.enter_context(web_service(self.workdir))
        token, raw = token_create(
            tenant=self.tenant,
            name=f"crash drill {self.nonce}",
            scopes=["attempts:read", "attempts:write"],
            actor=Actor.system("crashdrill"),
            expires_at=timezone.now() + timedelta(hours=6),
        )
        self.web_token = raw
        self._stack.callback(lambda: token_revoke(token=token, actor=Actor.system("crashdrill")))

    # running ----------------------------------------------------------------------------------

    def run(self, plan: list[Planned], *, mode: str, seed: int | None, queued: DrillRun | None = None) -> DrillRun:
        """Run ``plan`` as one drill; ``queued``, a run announced before (shown as running, no case
        done yet), becomes this run."""
        if any(p.via == HTTP for p in plan):
            self._web()
        fields = {
            "tenant": self.tenant,
            "mode": mode,
            "seed": seed,
            "iterations": len(plan),
            "database": connection.vendor,
            "host": socket.gethostname(),
        }
        if queued is None:
            run = DrillRun.objects.create(**fields)
        else:
            run = queued
            for name, value in {**fields, "started_at": timezone.now()}.items():
                setattr(run, name, value)
            run.save()
        prefix = f"drill:{run.pk}-{self.nonce}:"
        reports = []
        for number, planned in enumerate(plan, start=1):
            report = self.run_case(planned, case_id=f"{number:03d}-{planned.label}", prefix=prefix, run_id=run.pk)
            reports.append(report)
            # Progress for the pages that show a running drill: cases done so far, and failed.
            DrillRun.objects.filter(pk=run.pk).update(
                cases_total=len(reports), cases_failed=sum(1 for r in reports if not r.ok)
            )
            verdict = "ok" if report.ok else "FAILED: " + "; ".join(c.name for c in report.checks if not c.held)
            self.progress(f"{report.id:<34} {planned.crash_at or '-':<20} {verdict}")
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
            "provider": (
                {"name": self.provider.name, "preset": self.provider.preset, "replica": self.sandbox_url}
                if self.provider is not None
                else {"name": "sandbox", "url": self.sandbox_url}
            ),
            "host": run.host,
            "started_at": run.started_at.isoformat(),
            "finished_at": run.finished_at.isoformat(),
            "ok": run.ok,
            "keys": {
                "prefix": prefix,
                "note": f"every key of this run starts with {prefix} (nonce {self.nonce}), which no earlier run "
                "can have used: the provider's effects are counted only under this run's keys",
            },
            "cases": [r.as_dict() for r in reports],
        }
        run.save(update_fields=["finished_at", "ok", "cases_total", "cases_failed", "report"])
        event_record(
            tenant=self.tenant,
            kind=EventKind.DRILL,
            actor=Actor.system("crashdrill"),
            reason=f"crash drill #{run.pk}: {len(reports) - len(failed)} of {len(reports)} cases held every assertion",
            details={"drill_run": run.pk, "ok": run.ok, "seed": seed, "failed": [r.id for r in failed]},
        )
        return run

    def run_case(self, planned: Planned, *, case_id: str, prefix: str, run_id: int) -> CaseReport:
        self._baseline_policy()
        self.sandbox.clear()
        if not planned.idempotent:
            self.sandbox.faults(NON_IDEMPOTENT_TOOL, non_idempotent=True)
        key = prefix + case_id
        case = CASES[planned.letter]
        keys = [key] if case.keys == 1 else [f"{key}/{n}" for n in range(1, case.keys + 1)]
        report = CaseReport(id=case_id, planned=planned, key=key, keys=keys)
        script = SCRIPTS.get(planned.letter, crash_and_restart)
        jobs = [self._job_for(planned, k, f"drill-{run_id}-{case_id}" + k.removeprefix(key)) for k in keys]
        case_checks: list[Check] = script(self, planned, report, jobs) or []
        for job in jobs:
            report.steps.append({"step": "worker runs the task once more", **self.run_job(0, job, "final")})
        self.sandbox.clear()
        self._collect(report)
        report.checks = case_checks + judge(report)
        return report

    def _job_for(self, planned: Planned, key: str, task_id: str) -> dict[str, Any]:
        job: dict[str, Any] = {
            "tenant": self.tenant.slug,
            "task_id": task_id,
            "tool": planned.tool,
            "key": key,
            "args": (
                {"case": planned.letter, "to": "drill@example.com", "amount_cents": 100, "key": key}
                if self.provider is None
                else self.provider.adapter.example_args(key)
            ),
            "via": planned.via,
        }
        if planned.via == HTTP:
            job.update(url=self.web_url, token=self.web_token)
        if planned.via in (HTTP, MCP):
            job.update(
                adapter=ToolSpec(
                    name=planned.tool,
                    adapter=self.adapter_kind,
                    config=self.adapter_config,
                    idempotent=planned.idempotent,
                    max_request_seconds=MAX_REQUEST_SECONDS,
                ).as_dict(),
            )
        return job

    def run_job(self, worker: int, job: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
        agent = self.agents[worker]
        run = {**job, **extra, "id": f"{job['key']}#{name}"}
        agent.send(run)
        return agent.collect(run["id"])

    # what the cases' scripts act through ------------------------------------------------------

    def person_step(self, attempt: Attempt, what: str, *, expect: str) -> dict[str, Any]:
        """An operator or approver acting as the case needs, with what happened."""
        operator, approver = Actor.user(self.operator), Actor.user(self.approver)
        step: dict[str, Any] = {"attempt": attempt.pk}
        try:
            if what == "retry_request":
                step["step"] = f"an operator requests a retry of #{attempt.pk}"
                made = moves.retry_request(attempt=attempt, actor=operator, reason="the customer asks")
                step["detail"] = f"linked attempt #{made.pk}"
            elif what == "mark_failed":
                step["step"] = f"an operator marks #{attempt.pk} failed, without the provider's word"
                moves.attempt_mark_failed(attempt=attempt, actor=operator, reason="the customer says nothing arrived")
            else:
                step["step"] = f"an approver approves #{attempt.pk}, giving no reason why it is safe"
                moves.retry_approve(attempt=attempt, actor=approver, comment="looks fine")
            step["outcome"] = "done"
        except LedgerError as exc:
            step.update(outcome="refused", code=exc.code, detail=str(exc))
        step["expect"] = expectation(f"{what}_{'allowed' if expect == 'done' else 'refused'}", expect)
        return step

    def case_attempts(self, report: CaseReport) -> list[Attempt]:
        match = Q(idempotency_key__in=report.keys)
        return list(Attempt.objects.filter(match, tenant=self.tenant).order_by("id"))

    def wait_until_due(self, report: CaseReport) -> None:
        """Until every in-flight attempt of the case is due (real time passes: leases run out)."""
        deadline = time.monotonic() + ROUND_DEADLINE
        while time.monotonic() < deadline:
            due = [a.next_check_at for a in self.case_attempts(report) if a.state in IN_FLIGHT_STATES]
            latest = max((d for d in due if d is not None), default=None)
            if latest is None or latest <= clock.now():
                return
            time.sleep(min(0.5, (latest - clock.now()).total_seconds() + 0.02))

    def _snapshot(self, report: CaseReport) -> tuple[Any, ...]:
        attempts = self.case_attempts(report)
        return (
            [(a.pk, a.state, a.fence, a.owner_id, a.next_check_at) for a in attempts],
            AttemptEvent.objects.filter(attempt__in=attempts).count(),
        )

    def _observe(self, report: CaseReport, moment: str) -> None:
        queue_ids = set(needs_attention([self.tenant.pk]).values_list("id", flat=True))
        for attempt in self.case_attempts(report):
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

    def recover(self, planned: Planned, report: CaseReport, *, rounds: int = MAX_ROUNDS) -> list[dict[str, Any]]:
        """Recovery in rounds. A round waits (in real time) until the case's
        next attempt falls due, then runs two passes decided at one instant
        of the ledger's clock: the second must find nothing left to do."""
        reconciler = self.reconciler_factory(f"crashdrill-reconciler:{os.getpid()}")
        steps: list[dict[str, Any]] = []
        deadline = time.monotonic() + ROUND_DEADLINE
        authority_changed = False
        for number in range(1, rounds + 1):
            waiting = [a for a in self.case_attempts(report) if a.state in IN_FLIGHT_STATES and a.next_check_at]
            if not waiting and number > 1:
                break
            # The first round runs even when nothing waits: recovery must be
            # safe to run over a case that needs none.
            due = min((a.next_check_at for a in waiting if a.next_check_at is not None), default=clock.now())
            pause = (due - clock.now()).total_seconds()
            if time.monotonic() + max(pause, 0) > deadline:
                steps.append({"step": f"recovery round {number}", "stopped": f"next check is {pause:.1f}s away"})
                break
            if pause > 0:
                time.sleep(pause)
            with clock.frozen_at(clock.now()) as instant:
                first = reconciler.run_pass()
                self._observe(report, f"after recovery round {number}")
                before = self._snapshot(report)
                second = reconciler.run_pass()
                after = self._snapshot(report)
            steps.append(
                {
                    "step": f"recovery round {number}",
                    "at": instant.isoformat(),
                    "first_pass": first.line(),
                    "second_pass": second.line(),
                    "second_pass_changed_case": before != after,
                }
            )
            if (
                planned.letter == "E"
                and not authority_changed
                and any(a.state == S.UNKNOWN for a in self.case_attempts(report))
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
                steps.append(
                    {
                        "step": "authority changed while UNKNOWN",
                        "policy_version": policy.version,
                        "scopes": {planned.tool: NARROWED_SCOPES},
                    }
                )
        return steps

    # evidence ----------------------------------------------------------------------------------

    def _collect(self, report: CaseReport) -> None:
        attempts = self.case_attempts(report)
        report.attempts = [
            {
                "id": a.pk,
                "parent_id": a.parent_id,
                "tenant": self.tenant.slug,
                "tenant_id": a.tenant_id,
                "key": a.idempotency_key,
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
                "failed_because": a.failed_because,
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
            for e in events_of_attempts(list(attempts))
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


def leave_unknown(drill: Drill, *, count: int, run_id: int) -> list[int]:
    """Crash ``count`` agents after their requests left and let one recovery
    pass find the provider's lookup down: real crashes left UNKNOWN, owned,
    backing off. The demo uses this so its UNKNOWN queue is not empty."""
    ids = []
    drill.sandbox.faults(IDEMPOTENT_TOOL, lookup_5xx=True)
    Tool.objects.filter(name=IDEMPOTENT_TOOL).update(backoff_base_seconds=600.0, max_checks=50)
    try:
        for n in range(count):
            key = f"drill:{run_id}-{drill.nonce}:unsettled-{n}"
            job = {
                "tenant": drill.tenant.slug,
                "task_id": f"nightly-digest-{n}",
                "tool": IDEMPOTENT_TOOL,
                "key": key,
                "args": {"to": f"team-{n}@example.com", "digest": "nightly"},
                "via": "process",
            }
            drill.run_job(0, job, "crash", crash_at=crashpoints.AFTER_SEND)
            ids += list(Attempt.objects.filter(tenant=drill.tenant, idempotency_key=key).values_list("id", flat=True))
        time.sleep(LEASE_SECONDS + 0.1)  # past the dispatch lease
        drill.reconciler_factory("crashdrill-reconciler").run_pass()
    finally:
        Tool.objects.filter(name=IDEMPOTENT_TOOL).update(backoff_base_seconds=0.2, max_checks=2)
    return ids

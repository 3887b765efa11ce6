"""What each crash-drill case does between the worker's first run of its
task and the last (:meth:`~.runner.Drill.run_case` runs both, and judges
the case). Most cases are a crash and a restart followed by recovery
(:func:`crash_and_restart`); D and G to L have a script of their own, each
appending the steps it took to the case's report and returning the checks
particular to it. A script acts through the drill: its agent workers
(:meth:`~.runner.Drill.run_job`), its people
(:meth:`~.runner.Drill.person_step`) and its recovery rounds
(:meth:`~.runner.Drill.recover`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ledgerdash.ledger.drill.cases import BASELINE_TOOLS, NARROWED_SCOPES, Planned
from ledgerdash.ledger.drill.checks import CaseReport, Check, expectation
from ledgerdash.ledger.drill.processes import ReconcilerProcess, cut_connection
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import IN_FLIGHT_STATES, Attempt, State
from ledgerdash.ledger.policies import policy_publish
from ledgerdash_client import crashpoints

if TYPE_CHECKING:
    from ledgerdash.ledger.drill.runner import Drill

S = State
#: Claims of the reconcilers the drill kills or cuts off expire after this.
CHILD_CLAIM_SECONDS = 1
SETTLE_DEADLINE = 30.0


def crash_and_restart(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> None:
    """A, B, C, E, F: the worker is killed at the crash point, restarts and
    re-runs the task; recovery runs (E narrows the authority while the
    attempt is UNKNOWN; F's provider lookup times out)."""
    if planned.letter == "E":
        drill.sandbox.faults(planned.tool, lookup_5xx=True)
    if planned.letter == "F":
        drill.sandbox.faults(planned.tool, lookup_timeout=True, lookup_timeout_seconds=2.0)
    crash_then_restart(drill, planned, report, jobs)
    report.steps += drill.recover(planned, report)


def crash_then_restart(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        crash = drill.run_job(0, job, "crash", crash_at=planned.crash_at)
        report.steps.append({"step": f"worker runs the task, killed at {planned.crash_at}", **crash})
    for job in jobs:
        report.steps.append({"step": "worker restarts and re-runs the task", **drill.run_job(1, job, "restart")})


def case_D(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> None:
    (job,) = jobs
    for agent, n in zip(drill.agents, (1, 2), strict=True):
        agent.send({**job, "id": f"{job['key']}#w{n}"})
    runs = [agent.collect(f"{job['key']}#w{n}") for agent, n in zip(drill.agents, (1, 2), strict=True)]
    report.steps += [{"step": f"worker {n} (same message)", **r} for n, r in zip((1, 2), runs, strict=True)]
    report.steps += drill.recover(planned, report)


def case_G(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> list[Check]:
    """The call is made inside the caller's transaction, which then rolls
    back: the ledger must refuse before anything is recorded or sent."""
    (job,) = jobs
    inside = drill.run_job(0, job, "in-transaction", in_transaction=True)
    recorded = drill.case_attempts(report)
    performed = drill.sandbox.count(job["key"])
    report.steps.append(
        {
            "step": "worker runs the task inside a transaction that rolls back",
            "attempts_recorded": len(recorded),
            "performed_at_provider": performed,
            "expect": expectation("refused_inside_a_transaction", "refused", "inside_transaction"),
            **inside,
        }
    )
    report.steps.append({"step": "worker re-runs the task outside a transaction", **drill.run_job(1, job, "restart")})
    report.steps += drill.recover(planned, report)
    return [
        Check(
            "nothing_left_behind_by_the_rollback",
            not recorded and performed == 0,
            f"after the rolled-back call: {len(recorded)} attempts recorded, {performed} effects at the provider",
        )
    ]


def case_H(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> list[Check]:
    """The provider receives the request, cuts the connection, and acts
    only later: the agent reports UNKNOWN at once, the request is still
    on its way. An early "not found" must not count; neither a reworded
    re-run nor a person may send it again meanwhile."""
    (job,) = jobs
    drill.sandbox.faults(planned.tool, hold=True, hold_seconds=SETTLE_DEADLINE)
    first = drill.run_job(0, job, "cut-off")
    report.steps.append({"step": "worker runs the task; the provider cuts the connection and holds it", **first})
    reworded = {**job, "args": {**job["args"], "note": "reworded by the agent after the error"}}
    report.steps.append(
        {
            "step": "worker re-runs the task with reworded arguments",
            "expect": {
                "check": "reworded_rerun_is_not_sent",
                "outcome": "blocked",
                "code": "idempotency_key_reused",
            },
            **drill.run_job(1, reworded, "reworded"),
        }
    )
    report.steps += drill.recover(planned, report, rounds=1)
    original = root(drill, report)
    report.steps.append(drill.person_step(original, "retry_request", expect="refused"))
    linked = newest_child(original)
    if linked is not None:
        report.steps.append(drill.person_step(linked, "approve", expect="refused"))
    report.steps.append(
        {
            "step": "the provider acts on the held request (it lands late)",
            "performed": drill.sandbox.release(planned.tool),
        }
    )
    report.steps += drill.recover(planned, report)
    return []


def case_I(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> list[Check]:
    """The request was performed, the provider cannot be asked, the
    original goes to review; an operator requests a retry, then marks the
    original failed on nobody's evidence. Approving the retry must still
    need a reason: a person's "failed" is a claim."""
    drill.sandbox.faults(planned.tool, lookup_5xx=True)
    crash_then_restart(drill, planned, report, jobs)
    report.steps += drill.recover(planned, report)
    original = root(drill, report)
    report.steps.append(drill.person_step(original, "retry_request", expect="done"))
    report.steps.append(drill.person_step(original, "mark_failed", expect="done"))
    linked = newest_child(original)
    if linked is not None:
        report.steps.append(drill.person_step(linked, "approve", expect="refused"))
    report.steps += drill.recover(planned, report)
    return []


def case_J(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> list[Check]:
    """The worker dies after the intent; the policy then narrows the
    tool's scope. The restarted worker must not send it under the old
    authority, and the key must not die: a linked attempt under the new
    policy goes to review, is approved (the original was never sent) and
    is sent once."""
    (job,) = jobs
    crash = drill.run_job(0, job, "crash", crash_at=planned.crash_at)
    report.steps.append({"step": f"worker runs the task, killed at {planned.crash_at}", **crash})
    policy = policy_publish(
        tenant=drill.tenant,
        tools={**BASELINE_TOOLS, planned.tool: NARROWED_SCOPES},
        actor=Actor.system("crashdrill"),
        note="crash drill: scope narrowed between the intent and the dispatch",
    )
    report.steps.append(
        {"step": "the policy changes before dispatch", "policy_version": policy.version, "scopes": NARROWED_SCOPES}
    )
    report.steps.append(
        {
            "step": "worker restarts and re-runs the task",
            "expect": {
                "check": "not_sent_under_the_old_authority",
                "outcome": "refused",
                "code": "authorization_changed",
            },
            **drill.run_job(1, job, "restart"),
        }
    )
    linked = newest_child(root(drill, report))
    if linked is not None:
        report.steps.append(drill.person_step(linked, "approve", expect="done"))
    report.steps += drill.recover(planned, report)
    linked = newest_child(root(drill, report))
    return [
        Check(
            "the_key_lives_on_under_the_new_policy",
            linked is not None and linked.state == S.OUTCOME_CONFIRMED,
            f"linked attempt #{linked.pk} is {linked.state} under policy v{linked.policy_version}"
            if linked is not None
            else "no linked attempt was recorded: the key died with the policy change",
        )
    ]


def case_K(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> list[Check]:
    """Three requests left and their workers died; a reconciler claims the
    batch and is killed after its first decision. Its claims run out and
    another reconciler finishes the work."""
    crash_then_restart(drill, planned, report, jobs)
    drill.wait_until_due(report)
    child = ReconcilerProcess(
        drill.workdir,
        label=f"crashdrill-doomed-{drill.nonce}",
        args=["--once", "--batch-size", "20"],
        env={crashpoints.ENV: crashpoints.RECONCILER_MID_BATCH, **child_claims()},
    )
    try:
        announce = child.wait_for_announce()
        code = child.kill() if announce is not None else child.proc.wait(timeout=30)
    finally:
        child.close()
    killed = announce is not None and code == -9
    report.steps.append(
        {
            "step": "a reconciler claims the batch and is killed after its first decision",
            "announced": announce,
            "exit": code,
        }
    )
    report.steps += drill.recover(planned, report)
    return [
        Check(
            "reconciler_killed_mid_batch",
            killed,
            f"reconciler pid {child.proc.pid} announced {announce and announce['point']!r} and ended with {code}",
        )
    ]


def case_L(drill: Drill, planned: Planned, report: CaseReport, jobs: list[dict[str, Any]]) -> list[Check]:
    """Three requests left and their workers died; a reconciler loop's
    database connection is cut in the middle of its batch. It must not
    stop: close the broken connection, back off, come back and finish."""
    crash_then_restart(drill, planned, report, jobs)
    drill.wait_until_due(report)
    label = f"crashdrill-survivor-{drill.nonce}"
    child = ReconcilerProcess(
        drill.workdir,
        label=label,
        args=["--interval", "0.2", "--max-backoff", "1", "--batch-size", "20"],
        env={crashpoints.PAUSE_ENV: crashpoints.RECONCILER_MID_BATCH, **child_claims()},
    )
    try:
        announce = child.wait_for_announce()
        cut = cut_connection(announce, child) if announce is not None else "the reconciler never paused"
        settled = wait_until_settled(drill, report, child)
        alive = child.proc.poll() is None
        code = child.stop()
        log = child.log()
    finally:
        child.close()
    lost = "the database is unavailable" in log
    report.steps.append(
        {
            "step": "a reconciler's database connection is cut mid-pass",
            "announced": announce,
            "cut": cut,
            "settled_by_it": settled,
            "alive_after": alive,
            "exit_on_sigterm": code,
            "log": log[-1500:],
        }
    )
    report.steps += drill.recover(planned, report)
    return [
        Check(
            "reconciler_survived_a_cut_connection",
            announce is not None and alive and code == 0 and lost and settled,
            f"{cut}; it logged the outage: {lost}; it settled the case by itself: {settled}; still running "
            f"afterwards: {alive}; exit code on SIGTERM: {code}",
        )
    ]


# --- what the scripts share ----------------------------------------------------------------


def root(drill: Drill, report: CaseReport) -> Attempt:
    return Attempt.objects.get(tenant=drill.tenant, idempotency_key=report.keys[0], parent__isnull=True)


def newest_child(attempt: Attempt) -> Attempt | None:
    return attempt.children.order_by("-id").first()


def child_claims() -> dict[str, str]:
    return {"LEDGER_RECONCILER_CLAIM_SECONDS": str(CHILD_CLAIM_SECONDS)}


def wait_until_settled(drill: Drill, report: CaseReport, child: ReconcilerProcess) -> bool:
    deadline = time.monotonic() + SETTLE_DEADLINE
    while time.monotonic() < deadline and child.proc.poll() is None:
        if not any(a.state in IN_FLIGHT_STATES for a in drill.case_attempts(report)):
            return True
        time.sleep(0.1)
    return False


Script = Callable[["Drill", Planned, CaseReport, list[dict[str, Any]]], "list[Check] | None"]
#: The cases with a script of their own; the others crash and restart.
SCRIPTS: dict[str, Script] = {
    "D": case_D,
    "G": case_G,
    "H": case_H,
    "I": case_I,
    "J": case_J,
    "K": case_K,
    "L": case_L,
}

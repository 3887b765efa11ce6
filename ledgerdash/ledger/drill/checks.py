"""The crash drill's report of one case, and the assertions judged on it.

Every case is judged on what the ledger holds and on what the sandbox
provider says it performed, never on what the agent believed:

- no side effect was performed twice at the provider;
- every effect the provider performed is known to the ledger (an attempt
  confirmed with it, or one a person is deciding);
- every attempt ended OUTCOME_CONFIRMED, FAILED or MANUAL_REVIEW (or
  RECONCILED: superseded by an approved linked retry that itself settled);
- the operator can see the arguments hash (and it is the hash of the
  arguments) and the provider request id wherever the provider gave one;
- no linked retry widened credentials or crossed a tenant;
- UNKNOWN work was in the attention queue with an owner whenever seen;
- the second recovery pass of every round changed nothing;
- the last re-run of the task sent nothing new;

plus what the case itself is about (it crashed where planned, a call in a
transaction was refused, an approval without evidence was refused, …).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.drill.cases import CASES, Planned
from ledgerdash.ledger.models import OWNED_STATES, State

S = State
SETTLED = frozenset({S.OUTCOME_CONFIRMED, S.FAILED, S.MANUAL_REVIEW})


def expectation(check: str, outcome: str, code: str = "") -> dict[str, str]:
    """What a step must come to (a step's ``expect``), judged as the assertion ``check``."""
    return {"check": check, "outcome": outcome, "code": code}


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
    #: every idempotency key the case's task uses (one, or ``key/1``, ``key/2``, …)
    keys: list[str] = field(default_factory=list)
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

    def steps_named(self, prefix: str) -> list[dict[str, Any]]:
        return [step for step in self.steps if step["step"].startswith(prefix)]

    def as_dict(self) -> dict[str, Any]:
        case = CASES[self.planned.letter]
        return {
            "id": self.id,
            "case": case.letter,
            "title": case.title,
            "tool": self.planned.tool,
            "idempotent": self.planned.idempotent,
            "claimed": self.planned.claimed,
            "via": self.planned.via,
            "crash_point": self.planned.crash_at,
            "key": self.key,
            "keys": self.keys,
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


def judge(report: CaseReport) -> list[Check]:
    """Every assertion for ``report``: the case's own first, then the common ones."""
    return [
        *_case_checks(report),
        no_duplicate_effect(report),
        every_effect_known(report),
        every_attempt_settled(report),
        operator_sees_hash_and_request_id(report),
        no_wider_credentials(report),
        unknown_work_queued_and_owned(report),
        second_pass_changed_nothing(report),
        rerun_sent_nothing_new(report),
    ]


def _case_checks(report: CaseReport) -> list[Check]:
    planned = report.planned
    checks = []
    crashes = report.steps_named("worker runs the task, killed at")
    if planned.crash_at:
        checks.append(
            Check(
                "crashed_at_the_point",
                bool(crashes)
                and all(s.get("crashed_at") == planned.crash_at and s.get("signal") == signal.SIGKILL for s in crashes),
                "; ".join(
                    f"worker pid {s.get('killed_pid')} announced {s.get('crashed_at')!r} and ended with signal "
                    f"{s.get('signal')}"
                    for s in crashes
                )
                or "no worker was run to its crash point",
            )
        )
    if planned.letter == "D":
        outcomes = sorted(str(step.get("outcome")) for step in report.steps if "(same message)" in step["step"])
        checks.append(
            Check(
                "both_workers_ran",
                len(outcomes) == 2 and "error" not in outcomes,
                f"the two workers given the same message: {outcomes}",
            )
        )
    for step in report.steps:
        expected = step.get("expect")
        if expected is None:
            continue
        got = step.get("outcome")
        code = step.get("code", "")
        held = got == expected["outcome"] and (not expected.get("code") or code == expected["code"])
        checks.append(
            Check(
                expected["check"],
                held,
                f"{step['step']}: {got} {code}".strip()
                + (f" — {step['detail']}" if step.get("detail") else "")
                + ("" if held else f" (expected {expected['outcome']} {expected.get('code', '')})".rstrip()),
            )
        )
    return checks


def no_duplicate_effect(report: CaseReport) -> Check:
    duplicates = {key: n for key, n in report.effects.items() if n > 1}
    return Check(
        "no_duplicate_effect",
        not duplicates,
        "duplicate effect: "
        + ", ".join(f"key {key} was performed {n} times at the provider" for key, n in duplicates.items())
        if duplicates
        else f"sandbox effect counts: {report.effects or 'none'}",
    )


def every_effect_known(report: CaseReport) -> Check:
    """Each effect the provider performed has an attempt that says so (it is
    confirmed) or that a person is deciding (under review)."""
    unknown = []
    for key, n in report.effects.items():
        if not n:
            continue
        holders = [a for a in report.attempts if a["provider_key"] == key]
        if not any(a["state"] in (S.OUTCOME_CONFIRMED, S.MANUAL_REVIEW) for a in holders):
            states = ", ".join(f"#{a['id']} {a['state']}" for a in holders) or "no attempt"
            unknown.append(f"key {key} performed {n} time(s), but the ledger has {states}")
    performed = {k: n for k, n in report.effects.items() if n}
    return Check(
        "every_effect_known_to_the_ledger",
        not unknown,
        "; ".join(unknown)
        or (
            "; ".join(
                f"{key}: " + ", ".join(f"#{a['id']} {a['state']}" for a in report.attempts if a["provider_key"] == key)
                for key in performed
            )
            or "the provider performed nothing"
        ),
    )


def every_attempt_settled(report: CaseReport) -> Check:
    unsettled = []
    for attempt in report.attempts:
        if attempt["state"] in SETTLED:
            continue
        if attempt["state"] == S.RECONCILED:
            successors = [a for a in report.attempts if a["parent_id"] == attempt["id"]]
            if any(a["state"] in SETTLED for a in successors):
                continue
        unsettled.append(attempt)
    evidence = ", ".join(f"#{a['id']} {a['state']}" for a in report.attempts)
    if unsettled:
        evidence = "not settled: " + ", ".join(f"#{a['id']} {a['state']}" for a in unsettled)
    return Check(
        "every_attempt_settled",
        bool(report.attempts) and not unsettled,
        evidence or "no attempt was recorded",
    )


def operator_sees_hash_and_request_id(report: CaseReport) -> Check:
    problems = []
    for attempt in report.attempts:
        expected = normalize_args(attempt["args"])[1]
        if attempt["args_hash"] != expected:
            problems.append(f"#{attempt['id']} shows hash {attempt['args_hash'][:12]}, not {expected[:12]}")
        performed = report.effects.get(attempt["provider_key"], 0)
        if attempt["state"] == S.OUTCOME_CONFIRMED and not (attempt["provider_request_id"] or attempt["result_ref"]):
            problems.append(f"#{attempt['id']} is confirmed without a request id or receipt")
        if performed and attempt["state"] == S.OUTCOME_CONFIRMED and not attempt["provider_request_id"]:
            problems.append(f"#{attempt['id']} was performed but shows no provider request id")
    shown = ", ".join(
        f"#{a['id']} hash {a['args_hash'][:12]}… request {a['provider_request_id'] or '(none: provider key '}"
        + ("" if a["provider_request_id"] else f"{a['provider_key']})")
        for a in report.attempts
    )
    return Check("operator_sees_hash_and_request_id", not problems, "; ".join(problems) or shown)


def no_wider_credentials(report: CaseReport) -> Check:
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
    linked = [a for a in report.attempts if a["parent_id"] in by_id]
    evidence = "; ".join(problems) or (
        ", ".join(
            f"#{a['id']} scope '{a['credential_scope']}' within #{a['parent_id']}'s "
            f"'{by_id[a['parent_id']]['credential_scope']}', same tenant"
            for a in linked
        )
        or "no linked retry was created"
    )
    return Check("no_retry_widened_credentials_or_crossed_tenants", not problems, evidence)


def unknown_work_queued_and_owned(report: CaseReport) -> Check:
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


def second_pass_changed_nothing(report: CaseReport) -> Check:
    changed = [r["step"] for r in report.steps if r.get("second_pass_changed_case")]
    rounds = [r for r in report.steps if "second_pass" in r]
    return Check(
        "second_pass_changed_nothing",
        not changed,
        f"second pass changed the case in: {changed}"
        if changed
        else f"{len(rounds)} recovery rounds, each decided at one instant; each second pass: "
        + "; ".join(r["second_pass"] for r in rounds),
    )


def rerun_sent_nothing_new(report: CaseReport) -> Check:
    finals = report.steps_named("worker runs the task once more")
    resent = [f for f in finals if f.get("sent") is True or f.get("outcome") not in ("replayed", "blocked")]
    return Check(
        "rerun_after_recovery_sent_nothing_new",
        bool(finals) and not resent,
        "; ".join(f"the last run of the task: {f.get('outcome')} {f.get('code', '')}".strip() for f in finals)
        or "the task was not run again",
    )

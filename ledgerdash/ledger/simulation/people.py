"""The simulation's people, each acting through the ledger's real code:

- operators claim, reassign, re-check, verify, mark failed, request retries,
  abandon intents and comment through the moves, asking
  :mod:`ledgerdash.ledger.rules` first, as the dashboard does;
- approvers approve and reject retries, giving a reason where the rules
  ask for one;
- a policy author publishes new policy versions, changes tools' timing and
  deactivates the tenant for a while;
- an administrator takes a person's membership or account away for a
  while, whatever they are deciding.

What each decides is counted in the run's :class:`~.actors.Truth`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model

from ledgerdash.ledger import archive, audit, configuration, moves, partitions, rules
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.events import Actor as LedgerActor
from ledgerdash.ledger.models import Attempt, Membership, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.simulation.actors import Absence, ApprovalGiven
from ledgerdash.ledger.simulation.provider import newest_event
from ledgerdash.ledger.simulation.scenario import (
    APPROVERS,
    ARCHIVE_PARTITION_SIZE,
    OPERATORS,
    PROVIDERS,
    SCOPES,
    TENANT,
    _least_request_time,
)
from ledgerdash.ledger.simulation.world import Actor

if TYPE_CHECKING:
    from ledgerdash.ledger.simulation.runner import Run

S = State


# --- operators and approvers ----------------------------------------------------------------------------------


def _person(username: str) -> Any:
    return get_user_model().objects.get(username=username)


def operator_body(run: Run, username: str) -> Callable[[Actor], None]:
    def body(actor: Actor) -> None:
        world, rng = run.world, run.world.rng
        user = _person(username)
        me = LedgerActor.user(user)
        colleagues = [_person(name) for name in (*OPERATORS, *APPROVERS) if name != username]
        while not run.settling:
            world.sleep(rng.uniform(10, 400), "away from the dashboard")
            if run.settling:
                return
            work = list(
                Attempt.objects.filter(
                    tenant__slug=TENANT, state__in=[S.UNKNOWN, S.MANUAL_REVIEW, S.INTENT_RECORDED]
                ).order_by("id")
            )
            if not work:
                continue
            attempt = rng.choice(work)
            allowed = rules.moves_for(user, attempt, children=list(attempt.children.order_by("id")))
            choices = [
                name
                for name in (
                    "claim",
                    "assign",
                    "recheck",
                    "verify",
                    "mark_failed",
                    "request_retry",
                    "abandon",
                    "comment",
                )
                if getattr(allowed, name)
            ]
            if not choices:
                continue
            what = rng.choice(choices)
            if allowed.request_retry and rng.random() < 0.3:
                what = "request_retry"  # what a customer waiting on it asks for most
            elif allowed.verify and rng.random() < 0.5:
                # Most of the time an operator looks at the provider first.
                seen = run.network.providers[attempt.tool_name].found(attempt.provider_key)
                what = "verify" if seen is not None else rng.choice([c for c in choices if c != "verify"])
            try:
                _operate(run, what, attempt, me, rng.choice(colleagues))
                run.truth.decided(what)
            except LedgerError:
                run.truth.decided(f"{what} refused")

    return body


def _operate(run: Run, what: str, attempt: Attempt, me: LedgerActor, colleague: Any) -> None:
    if what == "claim":
        moves.attempt_assign(attempt=attempt, owner=_person_of(me), actor=me, expected_owner_id=attempt.owner_id)
    elif what == "assign":
        moves.attempt_assign(attempt=attempt, owner=colleague, actor=me, expected_owner_id=attempt.owner_id)
    elif what == "recheck":
        moves.attempt_recheck(attempt=attempt, actor=me, reason="looking again")
    elif what == "verify":
        # People record true reasons: only what the provider has is verified.
        effect = run.network.providers[attempt.tool_name].found(attempt.provider_key)
        if effect is None:
            return
        moves.attempt_verify(
            attempt=attempt,
            actor=me,
            evidence=f"seen in {attempt.tool_name}'s dashboard",
            provider_request_id=effect.request_id if not attempt.provider_request_id else "",
            fence=attempt.fence,
        )
    elif what == "mark_failed":
        moves.attempt_mark_failed(
            attempt=attempt, actor=me, reason="the customer says it never arrived", fence=attempt.fence
        )
    elif what == "request_retry":
        moves.retry_request(attempt=attempt, actor=me, reason="the customer still needs it")
    elif what == "abandon":
        moves.intent_abandon(attempt=attempt, actor=me, reason="its agent is gone", fence=attempt.fence)
    else:
        moves.attempt_comment(attempt=attempt, actor=me, text="looking into it")


def _person_of(actor: LedgerActor) -> Any:
    assert actor.user_id is not None
    return get_user_model().objects.get(pk=actor.user_id)


def approver_body(run: Run, username: str) -> Callable[[Actor], None]:
    def body(actor: Actor) -> None:
        world, rng = run.world, run.world.rng
        user = _person(username)
        me = LedgerActor.user(user)
        while not run.settling:
            world.sleep(rng.uniform(10, 400), "away from the approvals queue")
            if run.settling:
                return
            waiting = [
                a
                for a in Attempt.objects.filter(tenant__slug=TENANT, state=S.MANUAL_REVIEW).order_by("id")
                if rules.awaiting_approval(a)
            ]
            if not waiting:
                continue
            attempt = rng.choice(waiting)
            original = Attempt.objects.filter(pk=attempt.parent_id).first() if attempt.parent_id is not None else None
            verdict = rules.approval_verdict(attempt, original, user)
            try:
                # A retry the ledger says would never be sent (its side effect happened) is mostly rejected.
                never = any("the side effect happened" in refusal for refusal in verdict.refusals)
                if rng.random() < (0.8 if never else 0.2):
                    moves.retry_reject(attempt=attempt, actor=me, comment="not needed any more", fence=attempt.fence)
                    run.truth.decided("reject")
                elif verdict.needs_reason and rng.random() < 0.7:
                    moves.retry_approve(
                        attempt=attempt,
                        actor=me,
                        comment="the customer asked again",
                        safe_because="checked with the provider's support",
                        fence=attempt.fence,
                    )
                    _approved(run, attempt, with_reason=True)
                    run.truth.decided("approve over a risk, with a reason")
                else:
                    moves.retry_approve(attempt=attempt, actor=me, comment="approved", fence=attempt.fence)
                    _approved(run, attempt, with_reason=False)
                    run.truth.decided("approve")
            except LedgerError:
                run.truth.decided("approval refused")

    return body


def _approved(run: Run, attempt: Attempt, *, with_reason: bool) -> None:
    _step, _tools, approvals, _active = run.truth.authority[-1]
    run.truth.approvals.append(
        ApprovalGiven(attempt.pk, run.world.step, next(run.world.happened), dict(approvals), with_reason)
    )
    # The original's dispatcher, busy until a retry of it was let out, reports now: after the
    # approval, before the retry leaves.
    waiter = run.awaiting_retry.pop(attempt.parent_id, None) if attempt.parent_id is not None else None
    if waiter is not None:
        run.trace.append(f"{'':>22}{waiter.name} wakes: a retry of #{attempt.parent_id} was approved")
        run.world.wake(waiter)


# --- an administrator -------------------------------------------------------------------------


def admin_body(run: Run) -> Callable[[Actor], None]:
    """Takes a person's membership away, or deactivates their account, for
    a while, whatever they are deciding at that moment; then gives it back.
    The ledger must refuse what they decide meanwhile."""

    def body(actor: Actor) -> None:
        world, rng = run.world, run.world.rng
        admin = LedgerActor.system("administrator")
        tenant = Tenant.objects.get(slug=TENANT)
        while not run.settling:
            world.sleep(rng.uniform(60, 900), "between changes to people")
            if run.settling:
                return
            name = rng.choice([*OPERATORS[1:], *APPROVERS])
            user = _person(name)
            membership = Membership.objects.get(user=user, tenant=tenant)
            run.truth.fault("leave")
            account = rng.random() < 0.5
            with configuration.acting_as(admin):
                if account:
                    type(user).objects.filter(pk=user.pk).update(is_active=False)
                else:
                    membership.delete()
            absence = Absence(user.pk, name, newest_event(), "account deactivated" if account else "removed")
            run.truth.absences.append(absence)
            world.sleep(rng.uniform(5, 300), f"with {name} {absence.how}")
            with configuration.acting_as(admin):
                if account:
                    type(user).objects.filter(pk=user.pk).update(is_active=True)
                else:
                    Membership.objects.create(user=user, tenant=tenant, role=membership.role)
            absence.until = newest_event()

    return body


# --- the archive job --------------------------------------------------------------------------


def archiver_body(run: Run) -> Callable[[Actor], None]:
    """The operator's archive job (``event_partitions``, ``verify_audit``,
    ``archive_events --older-than 0``), run every few minutes: the oldest
    partitions whose attempts are all settled leave the database, while
    other attempts at the same side effects still move, and a settled one
    may be moved again by a late report. Nothing the ledger decides after
    may change for it: what it knew stays known."""

    def body(actor: Actor) -> None:
        world, rng, folder = run.world, run.archive_rng, run.archive_dir
        assert folder is not None
        said = "between archive runs"
        while not run.settling:
            world.sleep(rng.uniform(30, 240), said)  # (the trace shows what the last run archived)
            if run.settling:
                return
            partitions.make_ahead(ahead=2, size=ARCHIVE_PARTITION_SIZE)
            audit.verify()
            try:
                done = archive.archive_oldest(folder, older_than=timedelta(0))
            except archive.ArchiveError:
                done = []  # the oldest may not leave yet (an attempt in it still moves): next time
            for _record in done:
                run.truth.fault("archive")
            archived = ", ".join(f"{record.name} ({record.events} events)" for record in done)
            said = f"archived {archived}; between archive runs" if done else "between archive runs"

    return body


# --- the policy author -----------------------------------------------------------------------


def author_body(run: Run) -> Callable[[Actor], None]:
    def body(actor: Actor) -> None:
        world, rng = run.world, run.world.rng
        author = LedgerActor.system("policy-author")
        tools = {name: list(scopes) for name, scopes in SCOPES.items()}
        approvals: dict[str, str] = {}
        # Some seeds' authors change the policy every few seconds (a script gone wild), most now and then.
        tempo = rng.choice([15.0, 60.0, 180.0])
        approvals_seen = 0
        while not run.settling:
            world.sleep(rng.uniform(1, 2 * tempo), "between policy changes")
            if run.settling:
                return
            change = rng.choice(
                [
                    "drop",
                    "restore",
                    "narrow",
                    "narrow",
                    "widen",
                    "hold",
                    "hold",
                    "condition",
                    "tighten",
                    "release",
                    "timing",
                    "deactivate",
                    "freeze",
                    "thaw",
                ]
            )
            name = rng.choice(sorted(SCOPES))
            given = run.truth.approvals[approvals_seen:]
            approvals_seen = len(run.truth.approvals)
            waiting = (
                Attempt.objects.filter(tenant__slug=TENANT, state=S.FAILED_RETRYABLE)
                .order_by("id")
                .values_list("tool_name", flat=True)
                .first()
            )
            called, run.author_called = run.author_called, None
            if called is not None:
                # Woken between a refusal and the call sent again: the tool held, narrowed or dropped.
                change, name = rng.choice(["hold", "narrow", "drop"]), called
            elif given and rng.random() < 0.5:
                # Stricter right after an approval: an incident freeze, or a lower threshold for its tool.
                change = rng.choice(["freeze", "tighten"])
                name = Attempt.objects.filter(pk=given[-1].attempt_id).values_list("tool_name", flat=True).get()
            elif waiting is not None and rng.random() < 0.3:
                # Between a refusal and the call sent again: the tool held, narrowed or dropped.
                change, name = rng.choice(["hold", "narrow", "drop"]), waiting
            run.truth.fault("policy")
            tenant = Tenant.objects.get(slug=TENANT)
            if change == "timing":
                traits = PROVIDERS[name]
                least = _least_request_time(traits)
                max_request = round(least * rng.choice([1.0, 2.0, 4.0]), 2)
                Tool.objects.filter(name=name).update(
                    max_request_seconds=max_request,
                    dispatch_lease_seconds=round(max_request + rng.choice([1, 5, 20]), 2),
                )
                continue
            if change == "deactivate":
                Tenant.objects.filter(pk=tenant.pk).update(is_active=False)
                run.truth.authority.append((world.step, tools, approvals, False))
                world.sleep(rng.uniform(5, 120), "with the tenant deactivated")
                Tenant.objects.filter(pk=tenant.pk).update(is_active=True)
                run.truth.authority.append((world.step, tools, approvals, True))
                continue
            tools, approvals = dict(tools), dict(approvals)
            if change == "drop" and name in tools:
                tools.pop(name)
                approvals.pop(name, None)
            elif change in ("restore", "widen"):
                tools[name] = list(SCOPES[name])
            elif change == "narrow" and tools.get(name):
                tools[name] = tools[name][:-1]
            elif change == "hold" and name in tools:
                approvals[name] = ""
            elif change == "condition" and name in tools:
                approvals[name] = "amount_cents > `5000`"
            elif change == "tighten" and name in tools:
                approvals[name] = "amount_cents > `150`"
            elif change == "release":
                approvals.pop(name, None)
            elif change == "freeze":  # an incident: every call of every tool waits for an approver
                approvals = dict.fromkeys(tools, "")
            elif change == "thaw":
                approvals = {}
            policy_publish(tenant=tenant, tools=tools, approvals=approvals, actor=author, note=f"simulated: {change}")
            run.truth.authority.append((world.step, tools, approvals, True))

    return body

"""Run ``manage.py simulate`` with one hole the ledger once had put back,
to show the simulation finds it (tests/test_simulation.py)::

    python -m tests.sim_holes landing --seeds 80 --no-shrink --json-out out.json

Each hole is the old rule, patched in for this process only; nothing in the
ledger knows of them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime, timedelta


def landing() -> None:
    """A request could land until its claim plus the maximum request time;
    an "unknown" report did not move that."""
    from ledgerdash.ledger import landing as rule
    from ledgerdash.ledger.authority import Timing

    def from_the_claim(at: datetime, timing: Timing) -> datetime:
        return at + timedelta(seconds=timing.max_request_seconds)

    def unmoved(previous: datetime | None, at: datetime, timing: Timing, *, late: bool) -> datetime:
        return previous if previous is not None else from_the_claim(at, timing)

    rule.while_silent = from_the_claim
    rule.after_unknown = unmoved


def late_report() -> None:
    """UNKNOWN could not take a retryable failure, and a report no move
    fitted was refused (409) instead of kept as evidence."""
    from ledgerdash.ledger.errors import StaleFence
    from ledgerdash.ledger.models import ActorKind, State
    from ledgerdash.ledger.moves import agent, base

    base.LEGAL_MOVES.pop((State.UNKNOWN, State.FAILED_RETRYABLE))

    def as_holder(attempt, fence, actor, op, evidence):  # type: ignore[no-untyped-def]
        if attempt.fence == fence:
            try:
                return agent.Report(op(attempt))
            except StaleFence:
                pass
        fresh = agent.get_attempt(attempt.pk)
        if agent.already_reported(fresh, fence, evidence):
            return agent.Report(fresh, replayed=True)
        if fresh.fence == fence:
            return agent.Report(op(fresh))
        if agent._late_report_allowed(fresh, fence, actor):
            return agent.Report(op(fresh), late=True)
        if actor.kind == ActorKind.AGENT and fresh.dispatch_fence == fence:
            return agent.Report(agent.late_evidence(fresh, fence=fence, actor=actor, evidence=evidence), late=True)
        raise StaleFence(StaleFence.MESSAGE.format(attempt_id=attempt.pk, current=fresh.fence, given=fence))

    agent._as_holder = as_holder


def approval_condition() -> None:
    """A dispatch compared tenant, tool and scope only: a policy that began
    holding the tool for approval after the intent did not hold the call."""
    from ledgerdash.ledger import authority

    authority.approval_needed = lambda policy, tool_name, args: ""


def gateway_timeout() -> None:
    """The MCP gateway waited on an upstream for its own timeout (60 s by
    default), whatever the tool's maximum request time."""
    from ledgerdash.ledger.gateway import checks

    checks.timeout_for = lambda settings, max_request: settings.timeout if settings.timeout is not None else 60.0


def chain_standing() -> None:
    """Approving a linked retry weighed only its parent: a retry of a
    reworded call that was never sent needed no reason, though the first
    call of the same side effect had happened."""
    from ledgerdash.ledger import rules

    rules.side_effect_standing = lambda retry, original, **_: rules.original_standing(original)


def past_retention() -> None:
    """A "not found" answered after the provider may have forgotten the key
    was kept as "not_found", and taken for proof."""
    from ledgerdash.ledger import reconciler

    reconciler.PAST_RETENTION = "not_found"


def lookup_lag() -> None:
    """A "not found" counted once the request could no longer land, however
    far the lookup's search index lagged behind."""
    from ledgerdash.ledger import landing

    unlagged = landing.not_found_is_evidence
    landing.could_still_hide = lambda attempt, at, lag: landing.could_still_land(attempt, at)
    landing.not_found_is_evidence = lambda attempt, lag=0.0: unlagged(attempt, 0.0)


def send_gate() -> None:
    """A dispatch re-checked tenant, policy and scope, never what the ledger
    knew of the side effect: a retry approved before a late receipt was
    sent after it."""
    from ledgerdash.ledger import rules

    rules.send_verdict = lambda attempt, **_: rules.SEND


def approval_binding() -> None:
    """Once approved, a call went out under any later policy: a freeze
    published after the approval did not hold it again."""
    from ledgerdash.ledger import authority

    authority.held_again = lambda attempt, policy: ""


def provider_id() -> None:
    """A lookup's match was evidence whatever side effect the ledger had
    recorded it on, and the database let one provider id be recorded on two
    side effects: an alike call never sent was confirmed with another's id."""
    from django.db import connection

    from ledgerdash.ledger import provider_ids
    from ledgerdash.ledger.simulation import scenario

    provider_ids.unless_elsewhere = lambda attempt, lookup: lookup
    provider_ids.elsewhere = lambda attempt: lambda request_id: False
    build = scenario.build_world

    def without_the_rule() -> None:
        build()
        on = " ON ledger_attempt" if connection.vendor == "postgresql" else ""
        with connection.cursor() as cursor:
            for trigger in ("ledger_attempt_provider_id_changed", "ledger_attempt_provider_id_inserted"):
                cursor.execute(f"DROP TRIGGER IF EXISTS {trigger}{on}")

    scenario.build_world = without_the_rule


def clock() -> None:
    """Each process decided by its own host's clock, not the database
    server's: leases, landing times and back-offs written by hosts whose
    clocks disagree (some past the provider-clock margin) were compared."""
    from ledgerdash.ledger.simulation.world import World

    World.ledger_now = World.host_now  # type: ignore[method-assign]


HOLES: dict[str, Callable[[], None]] = {
    "landing": landing,
    "late_report": late_report,
    "approval_condition": approval_condition,
    "gateway_timeout": gateway_timeout,
    "chain_standing": chain_standing,
    "past_retention": past_retention,
    "lookup_lag": lookup_lag,
    "send_gate": send_gate,
    "approval_binding": approval_binding,
    "provider_id": provider_id,
    "clock": clock,
}


def main() -> int:
    hole, *args = sys.argv[1:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.core.management import call_command
    from django.core.management.base import CommandError

    django.setup()
    HOLES[hole]()
    try:
        call_command("simulate", *args)
    except CommandError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every person's move gives the answer :func:`ledgerdash.ledger.rules.moves_for`
gives, for every role and relationship, asked directly against the moves
(not through a view): allowed means the move goes through, refused means
the move raises the refusal the rules name (the role: RoleRequired; four
eyes: SelfApproval; the attempt's state: IllegalTransition), with the same
words.

The people: a viewer, an operator who owns the work under review, an
approver who requested the linked retry, an admin whose token triggered the
held first call, and an approver of another tenant.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from ledgerdash.ledger import moves, recording, rules
from ledgerdash.ledger.errors import (
    ApprovalRefused,
    IllegalTransition,
    LedgerError,
    OwnershipError,
    RoleRequired,
    SelfApproval,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, Membership, State, Tenant
from ledgerdash.ledger.moves import CREATE_MOVES, LEGAL_MOVES
from tests.conftest import AGENT, RECONCILER
from tests.factories import attempt_in
from tests.live import ROOT
from tests.test_approvals import under_review
from tests.test_people_moves_ask_rules import held_first_call

pytestmark = pytest.mark.django_db
S = State

Move = Callable[[Attempt, Any, Any], object]


def _assign_to_other(attempt: Attempt, person: Any, people: Any) -> object:
    other = people["operator"] if person.pk != people["operator"].pk else people["admin"]
    return moves.attempt_assign(attempt=attempt, owner=other, actor=Actor.user(person))


#: Each move of rules.PeoplesMoves, as the ledger function a person calls.
MOVES: dict[str, list[Move]] = {
    "claim": [lambda a, p, _: moves.attempt_assign(attempt=a, owner=p, actor=Actor.user(p))],
    "assign": [_assign_to_other],
    "unassign": [lambda a, p, _: moves.attempt_assign(attempt=a, owner=None, actor=Actor.user(p))],
    "comment": [lambda a, p, _: moves.attempt_comment(attempt=a, actor=Actor.user(p), text="seen")],
    "recheck": [lambda a, p, _: moves.attempt_recheck(attempt=a, actor=Actor.user(p))],
    "verify": [lambda a, p, _: moves.attempt_verify(attempt=a, actor=Actor.user(p), evidence="in the dashboard")],
    "mark_failed": [lambda a, p, _: moves.attempt_mark_failed(attempt=a, actor=Actor.user(p), reason="bounced")],
    "request_retry": [lambda a, p, _: moves.retry_request(attempt=a, actor=Actor.user(p), reason="resend")],
    "decide_retry": [
        lambda a, p, _: moves.retry_approve(attempt=a, actor=Actor.user(p), comment="ok", safe_because="checked"),
        lambda a, p, _: moves.retry_reject(attempt=a, actor=Actor.user(p), comment="no"),
    ],
    "abandon": [lambda a, p, _: moves.intent_abandon(attempt=a, actor=Actor.user(p), reason="not needed")],
}


def test_every_move_of_the_rules_is_walked() -> None:
    assert set(MOVES) == set(rules.MOVES)


def _sent_retry_back_in_review(tenant: Tenant, people: dict[str, Any]) -> Attempt:
    """A linked retry approved, sent, and lost again: it was sent, so it is
    settled like any sent attempt, never approved a second time."""
    original = under_review(tenant, lookup="not_found")
    retry = moves.retry_request(attempt=original, actor=Actor.user(people["operator"]), reason="resend")
    retry = moves.retry_approve(attempt=retry, actor=Actor.user(people["admin"]), comment="ok")
    retry = recording.mark_dispatched(retry, actor=AGENT)
    retry = recording.mark_unknown(retry, reason="timeout", actor=AGENT)
    return moves.attempt_escalate(attempt=retry, actor=RECONCILER, fence=retry.fence, reason="not idempotent")


SITUATIONS: dict[str, Callable[[Tenant, dict[str, Any]], Attempt]] = {
    "intent": lambda t, _: attempt_in(S.INTENT_RECORDED, t, key="k-intent"),
    "unknown": lambda t, _: attempt_in(S.UNKNOWN, t, key="k-unknown"),
    "review, owned by the operator": lambda t, p: moves.attempt_assign(
        attempt=attempt_in(S.MANUAL_REVIEW, t, key="k-review"), owner=p["operator"], actor=Actor.system("t")
    ),
    "linked retry the approver requested": lambda t, p: moves.retry_request(
        attempt=under_review(t, lookup="not_found"), actor=Actor.user(p["approver"]), reason="resend"
    ),
    "first call the admin's token triggered": lambda t, p: held_first_call(t, Actor.user(p["admin"])),
    "sent retry back under review": _sent_retry_back_in_review,
    "confirmed": lambda t, _: attempt_in(S.OUTCOME_CONFIRMED, t, key="k-done"),
}

EXPECTED_ERROR = {
    rules.Because.ROLE: RoleRequired,
    rules.Because.FOUR_EYES: SelfApproval,
    rules.Because.STATE: IllegalTransition,
    rules.Because.OWNERSHIP: OwnershipError,
}


@pytest.fixture
def people(
    tenant_a: Tenant, viewer_a: Any, operator_a: Any, approver_a: Any, admin_a: Any, outsider_b: Any
) -> dict[str, Any]:
    return {
        "viewer": viewer_a,
        "operator": operator_a,
        "approver": approver_a,
        "admin": admin_a,
        "another tenant's approver": outsider_b,
    }


@pytest.mark.parametrize("situation", list(SITUATIONS))
def test_each_move_answers_as_the_rules_do(situation: str, tenant_a: Tenant, people: dict[str, Any]) -> None:
    Membership.objects.filter(user=people["another tenant's approver"]).update(role="approver")
    attempt = SITUATIONS[situation](tenant_a, people)
    walked = 0
    for who, person in people.items():
        for name, calls in MOVES.items():
            for call in calls:
                fresh = Attempt.objects.get(pk=attempt.pk)
                children = list(fresh.children.order_by("id"))
                answer: rules.Allowed = getattr(rules.moves_for(person, fresh, children=children), name)
                where = f"{situation}: {who} {name}"
                with transaction.atomic():
                    outcome = _attempt(call, fresh, person, people)
                    transaction.set_rollback(True)
                _same_answer(where, answer, outcome)
                walked += 1
    assert walked == len(people) * sum(len(calls) for calls in MOVES.values())


def _attempt(call: Move, attempt: Attempt, person: Any, people: dict[str, Any]) -> LedgerError | None:
    try:
        call(attempt, person, people)
    except LedgerError as refused:
        return refused
    return None


def _same_answer(where: str, answer: rules.Allowed, outcome: LedgerError | None) -> None:
    if answer:
        assert outcome is None, f"{where}: the rules allow it, the move refused: {outcome!r}"
        return
    assert outcome is not None, f"{where}: the rules refuse it ({answer.why_not}), the move went through"
    assert answer.because is not None
    expected = EXPECTED_ERROR[answer.because]
    if isinstance(outcome, ApprovalRefused) and not isinstance(outcome, SelfApproval):
        # An approval refused for who decides is recorded with its words, as every refused approval is.
        assert answer.because == rules.Because.ROLE, f"{where}: {outcome!r}"
        assert answer.why_not in outcome.changes, f"{where}: {outcome.changes} lacks {answer.why_not!r}"
        return
    assert type(outcome) is expected, f"{where}: the rules say {answer.because} ({answer.why_not}), got {outcome!r}"
    said = [str(outcome), *getattr(outcome, "changes", [])]
    assert any(answer.why_not in words for words in said), f"{where}: {said} do not say {answer.why_not!r}"


def test_the_readmes_state_diagram_is_the_table_of_legal_moves() -> None:
    """README.md draws every legal move, with who may make it, and nothing else (Mermaid)."""
    (diagram,) = re.findall(r"^```mermaid\n(.*?)^```$", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    names = {"agent": "agent", "reconciler": "reconciler", "person": "user"}
    drawn = {}
    for start, end, who in re.findall(r"^\s*(\S+) --> (\S+): (.+)$", diagram, re.MULTILINE):
        drawn[(start, end)] = {names[w.strip()] for w in who.split(",")}
    table = {(str(a), str(b)): {str(actor) for actor in actors} for (a, b), actors in LEGAL_MOVES.items()}
    table |= {("[*]", str(state)): {str(actor) for actor in actors} for state, actors in CREATE_MOVES.items()}
    assert drawn == table

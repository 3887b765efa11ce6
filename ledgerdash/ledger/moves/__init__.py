"""Every change to an attempt, each one function, grouped by who makes it.

This package is the only writer of ``Attempt.state``. Each move is
keyword-only, named ``<thing>_<verb>``, takes the attempt as its caller read
it (``attempt=``) and the version (``fence=``) the caller acts on, and in one
transaction:

1. compare-and-sets the row on ``(id, state, fence)`` (or locks it, for
   people's decisions, which re-check authority under the lock),
2. checks the move is legal for that actor (:data:`LEGAL_MOVES`),
3. writes the new state and appends its event to the tenant's hash chain.

An illegal move raises a named error from :mod:`ledgerdash.ledger.errors`
and writes nothing. The modules: :mod:`.base` (the state machine),
:mod:`.create` (recording attempts), :mod:`.agent` (the dispatcher's moves),
:mod:`.evidence` (reports, and those that arrive late), :mod:`.reconciler`,
:mod:`.people` (decisions in the dashboard), :mod:`.incidents`.
"""

from __future__ import annotations

from ledgerdash.ledger.moves.agent import (
    attempt_abandon_intent,
    attempt_confirm,
    attempt_dispatch,
    attempt_fail,
    attempt_heartbeat,
    attempt_mark_unknown,
    attempt_record_request_id,
    attempt_report,
)
from ledgerdash.ledger.moves.base import (
    CREATE_MOVES,
    LEGAL_MOVES,
    backoff,
    get_attempt,
    on_attempt,
    refuse_open_transaction,
)
from ledgerdash.ledger.moves.create import (
    NewAttempt,
    attempt_create_intent,
    attempt_create_linked,
    linked_provider_key,
)
from ledgerdash.ledger.moves.evidence import (
    OUTCOME_STATE,
    Outcome,
    Report,
)
from ledgerdash.ledger.moves.incidents import (
    incident_assign,
    incident_resolve,
)
from ledgerdash.ledger.moves.people import (
    BULK_DECISIONS,
    attempt_assign,
    attempt_comment,
    attempt_mark_failed,
    attempt_recheck,
    attempt_verify,
    attempts_assign,
    attempts_decide,
    intent_abandon,
    retry_approve,
    retry_reject,
    retry_request,
)
from ledgerdash.ledger.moves.reconciler import (
    attempt_abandon,
    attempt_check_later,
    attempt_escalate,
    attempt_escalate_for_retry,
    attempt_expire_lease,
    attempt_release,
    attempt_wait_for_landing,
    attempts_claim_due,
    claim_lease,
)

__all__ = [
    "BULK_DECISIONS",
    "CREATE_MOVES",
    "LEGAL_MOVES",
    "OUTCOME_STATE",
    "NewAttempt",
    "Outcome",
    "Report",
    "attempt_abandon",
    "attempt_abandon_intent",
    "attempt_assign",
    "attempt_check_later",
    "attempt_comment",
    "attempt_confirm",
    "attempt_create_intent",
    "attempt_create_linked",
    "attempt_dispatch",
    "attempt_escalate",
    "attempt_escalate_for_retry",
    "attempt_expire_lease",
    "attempt_fail",
    "attempt_heartbeat",
    "attempt_mark_failed",
    "attempt_mark_unknown",
    "attempt_recheck",
    "attempt_record_request_id",
    "attempt_release",
    "attempt_report",
    "attempt_verify",
    "attempt_wait_for_landing",
    "attempts_assign",
    "attempts_claim_due",
    "attempts_decide",
    "backoff",
    "claim_lease",
    "get_attempt",
    "incident_assign",
    "incident_resolve",
    "intent_abandon",
    "linked_provider_key",
    "on_attempt",
    "refuse_open_transaction",
    "retry_approve",
    "retry_reject",
    "retry_request",
]

# Over 600 lines because: it is recovery's whole decision for one attempt, facts first, in the order docs give it.
"""Recovery: reconcile in-flight attempts against the provider.

Never a blind retry, never a blind skip. Each pass claims attempts that are
due (``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL, so any number of
workers share the work) and, for each:

- DISPATCHED past its lease: it is UNKNOWN now; look it up.
- UNKNOWN: ask the provider, facts first:
  - found, and its payload hash matches: confirm (a later policy change does
    not undo a fact); found, but naming a provider id the ledger recorded on
    another side effect: that effect is not this one's, as if not found;
  - found with another payload: MANUAL_REVIEW (someone used the key for
    something else);
  - not found, but the request may still land (less than the tool's
    maximum request time since it was sent or its dispatcher last beat):
    proves nothing yet; look again once it could no longer land;
  - not found after that: a retry is needed. Only when the tool is
    idempotent, the key is within the provider's retention, the dispatch
    budget is not spent and the attempt is still authorized, send it again
    with the same key. A changed authority gets a linked attempt for
    review; anything else a person;
  - unavailable: back off with jitter and decide nothing, until the checks
    are exhausted and a person takes over.
- FAILED_RETRYABLE past its back-off: the provider guaranteed nothing
  happened, so the same key is sent again under re-checked authority.
- INTENT_RECORDED: an approved linked retry is dispatched; an intent nobody
  dispatched within its lease (an approved first call included: its agent
  sends it) is failed as abandoned (nothing was sent).

Every decision is a transition with the lookup result and the reason in its
event. The provider is called with no transaction open; the decision is
applied with the claim's fence, so a claim superseded meanwhile (another
worker, a late report from the agent, an operator) makes it a no-op.

Time comes from :mod:`ledgerdash.ledger.clock`. Given a ``clock``, every
decision of a pass is made at the instant it returned when the pass began
(the crash drill uses this, so two passes in a row decide against one
moment); without one, the ledger's clock (the database server's) as each
decision reads it.

A pass that loses its database connection stops (it cannot decide anything
without it); the loop in ``manage.py reconcile`` closes the connection,
backs off and starts again. The claims the broken pass still held are this
worker's own, and it remembers them: its next pass first hands them back
(each with its claim's fence, so one another worker or an agent moved
meanwhile is left alone) and so takes them up at once, instead of leaving
them until ``LEDGER_RECONCILER_CLAIM_SECONDS`` ends the claim. A worker that
dies with its claims leaves them to that lease.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection

from ledgerdash.ledger import clock, landing, moves, provider_ids, retention
from ledgerdash.ledger.authority import standing_of
from ledgerdash.ledger.errors import (
    AlreadyHappened,
    AuthorizationChanged,
    AwaitingApproval,
    MissingEvidence,
    NothingHappened,
    PermanentFailure,
    RequestIdConflict,
    RequestIdTaken,
    SideEffectInFlight,
    StaleFence,
)
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, ResultSource, State
from ledgerdash.ledger.moves.evidence import Evidence, taken_id_evidence
from ledgerdash.ledger.providers import registry
from ledgerdash.ledger.providers.base import Lookup, LookupStatus, ProviderAdapter, Sought
from ledgerdash.ledger.providers.registry import ToolProfile
from ledgerdash_client import crashpoints
from ledgerdash_client.toolcalls import storable_json

log = logging.getLogger("ledgerdash.reconciler")
S = State
#: What the last lookup of an attempt is recorded as when the provider answered
#: "not found" after it may have forgotten the key: never evidence.
PAST_RETENTION = "past_retention"


def worker_label() -> str:
    return f"reconciler@{socket.gethostname()}:{os.getpid()}"


@dataclass
class PassSummary:
    """What one pass did: decisions by name, plus stale claims and errors."""

    decisions: Counter[str] = field(default_factory=Counter)
    claimed: int = 0
    stale: int = 0
    errors: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> int:
        return sum(n for name, n in self.decisions.items() if name != "released")

    def line(self) -> str:
        parts = [f"claimed={self.claimed}"]
        parts += [f"{name}={n}" for name, n in sorted(self.decisions.items())]
        parts += [f"stale={self.stale}", f"errors={self.errors}", f"in {self.seconds:.2f}s"]
        return "reconcile pass: " + " ".join(parts)


def connection_lost() -> bool:
    """Whether this thread's database connection is gone (a query that
    cannot fail fails), as opposed to one statement having failed."""
    if connection.in_atomic_block:
        return False
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        return True
    return False


def _pause_mid_batch() -> None:
    """The crash drill's pause in the middle of a batch: it names this
    process's database session, and on "drop" closes the connection under the
    ORM's feet, as a server restart or a network cut would leave it."""
    point = crashpoints.RECONCILER_MID_BATCH
    if not crashpoints.pausing(point):
        return
    backend = ""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = f"backend={cursor.fetchone()[0]}"

    def on_line(line: str) -> None:
        if line == "drop" and connection.connection is not None:
            connection.connection.close()

    crashpoints.paused(point, detail=backend, on_line=on_line)


def sought(attempt: Attempt) -> Sought:
    """What a lookup looks for: the attempt as the ledger knows it."""
    return Sought(
        key=attempt.provider_key,
        args_hash=attempt.args_hash,
        args=attempt.args if isinstance(attempt.args, dict) else {},
        request_id=attempt.provider_request_id,
        sent_after=attempt.first_dispatched_at or attempt.created_at,
        lands_by=attempt.lands_by,
        elsewhere=provider_ids.elsewhere(attempt),
    )


def safe_lookup(adapter: ProviderAdapter, attempt: Attempt) -> Lookup:
    """A lookup never raises: an adapter that fails is a provider that is unavailable."""
    try:
        return adapter.find(sought(attempt))
    except Exception as exc:
        log.warning("lookup for attempt %s raised %s", attempt.pk, exc, exc_info=True)
        return Lookup(LookupStatus.UNAVAILABLE, detail=f"adapter raised {type(exc).__name__}: {exc}")


class Reconciler:
    def __init__(
        self,
        *,
        label: str | None = None,
        batch_size: int = 50,
        stop: threading.Event | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.actor = Actor.reconciler(label or worker_label())
        self.batch_size = batch_size
        self.stop = stop or threading.Event()
        #: Decide each pass at the instant this returns when it begins; None: the ledger's clock.
        self.clock = clock
        #: Claims of this worker's not yet decided, by attempt id: after a pass broken by a lost
        #: connection, those it held (the next pass hands them back first).
        self._held: dict[int, Attempt] = {}

    # --- the pass -------------------------------------------------------------------

    def run_pass(self) -> PassSummary:
        """Reconcile everything due now, batch by batch, then return.

        Raises the database's error when the connection is lost (the pass
        cannot go on without it; see the module's docstring)."""
        if self.clock is None:
            return self._pass()
        with clock.frozen_at(self.clock()):
            return self._pass()

    def _pass(self) -> PassSummary:
        started = time.monotonic()
        summary = PassSummary()
        self._hand_back(list(self._held.values()))  # a broken pass's claims: due now, for this pass
        profiles = registry.profiles()
        seen: set[int] = set()
        while not self.stop.is_set():
            claimed = moves.attempts_claim_due(limit=self.batch_size)
            if not claimed:
                break
            summary.claimed += len(claimed)
            self._held.update((attempt.pk, attempt) for attempt in claimed)
            for index, attempt in enumerate(claimed):
                if self.stop.is_set():
                    self._hand_back(claimed[index:])
                    break
                if index == 1:
                    crashpoints.reached(crashpoints.RECONCILER_MID_BATCH)
                    _pause_mid_batch()
                if attempt.pk in seen:
                    self._held.pop(attempt.pk, None)
                    # Due again within this pass: leave it for the next one,
                    # so a pass always ends.
                    self._release(attempt, clock.now() + timedelta(seconds=1))
                    summary.decisions["deferred"] += 1
                    continue
                seen.add(attempt.pk)
                try:
                    summary.decisions[
                        self.reconcile_one(attempt, profiles.get(attempt.tool_name, attempt.tenant_id))
                    ] += 1
                except StaleFence as exc:
                    summary.stale += 1
                    log.info("attempt %s changed under this claim; leaving it: %s", attempt.pk, exc)
                except DatabaseError:
                    summary.errors += 1
                    if connection_lost():
                        log.warning(
                            "attempt %s: the database connection was lost; stopping this pass (its %d claim(s)"
                            " are taken up again once the database answers)",
                            attempt.pk,
                            len(self._held),
                        )
                        raise
                    log.exception("attempt %s: reconciling failed; it is retried when its claim expires", attempt.pk)
                except Exception:
                    summary.errors += 1
                    log.exception("attempt %s: reconciling failed; it is retried when its claim expires", attempt.pk)
                self._held.pop(attempt.pk, None)
        summary.seconds = time.monotonic() - started
        return summary

    def _hand_back(self, attempts: list[Attempt]) -> None:
        """Give claims not decided back, due now (stopping: another worker takes them; after a
        lost connection: this one does). A claim moved on since is left as it is."""
        now = clock.now()
        for attempt in attempts:
            self._release(attempt, now)
            self._held.pop(attempt.pk, None)

    def _release(self, attempt: Attempt, when: datetime) -> None:
        with contextlib.suppress(StaleFence):
            moves.attempt_release(attempt=attempt, fence=attempt.fence, next_check_at=when)

    # --- one attempt ------------------------------------------------------------------

    def reconcile_one(self, attempt: Attempt, tool: ToolProfile | None) -> str:
        """Decide one claimed attempt; returns the decision's name."""
        if attempt.state == S.INTENT_RECORDED:
            return self._intent(attempt, tool)
        if attempt.state == S.DISPATCHED:
            attempt = moves.attempt_expire_lease(attempt=attempt, actor=self.actor, fence=attempt.fence)
            self._log(attempt, "lease expired")
        if attempt.state == S.UNKNOWN:
            return self._unknown(attempt, tool)
        if attempt.state == S.FAILED_RETRYABLE:
            return self._retry(attempt, tool, None)
        self._release(attempt, clock.now() + timedelta(seconds=60))
        return "released"

    def _log(self, attempt: Attempt, decision: str) -> None:
        log.info(
            "attempt %s (%s %s key=%s) %s: %s",
            attempt.pk,
            attempt.tenant_id,
            attempt.tool_name,
            attempt.idempotency_key,
            decision,
            attempt.last_note,
            # Fields of their own for LOG_FORMAT=json (the plain format shows the message only).
            extra={
                "tenant": attempt.tenant_id,
                "attempt": attempt.pk,
                "fence": attempt.fence,
                "state": attempt.state,
                "decision": decision,
            },
        )

    def _escalate(
        self, attempt: Attempt, reason: str, lookup: dict[str, Any] | None = None, looked_at: datetime | None = None
    ) -> str:
        attempt = moves.attempt_escalate(
            attempt=attempt, actor=self.actor, fence=attempt.fence, reason=reason, lookup=lookup, looked_at=looked_at
        )
        self._log(attempt, "escalated")
        return "escalated"

    def _intent(self, attempt: Attempt, tool: ToolProfile | None) -> str:
        """An intent falls due when its lease passed (nobody dispatched it) or
        when a person approved it as a linked retry."""
        if attempt.approved_at is not None:
            # A linked retry has no agent waiting on it: the reconciler sends
            # it. A first call approved before it was sent is its agent's to
            # send, when it calls again.
            first_call = attempt.parent_id is None
            if not first_call and tool is not None and tool.adapter.can_dispatch:
                return self._dispatch(attempt, tool, "approved linked retry: sending it under re-checked authority")
            # Only the agent can send it; give it the intent lease to come back.
            deadline = attempt.approved_at + timedelta(seconds=settings.LEDGER_INTENT_LEASE_SECONDS)
            if deadline > clock.now():
                self._release(attempt, deadline)
                return "released"
            reason = (
                "abandoned: approved, but its agent did not call again within the intent lease; nothing was sent"
                if first_call
                else f"abandoned: approved, but no adapter can send {attempt.tool_name} and the agent did not "
                "dispatch it within the intent lease; nothing was sent"
            )
        else:
            reason = ""
        attempt = moves.attempt_abandon(attempt=attempt, actor=self.actor, fence=attempt.fence, reason=reason)
        self._log(attempt, "abandoned")
        return "abandoned"

    def _unknown(self, attempt: Attempt, tool: ToolProfile | None) -> str:
        if tool is None:
            return self._escalate(
                attempt, f"no provider adapter is configured for {attempt.tool_name}: nothing can look it up"
            )
        # The provider may have looked any time until it answered: a lookup
        # counts from when it was asked (ledgerdash.ledger.landing).
        asked_at = clock.now()
        lookup = provider_ids.unless_elsewhere(attempt, safe_lookup(tool.adapter, attempt))
        details = lookup.as_details()
        if lookup.status == LookupStatus.FOUND:
            return self._found(attempt, lookup, details)
        if lookup.status == LookupStatus.AMBIGUOUS:
            return self._escalate(
                attempt, f"the provider's lookup cannot tell: {lookup.detail or 'ambiguous'}", details, asked_at
            )
        if lookup.status == LookupStatus.NOT_EVIDENCE:
            return self._escalate(
                attempt, f"the provider's lookup could not have seen this call: {lookup.detail}", details, asked_at
            )
        if lookup.status == LookupStatus.NOT_FOUND:
            kept, first = retention.kept(tool.name, tool.adapter, attempt, asked_at), attempt.first_dispatched_at
            if kept is not None and first is not None and first + kept <= asked_at:
                return self._escalate(
                    attempt,
                    f"not found, but the call was first sent {first:%Y-%m-%d %H:%M:%S} UTC, longer ago than the "
                    f"provider keeps what it did ({kept}): not found proves nothing",
                    {**details, "status": PAST_RETENTION},
                    asked_at,
                )
            # A read-after-write consistent answer (Stripe's list) shows whatever landed: no lag to wait.
            lag = 0.0 if lookup.consistent else tool.adapter.lookup_lag_seconds
            if landing.could_still_hide(attempt, asked_at, lag):
                attempt = moves.attempt_wait_for_landing(
                    attempt=attempt, actor=self.actor, fence=attempt.fence, lookup=details, looked_at=asked_at, lag=lag
                )
                self._log(attempt, "waiting for the request to land")
                return "waiting"
            return self._retry(attempt, tool, lookup, asked_at)
        if attempt.check_count + 1 >= tool.max_checks:
            return self._escalate(
                attempt,
                f"checks exhausted: the provider did not answer {attempt.check_count + 1} lookups "
                f"(last: {lookup.detail or 'unavailable'})",
                details,
                asked_at,
            )
        attempt = moves.attempt_check_later(
            attempt=attempt,
            actor=self.actor,
            fence=attempt.fence,
            reason=f"provider unavailable ({lookup.detail or 'no answer'}); deciding nothing, checking again later",
            lookup=details,
            error=lookup.detail,
            backoff_base=tool.backoff_base,
            looked_at=asked_at,
            not_before=lookup.retry_after,
        )
        self._log(attempt, "backed off")
        return "backed_off"

    def _found(self, attempt: Attempt, lookup: Lookup, details: dict[str, Any]) -> str:
        if not lookup.payload_hash:
            if attempt.provider_request_id and lookup.request_id == attempt.provider_request_id:
                why = "provider has our request id for this key (it reports no payload hash)"
            else:
                return self._escalate(
                    attempt,
                    "provider has an effect for this key but reports no payload hash to compare with ours",
                    details,
                )
        elif lookup.payload_hash != attempt.args_hash:
            mismatch = {**details, "status": "mismatch", "provider_status": str(lookup.status)}
            return self._escalate(
                attempt,
                f"provider has an effect for this key with another payload (hash {lookup.payload_hash[:12]}…, "
                f"ours {attempt.args_hash[:12]}…)",
                mismatch,
            )
        else:
            why = "provider has it and its payload hash matches"
        try:
            attempt = moves.attempt_confirm(
                attempt=attempt,
                fence=attempt.fence,
                actor=self.actor,
                provider_request_id=lookup.request_id,
                result_ref=""
                if (lookup.request_id or attempt.provider_request_id)
                else f"lookup:{attempt.provider_key}",
                result=storable_json(lookup.document)[0],
                result_source=ResultSource.LOOKUP if storable_json(lookup.document)[0] is not None else "",
                reason=why,
                details={"lookup": details},
            )
        except RequestIdConflict:
            return self._escalate(
                attempt,
                f"provider's request id {lookup.request_id} for this key is not the recorded "
                f"{attempt.provider_request_id}",
                details,
            )
        except RequestIdTaken as taken:  # another side effect recorded it since the lookup
            return self._escalate(attempt, f"found, but not this call's: {taken}", details)
        except MissingEvidence:  # pragma: no cover - result_ref above always gives evidence
            return self._escalate(attempt, "found, but without a request id to record", details)
        self._log(attempt, "confirmed")
        return "confirmed"

    def _retry(
        self, attempt: Attempt, tool: ToolProfile | None, lookup: Lookup | None, looked_at: datetime | None = None
    ) -> str:
        """A retry is needed (not found once the request could no longer land,
        or rejected before acting). Decide whether it is safe."""
        details = lookup.as_details() if lookup is not None else None
        said = "not found at the provider" if lookup is not None else "the provider rejected it before acting"
        if details is not None and "left_out" in details:
            said += f" ({provider_ids.left_out_note(details['left_out'])})"
        if tool is None or not tool.adapter.can_dispatch:
            return self._escalate(
                attempt, f"{said}, and no adapter can send {attempt.tool_name} again", details, looked_at
            )
        if attempt.state == S.UNKNOWN:
            if not tool.adapter.idempotent:
                return self._escalate(
                    attempt,
                    f"{said}, but {attempt.tool_name} is not idempotent: the ledger never sends it again by itself, "
                    "so a person decides",
                    details,
                    looked_at,
                )
            if tool.adapter.key_retention is not None and attempt.first_dispatched_at is not None:
                expires = attempt.first_dispatched_at + tool.adapter.key_retention
                if expires <= clock.now():
                    # The answer came after the provider may have forgotten the key:
                    # recorded as such, so no one takes this "not found" for proof.
                    forgotten = {**(details or {}), "status": PAST_RETENTION}
                    return self._escalate(
                        attempt,
                        f"{said}, but the key was first sent {attempt.first_dispatched_at:%Y-%m-%d %H:%M:%S} UTC, "
                        f"past the provider's key retention ({tool.adapter.key_retention}): not found proves nothing "
                        "and a retry could repeat the effect",
                        forgotten,
                        looked_at,
                    )
        if attempt.dispatch_count >= tool.max_dispatches:
            return self._escalate(
                attempt,
                f"{said}; sent {attempt.dispatch_count} times already (limit {tool.max_dispatches}): a person decides",
                details,
                looked_at,
            )
        standing = standing_of(attempt)
        if not standing.holds:
            original, linked = moves.attempt_escalate_for_retry(
                attempt=attempt,
                actor=self.actor,
                fence=attempt.fence,
                changes=standing.refusals,
                lookup=details,
                looked_at=looked_at,
            )
            self._log(original, f"linked attempt #{linked.pk}" if linked else "escalated")
            return "linked" if linked else "escalated"
        why = (
            f"{said}; {attempt.tool_name} is idempotent, the key is within retention and the attempt is "
            "still authorized: sending again with the same key"
            if lookup is not None
            else f"{said}; back-off passed and the attempt is still authorized: sending again with the same key"
        )
        return self._dispatch(attempt, tool, why, {"lookup": details} if details is not None else {})

    def _dispatch(self, attempt: Attempt, tool: ToolProfile, why: str, details: dict[str, Any] | None = None) -> str:
        try:
            attempt = moves.attempt_dispatch(attempt=attempt, actor=self.actor, fence=attempt.fence, reason=why)
        except AwaitingApproval as exc:
            # Not sent: the current policy holds it by a rule its approval was not given under.
            self._log(exc.attempt if isinstance(exc.attempt, Attempt) else attempt, "held again for approval")
            return "held_again"
        except AlreadyHappened as exc:
            # Not sent: another attempt at the side effect acted; settled, with an incident for its people.
            self._log(exc.attempt if isinstance(exc.attempt, Attempt) else attempt, "not sent: it happened")
            return "not_sent"
        except SideEffectInFlight as exc:
            # A request of the side effect may still land (or another attempt may yet be sent): ask again then.
            self._release(attempt, (exc.due or clock.now() + moves.claim_lease()) + timedelta(milliseconds=1))
            log.info("attempt %s not sent yet: %s", attempt.pk, exc)
            return "released"
        except AuthorizationChanged as exc:
            # Not sent: the ledger put it under review beside a linked attempt.
            self._log(
                exc.original if isinstance(exc.original, Attempt) else attempt, "authority changed before sending"
            )
            return "linked" if exc.attempt is not None and exc.attempt.parent_id == attempt.pk else "escalated"
        holder = {"attempt": attempt}
        fence = attempt.fence

        def on_request_id(request_id: str) -> None:
            holder["attempt"] = moves.attempt_record_request_id(
                attempt=holder["attempt"], fence=fence, request_id=request_id, actor=self.actor
            )

        try:
            sent = tool.adapter.dispatch(key=attempt.provider_key, args=attempt.args, on_request_id=on_request_id)
        except NothingHappened as exc:
            attempt = moves.attempt_fail(
                attempt=holder["attempt"],
                fence=fence,
                actor=self.actor,
                reason=str(exc),
                retryable=True,
                not_before=getattr(exc, "retry_after", None),
            )
            self._log(attempt, "rejected")
            return "rejected"
        except PermanentFailure as exc:
            attempt = moves.attempt_fail(attempt=holder["attempt"], fence=fence, actor=self.actor, reason=str(exc))
            self._log(attempt, "failed")
            return "failed"
        except RequestIdTaken as taken:
            return self._taken(holder["attempt"], fence, tool, taken, Evidence("request_id", taken.request_id))
        except Exception as exc:
            attempt = moves.attempt_mark_unknown(
                attempt=holder["attempt"],
                fence=fence,
                actor=self.actor,
                reason=f"sent again with the same key; no answer ({type(exc).__name__}: {exc})",
                check_at=clock.now() + moves.backoff(1, base=tool.backoff_base),
            )
            self._log(attempt, "unknown after re-send")
            return "resent_unknown"
        attempt = holder["attempt"]
        if not (sent.request_id or sent.result_ref or attempt.provider_request_id):
            attempt = moves.attempt_mark_unknown(
                attempt=attempt,
                fence=fence,
                actor=self.actor,
                reason="sent again; the provider answered without a receipt, so it will be looked up",
                check_at=clock.now() + moves.backoff(1, base=tool.backoff_base),
            )
            return "resent_unknown"
        try:
            attempt = moves.attempt_confirm(
                attempt=attempt,
                fence=fence,
                actor=self.actor,
                provider_request_id=sent.request_id,
                result_ref=sent.result_ref,
                result=storable_json(sent.response)[0],
                reason="sent again with the same key; the provider answered with a receipt",
                details=details,
            )
        except RequestIdTaken as taken:
            return self._taken(attempt, fence, tool, taken, Evidence("confirmed", sent.request_id, sent.result_ref))
        self._log(attempt, "re-sent and confirmed")
        return "resent"

    def _taken(self, attempt: Attempt, fence: int, tool: ToolProfile, taken: RequestIdTaken, said: Evidence) -> str:
        """The provider answered this send with an id another side effect holds: kept as
        evidence (with an incident), and the attempt looked up again, that id left out."""
        taken_id_evidence(attempt, fence=fence, actor=self.actor, evidence=said, taken=taken)
        attempt = moves.attempt_mark_unknown(
            attempt=attempt,
            fence=fence,
            actor=self.actor,
            reason=f"sent again with the same key; the provider's answer is not this call's: {taken}",
            check_at=clock.now() + moves.backoff(1, base=tool.backoff_base),
        )
        self._log(attempt, "unknown after re-send")
        return "resent_unknown"

"""A model-based search for a sequence of crashes, recoveries and decisions
that breaks the drill's invariants. Hypothesis drives agents (record,
dispatch, send, crash, a request still on its way that beats, lands late or
never, an intent given up), the reconciler, policy changes (between intent
and dispatch too), provider faults and people's decisions (a retry, an
approval without a reason, marking an attempt failed on nobody's evidence)
in any order, against the real sandbox; after every step the invariants
must hold: no effect twice at the provider, and every effect the provider
performed known to the ledger.

Time is the machine's own: every step runs at ``self.now`` on the ledger's
clock, and only recovery moves it on. A request on its way lands only while
it still can (before its ``lands_by``), as the ledger assumes of providers.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ledgerdash.ledger import chain, clock, moves, recording
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    Attempt,
    AttemptEvent,
    FailedBecause,
    Incident,
    State,
    Tenant,
    Tool,
)
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers.registry import profile_for
from ledgerdash.ledger.reconciler import Reconciler
from tests.conftest import TOOLS_V1
from tests.sandboxes import Sandbox

S = State
TOOLS = ("send_email", "charge_card")  # idempotent, and not (see the sandbox_tools fixture)


class LedgerMachine(RuleBasedStateMachine):
    tenant: Tenant
    sandbox: Sandbox
    operator: Any
    approver: Any

    def __init__(self) -> None:
        super().__init__()
        self.prefix = uuid.uuid4().hex[:8]
        self.keys: set[str] = set()
        self.reconciler = Reconciler(label="hypothesis-reconciler")
        self.sandbox.clear()
        self.sandbox.faults("charge_card", non_idempotent=True)
        self.now = timezone.now()
        #: requests sent and not yet arrived: (the dispatcher's attempt, its fence)
        self.in_flight: list[tuple[Attempt, int]] = []
        self.agent = Actor.agent("hypothesis-agent")

    def at_now(self) -> Any:
        return clock.frozen_at(self.now)

    def _attempts(self) -> list[Attempt]:
        return list(Attempt.objects.filter(tenant=self.tenant, idempotency_key__in=self.keys).order_by("id"))

    def _pick(self, data: st.DataObject, states: tuple[str, ...]) -> Attempt | None:
        candidates = [a for a in self._attempts() if a.state in states]
        return data.draw(st.sampled_from(candidates)) if candidates else None

    # --- agents ---------------------------------------------------------------------------

    @rule(
        n=st.integers(0, 1),
        tool=st.sampled_from(TOOLS),
        variant=st.integers(0, 1),
        crash=st.sampled_from(
            ["after_send", "none", "after_intent", "before_send", "after_response", "on_its_way", "cut_off"]
        ),
    )
    def agent_runs(self, n: int, tool: str, variant: int, crash: str) -> None:
        """An agent runs one tool call and may die at any of the drill's points,
        or wait on a request still on its way to the provider."""
        with self.at_now():
            self._agent_runs(n, tool, variant, crash)

    def _agent_runs(self, n: int, tool: str, variant: int, crash: str) -> None:
        key = f"{self.prefix}-{tool}-{n}"
        self.keys.add(key)
        agent = self.agent
        try:
            attempt = recording.record_intent(
                tenant=self.tenant,
                task_id="hypothesis",
                tool_name=tool,
                idempotency_key=key,
                args={"n": n, "variant": variant},
                actor=agent,
            ).attempt
            recording.refuse_unless_dispatchable(attempt)
            if attempt.state == S.OUTCOME_CONFIRMED or crash == "after_intent":
                return
            attempt = recording.mark_dispatched(attempt, actor=agent)
        except LedgerError:
            return  # a conflict, work in flight or under review, a changed policy: the agent stops
        if crash == "before_send":
            return
        if crash in ("on_its_way", "cut_off"):
            # The request is on its way; when the connection was cut off the
            # agent reports UNKNOWN at once, and the provider may still act.
            self.in_flight.append((Attempt.objects.get(pk=attempt.pk), attempt.fence))
            if crash == "cut_off":
                with contextlib.suppress(LedgerError):
                    recording.mark_unknown(attempt, reason="connection reset", actor=agent)
            return
        profile = profile_for(tool)
        assert profile is not None
        sent = profile.adapter.dispatch(key=attempt.provider_key, args=attempt.args)
        if crash == "after_send":
            return
        with contextlib.suppress(LedgerError):
            attempt = recording.record_request_id(attempt, sent.request_id, actor=agent)
            if crash == "none":
                recording.confirm(attempt, actor=agent)

    # --- recovery and the world ---------------------------------------------------------------

    @rule(data=st.data())
    def agent_beats(self, data: st.DataObject) -> None:
        """A dispatcher still waiting on its request says so."""
        if not self.in_flight:
            return
        attempt, fence = data.draw(st.sampled_from(self.in_flight))
        with self.at_now(), contextlib.suppress(LedgerError):
            recording.heartbeat(attempt, fence=fence, actor=self.agent)

    @rule(data=st.data(), answered=st.booleans())
    def request_lands(self, data: st.DataObject, answered: bool) -> None:
        """A request on its way reaches the provider, which acts; its
        dispatcher hears back (a late report, perhaps) or dies first."""
        if not self.in_flight:
            return
        attempt, fence = data.draw(st.sampled_from(self.in_flight))
        self.in_flight.remove((attempt, fence))
        status, body = self.sandbox.perform(attempt.tool_name, attempt.provider_key, attempt.args)
        assert status in (200, 201), body
        if answered:
            with self.at_now():
                recording.confirm(attempt, fence=fence, provider_request_id=body["id"], actor=self.agent)

    @rule(data=st.data())
    def agent_abandons(self, data: st.DataObject) -> None:
        """An agent that re-ran with other arguments gives up its unsent intent."""
        attempt = self._pick(data, (S.INTENT_RECORDED,))
        if attempt is None:
            return
        with self.at_now(), contextlib.suppress(LedgerError):
            recording.abandon(attempt, reason="re-ran with other arguments", actor=self.agent)

    @rule(lookup_down=st.booleans())
    def reconcile_twice(self, lookup_down: bool) -> None:
        """Time passes (leases, back-offs and landing windows run out) and
        recovery runs twice at that moment, with the provider's lookup API up
        or down. A request on its way that could not land by then never will."""
        for tool in TOOLS:
            self.sandbox.faults(tool, lookup_5xx=lookup_down)
        due = [
            a.next_check_at
            for a in self._attempts()
            if a.next_check_at and not (a.state == S.INTENT_RECORDED and a.approved_at is None)
        ]
        if due:
            self.now = max(self.now, max(due) + timedelta(milliseconds=1))
        for attempt, fence in list(self.in_flight):
            attempt.refresh_from_db()
            if attempt.lands_by is None or attempt.lands_by < self.now:
                self.in_flight.remove((attempt, fence))  # timed out at the provider: it never lands
        with self.at_now():
            self.reconciler.run_pass()
            before = self._snapshot()
            second = self.reconciler.run_pass()
        assert self._snapshot() == before, f"the second pass changed the ledger: {second.line()}"

    def _snapshot(self) -> Any:
        attempts = self._attempts()
        return (
            [(a.pk, a.state, a.fence, a.owner_id) for a in attempts],
            AttemptEvent.objects.filter(attempt__in=attempts).count(),
        )

    @rule(narrow=st.booleans())
    def change_policy(self, narrow: bool) -> None:
        """Between any two steps (an intent and its dispatch among them)."""
        tools = dict(TOOLS_V1)
        if narrow:
            tools["charge_card"] = ["payments:charge"]
        with self.at_now():
            policy_publish(tenant=self.tenant, tools=tools, actor=Actor.system("hypothesis"))

    # --- people ---------------------------------------------------------------------------------

    @rule(data=st.data())
    def request_retry(self, data: st.DataObject) -> None:
        attempt = self._pick(data, (S.MANUAL_REVIEW,))
        if attempt is None:
            return
        with self.at_now(), contextlib.suppress(LedgerError):
            moves.retry_request(attempt=attempt, actor=Actor.user(self.operator), reason="retry")

    @rule(data=st.data())
    def operator_marks_failed(self, data: st.DataObject) -> None:
        """On nobody's evidence: a person's claim."""
        attempt = self._pick(data, (S.MANUAL_REVIEW,))
        if attempt is None:
            return
        with self.at_now(), contextlib.suppress(LedgerError):
            moves.attempt_mark_failed(
                attempt=attempt, actor=Actor.user(self.operator), reason="the customer says it never arrived"
            )

    @rule(data=st.data(), approve=st.booleans())
    def decide(self, data: st.DataObject, approve: bool) -> None:
        retries = [a for a in self._attempts() if a.state == S.MANUAL_REVIEW and a.parent_id]
        if not retries:
            return
        retry = data.draw(st.sampled_from(retries))
        with self.at_now():
            self._decide(retry, approve)

    def _decide(self, retry: Attempt, approve: bool) -> None:
        try:
            if approve:
                moves.retry_approve(
                    attempt=retry,
                    actor=Actor.user(self.approver),
                    comment="checked",
                )
            else:
                moves.retry_reject(attempt=retry, actor=Actor.user(self.approver), comment="no")
        except LedgerError:
            pass  # refused: recorded, and nothing moved

    # --- the drill's invariants -------------------------------------------------------------------

    @invariant()
    def no_non_idempotent_effect_happened_twice(self) -> None:
        for attempt in self._attempts():
            if attempt.tool_name == "charge_card":
                count = self.sandbox.count(attempt.provider_key)
                assert count <= 1, f"{attempt.provider_key} was charged {count} times"

    @invariant()
    def every_effect_the_provider_performed_is_known_to_the_ledger(self) -> None:
        """No effect is silently settled as not having happened: an attempt
        with its key is confirmed, still being worked on (by machines or
        people), or failed on a person's recorded word; or an incident says so."""
        attempts = self._attempts()
        incidents = set(Incident.objects.filter(attempt__in=attempts).values_list("attempt_id", flat=True))
        for key in {a.provider_key for a in attempts}:
            if not self.sandbox.count(key):
                continue
            holders = [a for a in attempts if a.provider_key == key]
            known = any(
                a.state in (S.OUTCOME_CONFIRMED, S.MANUAL_REVIEW, *IN_FLIGHT_STATES)
                or (a.state == S.FAILED and a.failed_because == FailedBecause.PERSON)
                or a.pk in incidents
                for a in holders
            )
            assert known, f"{key} was performed, but the ledger has " + ", ".join(
                f"#{a.pk} {a.state} {a.failed_because}" for a in holders
            )

    @invariant()
    def stuck_work_has_an_owner(self) -> None:
        for attempt in self._attempts():
            if attempt.state in OWNED_STATES:
                assert attempt.owner_id is not None, f"#{attempt.pk} is {attempt.state} with no owner"

    @invariant()
    def a_confirmation_has_a_receipt(self) -> None:
        for attempt in self._attempts():
            if attempt.state == S.OUTCOME_CONFIRMED:
                assert attempt.provider_request_id or attempt.result_ref

    @invariant()
    def no_retry_widens_credentials_or_crosses_tenants(self) -> None:
        by_id = {a.pk: a for a in self._attempts()}
        for attempt in by_id.values():
            parent = by_id.get(attempt.parent_id) if attempt.parent_id else None
            if parent is not None:
                assert attempt.scopes <= parent.scopes
                assert attempt.tenant_id == parent.tenant_id

    @invariant()
    def one_root_per_key(self) -> None:
        roots = [a.idempotency_key for a in self._attempts() if a.parent_id is None]
        assert len(roots) == len(set(roots))

    @invariant()
    def the_event_chain_is_intact(self) -> None:
        prev = chain.GENESIS
        for event in AttemptEvent.objects.filter(tenant=self.tenant).order_by("seq"):
            assert event.prev_hash == prev
            assert event.content_hash == chain.content_hash(chain.event_content(event))
            assert event.hash == chain.link(prev, event.content_hash)
            prev = event.hash


@pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="the model runs in the SQLite pass; PostgreSQL's concurrency has its own tests",
)
def test_no_sequence_of_crashes_and_decisions_breaks_the_invariants(
    tenant_a: Tenant, sandbox_tools: Sandbox, operator_a: Any, approver_a: Any
) -> None:
    # One unanswered lookup hands an attempt to people: the search reaches
    # decisions about work that may or may not have happened in few steps.
    Tool.objects.filter(name__in=TOOLS).update(backoff_base_seconds=0.01, max_checks=1)
    LedgerMachine.tenant = tenant_a
    LedgerMachine.sandbox = sandbox_tools
    LedgerMachine.operator = operator_a
    LedgerMachine.approver = approver_a
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning"),
]

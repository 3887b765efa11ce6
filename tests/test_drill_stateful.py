"""A model-based search for a sequence of crashes, recoveries and decisions
that breaks the drill's invariants. Hypothesis drives agents (record,
dispatch, send, crash), the reconciler, policy changes, provider faults and
people's decisions in any order, against the real sandbox; after every step
the invariants must hold."""

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

from ledgerdash.ledger import chain, recording, transitions
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.models import OWNED_STATES, Attempt, AttemptEvent, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers.registry import profile_for
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.ledger.transitions import Actor
from reviews.models import Role
from reviews.permissions import may_act_as
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
        crash=st.sampled_from(["after_send", "none", "after_intent", "before_send", "after_response"]),
    )
    def agent_runs(self, n: int, tool: str, variant: int, crash: str) -> None:
        """An agent runs one tool call and may die at any of the drill's points."""
        key = f"{self.prefix}-{tool}-{n}"
        self.keys.add(key)
        agent = Actor.agent("hypothesis-agent")
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

    @rule(lookup_down=st.booleans())
    def reconcile_twice(self, lookup_down: bool) -> None:
        """Time passes (leases and back-offs run out) and recovery runs twice,
        with the provider's lookup API up or down."""
        for tool in TOOLS:
            self.sandbox.faults(tool, lookup_5xx=lookup_down)
        past = timezone.now() - timedelta(seconds=1)
        Attempt.objects.filter(pk__in=[a.pk for a in self._attempts() if a.next_check_at]).exclude(
            state=S.INTENT_RECORDED, approved_at__isnull=True
        ).update(next_check_at=past)
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
        tools = dict(TOOLS_V1)
        if narrow:
            tools["charge_card"] = ["payments:charge"]
        policy_publish(tenant=self.tenant, tools=tools, actor=Actor.system("hypothesis"))

    # --- people ---------------------------------------------------------------------------------

    @rule(data=st.data())
    def request_retry(self, data: st.DataObject) -> None:
        attempt = self._pick(data, (S.MANUAL_REVIEW,))
        if attempt is None:
            return
        with contextlib.suppress(LedgerError):
            transitions.retry_request(attempt_id=attempt.pk, actor=Actor.user(self.operator), reason="retry")

    @rule(data=st.data(), approve=st.booleans())
    def decide(self, data: st.DataObject, approve: bool) -> None:
        retries = [a for a in self._attempts() if a.state == S.MANUAL_REVIEW and a.parent_id]
        if not retries:
            return
        retry = data.draw(st.sampled_from(retries))
        try:
            if approve:
                transitions.retry_approve(
                    attempt_id=retry.pk,
                    actor=Actor.user(self.approver),
                    comment="checked",
                    may_act=may_act_as(self.approver, Role.APPROVER),
                )
            else:
                transitions.retry_reject(attempt_id=retry.pk, actor=Actor.user(self.approver), comment="no")
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

"""The chain under concurrent writers: many agents of one tenant recording,
dispatching and confirming at once leave one unbroken chain."""

from __future__ import annotations

import pytest

from ledgerdash.ledger import audit, recording
from ledgerdash.ledger.models import AttemptEvent, Tenant
from ledgerdash.ledger.transitions import Actor
from tests.conftest import together


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_agents_leave_one_unbroken_chain(tenant_a: Tenant) -> None:
    errors: list[BaseException] = []

    def agent(n: int) -> None:
        actor = Actor.agent(f"agent-{n}")
        try:
            for i in range(25):
                attempt = recording.record_intent(
                    tenant="acme",
                    task_id=f"t{n}",
                    tool_name="send_email",
                    idempotency_key=f"k-{n}-{i}",
                    args={"n": n, "i": i},
                    actor=actor,
                ).attempt
                attempt = recording.mark_dispatched(attempt, actor=actor)
                recording.confirm(attempt, provider_request_id=f"r-{n}-{i}", actor=actor)
        except BaseException as exc:
            errors.append(exc)

    together(agent, range(8))
    assert errors == []
    (result,) = audit.verify([tenant_a], save=False)
    assert result.ok, result
    seqs = list(AttemptEvent.objects.filter(tenant=tenant_a).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert AttemptEvent.objects.filter(tenant=tenant_a, attempt__isnull=False).count() == 8 * 25 * 3

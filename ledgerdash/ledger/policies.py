"""Publishing a tenant's policy: always a new version, recorded in the chain."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max

from ledgerdash.ledger.events import Actor, EventKind, event_record
from ledgerdash.ledger.models import Policy, Tenant, validate_policy_tools


def policy_publish(*, tenant: Tenant, tools: dict[str, Any], actor: Actor, note: str = "") -> Policy:
    """Publish ``tools`` as the tenant's next policy version.

    Attempts recorded under an older version keep naming it; dispatching,
    retrying or approving them afterwards sees the change and refuses or
    routes them to review.
    """
    validate_policy_tools(tools)
    with transaction.atomic():
        # Lock the tenant so two publishers cannot both take the same number.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).get()
        latest = Policy.objects.filter(tenant=tenant).aggregate(v=Max("version"))["v"] or 0
        policy = Policy.objects.create(
            tenant=tenant, version=latest + 1, tools=tools, note=note, created_by_id=actor.user_id
        )
        event_record(
            tenant=tenant,
            kind=EventKind.POLICY,
            actor=actor,
            reason=f"policy v{policy.version} published" + (f": {note}" if note else ""),
            details={"version": policy.version, "tools": tools},
        )
    return policy

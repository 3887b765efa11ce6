"""Publishing a tenant's policy: always a new version, recorded in the chain."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max

from ledgerdash.ledger.configuration import acting_as
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Policy, Tenant, validate_policy_approvals, validate_policy_tools


def policy_publish(
    *, tenant: Tenant, tools: dict[str, Any], actor: Actor, note: str = "", approvals: dict[str, str] | None = None
) -> Policy:
    """Publish ``tools`` as the tenant's next policy version.

    Attempts recorded under an older version keep naming it; dispatching,
    retrying or approving them afterwards sees the change and refuses or
    routes them to review. ``approvals``: the tools whose calls wait for an
    approver before they are first sent, each with its JMESPath condition
    over the arguments (empty: every call).
    """
    approvals = approvals or {}
    # Its event (kind policy) is written by the row's save, like every
    # configuration change: see ledgerdash.ledger.configuration.
    validate_policy_tools(tools)
    validate_policy_approvals(approvals, tools)
    with transaction.atomic():
        # Lock the tenant so two publishers cannot both take the same number.
        Tenant.objects.select_for_update().filter(pk=tenant.pk).get()
        latest = Policy.objects.filter(tenant=tenant).aggregate(v=Max("version"))["v"] or 0
        with acting_as(actor):
            policy = Policy.objects.create(
                tenant=tenant,
                version=latest + 1,
                tools=tools,
                approvals=approvals,
                note=note,
                created_by_id=actor.user_id,
            )
    return policy

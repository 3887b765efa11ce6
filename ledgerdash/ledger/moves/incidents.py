"""People settling incidents: owning one, and resolving it saying what was done."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F

from ledgerdash.ledger import clock, rules
from ledgerdash.ledger.errors import (
    IncidentError,
    OwnershipError,
    StaleFence,
)
from ledgerdash.ledger.models import (
    Incident,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser
from ledgerdash.ledger.events import Actor, EventDraft, EventKind, clean_text
from ledgerdash.ledger.moves.base import person_of, required
from ledgerdash.ledger.store import append_events


def _locked_incident(incident_id: int, fence_seen: int | None) -> Incident:
    try:
        incident = Incident.objects.select_for_update().get(pk=incident_id)
    except Incident.DoesNotExist:
        raise IncidentError(f"no incident {incident_id}") from None
    if fence_seen is not None and incident.fence != fence_seen:
        raise StaleFence(f"incident {incident_id} changed since you loaded it; reload and decide again")
    return incident


def _person_may(actor: Actor, incident: Incident, move: str) -> None:
    if actor.user_id is not None:
        rules.require_incident(person_of(actor), incident, move)


def incident_resolve(*, incident: Incident, actor: Actor, resolution: str, fence: int | None = None) -> Incident:
    """A person settles an incident, saying what was done (refunded the
    second charge, told the customer, confirmed only one landed)."""
    resolution = required(resolution, "resolution")
    with transaction.atomic():
        incident = _locked_incident(incident.pk, fence)
        _person_may(actor, incident, "resolve")
        now = clock.now()
        Incident.objects.filter(pk=incident.pk).update(
            status=Incident.Status.RESOLVED,
            resolved_at=now,
            resolved_by_id=actor.user_id,
            resolution=clean_text(resolution),
            fence=F("fence") + 1,
        )
        append_events(
            [
                EventDraft(
                    incident.tenant_id,
                    incident.attempt_id,
                    EventKind.INCIDENT,
                    actor,
                    reason=f"incident #{incident.pk} resolved by {actor.label}: {resolution}",
                    details={"incident_id": incident.pk, "action": "resolved", "resolution": resolution},
                )
            ],
            now=now,
        )
    incident.refresh_from_db()
    return incident


def incident_assign(
    *, incident: Incident, owner: AbstractBaseUser, actor: Actor, expected_owner_id: Any = ..., reason: str = ""
) -> Incident:
    """Give an open incident to ``owner``; refuse if its owner changed since the caller looked."""
    with transaction.atomic():
        incident = _locked_incident(incident.pk, None)
        _person_may(actor, incident, "claim" if owner.pk == actor.user_id else "assign")
        if expected_owner_id is not ... and incident.owner_id != expected_owner_id:
            raise OwnershipError(f"incident {incident.pk} is now owned by someone else; reload and try again")
        if incident.owner_id == owner.pk:
            return incident
        previous = incident.owner_id
        Incident.objects.filter(pk=incident.pk).update(owner_id=owner.pk, fence=F("fence") + 1)
        append_events(
            [
                EventDraft(
                    incident.tenant_id,
                    incident.attempt_id,
                    EventKind.INCIDENT,
                    actor,
                    reason=reason or f"incident #{incident.pk} assigned to {owner.get_username()}",
                    details={
                        "incident_id": incident.pk,
                        "action": "assigned",
                        "from_user_id": previous,
                        "to_user_id": owner.pk,
                    },
                )
            ]
        )
    incident.refresh_from_db()
    return incident

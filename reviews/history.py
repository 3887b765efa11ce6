"""How the ledger's events read to people: whom an owner event gave the
attempt to, and what created a linked attempt.

The events keep user ids (``from_user_id``, ``to_user_id``,
``owner_assigned.user_id``); a timeline names the people, resolving every
id on the page in one query.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model

from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import ActorKind, Attempt, AttemptEvent


def _user_ids(event: AttemptEvent) -> list[int]:
    details = event.details if isinstance(event.details, dict) else {}
    ids = [details.get("from_user_id"), details.get("to_user_id")]
    assigned = details.get("owner_assigned")
    if isinstance(assigned, dict):
        ids.append(assigned.get("user_id"))
    return [pk for pk in ids if isinstance(pk, int) and not isinstance(pk, bool)]


def user_names(events: Iterable[AttemptEvent]) -> dict[int, str]:
    """The usernames of every user an owner change in ``events`` names, in one query."""
    ids = {pk for event in events for pk in _user_ids(event)}
    if not ids:
        return {}
    return dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))


@dataclass(frozen=True)
class OwnerChange:
    """Who owned the attempt before and after an event (None: nobody)."""

    before: str | None
    after: str | None
    #: How the ledger chose the new owner ("on call", "tenant default owner"), when it did.
    chosen_by: str = ""
    #: Whether the event said who owned it before (an automatic assignment does not).
    knows_before: bool = True


def _name(pk: Any, names: Mapping[int, str]) -> str | None:
    if pk is None:
        return None
    return names.get(pk, f"user #{pk} (no longer exists)")


def owner_change(event: AttemptEvent, names: Mapping[int, str]) -> OwnerChange | None:
    """The owner change ``event`` records, with usernames, or None."""
    details = event.details if isinstance(event.details, dict) else {}
    if event.kind == EventKind.OWNER and ("to_user_id" in details or "from_user_id" in details):
        return OwnerChange(_name(details.get("from_user_id"), names), _name(details.get("to_user_id"), names))
    assigned = details.get("owner_assigned")
    if isinstance(assigned, dict):
        # The ledger says "nobody: <why>" when it found no one; the page says "no owner" itself.
        chosen_by = str(assigned.get("by") or "").removeprefix("nobody: ")
        return OwnerChange(None, _name(assigned.get("user_id"), names), chosen_by=chosen_by, knows_before=False)
    return None


@dataclass(frozen=True)
class Origin:
    """What created an attempt, in words: who (``actor``) and why (``why``)."""

    actor: str
    why: str
    #: "agent", "reconciler", "user" or "system": what kind of actor created it.
    kind: str


def creating_event(attempt: Attempt, events: Iterable[AttemptEvent]) -> AttemptEvent | None:
    """The first event of ``attempt`` among ``events`` (the one that recorded it)."""
    own = [event for event in events if event.attempt_id == attempt.pk]
    return min(own, key=lambda event: event.seq) if own else None


def _authority_changes(details: Mapping[str, Any]) -> list[str]:
    changes = []
    before, after = details.get("parent_policy_version"), details.get("policy_version")
    if before is not None and after is not None and before != after:
        changes.append(f"policy v{before} → v{after}")
    if details.get("scope_narrowed_from"):
        changes.append(
            f"scope narrowed from {details['scope_narrowed_from']} to {details.get('credential_scope') or '(none)'}"
        )
    return changes


def origin(attempt: Attempt, event: AttemptEvent | None) -> Origin:
    """Who or what created ``attempt`` and why, read from its creating event
    (its actor, reason and details), so a page never guesses from which
    fields happen to be empty."""
    if event is None:
        requester = attempt.requested_by.get_username() if attempt.requested_by_id and attempt.requested_by else ""
        if requester:
            return Origin(requester, "asked for a retry", ActorKind.USER)
        return Origin("unknown", "its first event is not on this page", "")
    details = event.details if isinstance(event.details, dict) else {}
    label = event.actor_label
    if attempt.parent_id is None:
        return Origin(f"{event.actor_kind} {label}", "recorded the intent", event.actor_kind)
    if event.actor_kind == ActorKind.AGENT:
        # The ledger's reason says which: "idempotency key reused with different tool" or "... arguments".
        reused = (
            "another tool"
            if event.reason.startswith("idempotency key reused with different tool")
            else "other arguments"
        )
        return Origin(f"agent {label}", f"reused the idempotency key with {reused}", ActorKind.AGENT)
    if event.actor_kind == ActorKind.RECONCILER:
        changes = _authority_changes(details)
        why = "the authority changed before a retry" + (f" ({'; '.join(changes)})" if changes else "")
        return Origin(f"the reconciler ({label})", why, ActorKind.RECONCILER)
    if event.actor_kind == ActorKind.USER:
        who = event.actor_user.get_username() if event.actor_user_id and event.actor_user else label
        return Origin(who, "asked for a retry", ActorKind.USER)
    return Origin(f"{event.actor_kind} {label}", event.reason or "created it", event.actor_kind)

"""A provider's id for an effect is the outcome of one side effect.

The database keeps the rule (:class:`~ledgerdash.ledger.models.ProviderId`,
migration 0028): it refuses an attempt naming a provider's id that an
attempt at another side effect of the tenant's tool (another idempotency
key) named first. This module reads what it keeps: which attempt holds an
id, the question a lookup asks of each candidate it might take for the
call (:attr:`~ledgerdash.ledger.providers.base.Sought.elsewhere`), and the
named error a refused write becomes (:class:`RequestIdTaken`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from django.db import IntegrityError

from ledgerdash.ledger.errors import RequestIdTaken
from ledgerdash.ledger.models import Attempt, ProviderId
from ledgerdash.ledger.providers.base import Lookup, LookupStatus

#: The name the database's refusal carries, on PostgreSQL as its constraint and on SQLite in its message.
REFUSAL = "ledger_providerid_one_side_effect"


@dataclass(frozen=True)
class Holder:
    """The attempt at another side effect that named a provider's id first."""

    attempt_id: int
    idempotency_key: str

    def as_details(self, request_id: str) -> dict[str, Any]:
        return {"request_id": request_id, "attempt_id": self.attempt_id, "idempotency_key": self.idempotency_key}


def holder(attempt: Attempt, request_id: str) -> Holder | None:
    """The attempt at another side effect of ``attempt``'s tenant and tool
    that named ``request_id`` (None: none did, or this side effect did)."""
    if not request_id:
        return None
    row = (
        ProviderId.objects.filter(
            tenant_id=attempt.tenant_id, tool_name=attempt.tool_name, provider_request_id=request_id
        )
        .exclude(idempotency_key=attempt.idempotency_key)
        .values_list("attempt_id", "idempotency_key")
        .first()
    )
    return Holder(*row) if row is not None else None


def elsewhere(attempt: Attempt) -> Callable[[str], bool]:
    """For a lookup of ``attempt`` (:attr:`Sought.elsewhere`): whether an id
    names another side effect's effect. Asked once per id, and only of the
    candidates a search would otherwise take."""
    asked: dict[str, bool] = {}

    def held(request_id: str) -> bool:
        if request_id not in asked:
            asked[request_id] = holder(attempt, request_id) is not None
        return asked[request_id]

    return held


def unless_elsewhere(attempt: Attempt, lookup: Lookup) -> Lookup:
    """``lookup`` as evidence about ``attempt``.

    A FOUND naming an id the ledger recorded on another side effect is not
    this call's effect, whatever the adapter matched it by: it is answered
    as if absent (not found). A FOUND matched by content alone (the
    adapter marks it ``matched_by: content``) while another side effect
    with the same arguments was sent and has no id recorded yet may be
    that one's: ambiguous, for a person. Every id left out, by this or by
    the adapter's own search (its ``left_out``), is recorded with the
    attempt that holds it, so an operator sees why."""
    extra = dict(lookup.extra)
    left_out = [_held(attempt, str(i)) for i in extra.get("left_out") or [] if isinstance(i, str)]
    held = holder(attempt, lookup.request_id) if lookup.status == LookupStatus.FOUND else None
    if held is not None:
        left_out.append({**held.as_details(lookup.request_id), "provider_detail": lookup.detail[:300]})
        extra["left_out"] = left_out
        return Lookup(LookupStatus.NOT_FOUND, detail=f"{left_out_note(left_out)}; nothing else matched", extra=extra)
    if lookup.status == LookupStatus.FOUND and extra.get("matched_by") == "content":
        twin = unattributed_twin(attempt)
        if twin is not None:
            extra.update(left_out=left_out, twin=twin)
            return Lookup(
                LookupStatus.AMBIGUOUS,
                detail=f"{lookup.detail[:300]}; but it matched by content alone, and #{twin['attempt_id']} (key "
                f"{twin['idempotency_key']!r}), another call with the same arguments, was sent and has no "
                "provider id recorded yet: the effect may be its",
                extra=extra,
            )
    if not left_out:
        return lookup
    extra["left_out"] = left_out
    return replace(lookup, extra=extra)


def unattributed_twin(attempt: Attempt) -> dict[str, Any] | None:
    """Another side effect of ``attempt``'s tenant and tool with the same
    arguments that was sent and has no provider id recorded: an effect
    found by content alone may be its as well as ``attempt``'s (its
    dispatcher may not have reported yet). None when there is none."""
    row = (
        Attempt.objects.filter(
            tenant_id=attempt.tenant_id,
            tool_name=attempt.tool_name,
            args_hash=attempt.args_hash,
            dispatch_count__gt=0,
            provider_request_id="",
        )
        .exclude(idempotency_key=attempt.idempotency_key)
        .order_by("id")
        .values_list("pk", "idempotency_key", "state")
        .first()
    )
    if row is None:
        return None
    return {"attempt_id": row[0], "idempotency_key": row[1], "state": row[2]}


def _held(attempt: Attempt, request_id: str) -> dict[str, Any]:
    held = holder(attempt, request_id)
    return held.as_details(request_id) if held is not None else {"request_id": request_id}


def left_out_note(left_out: list[dict[str, Any]]) -> str:
    """What an operator reads of the effects a lookup left out."""
    return "; ".join(
        f"the provider's lookup found {each['request_id']}, but the ledger recorded it on attempt "
        f"#{each.get('attempt_id', '?')}, another side effect (key {each.get('idempotency_key', '?')!r}): "
        "not this call's"
        for each in left_out
    )


def taken(attempt: Attempt, request_id: str) -> RequestIdTaken:
    """The error for ``attempt`` naming ``request_id``, which another side effect holds."""
    held = holder(attempt, request_id)
    return RequestIdTaken(
        RequestIdTaken.MESSAGE.format(
            request_id=request_id,
            tool=attempt.tool_name,
            holder_id=held.attempt_id if held else "(unknown)",
            holder_key=held.idempotency_key if held else "",
            attempt_id=attempt.pk,
        ),
        attempt_id=attempt.pk,
        request_id=request_id,
        holder_id=held.attempt_id if held else None,
        holder_key=held.idempotency_key if held else "",
    )


def refused(error: IntegrityError) -> bool:
    """Whether ``error`` is the database refusing an id another side effect holds."""
    diag = getattr(error.__cause__, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == REFUSAL
    return REFUSAL in str(error)


@contextmanager
def named(attempt: Attempt, request_id: str) -> Iterator[None]:
    """A write of ``request_id`` on ``attempt`` that the database refuses
    raises :class:`RequestIdTaken`, naming the attempt that holds the id
    (read after the refused statement rolled back)."""
    try:
        yield
    except IntegrityError as exc:
        if not request_id or not refused(exc):
            raise
        raise taken(attempt, request_id) from None

"""A provider's id for an effect is the outcome of one side effect.

The database keeps the rule (:class:`~ledgerdash.ledger.models.ProviderId`,
migration 0027): it refuses an attempt naming a provider's id that an
attempt at another side effect of the tenant's tool (another idempotency
key) named first. This module reads what it keeps (which attempt holds an
id) and names a refused write (:class:`RequestIdTaken`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError

from ledgerdash.ledger.errors import RequestIdTaken
from ledgerdash.ledger.models import Attempt, ProviderId

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

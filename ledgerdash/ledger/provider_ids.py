"""A provider's id for an effect is the outcome of one side effect.

The database keeps the rule (:class:`~ledgerdash.ledger.models.ProviderId`,
migration 0027): it refuses an attempt naming a provider's id that an
attempt at another side effect of the tenant's tool (another idempotency
key) named first. This module tells that refusal from any other.
"""

from __future__ import annotations

from django.db import IntegrityError

#: The name the database's refusal carries, on PostgreSQL as its constraint and on SQLite in its message.
REFUSAL = "ledger_providerid_one_side_effect"


def refused(error: IntegrityError) -> bool:
    """Whether ``error`` is the database refusing an id another side effect holds."""
    diag = getattr(error.__cause__, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == REFUSAL
    return REFUSAL in str(error)

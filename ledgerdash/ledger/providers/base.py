"""The provider adapter interface.

An adapter knows four things about a provider: how to dispatch a call with
an idempotency key, how to look an effect up by that key (or a correlation
field) and report its payload hash, whether the provider honours keys
(idempotent), and how long it remembers them.

Dispatch raises :class:`~ledgerdash.ledger.errors.NothingHappened` when the
provider guarantees it did not act, :class:`~ledgerdash.ledger.errors.PermanentFailure`
for a definitive refusal; any other exception means "we cannot tell".
Lookup never raises for provider trouble: it answers UNAVAILABLE.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


class ProviderAmbiguous(Exception):
    """The provider answered, but the answer does not say whether it acted
    (a 5xx, an unexpected status): the outcome is UNKNOWN."""


class LookupStatus(enum.StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Lookup:
    """A provider's answer about one key."""

    status: LookupStatus
    request_id: str = ""
    payload_hash: str = ""
    #: What the provider said, for the operator (status code, message, timing).
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_details(self) -> dict[str, Any]:
        """The lookup as it is recorded in the reconciler's event."""
        out: dict[str, Any] = {"status": str(self.status)}
        if self.request_id:
            out["request_id"] = self.request_id
        if self.payload_hash:
            out["payload_hash"] = self.payload_hash
        if self.detail:
            out["detail"] = self.detail[:500]
        if self.extra:
            out.update(self.extra)
        return out


@dataclass(frozen=True)
class Dispatched:
    """The provider accepted the call. ``request_id`` is its receipt."""

    request_id: str
    result_ref: str = ""
    payload_hash: str = ""
    #: The provider's response body, for the caller (and replay).
    response: Any = None


class ProviderAdapter(ABC):
    idempotent: bool = False
    #: None: the provider keeps keys for ever.
    key_retention: timedelta | None = None

    @abstractmethod
    def dispatch(
        self, *, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None = None
    ) -> Dispatched:
        """Send the call with ``key`` as its idempotency key. Call
        ``on_request_id`` as soon as the provider's request id is known, before
        anything else can go wrong."""

    @abstractmethod
    def lookup(self, *, key: str, args_hash: str) -> Lookup:
        """Ask the provider whether an effect with ``key`` exists."""

    @property
    def can_dispatch(self) -> bool:
        return True

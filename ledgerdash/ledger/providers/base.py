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
from typing import Any, Protocol


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
    #: The provider's answer itself (JSON), when it found the effect: kept as
    #: the attempt's result, so a re-run replays what the provider said.
    document: Any = None

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
    #: The longest one dispatch may take; an adapter gives up after it (its
    #: timeout). The ledger counts on no request landing later than this
    #: after it was sent.
    max_request_seconds: float = 30.0

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


class CallLike(Protocol):
    """What :func:`dispatch_through` needs of a tool call (a ``ToolCall``)."""

    request_id: str
    result_ref: str

    @property
    def key(self) -> str: ...

    @property
    def args(self) -> dict[str, Any]: ...

    def record_request_id(self, request_id: str) -> None: ...


def dispatch_through(adapter: ProviderAdapter, call: CallLike) -> Any:
    """Send a wrapped tool call through ``adapter``: its key, its arguments,
    the request id persisted the moment the provider names it; returns the
    provider's response (replayed to a re-run)."""
    sent = adapter.dispatch(key=call.key, args=call.args, on_request_id=call.record_request_id)
    call.result_ref = sent.result_ref
    if sent.request_id and not call.request_id:
        call.record_request_id(sent.request_id)
    return sent.response

"""The provider adapter interface.

An adapter knows five things about a provider: how to dispatch a call with
an idempotency key, how to look an effect up by that key (or a correlation
field) and report its payload hash, whether the provider honours keys
(idempotent), how long it remembers them, and how far its lookup may lag
behind what it did (a search index's lag).

Dispatch raises :class:`~ledgerdash.ledger.errors.NothingHappened` when the
provider guarantees it did not act, :class:`~ledgerdash.ledger.errors.PermanentFailure`
for a definitive refusal; any other exception means "we cannot tell".
Lookup never raises for provider trouble: it answers UNAVAILABLE.
"""

from __future__ import annotations

import email.utils
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from ledgerdash.ledger import clock
from ledgerdash.ledger.errors import NothingHappened


class ProviderAmbiguous(Exception):
    """The provider answered, but the answer does not say whether it acted
    (a 5xx, an unexpected status): the outcome is UNKNOWN."""


class RateLimited(NothingHappened):
    """The provider refused the request before acting because too many came
    (HTTP 429), and may have said when to come back (``Retry-After``): the
    same key is sent again no sooner than that."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header's seconds (RFC 9110: delay-seconds or an
    HTTP date), None when absent or unreadable; never negative, at most a day."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - (now or clock.now())).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), 86400.0)


class LookupStatus(enum.StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    #: The provider has effects that may be this call's, and the lookup
    #: cannot tell which (two matches where one was sought, a match by
    #: content alone that another call could share): a person decides.
    AMBIGUOUS = "ambiguous"
    #: The lookup saw nothing, but it could not have seen the call: the call
    #: may lie in one of the preset's blind spots (:class:`BlindSpot`: a
    #: redacted message, a retention that may have been shortened, an issue
    #: transferred away). Not evidence either way: a person decides, and
    #: asking again would see no more.
    NOT_EVIDENCE = "not_evidence"


@dataclass(frozen=True)
class BlindSpot:
    """Where a preset's lookup cannot see a call that happened, as the
    provider documents it: the preset answers NOT_EVIDENCE, never
    NOT_FOUND, whenever one could hide the call."""

    #: Its name in the lookup's details (``blind_spot``).
    name: str
    #: What hides the call, for the person who decides.
    what: str
    #: The provider's page that documents it (title and address).
    source: str


def _nowhere(request_id: str) -> bool:
    return False


@dataclass(frozen=True)
class Sought:
    """What a lookup looks for: the attempt's key, its arguments and their
    hash, and what else the ledger knows of it. A provider with no lookup by
    key finds the call by what the adapter wrote into it (a correlation
    field, a marker) or by its content, within a window that opens when the
    call could first have been sent."""

    key: str
    args_hash: str
    args: dict[str, Any] = field(default_factory=dict)
    #: The provider's id for the effect, when a dispatcher recorded one.
    request_id: str = ""
    #: When the call could first have been sent (its first dispatch claim).
    sent_after: datetime | None = None
    #: Until when its request could land (None: not known); a search by time may stop there.
    lands_by: datetime | None = None
    #: Whether the provider's id for an effect is one the ledger recorded on
    #: an attempt at another side effect (another key of the tenant and
    #: tool): that effect is not this call's, however alike. A search that
    #: chooses among candidates leaves such ones out before it chooses.
    elsewhere: Callable[[str], bool] = field(default=_nowhere, compare=False, repr=False)


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
    #: Seconds the provider asked to be left alone (``Retry-After`` on a 429).
    retry_after: float | None = None
    #: The answer came from a read-after-write consistent read (a list, a read by id), not a search
    #: index: a "not found" needs no wait for the tool's lookup lag.
    consistent: bool = False

    def as_details(self) -> dict[str, Any]:
        """The lookup as it is recorded in the reconciler's event."""
        out: dict[str, Any] = {"status": str(self.status)}
        if self.request_id:
            out["request_id"] = self.request_id
        if self.payload_hash:
            out["payload_hash"] = self.payload_hash
        if self.detail:
            out["detail"] = self.detail[:500]
        if self.retry_after is not None:
            out["retry_after"] = self.retry_after
        if self.consistent:
            out["consistent"] = True
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
    #: How long the provider's lookup can find an effect at all (a message
    #: log kept so many days); None: for as long as it matters. A "not
    #: found" asked later than this after the first dispatch proves nothing.
    lookup_retention: timedelta | None = None
    #: How long after an effect the lookup may still not show it (a search
    #: index's lag): a "not found" proves nothing until the request could no
    #: longer land plus this (:mod:`ledgerdash.ledger.landing`).
    lookup_lag_seconds: float = 0.0

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

    def find(self, sought: Sought) -> Lookup:
        """Ask the provider whether the call ``sought`` describes happened.
        The reconciler asks this; by default it is :meth:`lookup` by key. An
        adapter whose provider has no lookup by key overrides it, to search
        by what it wrote into the call or by the call's content."""
        return self.lookup(key=sought.key, args_hash=sought.args_hash)

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

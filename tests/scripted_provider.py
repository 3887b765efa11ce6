"""A provider adapter whose answers a test writes: a tool configured with
``{"class": "tests.scripted_provider.Scripted"}`` looks keys up in
:data:`EFFECTS`, and a lookup may take time on the ledger's clock
(:data:`LOOKUP_TAKES`, moved by a test that drives the clock)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import Dispatched, Lookup, LookupStatus, ProviderAdapter

#: provider key -> (request id, payload hash) of the effect the provider performed.
EFFECTS: dict[str, tuple[str, str]] = {}
#: Called while a lookup is on its way (a test moves its clock there).
DURING_LOOKUP: list[Callable[[], None]] = []
#: Keys the provider declines for good when they are sent.
DECLINED: set[str] = set()


def reset() -> None:
    EFFECTS.clear()
    DURING_LOOKUP.clear()
    DECLINED.clear()


class Scripted(ProviderAdapter):
    def __init__(self, **_config: Any) -> None:
        pass

    def dispatch(self, *, key: str, args: dict[str, Any], on_request_id: Any = None) -> Dispatched:
        if key in DECLINED:
            raise PermanentFailure("declined")
        raise AssertionError(f"the scripted provider does not expect {key} to be sent")

    def lookup(self, *, key: str, args_hash: str) -> Lookup:
        for step in DURING_LOOKUP:
            step()
        if key in EFFECTS:
            request_id, payload_hash = EFFECTS[key]
            return Lookup(LookupStatus.FOUND, request_id=request_id, payload_hash=payload_hash)
        return Lookup(LookupStatus.NOT_FOUND)

"""What every framework adapter shares: a framework's tool call, run through
the ledger's one-line wrapper (:mod:`ledgerdash_client.toolcalls`).

The key names the side effect from the arguments the model chose, never
from the framework's tool-call id: asked again after a crash, a model makes
a new id for the same effect. A confirmed key replays its recorded result
without running the tool; an attempt whose outcome is unknown, under review
or in flight raises the ledger's error instead, so the run stops rather
than send again.

The tool's return value is its receipt, stored for replay, unless
``receipt`` picks the provider's request id out of it (or the tool records
one itself through :func:`current_call`); a tool that wants the key for its
provider reads ``current_call().key``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from ledgerdash_client.toolcalls import ToolCall

_current: ContextVar[ToolCall | None] = ContextVar("ledgerdash_adapter_call", default=None)


def current_call() -> ToolCall:
    """The ledger's call the running tool belongs to (its ``key`` for the
    provider, ``record_request_id``). Only inside a ledger tool."""
    call = _current.get()
    if call is None:
        raise LookupError("current_call() is only available inside a tool wrapped for the ledger")
    return call


def _default_ledger() -> ModuleType:
    import ledgerdash_client as client

    return client


def ledgered(
    name: str,
    *,
    framework: str,
    run: Callable[[dict[str, Any]], Any],
    key: str | Callable[[dict[str, Any]], str],
    scope: str | Iterable[str] | None = None,
    receipt: Callable[[Any], str | None] | None = None,
    ledger: ModuleType | None = None,
) -> Callable[..., Any]:
    """``run(arguments)`` as a ledger tool named ``name``, called with the
    arguments as keywords. ``ledger`` is the way to the ledger: the HTTP
    client (:mod:`ledgerdash_client`, the default) or the in-process API
    (:mod:`ledgerdash.ledger.recording`); calls belong to its current
    ``task``."""
    way = ledger or _default_ledger()

    def body(call: ToolCall, **arguments: Any) -> Any:
        token = _current.set(call)
        try:
            result = run(arguments)
        finally:
            _current.reset(token)
        request_id = receipt(result) if receipt is not None else None
        if request_id:
            call.record_request_id(str(request_id))
        elif not call.request_id:
            call.result_ref = f"{framework}:{name}"
        return result

    wrapped: Callable[..., Any] = way.tool(name, key=key, scope=scope)(body)
    return wrapped

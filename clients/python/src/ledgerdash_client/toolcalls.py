"""The one-line tool wrapper, shared by the in-process recording API
(:mod:`ledgerdash.ledger.recording`) and the HTTP client
(:mod:`ledgerdash_client`).

Both wrap a tool the same way; only where the ledger lives differs. The
steps, in order, are the safe order of a side effect:

1. bind the call's arguments and name the side effect (the key);
2. record the intent (a confirmed key replays its stored result; one that
   is unknown, under review or in flight elsewhere refuses);
3. claim the dispatch, committed before the request leaves (for a tool
   whose intent and claim commit together, ``Tool.claim_with_intent``,
   steps 2 and 3 are one commit);
4. run the tool with a :class:`ToolCall` (its key, its arguments, and a way
   to persist the provider's request id at once), beating the attempt's
   heartbeat while it runs, so work longer than the lease never looks lost;
5. report the outcome: confirmed on a receipt, FAILED_RETRYABLE on
   :class:`NothingHappened`, FAILED on :class:`PermanentFailure`, UNKNOWN on
   anything else or on a return without a receipt.

A re-run of a confirmed key replays its recorded result without calling
the tool; when the ledger holds no result it can replay (the effect was
confirmed by a lookup that returned nothing, or by a person), the replay
says so with an error rather than returning an empty value.

This module imports no Django: agents using the HTTP client do not need it.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from ledgerdash_client import crashpoints
from ledgerdash_client.outcomes import NothingHappened, PermanentFailure

log = logging.getLogger("ledgerdash.recording")
# Type variables are declared the old way, not as ``def wrap[T]``: the client runs on Python 3.10.
#: What a wrapped tool returns.
T = TypeVar("T")
#: What a tool returns, inside the wrapper.
R = TypeVar("R")

CONFIRMED = "OUTCOME_CONFIRMED"
NO_RECEIPT = (
    "the tool returned without a receipt (no provider request id or result reference); "
    "the reconciler will verify it at the provider"
)


class AttemptView(Protocol):
    """What the wrapper reads of an attempt, whichever side of HTTP it is on."""

    @property
    def pk(self) -> Any: ...
    @property
    def state(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def provider_key(self) -> str: ...
    @property
    def provider_request_id(self) -> str: ...
    @property
    def result(self) -> Any: ...
    @property
    def args(self) -> Any: ...


#: One side's attempt (a model row in process, a JSON view over HTTP).
A = TypeVar("A", bound=AttemptView)


class Session(Protocol, Generic[A]):
    """One task's way to the ledger: what a wrapped call needs from it. ``A``
    is that side's attempt (a model row in process, a JSON view over HTTP)."""

    def record_intent(
        self, *, tool_name: str, idempotency_key: str, args: dict[str, Any], credential_scope: Any
    ) -> tuple[A, bool]:
        """Record the intent or find the key's attempt; raises when the key
        was used with other arguments. Asks for the dispatch claim in the same
        commit, which the ledger grants where the tool allows it: the second
        value says whether it did (the attempt is then this call's, DISPATCHED)."""

    def refuse_unless_dispatchable(self, attempt: A) -> None:
        """Raise the error that tells the agent why it must not call the tool now."""

    def replay(self, attempt: A) -> Any:
        """The confirmed attempt's recorded result; raises when there is none to replay."""

    def dispatch(self, attempt: A) -> A:
        """Claim the dispatch (committed before returning); raises when another worker holds it."""

    def heartbeat_interval(self, attempt: A) -> float:
        """Seconds between heartbeats for the dispatched ``attempt`` (a third of its lease)."""

    def heartbeat(self, attempt: A, fence: int) -> Any:
        """The dispatcher's work is still running: extend the lease."""

    def heartbeat_done(self) -> None:
        """Called in the heartbeat's own thread as it ends (to release what it held there)."""

    def record_request_id(self, attempt: A, request_id: str, fence: int) -> A: ...

    def confirm(
        self, attempt: A, *, fence: int, provider_request_id: str, result_ref: str, result: Any, storable: bool
    ) -> Any:
        """Report a receipt; ``storable`` is False when the tool's value could not be kept for replay."""

    def fail(self, attempt: A, *, fence: int, reason: str, retryable: bool) -> Any: ...

    def mark_unknown(self, attempt: A, *, fence: int, reason: str) -> Any: ...


def storable_json(value: Any) -> tuple[Any, str]:
    """``(value, "")`` when the ledger can store ``value`` as a tool's
    result (JSON, finite numbers, no NUL, which PostgreSQL refuses), else
    ``(None, why not)``: a result that cannot be stored is not replayed, but
    must never stop the outcome from being recorded."""
    try:
        dumped = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return None, f"result not stored for replay: {exc}"
    if "\\u0000" in dumped:
        return None, "result not stored for replay: it contains a NUL character"
    return value, ""


class ToolCall:
    """What a wrapped tool receives as its first argument."""

    def __init__(self, session: Session[Any], attempt: AttemptView) -> None:
        self.session = session
        self.attempt = attempt
        self.fence = attempt.fence
        self.request_id = attempt.provider_request_id
        #: Set this to where the result can be checked, if the provider gives no request id.
        self.result_ref = ""

    @property
    def key(self) -> str:
        """The idempotency key to send to the provider."""
        return self.attempt.provider_key

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.attempt.args or {})

    def record_request_id(self, request_id: str) -> None:
        """Persist the provider's request id now, before anything else can go wrong."""
        if request_id and request_id != self.request_id:
            self.attempt = self.session.record_request_id(self.attempt, request_id, self.fence)
            self.request_id = request_id

    def heartbeat(self) -> None:
        """Say the work is still running (the wrapper also does this on its
        own while the tool runs): the lease is extended, and the ledger
        knows the request may still land."""
        self.session.heartbeat(self.attempt, self.fence)


class _Heartbeat:
    """Beats ``call``'s heartbeat every ``interval`` seconds until stopped.
    A beat that fails is logged and beating goes on (the next may succeed);
    a dispatch superseded meanwhile stops it."""

    def __init__(self, call: ToolCall, interval: float, on_stop: Callable[[], None] | None = None) -> None:
        self.call = call
        self.interval = interval
        self.on_stop = on_stop
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"ledgerdash-heartbeat-{call.attempt.pk}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        if self.interval > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self.done.wait(self.interval):
                try:
                    self.call.heartbeat()
                except Exception as exc:
                    if getattr(exc, "code", "") in ("stale_fence", "claim_lost"):
                        log.warning("attempt %s: heartbeat refused, stopping: %s", self.call.attempt.pk, exc)
                        return
                    log.warning("attempt %s: heartbeat failed: %s", self.call.attempt.pk, exc)
        finally:
            if self.on_stop is not None:
                self.on_stop()


def call_arguments(signature: inspect.Signature, bound: inspect.BoundArguments) -> dict[str, Any]:
    """The call's arguments by name (the first parameter, the ToolCall, left out;
    ``**kwargs`` flattened), as they are recorded and hashed."""
    arguments: dict[str, Any] = {}
    for name, value in list(bound.arguments.items())[1:]:
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        else:
            arguments[name] = value
    return arguments


def wrap(
    fn: Callable[..., T],
    *,
    name: str,
    key: str | Callable[[dict[str, Any]], str],
    scope: str | Iterable[str] | None,
    session: Callable[[], Session[Any]],
) -> Callable[..., T]:
    """``fn`` as a ledger tool; ``session()`` gives the current task's way to the ledger."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        ledger = session()
        bound = signature.bind(None, *args, **kwargs)
        bound.apply_defaults()
        arguments = call_arguments(signature, bound)
        idempotency_key = key(arguments) if callable(key) else key.format(**arguments)
        attempt, claimed = ledger.record_intent(
            tool_name=name, idempotency_key=idempotency_key, args=arguments, credential_scope=scope
        )
        if not claimed:
            if attempt.state == CONFIRMED:
                log.info("replaying confirmed attempt %s for key %s", attempt.pk, idempotency_key)
                return ledger.replay(attempt)
            ledger.refuse_unless_dispatchable(attempt)
        crashpoints.reached(crashpoints.AFTER_INTENT)  # claimed: the claim committed with the intent
        call = ToolCall(ledger, attempt if claimed else ledger.dispatch(attempt))
        bound.arguments[next(iter(bound.arguments))] = call
        return _run(fn, call, bound)

    wrapper.ledger_tool = name  # type: ignore[attr-defined]
    return wrapper


def _best_effort(what: str, call: ToolCall, report: Callable[[], Any]) -> None:
    # The tool's own exception matters more than a failed report: an
    # unreported outcome is found by the reconciler when the lease runs out.
    try:
        report()
    except Exception:
        log.exception("could not report attempt %s as %s; the reconciler will settle it", call.attempt.pk, what)


def _run(fn: Callable[..., R], call: ToolCall, bound: inspect.BoundArguments) -> R:
    ledger, attempt, fence = call.session, call.attempt, call.fence
    try:
        with _Heartbeat(call, ledger.heartbeat_interval(attempt), ledger.heartbeat_done):
            value = fn(*bound.args, **bound.kwargs)
    except NothingHappened as exc:
        reason = str(exc) or "provider rejected the request before acting"
        _best_effort(
            "failed, retryable", call, lambda: ledger.fail(call.attempt, fence=fence, reason=reason, retryable=True)
        )
        raise
    except PermanentFailure as exc:
        reason = str(exc) or "provider refused the request"
        _best_effort("failed", call, lambda: ledger.fail(call.attempt, fence=fence, reason=reason, retryable=False))
        raise
    except BaseException as exc:
        reason = f"tool raised {type(exc).__name__}: {exc}"[:1000]
        _best_effort("unknown", call, lambda: ledger.mark_unknown(call.attempt, fence=fence, reason=reason))
        raise
    crashpoints.reached(crashpoints.AFTER_RESPONSE)
    # The tool acted: from here on a failed report must not hide its value
    # from the caller. An unreported outcome is found by the reconciler.
    if not (call.request_id or call.result_ref):
        _best_effort("unknown", call, lambda: ledger.mark_unknown(call.attempt, fence=fence, reason=NO_RECEIPT))
        return value
    stored, note = storable_json(value)
    if note:
        log.warning("attempt %s: %s", attempt.pk, note)
    _best_effort(
        "confirmed",
        call,
        lambda: ledger.confirm(
            call.attempt,
            fence=fence,
            provider_request_id=call.request_id,
            result_ref=call.result_ref,
            result=stored,
            storable=not note,
        ),
    )
    return value

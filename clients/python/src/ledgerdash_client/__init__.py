# Over 600 lines because: the HTTP client is the in-process API's twin, each step beside its retry rule.
"""The ledger over HTTP: the in-process wrapper's shape, for agents in another process.

Wrap each side-effecting tool once, exactly as with
:mod:`ledgerdash.ledger.recording`::

    import ledgerdash_client as ledger

    @ledger.tool("send_email", key="invoice:{invoice_id}:send")
    def send_email(call, *, invoice_id, to, body):
        response = provider.send(to=to, body=body, idempotency_key=call.key)
        call.record_request_id(response["id"])   # persisted at once
        return response

    with ledger.task(task_id="billing-run-42"):   # LEDGERDASH_URL, LEDGERDASH_TOKEN
        send_email(invoice_id="INV-7", to="ap@example.com", body="…")

The tenant is the token's. ``task(client=LedgerClient(url, token))`` names
the server explicitly; without it the client is configured from the
environment (``LEDGERDASH_URL``, ``LEDGERDASH_TOKEN``, optionally
``LEDGERDASH_AGENT``), so an agent started as a separate process needs no
code to find the ledger.

Requests the ledger may safely receive twice are retried on transport
errors: reads, recording an intent (the same key and arguments return the
same attempt), recording a request id, and reporting an outcome with the
same fence (a report that already landed is answered 200). Claiming an
attempt for dispatch is retried only when the request certainly never left
(no connection could be made, or the kept connection turned out closed
before the request went out: :mod:`ledgerdash_client.httpconn`). The tool itself is never called again by the
client: a re-run learns from the ledger whether it may.

The package needs only the standard library (its modules: the table of
error codes, the shared tool wrapper, what a tool tells the ledger, crash
points and the key rule, which the server imports from here): ``pip
install ./clients/python`` installs nothing else (``tests/test_client_alone.py``
holds it to that). The framework adapters are its extras.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from ledgerdash_client import errorcodes, keys, toolcalls
from ledgerdash_client.httpconn import Connections, MaybeSent, NotSent
from ledgerdash_client.outcomes import NothingHappened, PermanentFailure
from ledgerdash_client.toolcalls import ToolCall

__all__ = [
    "Attempt",
    "LedgerClient",
    "NothingHappened",
    "PermanentFailure",
    "Recorded",
    "ToolCall",
    "task",
    "tool",
]

log = logging.getLogger("ledgerdash_client")
#: What a wrapped tool returns (a TypeVar, not ``def tool[T]``: the client runs on Python 3.10).
T = TypeVar("T")

ENV_URL = "LEDGERDASH_URL"
ENV_TOKEN = "LEDGERDASH_TOKEN"  # noqa: S105 - the variable's name, not a token
ENV_AGENT = "LEDGERDASH_AGENT"
ENV_MAX_BODY = "LEDGERDASH_MAX_BODY_BYTES"
#: The largest request body the ledger takes unless its operator raised it
#: (the server's ``LEDGER_API_MAX_BODY_BYTES``, 512 KiB by default).
MAX_BODY_BYTES = 512 * 1024
API_PATH = "/api/v1"


# --- errors: one class per code the ledger answers with (built from ledgerdash_client.errorcodes) ---


class LedgerClientError(Exception):
    """Base of everything this client raises on purpose."""

    code = "client_error"


class ConfigurationError(LedgerClientError):
    code = "client_configuration"


class NoTask(LedgerClientError):
    code = "no_task"
    MESSAGE = "call ledger tools inside `with ledger.task(task_id=...)`"


class LedgerUnavailable(LedgerClientError):
    """The ledger could not be reached, or kept answering that it is unavailable.

    ``sent`` is False when the request certainly never arrived, True or None
    when it may have (it was sent and no answer came back).
    """

    code = "ledger_unavailable"
    retryable = True

    def __init__(self, message: str, *, sent: bool | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.sent = sent
        self.status = status


class ApiError(LedgerClientError):
    """The ledger answered with an error: ``code`` (stable), ``status``, ``body``."""

    code = "api_error"
    #: Whether the same request may succeed later, unchanged (see :mod:`ledgerdash_client.errorcodes`).
    retryable = False

    def __init__(self, message: str, *, status: int, body: dict[str, Any], code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        if code is not None and code != type(self).code:
            self.code = code
        #: the attempt the error is about, when there is one (on a conflict: the linked attempt)
        self.attempt_id: int | None = body.get("attempt_id")
        self.state: str | None = body.get("state")

    @property
    def original_id(self) -> int | None:
        """On idempotency_key_reused and authorization_changed: the attempt first recorded."""
        return self.body.get("original_id")

    @property
    def retry_after(self) -> int | None:
        """The seconds to wait before calling again, on every refusal the ledger gave a wait
        (awaiting_approval, retry_pending, attempt_in_flight)."""
        value = self.body.get("retry_after")
        return value if isinstance(value, int) and value > 0 else None


def _build_errors() -> dict[str, type[ApiError]]:
    """One exception class per row of :mod:`ledgerdash_client.errorcodes` that names one,
    under its parent's class: ``except AttemptBlocked`` catches every refusal
    to call the tool, ``except NotAllowed`` every 403."""
    built: dict[str, type[ApiError]] = {}
    for row in errorcodes.TABLE:
        if row.client is None or row.client in globals():
            continue  # the ledger's own (never answered), or written by hand (LedgerUnavailable)
        base = built[row.parent] if row.parent is not None else ApiError
        attrs = {"code": row.code, "retryable": row.retryable, "__doc__": row.description, "__module__": __name__}
        built[row.code] = globals()[row.client] = type(row.client, (base,), attrs)
    return built


#: The exception class for each code the ledger answers with.
ERRORS: dict[str, type[ApiError]] = _build_errors()
#: The family for a code this client does not know yet: the first row of its status.
_BY_STATUS: dict[int, type[ApiError]] = {}
for _row in errorcodes.TABLE:
    if _row.code in ERRORS:
        _BY_STATUS.setdefault(_row.status, ERRORS[_row.code])


def __getattr__(name: str) -> type[ApiError]:
    # Only reached for a name that is not a generated class: tells type checkers
    # that the generated names (IdempotencyConflict, ...) are ApiError classes.
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_key(key: object) -> None:
    """Refuse, before sending, a key the ledger would refuse (the same rule:
    :mod:`ledgerdash_client.keys`), so an agent learns it without a round trip."""
    problem = keys.key_problem(key)
    if problem is not None:
        raise ERRORS["invalid_idempotency_key"](
            problem, status=0, body={"code": "invalid_idempotency_key", "message": problem}
        )


def error_for(status: int, body: dict[str, Any]) -> ApiError:
    """The typed exception for an error answer (by its code, else its status)."""
    code = str(body.get("code") or f"http_{status}")
    cls = ERRORS.get(code) or _BY_STATUS.get(status) or (ERRORS["internal_error"] if status >= 500 else ApiError)
    message = str(body.get("message") or f"HTTP {status}")
    return cls(message, status=status, body=body, code=code)


# --- what the ledger answers -------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """An attempt as the API shows it. ``data`` has every field it sent."""

    id: int
    state: str
    fence: int
    task_id: str
    tool_name: str
    idempotency_key: str
    provider_key: str
    args_hash: str
    provider_request_id: str = ""
    result_ref: str = ""
    dispatch_fence: int | None = None
    parent_id: int | None = None
    args: dict[str, Any] | None = None
    result: Any = None
    #: ``tool`` or ``lookup`` when ``result`` can be replayed; empty when none was recorded.
    result_source: str = ""
    events: list[dict[str, Any]] | None = None
    #: Who owns it while it waits on people (a username), or None.
    owner: str | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def pk(self) -> int:
        return self.id

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        known = {f for f in cls.__dataclass_fields__ if f != "data"}
        return cls(**{k: v for k, v in data.items() if k in known}, data=data)


@dataclass(frozen=True)
class Recorded:
    attempt: Attempt
    #: False when the key was already recorded with these arguments.
    created: bool

    @property
    def claimed(self) -> bool:
        """The dispatch was claimed with the intent (``claim=True``, granted by
        the tool's setting): the attempt is this call's to send, with its fence."""
        return self.created and self.attempt.state == "DISPATCHED"


def _max_body_from_env() -> int:
    given = os.environ.get(ENV_MAX_BODY, "").strip()
    if not given:
        return MAX_BODY_BYTES
    try:
        value = int(given)
    except ValueError:
        value = 0
    if value < 1024:
        raise ConfigurationError(f"{ENV_MAX_BODY}={given!r}: a whole number of bytes, 1024 or more")
    return value


def _default_agent() -> str:
    return os.environ.get(ENV_AGENT) or f"{socket.gethostname()}:{os.getpid()}"


class LedgerClient:
    """One ledger server, one token. Thread-safe: each thread keeps its own
    connection to the server open between requests (:mod:`ledgerdash_client.httpconn`)."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        agent: str | None = None,
        timeout: float = 10.0,
        retries: int = 4,
        backoff: float = 0.2,
        max_body_bytes: int | None = None,
    ) -> None:
        base_url = base_url or os.environ.get(ENV_URL, "")
        token = token or os.environ.get(ENV_TOKEN, "")
        if not base_url:
            raise ConfigurationError(f"no ledger URL: pass base_url or set {ENV_URL} (e.g. http://127.0.0.1:8000)")
        if not token:
            raise ConfigurationError(f"no API token: pass token or set {ENV_TOKEN}")
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigurationError(f"{base_url!r} is not an http(s) URL")
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith(API_PATH) else root + API_PATH
        self._token = token
        self.agent = agent or _default_agent()
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_body_bytes = max_body_bytes or _max_body_from_env()
        self._connections = Connections(self.base_url)

    def __repr__(self) -> str:
        return f"LedgerClient({self.base_url!r}, agent={self.agent!r})"

    def close(self) -> None:
        """Close this thread's kept connection (the next request opens a new one)."""
        self._connections.close()

    def with_agent(self, agent: str) -> LedgerClient:
        """The same client, naming another agent in the ledger's events."""
        other = copy.copy(self)
        other.agent = agent
        return other

    # --- transport -------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        retry_if_sent: bool,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        data = None
        if body is not None:
            try:
                data = json.dumps(body, allow_nan=False, ensure_ascii=False).encode("utf-8")
            except (TypeError, ValueError) as exc:
                raise ERRORS["invalid_args"](
                    f"not JSON: {exc}", status=0, body={"code": "invalid_args", "message": str(exc)}
                ) from None
        if data is not None and len(data) > self.max_body_bytes:
            # A server refuses a body over its limit by closing the connection while it is sent, which
            # reads as a server down: refuse it here, where it is certain nothing was sent.
            message = (
                f"the request body is {len(data)} bytes, over the limit of {self.max_body_bytes} "
                f"(the ledger's LEDGER_API_MAX_BODY_BYTES; where the ledger allows more, pass max_body_bytes or "
                f"set {ENV_MAX_BODY}); nothing was sent"
            )
            raise ERRORS["body_too_large"](message, status=413, body={"code": "body_too_large", "message": message})
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            "Ledgerdash-Agent": "".join(c for c in self.agent if c.isprintable() and ord(c) < 128)[:100],
            "User-Agent": "ledgerdash-client/1",
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        last: LedgerUnavailable | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(random.uniform(0, min(5.0, self.backoff * 2**attempt)))  # noqa: S311 - jitter
            try:
                answer = self._connections.request(
                    method, url, body=data, headers=headers, timeout=timeout or self.timeout
                )
            except (NotSent, MaybeSent) as exc:
                never_sent = isinstance(exc, NotSent)
                last = LedgerUnavailable(f"{method} {url}: {exc}", sent=False if never_sent else None)
                if never_sent or retry_if_sent:
                    log.info("ledger request failed (%s); retrying", last)
                    continue
                raise last from None
            status, payload = answer.status, self._json(answer.body, answer.status)
            if status < 300:
                return status, payload
            if status < 400:
                raise ConfigurationError(
                    f"the ledger answered {status} with a redirect to {answer.headers.get('Location')}; "
                    f"point {ENV_URL} at that address"
                )
            if status in (502, 503, 504):
                last = LedgerUnavailable(str(payload.get("message") or f"HTTP {status}"), sent=True, status=status)
                if retry_if_sent:
                    continue
                raise last
            raise error_for(status, payload)
        assert last is not None
        raise last

    @staticmethod
    def _json(raw: bytes, status: int) -> dict[str, Any]:
        try:
            value = json.loads(raw or b"{}")
        except ValueError:
            return {"code": f"http_{status}", "message": raw[:200].decode("utf-8", "replace")}
        return value if isinstance(value, dict) else {"value": value}

    # --- the steps -------------------------------------------------------------------

    def record_intent(
        self,
        *,
        task_id: str,
        tool_name: str,
        idempotency_key: str,
        args: dict[str, Any],
        credential_scope: str | Iterable[str] | None = None,
        claim: bool = False,
    ) -> Recorded:
        """Record the intent; safe to repeat (the same key and arguments answer with the same attempt).

        ``claim``: also claim the dispatch in the same commit where the tool
        allows it; :attr:`Recorded.claimed` says whether it was (then skip
        :meth:`dispatch`: the attempt is DISPATCHED with its fence).

        Raises :class:`IdempotencyConflict` (naming the linked attempt) when
        the key was used with other arguments: do not call the tool.
        """
        _check_key(idempotency_key)
        body: dict[str, Any] = {
            "task_id": task_id,
            "tool_name": tool_name,
            "idempotency_key": idempotency_key,
            "args": args,
        }
        if claim:
            body["claim"] = True
        if credential_scope is not None:
            body["credential_scope"] = (
                credential_scope.split() if isinstance(credential_scope, str) else list(credential_scope)
            )
        status, data = self._request("POST", "/attempts", body, retry_if_sent=True)
        return Recorded(Attempt.from_json(data), created=status == 201)

    def dispatch(self, attempt_id: int, *, fence: int | None = None) -> Attempt:
        """Claim the attempt for dispatch; call the provider only after this returns.
        The returned ``fence`` goes with the outcome report."""
        _, data = self._request(
            "POST",
            f"/attempts/{attempt_id}/dispatch",
            {"fence": fence} if fence is not None else None,
            retry_if_sent=False,
        )
        return Attempt.from_json(data)

    def heartbeat(self, attempt_id: int, *, fence: int) -> Attempt:
        """The dispatched work is still running: extend the lease (the tool
        wrapper does this on its own while a tool runs). Safe to repeat."""
        _, data = self._request("POST", f"/attempts/{attempt_id}/heartbeat", {"fence": fence}, retry_if_sent=True)
        return Attempt.from_json(data)

    def abandon(self, attempt_id: int, *, fence: int = 0, reason: str = "") -> Attempt:
        """Give up an intent that was never sent (after a re-run with other
        arguments recorded a linked attempt, this lets it be approved)."""
        _, data = self._request(
            "POST", f"/attempts/{attempt_id}/abandon", {"fence": fence, "reason": reason}, retry_if_sent=True
        )
        return Attempt.from_json(data)

    def record_request_id(self, attempt_id: int, request_id: str, *, fence: int) -> Attempt:
        _, data = self._request(
            "POST",
            f"/attempts/{attempt_id}/request-id",
            {"fence": fence, "provider_request_id": request_id},
            retry_if_sent=True,
        )
        return Attempt.from_json(data)

    def _outcome(self, attempt_id: int, body: dict[str, Any]) -> Attempt:
        _, data = self._request("POST", f"/attempts/{attempt_id}/outcome", body, retry_if_sent=True)
        return Attempt.from_json(data)

    def confirm(
        self,
        attempt_id: int,
        *,
        fence: int,
        provider_request_id: str = "",
        result_ref: str = "",
        result: Any = None,
    ) -> Attempt:
        body = {"outcome": "confirmed", "fence": fence, "provider_request_id": provider_request_id}
        body.update({"result_ref": result_ref, "result": result})
        return self._outcome(attempt_id, body)

    def fail(self, attempt_id: int, *, fence: int, reason: str) -> Attempt:
        return self._outcome(attempt_id, {"outcome": "failed", "fence": fence, "reason": reason})

    def fail_retryable(self, attempt_id: int, *, fence: int, reason: str) -> Attempt:
        return self._outcome(attempt_id, {"outcome": "failed_retryable", "fence": fence, "reason": reason})

    def mark_unknown(self, attempt_id: int, *, fence: int, reason: str) -> Attempt:
        return self._outcome(attempt_id, {"outcome": "unknown", "fence": fence, "reason": reason})

    # --- reads -------------------------------------------------------------------------

    def get(self, attempt_id: int, *, wait: float = 0, fence: int | None = None) -> Attempt:
        """One attempt with its events. ``wait`` (seconds, at most 25): answer
        as soon as the attempt's fence differs from ``fence`` (default: its
        fence when the ledger receives the request), else when the wait ends."""
        params = {"wait": wait, "fence": fence} if wait else None
        _, data = self._request(
            "GET", f"/attempts/{attempt_id}", params=params, retry_if_sent=True, timeout=self.timeout + wait
        )
        return Attempt.from_json(data)

    def _list(self, params: dict[str, Any], limit: int | None) -> list[Attempt]:
        found: list[Attempt] = []
        before: int | None = None
        while limit is None or len(found) < limit:
            _, page = self._request(
                "GET", "/attempts", params={**params, "limit": 200, "before": before}, retry_if_sent=True
            )
            found.extend(Attempt.from_json(item) for item in page["items"])
            before = page.get("next_before")
            if before is None:
                break
        return found[:limit] if limit is not None else found

    def find(self, idempotency_key: str) -> list[Attempt]:
        """The key's attempts, newest first (the first recorded and its linked attempts)."""
        _check_key(idempotency_key)
        return self._list({"idempotency_key": idempotency_key}, None)

    def needs_attention(self, *, limit: int | None = 1000) -> list[Attempt]:
        """The tenant's UNKNOWN and MANUAL_REVIEW attempts, newest first."""
        return self._list({"needs_attention": "true"}, limit)

    def task(self, *, task_id: str, agent: str | None = None) -> Any:
        """``with client.task(task_id=...)``: the task that tool calls inside belong to."""
        return task(task_id=task_id, client=self, agent=agent)


# --- the one-line wrapper -------------------------------------------------------------------


@dataclass(frozen=True)
class TaskContext:
    client: LedgerClient
    task_id: str


_current_task: ContextVar[TaskContext | None] = ContextVar("ledgerdash_client_task", default=None)


@contextmanager
def task(*, task_id: str, client: LedgerClient | None = None, agent: str | None = None) -> Iterator[TaskContext]:
    """The task (and ledger) that tool calls inside this block belong to.

    Without ``client``, one is configured from the environment
    (``LEDGERDASH_URL``, ``LEDGERDASH_TOKEN``).
    """
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError("task_id must be a non-empty string")
    chosen = client or LedgerClient()
    if agent:
        chosen = chosen.with_agent(agent)
    context = TaskContext(client=chosen, task_id=task_id)
    token = _current_task.set(context)
    try:
        yield context
    finally:
        _current_task.reset(token)


class _OverHttp:
    """The wrapper's way to the ledger over HTTP (see :mod:`ledgerdash_client.toolcalls`).

    The server refuses a dispatch the ledger would refuse (unknown, under
    review, in flight) with the same codes, so nothing is checked twice here.
    """

    def __init__(self, context: TaskContext) -> None:
        self.client = context.client
        self.task_id = context.task_id

    def record_intent(
        self, *, tool_name: str, idempotency_key: str, args: dict[str, Any], credential_scope: Any
    ) -> tuple[Attempt, bool]:
        recorded = self.client.record_intent(
            task_id=self.task_id,
            tool_name=tool_name,
            idempotency_key=idempotency_key,
            args=args,
            credential_scope=credential_scope,
            claim=True,
        )
        return recorded.attempt, recorded.claimed

    def refuse_unless_dispatchable(self, attempt: Attempt) -> None:
        return None

    def replay(self, attempt: Attempt) -> Any:
        if attempt.result_source in ("tool", "lookup"):
            return attempt.result
        body = {"code": "result_unavailable", "attempt_id": attempt.id, "state": attempt.state}
        raise ERRORS["result_unavailable"](
            f"attempt {attempt.id} is confirmed ({attempt.data.get('last_note') or 'confirmed'}) but has no "
            "recorded result to replay; the effect happened, do not call the tool again",
            status=200,
            body=body,
        )

    def dispatch(self, attempt: Attempt) -> Attempt:
        try:
            return self.client.dispatch(attempt.id, fence=attempt.fence)
        except ERRORS["claim_lost"] as exc:
            raise ERRORS["attempt_in_flight"](str(exc), status=exc.status, body=exc.body) from None

    def heartbeat_interval(self, attempt: Attempt) -> float:
        try:
            lease_end = datetime.fromisoformat(str(attempt.data["next_check_at"]))
            started = datetime.fromisoformat(str(attempt.data["updated_at"]))
        except (KeyError, ValueError):
            return 0.0
        return max(0.05, (lease_end - started).total_seconds() / 3)

    def heartbeat(self, attempt: Attempt, fence: int) -> Attempt:
        return self.client.heartbeat(attempt.id, fence=fence)

    def heartbeat_done(self) -> None:
        return None

    def record_request_id(self, attempt: Attempt, request_id: str, fence: int) -> Attempt:
        return self.client.record_request_id(attempt.id, request_id, fence=fence)

    def confirm(
        self, attempt: Attempt, *, fence: int, provider_request_id: str, result_ref: str, result: Any, storable: bool
    ) -> Attempt:
        return self.client.confirm(
            attempt.id, fence=fence, provider_request_id=provider_request_id, result_ref=result_ref, result=result
        )

    def fail(self, attempt: Attempt, *, fence: int, reason: str, retryable: bool) -> Attempt:
        report = self.client.fail_retryable if retryable else self.client.fail
        return report(attempt.id, fence=fence, reason=reason)

    def mark_unknown(self, attempt: Attempt, *, fence: int, reason: str) -> Attempt:
        return self.client.mark_unknown(attempt.id, fence=fence, reason=reason)


def _session() -> _OverHttp:
    context = _current_task.get()
    if context is None:
        raise NoTask(NoTask.MESSAGE)
    return _OverHttp(context)


def tool(
    name: str,
    *,
    key: str | Callable[[dict[str, Any]], str],
    scope: str | Iterable[str] | None = None,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Wrap a tool so every call goes through the ledger over HTTP.

    The same contract as :func:`ledgerdash.ledger.recording.tool` (the steps
    are shared: :mod:`ledgerdash_client.toolcalls`): ``key`` names the logical side
    effect (a format string over the call's arguments or a function of
    them); the tool receives a :class:`ToolCall` first. Raise
    :class:`NothingHappened` when the provider guarantees it did not act,
    :class:`PermanentFailure` for a definitive refusal; any other exception
    leaves the outcome UNKNOWN for the reconciler. A confirmed key returns
    its stored result without calling the tool; one whose outcome is
    unknown, under review or in flight raises instead.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a tool needs a name")

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        return toolcalls.wrap(fn, name=name, key=key, scope=scope, session=_session)

    return decorate

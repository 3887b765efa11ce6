"""What every replica shares: the server, the effects it performed, its
faults, its clock, and the control API the tests and the crash drill use.

A replica is one provider. Its provider routes are of three kinds:

- ``act``: the request may perform an effect (create a payment intent,
  post a message). Faults here: ``reject`` (429 with ``Retry-After``,
  nothing done), ``server_error`` (``"before_acting"``: a 503 and nothing
  done; ``"after_acting"``: the effect is performed, then a 500),
  ``lose_response`` (performed, then the connection is dropped), ``hold``
  (the connection is dropped at once and the effect performed later, on
  release or after ``hold_seconds``: a slow provider acting on a request
  its caller gave up on), ``latency_ms``.
- ``read``: a lookup by id or a listing, read-after-write consistent.
  Faults: ``lookup_timeout`` (stall ``lookup_timeout_seconds``, then drop),
  ``lookup_5xx`` (503), ``lookup_429`` (429 with ``Retry-After``),
  ``latency_ms``.
- ``search``: a lookup through a search index, which shows an effect only
  ``search_lag_seconds`` after it was performed; the read faults too.

Control API (JSON), the sandbox provider's, so the crash drill drives a
replica as it drives the sandbox; a replica is one provider, so a fault set
for any tool name applies to all of its routes::

    GET  /health
    GET  /effects/count?key=<key>    effects whose record names the key (or its ledger reference)
    GET  /effects                    every effect, as the provider stores it
    GET  /faults   PUT /faults/<tool> {...}   DELETE /faults (the faults only; effects stay, counted by key)
    PUT  /baseline {...}             faults that DELETE /faults keeps (a search index's lag)
    POST /faults/<tool>/release      perform the held requests now -> {"performed": n}
    POST /clock {"advance": s}       move the replica's clock on (its timestamps, retention, search lag)
    DELETE /effects                  forget everything (effects and idempotency keys)
    GET  /modes    PUT /modes {...}   DELETE /modes (back to the defaults)

A mode is how an account of the provider may be set up, or a behaviour of
the real service that is unkind to a lookup (Twilio redacting a message,
Slack's rate for apps outside its Marketplace): each replica states its own
in :attr:`Replica.MODES`, with the provider's page that documents it; they
are off until switched on, and neither clearing faults nor forgetting
effects switches them off.

Standalone: nothing of Django or the ledger is imported, as a real provider
would import neither.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS: dict[str, Any] = {
    "non_idempotent": False,  # accepted for the drill; a replica deduplicates only as its provider does
    "reject": False,
    "reject_count": -1,
    "retry_after": 1,
    "server_error": "",
    "server_error_count": -1,
    "lose_response": False,
    "lose_response_count": -1,
    "hold": False,
    "hold_seconds": 30.0,
    "latency_ms": 0,
    "lookup_timeout": False,
    "lookup_timeout_seconds": 30.0,
    "lookup_5xx": False,
    "lookup_429": False,
    "search_lag_seconds": 0.0,
}
MAX_BODY = 1024 * 1024
ACT, READ, SEARCH = "act", "read", "search"


def ledger_ref(key: str) -> str:
    """The ledger's reference for a key, as its presets write it (``ld-`` and
    40 hex digits of the key's SHA-256): how a replica counts effects by key."""
    return "ld-" + hashlib.sha256(key.encode()).hexdigest()[:40]


@dataclass
class Effect:
    """One thing the provider did, as it stores it."""

    kind: str
    id: str
    created: float
    document: dict[str, Any]
    #: Any text the effect is known by besides its document (a hidden marker, a label).
    extra: str = ""

    def names(self, key: str) -> bool:
        text = json.dumps(self.document, ensure_ascii=False) + self.extra
        return key in text or ledger_ref(key) in text


@dataclass
class Request:
    method: str
    path: str
    groups: tuple[str, ...]
    query: dict[str, list[str]]
    headers: Any
    raw: bytes
    replica: Replica

    def arg(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[-1] if values else default

    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None

    def form(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.raw.decode(), keep_blank_values=True)

    def bearer(self) -> str:
        value = self.headers.get("Authorization", "")
        scheme, _, token = value.partition(" ")
        return token.strip() if scheme.lower() in ("bearer", "token") else ""

    def basic(self) -> tuple[str, str]:
        value = self.headers.get("Authorization", "")
        scheme, _, encoded = value.partition(" ")
        if scheme.lower() != "basic":
            return "", ""
        try:
            user, _, password = base64.b64decode(encoded.strip()).decode().partition(":")
        except ValueError:
            return "", ""
        return user, password


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    kind: str
    handler: Handler


@dataclass(frozen=True)
class Mode:
    """A switchable behaviour of the provider: its value when off, and where the provider documents it."""

    off: Any
    what: str
    source: str


class Replica:
    """One provider's state and routes. Subclasses add routes in :meth:`routes`
    and answer the provider's own way; :meth:`unauthorized` names what its
    API says when the credential is missing."""

    name = "replica"
    #: The provider's unkind behaviours this replica can show (``PUT /modes``).
    MODES: dict[str, Mode] = {}
    #: Its ``<fate>_every`` modes (every Nth effect made meets that fate), the first that applies winning.
    FATES: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.effects: list[Effect] = []
        self.fault_settings: dict[str, Any] = dict(FAULTS)
        self.mode_settings: dict[str, Any] = {name: mode.off for name, mode in self.MODES.items()}
        #: Faults that clearing the others keeps (``PUT /baseline``: a search index's lag).
        self.baseline: dict[str, Any] = {}
        self.offset = 0.0
        self.held: list[Callable[[], Any]] = []
        self.sequence = 0
        self._routes = [Route(m, re.compile(p + r"\Z"), k, h) for m, p, k, h in self.routes()]

    # --- what a provider defines -------------------------------------------------------

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        raise NotImplementedError

    def authorized(self, request: Request) -> Response | None:
        """None when the request carries a credential the provider would take; its refusal otherwise."""
        raise NotImplementedError

    def rate_limit_body(self) -> Any:
        return {"error": "rate limited"}

    def server_error_body(self) -> Any:
        return {"error": "internal server error"}

    def rate_limit_headers(self) -> dict[str, str]:
        """The headers of a 429 (``Retry-After``, where the provider sends one)."""
        return {"Retry-After": str(self.fault("retry_after"))}

    def rate_limit_status(self) -> int:
        """The status a request refused for its rate gets (429; GitHub's may be a 403)."""
        return 429

    def rate_limited(self) -> Response:
        """The answer to a request refused for its rate (the ``reject`` and ``lookup_429`` faults)."""
        return Response(self.rate_limit_status(), self.rate_limit_body(), self.rate_limit_headers())

    def forget(self) -> None:
        """Drop what the provider remembers besides its effects (idempotency keys)."""

    # --- state ---------------------------------------------------------------------------

    def now(self) -> float:
        return time.time() + self.offset

    def next_id(self) -> int:
        with self.lock:
            self.sequence += 1
            return self.sequence

    def record(self, effect: Effect) -> Effect:
        with self.lock:
            self.effects.append(effect)
        return effect

    def visible(self, effect: Effect) -> bool:
        """Whether a search index shows ``effect`` yet."""
        return effect.created <= self.now() - float(self.fault_settings["search_lag_seconds"])

    def of_kind(self, kind: str, *, searching: bool = False) -> list[Effect]:
        with self.lock:
            return [e for e in self.effects if e.kind == kind and (not searching or self.visible(e))]

    def fault(self, name: str) -> Any:
        with self.lock:
            return self.fault_settings[name]

    def fires(self, name: str) -> bool:
        """Whether a counted fault fires now, counting it down."""
        counter = f"{name}_count"
        with self.lock:
            if not self.fault_settings[name]:
                return False
            remaining = int(self.fault_settings.get(counter, -1))
            if remaining == 0:
                return False
            if remaining > 0:
                self.fault_settings[counter] = remaining - 1
            return True

    def set_faults(self, settings: dict[str, Any]) -> dict[str, Any]:
        unknown = set(settings) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {', '.join(sorted(unknown))} (known: {', '.join(sorted(FAULTS))})")
        if settings.get("server_error") not in (None, "", False, "before_acting", "after_acting"):
            raise ValueError('server_error is "before_acting", "after_acting" or ""')
        with self.lock:
            self.fault_settings.update(settings)
            return dict(self.fault_settings)

    def mode(self, name: str) -> Any:
        with self.lock:
            return self.mode_settings[name]

    def fate(self, number: int, fates: tuple[str, ...] | None = None) -> str:
        """What was done to the ``number``-th effect after it was made: the first of ``fates`` (of
        :attr:`FATES` unless told) whose every Nth takes it, without its ``_every`` ("" for nothing)."""
        for mode in self.FATES if fates is None else fates:
            every = int(self.mode(mode))
            if every > 0 and number % every == 0:
                return mode.removesuffix("_every")
        return ""

    def set_modes(self, settings: dict[str, Any]) -> dict[str, Any]:
        unknown = set(settings) - set(self.MODES)
        if unknown:
            known = ", ".join(sorted(self.MODES)) or "none"
            raise ValueError(f"unknown modes of {self.name}: {', '.join(sorted(unknown))} (known: {known})")
        for name, value in settings.items():
            if type(value) is not type(self.MODES[name].off) and not (
                isinstance(value, int | float) and isinstance(self.MODES[name].off, int | float)
            ):
                raise ValueError(f"mode {name} takes a {type(self.MODES[name].off).__name__}, not {value!r}")
        with self.lock:
            self.mode_settings.update(settings)
            return dict(self.mode_settings)

    def hold(self, perform: Callable[[], Any]) -> None:
        with self.lock:
            self.held.append(perform)
        timer = threading.Timer(float(self.fault("hold_seconds")), self._perform_held, args=(perform,))
        timer.daemon = True
        timer.start()

    def _perform_held(self, perform: Callable[[], Any]) -> bool:
        with self.lock:
            if perform not in self.held:
                return False
            self.held.remove(perform)
        perform()
        return True

    def release(self) -> int:
        with self.lock:
            pending = list(self.held)
        return sum(self._perform_held(p) for p in pending)

    # --- serving ------------------------------------------------------------------------

    def match(self, method: str, path: str) -> tuple[Route, tuple[str, ...]] | None:
        for route in self._routes:
            if route.method == method:
                found = route.pattern.match(path)
                if found:
                    return route, tuple(urllib.parse.unquote(g) if g else "" for g in found.groups())
        return None


class ReplicaHandler(BaseHTTPRequestHandler):
    server: ReplicaServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, response: Response) -> None:
        data = b"" if response.body is None else json.dumps(response.body).encode()
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without a response: the client never learns."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _serve(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self._send(Response(413, {"error": "body too large"}))
        raw = self.rfile.read(length) if length else b""
        replica = self.server.replica
        if self._control(method, parsed.path, parsed.query, raw):
            return None
        matched = replica.match(method, parsed.path)
        if matched is None:
            return self._send(Response(404, {"error": f"no such endpoint: {method} {parsed.path}"}))
        route, groups = matched
        request = Request(
            method, parsed.path, groups, urllib.parse.parse_qs(parsed.query, True), self.headers, raw, replica
        )
        refusal = replica.authorized(request)
        if refusal is not None:
            return self._send(refusal)
        latency = float(replica.fault("latency_ms"))
        if latency > 0:
            time.sleep(latency / 1000)
        if route.kind == ACT:
            return self._act(route, request)
        return self._read(route, request)

    def _act(self, route: Route, request: Request) -> None:
        replica = self.server.replica
        if replica.fires("reject"):
            return self._send(replica.rate_limited())
        error = replica.fault("server_error")
        if error == "before_acting" and replica.fires("server_error"):
            return self._send(Response(503, replica.server_error_body()))
        if replica.fault("hold"):
            replica.hold(lambda: route.handler(request))
            return self._drop()
        response = route.handler(request)
        acted = 200 <= response.status < 300
        if acted and replica.fires("lose_response"):
            return self._drop()
        if acted and error == "after_acting" and replica.fires("server_error"):
            return self._send(Response(500, replica.server_error_body()))
        return self._send(response)

    def _read(self, route: Route, request: Request) -> None:
        replica = self.server.replica
        if replica.fault("lookup_timeout"):
            time.sleep(float(replica.fault("lookup_timeout_seconds")))
            return self._drop()
        if replica.fault("lookup_5xx"):
            return self._send(Response(503, replica.server_error_body()))
        if replica.fault("lookup_429"):
            return self._send(replica.rate_limited())
        return self._send(route.handler(request))

    def _control(self, method: str, path: str, query: str, raw: bytes) -> bool:
        replica = self.server.replica
        params = urllib.parse.parse_qs(query)
        parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
        reply: Any = None
        try:
            if method == "GET" and parts == ["health"]:
                reply = {"ok": True, "provider": replica.name}
            elif method == "GET" and parts == ["effects", "count"]:
                key = (params.get("key") or [""])[-1]
                with replica.lock:
                    reply = {"key": key, "count": sum(e.names(key) for e in replica.effects)}
            elif method == "GET" and parts == ["effects"]:
                with replica.lock:
                    reply = [{"kind": e.kind, "id": e.id, "created": e.created, **e.document} for e in replica.effects]
            elif method == "DELETE" and parts == ["effects"]:
                with replica.lock:
                    replica.effects.clear()
                    replica.forget()
                reply = {}
            elif method == "GET" and parts == ["faults"]:
                reply = dict(replica.fault_settings)
            elif method == "PUT" and len(parts) == 2 and parts[0] == "faults":
                settings = json.loads(raw or b"{}")
                if not isinstance(settings, dict):
                    raise ValueError("faults must be a JSON object")
                reply = replica.set_faults(settings)
            elif method == "DELETE" and parts == ["faults"]:
                with replica.lock:
                    replica.fault_settings = {**FAULTS, **replica.baseline}
                reply = {}
            elif method == "PUT" and parts == ["baseline"]:
                settings = json.loads(raw or b"{}")
                if not isinstance(settings, dict):
                    raise ValueError("the baseline must be a JSON object")
                replica.set_faults(settings)
                with replica.lock:
                    replica.baseline = dict(settings)
                reply = dict(replica.baseline)
            elif method == "POST" and len(parts) == 3 and parts[0] == "faults" and parts[2] == "release":
                reply = {"performed": replica.release()}
            elif method == "GET" and parts == ["modes"]:
                reply = dict(replica.mode_settings)
            elif method == "PUT" and parts == ["modes"]:
                settings = json.loads(raw or b"{}")
                if not isinstance(settings, dict):
                    raise ValueError("modes must be a JSON object")
                reply = replica.set_modes(settings)
            elif method == "DELETE" and parts == ["modes"]:
                reply = replica.set_modes({name: mode.off for name, mode in replica.MODES.items()})
            elif method == "POST" and parts == ["clock"]:
                advance = float(json.loads(raw or b"{}").get("advance", 0))
                with replica.lock:
                    replica.offset += advance
                reply = {"now": replica.now()}
            else:
                return False
        except (ValueError, TypeError, AttributeError) as exc:
            self._send(Response(400, {"error": str(exc)}))
            return True
        self._send(Response(200, reply))
        return True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class ReplicaServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], replica: Replica, *, verbose: bool = False) -> None:
        super().__init__(address, ReplicaHandler)
        self.replica = replica
        self.verbose = verbose


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))

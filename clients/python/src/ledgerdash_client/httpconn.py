"""Keep-alive HTTP connections for the ledger's Python client (standard library only).

A tool call through the ingest API is two or three requests in a row to the
same server. Opening a TCP (and TLS) connection for each costs more than
the request itself on loopback, so :class:`Connections` keeps one open
connection per thread and sends the next request on it.

A kept connection can be closed by the server while it sits idle (gunicorn
closes one after its ``keepalive`` seconds). Two rules keep that from
costing a request, the same as the standard HTTP clients' (Go's
``net/http``, urllib3):

- a connection idle for longer than ``reuse_within`` seconds (below any
  sane server keep-alive), or one the server has written to or closed
  while idle (its socket is readable), is replaced before it is used;
- when sending a request on a reused connection fails, the server closed
  it before it read a byte of that request: the request is sent again on
  a new connection. Once a request was sent, a failure is the caller's to
  judge (:class:`MaybeSent`): the server may have acted on it.

Behind an HTTP(S) proxy named by the environment (``HTTPS_PROXY``, ...)
requests go through :mod:`urllib`, one connection each.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any

#: Seconds a connection may sit idle and still be used again: well under
#: gunicorn's default keep-alive (2 s) and the one deploy/gunicorn.conf.py sets.
REUSE_WITHIN = 1.5


class NotSent(OSError):
    """The request certainly did not reach the server: no connection could
    be made (refused, unresolved, timed out), or the kept one was closed."""


class MaybeSent(OSError):
    """The request was sent (or may have been) and no complete answer came back."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # urllib would turn a redirected POST into a GET without its body.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class _Held:
    conn: http.client.HTTPConnection
    pid: int
    last_used: float


class Connections:
    """Requests to one server (``scheme://host:port``), on a kept connection
    per thread. Safe to share between threads; a forked child opens its own."""

    def __init__(self, base_url: str, *, reuse_within: float = REUSE_WITHIN) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.scheme, self.host = parts.scheme, parts.hostname or ""
        self.port = parts.port or (443 if self.scheme == "https" else 80)
        self.reuse_within = reuse_within
        proxies = urllib.request.getproxies()
        self._via_proxy = self.scheme in proxies and not urllib.request.proxy_bypass(parts.netloc)
        self._opener = urllib.request.build_opener(_NoRedirects) if self._via_proxy else None
        self._local = threading.local()

    def request(self, method: str, url: str, *, body: bytes | None, headers: dict[str, str], timeout: float) -> Answer:
        """Send one request to ``url`` (on this server) and read its whole answer.

        Raises :class:`NotSent` when the request certainly did not arrive,
        :class:`MaybeSent` when it may have."""
        if self._via_proxy:
            return self._through_urllib(method, url, body=body, headers=headers, timeout=timeout)
        parts = urllib.parse.urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        held = self._reusable()
        if held is not None:
            try:
                return self._exchange(held.conn, method, target, body, headers, timeout)
            except NotSent:
                pass  # closed by the server while idle: this request never reached it
        return self._exchange(self._open(), method, target, body, headers, timeout)

    def close(self) -> None:
        """Close this thread's kept connection, if any."""
        held: _Held | None = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None and held.pid == os.getpid():
            held.conn.close()

    def _reusable(self) -> _Held | None:
        held: _Held | None = getattr(self._local, "held", None)
        if held is None:
            return None
        if held.pid != os.getpid():
            # Inherited through fork: the parent may still use this socket.
            self._local.held = None
            return None
        sock = held.conn.sock
        idle = time.monotonic() - held.last_used
        if sock is None or idle >= self.reuse_within or _readable(sock):
            # Nothing is due on an idle connection: anything to read is the server closing it.
            self.close()
            return None
        return held

    def _open(self) -> http.client.HTTPConnection:
        self.close()
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port)
        self._local.held = _Held(conn, os.getpid(), time.monotonic())
        return conn

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float,
    ) -> Answer:
        reused = conn.sock is not None
        conn.timeout = timeout
        if not reused:
            try:
                conn.connect()
            except OSError as exc:  # refused, unresolved, timed out, TLS refused: nothing was sent
                self.close()
                raise NotSent(f"{type(exc).__name__}: {exc}") from exc
        assert conn.sock is not None
        conn.sock.settimeout(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if reused:
                raise NotSent(f"the kept connection was closed: {exc}") from exc
            raise MaybeSent(f"{type(exc).__name__}: {exc}") from exc
        try:
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise MaybeSent(f"{type(exc).__name__}: {exc}") from exc
        if response.will_close:
            self.close()
        else:
            self._local.held.last_used = time.monotonic()
        return Answer(response.status, response.headers, data)

    def _through_urllib(
        self, method: str, url: str, *, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Answer:
        assert self._opener is not None
        request = urllib.request.Request(url, data=body, headers=headers, method=method)  # noqa: S310
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return Answer(response.status, response.headers, response.read())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, exc.headers, exc.read())
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, ConnectionRefusedError | socket.gaierror):
                raise NotSent(f"{type(reason).__name__}: {reason}") from exc
            raise MaybeSent(f"{type(reason).__name__}: {reason}") from exc


def _readable(sock: socket.socket) -> bool:
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)

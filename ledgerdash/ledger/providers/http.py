"""The generic HTTP adapter: a provider with an idempotency header and a
lookup API needs configuration, not code.

Example ``Tool.config`` for a provider that takes ``POST /v1/messages`` with
an ``Idempotency-Key`` header and answers ``GET /v1/messages?key=…``::

    {
      "dispatch_url": "https://api.example.com/v1/messages",
      "idempotency_header": "Idempotency-Key",
      "headers": {"Authorization": "Bearer ${EXAMPLE_API_TOKEN}"},
      "request_id_path": "id",
      "lookup_url": "https://api.example.com/v1/messages?key={key}",
      "lookup_request_id_path": "data[0].id",
      "lookup_payload_hash_path": "data[0].payload_sha256",
      "lookup_not_found_statuses": [404]
    }

Paths are JMESPath expressions into the JSON responses. ``{key}`` and
``{tool}`` in URLs are replaced (URL-quoted). ``${NAME}`` in header values is
a secret resolved at call time (:mod:`ledgerdash.ledger.secrets`: the
secrets file, then the environment), so secrets never sit in the database.
When a tenant binds ``NAME`` to a secret of its own
(:class:`~ledgerdash.ledger.models.ToolCredential`), that tenant's calls use
it; once any tenant binds ``NAME``, a tenant without a binding cannot call.

When the provider returns the payload rather than its hash, set
``lookup_payload_path`` and the adapter hashes it (RFC 8785, as the ledger
does).

The request body is the attempt's arguments as canonical JSON: exactly the
bytes the ledger hashed.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import string
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jmespath

from ledgerdash.ledger import secrets
from ledgerdash.ledger.canonical import canonical_bytes, sha256_hex
from ledgerdash.ledger.errors import InvalidArgs, NothingHappened, PermanentFailure
from ledgerdash.ledger.providers.base import (
    Dispatched,
    Lookup,
    LookupStatus,
    ProviderAdapter,
    ProviderAmbiguous,
    RateLimited,
    retry_after_seconds,
)
from ledgerdash_client import crashpoints

MAX_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HttpConfig:
    dispatch_url: str = ""
    dispatch_method: str = "POST"
    idempotency_header: str = "Idempotency-Key"
    headers: dict[str, str] = field(default_factory=dict)
    request_id_path: str = "id"
    result_ref_path: str = ""
    lookup_url: str = ""
    lookup_method: str = "GET"
    lookup_request_id_path: str = "id"
    lookup_payload_hash_path: str = "payload_hash"
    lookup_payload_path: str = ""
    lookup_not_found_statuses: list[int] = field(default_factory=lambda: [404])
    #: Dispatch statuses that mean "rejected before acting": retry with the same key later.
    nothing_happened_statuses: list[int] = field(default_factory=lambda: [429])
    #: Dispatch statuses that mean "refused for good".
    permanent_failure_statuses: list[int] = field(default_factory=lambda: [400, 401, 402, 403, 404, 405, 410, 413, 422])
    connect_timeout: float = 3.0
    lookup_timeout: float = 5.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HttpConfig:
        if not isinstance(raw, dict):
            raise TypeError("HTTP adapter config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown HTTP adapter settings: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        config = cls(**raw)
        config.validate()
        return config

    def validate(self) -> None:
        if not self.dispatch_url and not self.lookup_url:
            raise ValueError("set dispatch_url, lookup_url, or both")
        for name in ("dispatch_url", "lookup_url"):
            url = getattr(self, name)
            if not url:
                continue
            sample = _fill(url, key="k", tool="t")
            parts = urllib.parse.urlsplit(sample)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{name} must be an http(s) URL, not {url!r}")
        for name in (
            "request_id_path",
            "result_ref_path",
            "lookup_request_id_path",
            "lookup_payload_hash_path",
            "lookup_payload_path",
        ):
            path = getattr(self, name)
            if path:
                jmespath.compile(path)
        for value in self.headers.values():
            string.Template(value).get_identifiers()
        if min(self.connect_timeout, self.lookup_timeout) <= 0:
            raise ValueError("timeouts must be positive")


def _fill(template: str, *, key: str, tool: str) -> str:
    try:
        return template.format(key=urllib.parse.quote(key, safe=""), tool=urllib.parse.quote(tool, safe=""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"URL template {template!r} may use only {{key}} and {{tool}}: {exc}") from None


def _latin1(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


class NotSent(Exception):
    """The connection failed before a byte of the request left."""


def _search(path: str, document: Any) -> str:
    if not path or document is None:
        return ""
    found = jmespath.search(path, document)
    if found is None:
        return ""
    return found if isinstance(found, str) else json.dumps(found)


class HttpCalls(ProviderAdapter):
    """What every adapter that speaks HTTP shares: the tool's credentials
    (``${NAME}`` placeholders filled from the secrets at call time, a
    tenant's own binding first) and one request bounded as a whole.

    A request gives up when its time has passed since it began, counting
    connecting, sending and reading alike: for a dispatch that is the tool's
    maximum request time (``max_request_seconds``), as the ledger relies on
    no request landing later than that after it was sent."""

    connect_timeout: float = 3.0

    def __init__(
        self,
        tool_name: str,
        *,
        credentials: Mapping[str, str] | None = None,
        per_tenant: Iterable[str] = (),
        tenant_label: str = "",
    ) -> None:
        self.tool_name = tool_name
        #: This tenant's bindings: placeholder -> secret name.
        self.credentials = dict(credentials or {})
        #: Placeholders some tenant binds: never filled from a shared secret.
        self.per_tenant = frozenset(per_tenant)
        self.tenant_label = tenant_label

    def _filled(
        self, templates: Mapping[str, str], extra: Mapping[str, str] | None = None, *, what: str = "header"
    ) -> dict[str, str]:
        """Headers from ``templates`` with their secrets filled in, then
        ``extra``; ``what`` the templates are, for the messages."""
        headers = {"Accept": "application/json", "User-Agent": "ledgerdash"}
        for name, value in templates.items():
            template = string.Template(value)
            filled: dict[str, str] = {}
            for placeholder in template.get_identifiers():
                filled[placeholder] = self._secret(f"{what} {name}", placeholder)
            headers[name] = template.substitute(filled)
        headers.update(extra or {})
        return headers

    def _secret(self, where: str, placeholder: str) -> str:
        """The secret ``${placeholder}`` (in ``where``: a header, a setting)
        stands for; nothing is sent when it is missing (the message names
        it, never its value)."""
        whose = f" for tenant {self.tenant_label}" if self.tenant_label else ""
        if placeholder in self.credentials:
            name, source = self.credentials[placeholder], f"the credential bound{whose}"
        elif placeholder in self.per_tenant:
            raise NothingHappened(
                f"{where} needs ${{{placeholder}}}, a per-tenant credential of {self.tool_name}, "
                f"and none is bound{whose}"
            )
        else:
            name, source = placeholder, "the tool's shared secret"
        try:
            value = secrets.secret(name)
        except secrets.SecretsFileInvalid as exc:
            raise NothingHappened(f"{where}: {exc}") from None
        if value is None:
            raise NothingHappened(
                f"{where} needs secret {name} ({source}), which is in neither the secrets file nor the environment"
            )
        if not value.isprintable() or not _latin1(value):
            # Refused before anything is sent: http.client would refuse the header, its value in the message.
            raise NothingHappened(
                f"{where}: secret {name} ({source}) holds a line break or a character a header cannot carry"
            )
        return value

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float,
        before_send: Callable[[], None] | None = None,
        after_send: Callable[[], None] | None = None,
    ) -> tuple[int, bytes, http.client.HTTPMessage]:
        """One request that gives up ``timeout`` seconds after it began,
        whatever the provider does (a socket timeout alone bounds each read,
        not the whole response): its status, body and headers. Raises
        :class:`NotSent` when the connection failed before a byte left."""
        deadline = time.monotonic() + timeout
        parts = urllib.parse.urlsplit(url)
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = connection_class(parts.hostname or "", parts.port, timeout=min(self.connect_timeout, timeout))
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query

        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError  # named below, with a socket's own timeout
            return left

        try:
            try:
                conn.connect()
            except OSError as exc:
                raise NotSent(f"{type(exc).__name__}: {exc}") from exc
            if before_send is not None:
                before_send()
            # The response reads through this socket even after the
            # connection object lets go of it (a "Connection: close" answer).
            sock = conn.sock
            assert sock is not None
            sock.settimeout(remaining())
            conn.request(method, target, body=body, headers=headers)
            if after_send is not None:
                after_send()
            sock.settimeout(remaining())
            response = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_RESPONSE_BYTES:
                if response.isclosed():
                    # All of a Content-Length body was read: on a "Connection:
                    # close" answer (any HTTP/1.0 server) the socket is gone now.
                    break
                sock.settimeout(remaining())
                chunk = response.read1(64 * 1024)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return response.status, b"".join(chunks)[:MAX_RESPONSE_BYTES], response.headers
        except TimeoutError as exc:
            # The whole request's bound ran out, or a socket's (set to what was
            # left of it), whose "timed out" says nothing of which: name it.
            raise TimeoutError(f"no complete answer within {timeout:g}s") from exc
        finally:
            conn.close()


class HttpAdapter(HttpCalls):
    def __init__(
        self,
        tool_name: str,
        config: HttpConfig,
        *,
        credentials: Mapping[str, str] | None = None,
        per_tenant: Iterable[str] = (),
        tenant_label: str = "",
    ) -> None:
        super().__init__(tool_name, credentials=credentials, per_tenant=per_tenant, tenant_label=tenant_label)
        self.config = config
        self.connect_timeout = config.connect_timeout

    @classmethod
    def from_config(cls, tool_name: str, raw: dict[str, Any]) -> HttpAdapter:
        return cls(tool_name, HttpConfig.from_dict(raw))

    @property
    def can_dispatch(self) -> bool:
        return bool(self.config.dispatch_url)

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        return self._filled(self.config.headers, extra)

    def dispatch(
        self, *, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None = None
    ) -> Dispatched:
        if not self.config.dispatch_url:
            raise PermanentFailure(f"tool {self.tool_name} has no dispatch_url: it can be looked up, not sent")
        try:
            body = canonical_bytes(args)
        except InvalidArgs as exc:
            raise PermanentFailure(str(exc)) from None
        headers = self._headers({"Content-Type": "application/json", self.config.idempotency_header: key})
        url = _fill(self.config.dispatch_url, key=key, tool=self.tool_name)
        try:
            status, data, answer = self._exchange(
                self.config.dispatch_method,
                url,
                body=body,
                headers=headers,
                timeout=self.max_request_seconds,
                before_send=lambda: crashpoints.reached(crashpoints.BEFORE_SEND),
                after_send=lambda: crashpoints.reached(crashpoints.AFTER_SEND),
            )
        except NotSent as exc:
            raise NothingHappened(f"could not connect to the provider: {exc}") from None
        snippet = data[:200].decode("utf-8", "replace")
        if 200 <= status < 300:
            document = _json(data)
            request_id = _search(self.config.request_id_path, document)
            if request_id and on_request_id is not None:
                on_request_id(request_id)
            return Dispatched(
                request_id=request_id,
                result_ref=_search(self.config.result_ref_path, document),
                response=document,
            )
        if status in self.config.nothing_happened_statuses:
            wait = retry_after_seconds(answer.get("Retry-After"))
            raise RateLimited(f"provider answered HTTP {status} before acting: {snippet}", wait)
        if status in self.config.permanent_failure_statuses:
            raise PermanentFailure(f"provider refused with HTTP {status}: {snippet}")
        raise ProviderAmbiguous(f"provider answered HTTP {status}, which does not say whether it acted: {snippet}")

    def lookup(self, *, key: str, args_hash: str) -> Lookup:
        if not self.config.lookup_url:
            return Lookup(LookupStatus.UNAVAILABLE, detail=f"tool {self.tool_name} has no lookup_url configured")
        url = _fill(self.config.lookup_url, key=key, tool=self.tool_name)
        started = time.monotonic()
        try:
            headers = self._headers({})
            status, data, answer = self._exchange(
                self.config.lookup_method, url, body=None, headers=headers, timeout=self.config.lookup_timeout
            )
        except (NotSent, NothingHappened, OSError, http.client.HTTPException) as exc:
            took = time.monotonic() - started
            return Lookup(LookupStatus.UNAVAILABLE, detail=f"{type(exc).__name__} after {took:.1f}s: {exc}")
        if status in self.config.lookup_not_found_statuses:
            return Lookup(LookupStatus.NOT_FOUND, detail=f"HTTP {status}")
        if not 200 <= status < 300:
            return Lookup(
                LookupStatus.UNAVAILABLE,
                detail=f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}",
                retry_after=retry_after_seconds(answer.get("Retry-After")) if status == 429 else None,
            )
        document = _json(data)
        if document is None:
            return Lookup(LookupStatus.UNAVAILABLE, detail=f"HTTP {status} with a body that is not JSON")
        payload_hash = _search(self.config.lookup_payload_hash_path, document)
        if not payload_hash and self.config.lookup_payload_path:
            payload = jmespath.search(self.config.lookup_payload_path, document)
            if payload is not None:
                try:
                    payload_hash = sha256_hex(canonical_bytes(payload))
                except InvalidArgs:
                    payload_hash = ""
        return Lookup(
            LookupStatus.FOUND,
            request_id=_search(self.config.lookup_request_id_path, document),
            payload_hash=payload_hash,
            detail=f"HTTP {status}",
            document=document,
        )


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except (ValueError, UnicodeDecodeError):
        return None

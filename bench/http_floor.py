"""The HTTP floor: the least a service could do to record a tool call over HTTP.

A WSGI application of a few dozen lines, served by the same gunicorn
configuration as the ledger (deploy/gunicorn.conf.py, the same workers and
threads) and called by the same client (:class:`ledgerdash_client.LedgerClient`
on its kept connection), answering the three requests of a tool call at the
ingest API's paths:

- ``POST /api/v1/attempts`` (with ``"claim": true``, the two-commit path),
- ``POST /api/v1/attempts/<id>/dispatch``,
- ``POST /api/v1/attempts/<id>/outcome`` (``confirmed`` only).

Each request does the authentication the ledger does (the bearer token's
sha256 compared with the stored hash, its scope, expiry, revocation and the
tenant's being active, kept per worker for ``LEDGER_TOKEN_CACHE_SECONDS``
as the ledger keeps its checks), then sends the minimal psycopg peer's one
statement for its step (:class:`bench.peers.MinimalPeer`: the attempt's
change and its hash-chained event in one autocommitted statement, guarded
by the tenant's current authority), on a connection of the thread's own,
and answers the attempt as JSON with the fields the client reads.

What it leaves out is what the ledger adds over the same transport: Django's
request cycle and middleware, django-ninja's validation and rendering, the
ledger's checks in Python and its fuller answer. It keeps a copy of each
attempt it recorded (key, tool, policy version: what the next step's event
states) so that the dispatch and the outcome need no read; a request for an
attempt another worker recorded reads it first (tenant-checked). No retries
of a recorded key: a repeated key answers 409 (the ledger answers the same
attempt); the benchmark never repeats one.
"""

from __future__ import annotations

import hashlib
import hmac
import http
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.peers import TOOL, TOOL_CLAIMED, MinimalPeer
from ledgerdash_client.errorcodes import BY_CODE

#: As ledgerdash.ledger.tokens and TokenScope.WRITE say (the floor imports nothing of Django).
TOKEN_PREFIX = "ldk_"  # noqa: S105 - the public marker every token starts with
WRITE = "attempts:write"
#: What a worker keeps: checked tokens for this long (the ledger's default), at most this many attempts.
TOKEN_SECONDS = float(os.environ.get("LEDGER_TOKEN_CACHE_SECONDS", "5"))
COPIES_MAX = 100_000
#: As the ledger: a body over this is refused; a token's last use is written at most once a minute.
MAX_BODY = int(os.environ.get("LEDGER_API_MAX_BODY_BYTES", str(512 * 1024)))
TOUCH_EVERY = timedelta(minutes=1)

_PATH = re.compile(r"^/api/v1/attempts(?:/(\d{1,18})/(dispatch|outcome))?/?$")
_local = threading.local()
_tokens: dict[str, tuple[float, dict[str, Any]]] = {}
_copies: dict[int, dict[str, Any]] = {}

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class Refused(Exception):
    """An error answer with one of the ledger's codes, at the status the ledger answers it with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        status = BY_CODE[code].status
        self.status = f"{status} {http.HTTPStatus(status).phrase}"


def _peer() -> MinimalPeer:
    """This thread's floor, on its own autocommitted connection (opened on first use)."""
    peer: MinimalPeer | None = getattr(_local, "peer", None)
    if peer is None or peer.conn.closed:
        import psycopg

        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        peer = _local.peer = MinimalPeer(
            conn,
            "",
            dispatch_lease=float(os.environ.get("LEDGER_DISPATCH_LEASE_SECONDS", "60")),
            max_request=float(os.environ.get("LEDGER_MAX_REQUEST_SECONDS", "30")),
            intent_lease=float(os.environ.get("LEDGER_INTENT_LEASE_SECONDS", "900")),
        )
    return peer


def _authenticate(conn: Any, header: str) -> dict[str, Any]:
    """The token's id, tenant and prefix, as the ledger checks a bearer token."""
    scheme, _, raw = header.partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise Refused("missing_token", "no bearer token was sent")
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        raise Refused("invalid_token", "no valid bearer token")
    digest = hashlib.sha256(raw.encode()).hexdigest()
    kept = _tokens.get(digest)
    now = datetime.now(UTC)
    if kept is None or time.monotonic() - kept[0] >= TOKEN_SECONDS:
        prefix = raw[len(TOKEN_PREFIX) :].partition("_")[0]
        row = conn.execute(
            "SELECT k.tenant_id, k.secret_hash, k.scopes, k.revoked_at, k.expires_at, t.is_active, k.id,"
            " k.last_used_at FROM ledger_apitoken k JOIN ledger_tenant t ON t.id = k.tenant_id WHERE k.prefix = %s",
            [prefix],
        ).fetchone()
        if row is None or not hmac.compare_digest(row[1], digest):
            raise Refused("invalid_token", "no valid bearer token")
        tenant_id, _, scopes, revoked_at, expires_at, active, token_id, last_used_at = row
        if revoked_at is not None:
            raise Refused("token_revoked", f"token {prefix} was revoked")
        if WRITE not in scopes.split():
            raise Refused("insufficient_scope", f"token {prefix} lacks {WRITE}")
        if not active:
            raise Refused("tenant_inactive", "the tenant is not active")
        token = {"id": token_id, "tenant": tenant_id, "prefix": prefix, "expires_at": expires_at, "used": last_used_at}
        kept = (time.monotonic(), token)
        if len(_tokens) >= 1024:
            _tokens.clear()
        _tokens[digest] = kept
    token = kept[1]
    if token["expires_at"] is not None and token["expires_at"] <= now:
        raise Refused("token_expired", f"token {token['prefix']} expired")
    if token["used"] is None or token["used"] <= now - TOUCH_EVERY:
        conn.execute(
            "UPDATE ledger_apitoken SET last_used_at = %s WHERE id = %s"
            " AND (last_used_at IS NULL OR last_used_at <= %s)",
            [now, token["id"], now - TOUCH_EVERY],
        )
        token["used"] = now
    return token


def _attempt(peer: MinimalPeer, attempt_id: int, tenant_id: int) -> dict[str, Any]:
    """The worker's copy of an attempt it recorded, else the row (of the token's tenant)."""
    copy = _copies.get(attempt_id)
    if copy is not None and copy["tenant_id"] == tenant_id:
        return copy
    row = peer.conn.execute(
        "SELECT policy_version, idempotency_key, tool_name, task_id, args_hash FROM ledger_attempt"
        " WHERE id = %s AND tenant_id = %s",
        [attempt_id, tenant_id],
    ).fetchone()
    if row is None:
        raise Refused("attempt_not_found", f"no attempt {attempt_id}")
    version, key, tool, task, args_hash = row
    return {
        "id": attempt_id, "tenant_id": tenant_id, "policy_version": version, "key": key, "tool": tool,
        "task_id": task, "args_hash": args_hash,
    }  # fmt: skip


def _shown(attempt: dict[str, Any], state: str, fence: int, request_id: str = "") -> dict[str, Any]:
    return {
        "id": attempt["id"],
        "state": state,
        "fence": fence,
        "task_id": attempt["task_id"],
        "tool_name": attempt["tool"],
        "idempotency_key": attempt["key"],
        "provider_key": attempt["key"],
        "args_hash": attempt["args_hash"],
        "dispatch_fence": 1 if fence else None,
        "provider_request_id": request_id,
        "result_ref": "",
        "result_source": "tool" if state == "OUTCOME_CONFIRMED" else "",
        "parent_id": None,
        "result": None,
    }


def _refused_intent(peer: MinimalPeer, tenant_id: int, key: str) -> Refused:
    """Why an intent's statement wrote nothing (asked only then): the key is
    recorded already (the floor does not answer a repeat with its attempt, as
    the ledger does), or the tenant's authority does not allow the tool."""
    found = peer.conn.execute(
        "SELECT FROM ledger_attempt WHERE tenant_id = %s AND idempotency_key = %s AND parent_id IS NULL",
        [tenant_id, key],
    ).fetchone()
    if found is not None:
        return Refused("idempotency_key_reused", f"the key {key!r} is recorded already")
    return Refused("tool_not_allowed", "the tenant's policy does not allow the tool with these scopes")


def _handle(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[str, dict[str, Any]]:
    if method == "GET" and path == "/healthz":
        return "200 OK", {"status": "ok"}
    matched = _PATH.match(path)
    if matched is None or method != "POST":
        raise Refused("not_found", f"{method} {path}")
    peer = _peer()
    token = _authenticate(peer.conn, headers.get("authorization", ""))
    label = "".join(c for c in headers.get("ledgerdash-agent", "") if c.isprintable()).strip()[:100]
    peer.label = f"{label or 'api'} via token {token['prefix']}"
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise Refused("malformed_json", "the body is not JSON") from None
    if not isinstance(data, dict):
        raise Refused("malformed_json", "the body is not a JSON object")
    attempt_id, step = matched[1], matched[2]
    try:
        if attempt_id is None:
            claim = data.get("claim") is True
            if data["tool_name"] != (TOOL_CLAIMED if claim else TOOL):
                raise Refused("tool_not_allowed", "the floor records the benchmark's tool only")
            key = str(data["idempotency_key"])
            try:
                attempt = peer.record_intent(
                    tenant_id=token["tenant"],
                    task_id=str(data["task_id"]),
                    key=key,
                    args=data["args"],
                    claim=claim,
                    api_token=token["id"],
                )
            except RuntimeError:
                raise _refused_intent(peer, token["tenant"], key) from None
            if len(_copies) >= COPIES_MAX:
                _copies.clear()
            _copies[attempt["id"]] = attempt
            return "201 Created", _shown(attempt, "DISPATCHED" if claim else "INTENT_RECORDED", int(claim))
        attempt = _attempt(peer, int(attempt_id), token["tenant"])
        if step == "dispatch":
            if data.get("fence", 0) != 0:
                raise Refused("stale_fence", "the dispatch is claimed at fence 0")
            try:
                peer.dispatch(attempt)
            except RuntimeError as exc:  # lost the claim, or the authority changed: nothing was written
                raise Refused("claim_lost", str(exc)) from None
            return "200 OK", _shown(attempt, "DISPATCHED", 1)
        if data.get("outcome") != "confirmed" or data.get("fence") != 1:
            raise Refused("stale_fence", "the floor confirms a dispatch at fence 1 only")
        request_id = str(data.get("provider_request_id") or "")
        if not request_id:
            raise Refused("missing_evidence", "confirmed without a provider request id")
        if data.get("result_ref") or data.get("result") is not None:
            raise Refused("invalid_field", "the floor records a confirmation's provider request id only")
        try:
            peer.confirm(attempt, request_id=request_id)
        except RuntimeError as exc:
            raise Refused("stale_fence", str(exc)) from None
        _copies.pop(attempt["id"], None)
        return "200 OK", _shown(attempt, "OUTCOME_CONFIRMED", 2, request_id)
    except KeyError as exc:
        raise Refused("validation_error", f"missing {exc}") from None


def _answer(environ: dict[str, Any]) -> tuple[str, dict[str, Any], list[tuple[str, str]]]:
    import psycopg

    try:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise Refused("invalid_content_length", "Content-Length is not a number") from None
        if length > MAX_BODY:
            raise Refused("body_too_large", f"the body is over {MAX_BODY} bytes")
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        headers = {
            "authorization": environ.get("HTTP_AUTHORIZATION", ""),
            "ledgerdash-agent": environ.get("HTTP_LEDGERDASH_AGENT", ""),
        }
        status, answer = _handle(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), headers, body)
        return status, answer, []
    except Refused as exc:
        extra = [("WWW-Authenticate", 'Bearer realm="ledgerdash"')] if exc.status.startswith("401") else []
        return exc.status, {"code": exc.code, "message": str(exc)}, extra
    except psycopg.OperationalError as exc:  # the database is away: this thread connects afresh next time
        peer = getattr(_local, "peer", None)
        if peer is not None:
            peer.conn.close()
        refused = Refused("ledger_unavailable", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
        return refused.status, {"code": refused.code, "message": str(refused)}, [("Retry-After", "1")]


def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    status, answer, headers = _answer(environ)
    payload = json.dumps(answer).encode()
    headers += [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
    start_response(status, headers)
    return [payload]

"""The sandbox provider: a small, real HTTP service that performs and counts effects.

It stands in for an email, payment or ticket provider in the demo, the
tests and the crash drill, and it is honest: every effect it reports was
written to its own SQLite file, and ``/effects/count`` says how many times
each key was actually performed. Faults are switched per tool at run time:

- ``non_idempotent``: ignore idempotency keys, perform every request (the
  key is still stored as a correlation field for lookups);
- ``lose_response``: perform the effect, then drop the connection without
  answering (the classic "accepted but never acknowledged");
- ``reject``: answer 429 without acting (``reject_count`` times, -1 for ever);
- ``lookup_timeout``: stall lookups for ``lookup_timeout_seconds``;
- ``lookup_5xx``: answer lookups with 503;
- ``latency_ms``: add latency to every request of the tool.
- ``hold``: a request still in flight: the sandbox reads it, drops the
  connection at once (the caller sees its request cut off) and performs it
  only when released (``POST /faults/<tool>/release``), or by itself after
  ``hold_seconds`` — as a slow provider acts on a request the caller gave
  up on. Lookups meanwhile answer 404, truthfully: it has not happened yet.

API (JSON everywhere)::

    POST /tools/<tool>/effects        Idempotency-Key: <key>; body: the payload
         -> 201 {"id", "key", "tool", "payload_hash", "created_at"}  performed
         -> 200 the same body                                         key seen before, same payload
         -> 422 {"error": "key reused with a different payload"}      nothing performed
    GET  /tools/<tool>/effects?key=<key>
         -> 200 {"id", "key", "tool", "payload_hash", "count", ...}   the latest effect for the key
         -> 404 {"error": "not found"}
    GET  /effects/count?key=<key>     -> {"key", "count"}   effects performed for the key, any tool
    GET  /effects/counts              -> {"<key>": n, ...}
    GET  /faults   PUT /faults/<tool>  {"lose_response": true, ...}   DELETE /faults
    POST /faults/<tool>/release       -> {"performed": n}   perform the held requests now
    GET  /health

Keys are remembered for ``--key-retention`` seconds (like real providers):
past that, the same key performs again and lookups by it answer 404.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import signal
import socket
import sqlite3
import sys
import threading
import time
import urllib.parse
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import rfc8785

FAULTS = {
    "non_idempotent": False,
    "lose_response": False,
    "lose_response_count": -1,
    "reject": False,
    "reject_count": -1,
    "lookup_timeout": False,
    "lookup_timeout_seconds": 30.0,
    "lookup_5xx": False,
    "latency_ms": 0,
    "hold": False,
    "hold_seconds": 30.0,
}
SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    payload_hash TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_key ON effects (tool, key, created_at);
CREATE TABLE IF NOT EXISTS faults (
    tool TEXT PRIMARY KEY,
    settings TEXT NOT NULL
);
"""
MAX_BODY = 1024 * 1024


class Store:
    """The sandbox's durable state: one SQLite connection, every use under
    one lock. The sandbox is for correctness, not throughput."""

    def __init__(self, path: str, key_retention: float) -> None:
        self.key_retention = key_retention
        self.lock = threading.RLock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        cursor = self.db.cursor()
        cursor.row_factory = sqlite3.Row
        return cursor.execute(sql, params).fetchall()

    def _settings(self, tool: str) -> dict[str, Any]:
        rows = self._rows("SELECT settings FROM faults WHERE tool = ?", (tool,))
        return json.loads(rows[0]["settings"]) if rows else {}

    def _save_settings(self, tool: str, settings: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT INTO faults (tool, settings) VALUES (?, ?) "
            "ON CONFLICT (tool) DO UPDATE SET settings = excluded.settings",
            (tool, json.dumps(settings)),
        )

    def faults(self, tool: str) -> dict[str, Any]:
        """The tool's faults: defaults, then those set for every tool ("*"), then its own."""
        with self.lock:
            return {**FAULTS, **self._settings("*"), **self._settings(tool)}

    def all_faults(self) -> dict[str, Any]:
        with self.lock:
            return {row["tool"]: json.loads(row["settings"]) for row in self._rows("SELECT * FROM faults")}

    def set_faults(self, tool: str, settings: dict[str, Any]) -> dict[str, Any]:
        unknown = set(settings) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults: {', '.join(sorted(unknown))}")
        with self.lock:
            merged = {**self._settings(tool), **settings}
            self._save_settings(tool, merged)
            return merged

    def clear_faults(self) -> None:
        with self.lock:
            self.db.execute("DELETE FROM faults")

    def fires(self, tool: str, fault: str) -> bool:
        """Whether a counted fault (``reject``, ``lose_response``) fires now,
        counting it down where it was set with a count."""
        counter = f"{fault}_count"
        with self.lock:
            if not self.faults(tool)[fault]:
                return False
            for scope in (tool, "*"):
                settings = self._settings(scope)
                if counter in settings:
                    remaining = int(settings[counter])
                    if remaining == 0:
                        return False
                    if remaining > 0:
                        settings[counter] = remaining - 1
                        self._save_settings(scope, settings)
                    return True
            return True

    def _latest(self, tool: str, key: str) -> sqlite3.Row | None:
        cutoff = time.time() - self.key_retention
        rows = self._rows(
            "SELECT * FROM effects WHERE tool = ? AND key = ? AND created_at >= ? ORDER BY id DESC LIMIT 1",
            (tool, key, cutoff),
        )
        return rows[0] if rows else None

    def perform(self, tool: str, key: str, payload: Any, payload_hash: str) -> tuple[int, dict[str, Any]]:
        """Perform the effect, unless the key was seen within retention and
        the tool honours keys."""
        with self.lock:
            if not self.faults(tool)["non_idempotent"]:
                existing = self._latest(tool, key)
                if existing is not None:
                    if existing["payload_hash"] != payload_hash:
                        return HTTPStatus.UNPROCESSABLE_ENTITY, {"error": "key reused with a different payload"}
                    return HTTPStatus.OK, self._describe(existing)
            cursor = self.db.execute(
                "INSERT INTO effects (tool, key, payload, payload_hash, created_at) VALUES (?, ?, ?, ?, ?)",
                (tool, key, json.dumps(payload), payload_hash, time.time()),
            )
            (row,) = self._rows("SELECT * FROM effects WHERE id = ?", (cursor.lastrowid,))
            return HTTPStatus.CREATED, self._describe(row)

    def lookup(self, tool: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self._latest(tool, key)
            if row is None:
                return None
            described = self._describe(row)
            described["count"] = self.count(key, tool=tool)
            return described

    def count(self, key: str, *, tool: str | None = None) -> int:
        with self.lock:
            if tool is None:
                rows = self._rows("SELECT count(*) AS n FROM effects WHERE key = ?", (key,))
            else:
                rows = self._rows("SELECT count(*) AS n FROM effects WHERE key = ? AND tool = ?", (key, tool))
            return int(rows[0]["n"])

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {row["key"]: row["n"] for row in self._rows("SELECT key, count(*) AS n FROM effects GROUP BY key")}

    @staticmethod
    def _describe(row: sqlite3.Row) -> dict[str, Any]:
        return {
            "id": f"eff_{row['id']}",
            "tool": row["tool"],
            "key": row["key"],
            "payload_hash": row["payload_hash"],
            "payload": json.loads(row["payload"]),
            "created_at": datetime.fromtimestamp(row["created_at"], UTC).isoformat(),
        }


class Held:
    """Requests the sandbox has received and not yet acted on (the ``hold``
    fault): each is performed once, on release or when its time is up."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.waiting: dict[str, list[tuple[str, Any, str]]] = {}

    def add(self, tool: str, key: str, payload: Any, payload_hash: str, after: float) -> None:
        request = (key, payload, payload_hash)
        with self.lock:
            self.waiting.setdefault(tool, []).append(request)
        timer = threading.Timer(after, self._perform, args=(tool, request))
        timer.daemon = True
        timer.start()

    def _perform(self, tool: str, request: tuple[str, Any, str]) -> bool:
        with self.lock:
            queue = self.waiting.get(tool, [])
            if request not in queue:
                return False  # released already
            queue.remove(request)
        self.store.perform(tool, *request)
        return True

    def release(self, tool: str) -> int:
        with self.lock:
            pending = list(self.waiting.get(tool, []))
        return sum(self._perform(tool, request) for request in pending)


class Handler(BaseHTTPRequestHandler):
    server: SandboxServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without a response: the client never learns."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def _route(self) -> tuple[list[str], dict[str, str]]:
        parsed = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in parsed.path.split("/") if p]
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()}
        return parts, query

    def _latency(self, tool: str) -> None:
        delay = float(self.server.store.faults(tool)["latency_ms"])
        if delay > 0:
            time.sleep(delay / 1000)

    def do_GET(self) -> None:
        parts, query = self._route()
        store = self.server.store
        if parts == ["health"]:
            return self._send(200, {"ok": True})
        if parts == ["faults"]:
            return self._send(200, store.all_faults())
        if parts == ["effects", "count"]:
            key = query.get("key", "")
            return self._send(200, {"key": key, "count": store.count(key)})
        if parts == ["effects", "counts"]:
            return self._send(200, store.counts())
        if len(parts) == 3 and parts[0] == "tools" and parts[2] == "effects":
            tool = parts[1]
            key = query.get("key", "")
            self._latency(tool)
            faults = store.faults(tool)
            if faults["lookup_timeout"]:
                time.sleep(float(faults["lookup_timeout_seconds"]))
                return self._drop()
            if faults["lookup_5xx"]:
                return self._send(503, {"error": "lookup unavailable"})
            found = store.lookup(tool, key)
            if found is None:
                return self._send(404, {"error": "not found", "key": key})
            return self._send(200, found)
        return self._send(404, {"error": "no such endpoint"})

    def do_POST(self) -> None:
        parts, _ = self._route()
        store = self.server.store
        if len(parts) == 3 and parts[0] == "faults" and parts[2] == "release":
            return self._send(200, {"performed": self.server.held.release(parts[1])})
        if len(parts) == 3 and parts[0] == "tools" and parts[2] == "effects":
            tool = parts[1]
            key = self.headers.get("Idempotency-Key", "")
            if not key:
                return self._send(400, {"error": "Idempotency-Key header is required"})
            try:
                payload = self._body()
                payload_hash = hashlib.sha256(rfc8785.dumps(payload)).hexdigest()
            except (ValueError, rfc8785.CanonicalizationError) as exc:
                return self._send(400, {"error": f"body is not canonicalizable JSON: {exc}"})
            self._latency(tool)
            if store.fires(tool, "reject"):
                return self._send(429, {"error": "rate limited; nothing was performed"})
            faults = store.faults(tool)
            if faults["hold"]:
                self.server.held.add(tool, key, payload, payload_hash, float(faults["hold_seconds"]))
                return self._drop()
            status, body = store.perform(tool, key, payload, payload_hash)
            if status == HTTPStatus.CREATED and store.fires(tool, "lose_response"):
                return self._drop()
            return self._send(status, body)
        return self._send(404, {"error": "no such endpoint"})

    def do_PUT(self) -> None:
        parts, _ = self._route()
        if len(parts) == 2 and parts[0] == "faults":
            try:
                settings = self._body() or {}
                if not isinstance(settings, dict):
                    raise ValueError("faults must be a JSON object")
                merged = self.server.store.set_faults(parts[1], settings)
            except ValueError as exc:
                return self._send(400, {"error": str(exc)})
            return self._send(200, merged)
        return self._send(404, {"error": "no such endpoint"})

    def do_DELETE(self) -> None:
        parts, _ = self._route()
        if parts == ["faults"]:
            self.server.store.clear_faults()
            return self._send(200, {})
        return self._send(404, {"error": "no such endpoint"})


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, *, verbose: bool = False) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.held = Held(store)
        self.verbose = verbose


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledgerdash-sandbox", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", default="var/sandbox.sqlite3", help="SQLite file for effects (created if missing)")
    parser.add_argument("--key-retention", type=float, default=86400.0, help="seconds a key is remembered")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    server = SandboxServer((args.host, args.port), Store(args.db, args.key_retention), verbose=args.verbose)

    def stop(_signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"sandbox provider on http://{args.host}:{server.server_port}/ (effects in {args.db})", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

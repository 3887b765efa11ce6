"""The failover drill's agents: ordinary agents that keep calling tools
while the database under the ledger fails over.

``manage.py ha_agent`` runs one agent until SIGTERM: tool call after tool
call, each with a key of its own, in process (:func:`ledgerdash.ledger.recording.provider_tool`,
the ledger's own connection to the database) or over the HTTP API (the
Python client, the provider called from this process). A call that meets
trouble is called again with the same key, as a restarted agent would: a
retryable refusal (the ledger unavailable, the attempt in flight or
unknown) is an answer to act on by waiting and calling again; the ledger
either replays what the provider did or lets the call go out once. A call
ends when the tool returns (the ledger acknowledged it), when the ledger
refuses it for good, or, after SIGTERM, when its grace runs out.

One JSON line per call on standard output::

    {"key", "tool", "acked": true, "id", "tries", "errors": {code: n}, "started", "ended"}
    {"key", "tool", "acked": false, "refused": code | null, "last_error", "tries", "errors", ...}

``started``/``ended`` are seconds on the monotonic clock (the drill runs on
one machine, so it compares them with its own fault times).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import IO, Any

from django.db import connections

import ledgerdash_client as client
from ledgerdash.ledger import recording
from ledgerdash.ledger.drill.agent import client_tool
from ledgerdash_client import errorcodes

#: Seconds between calls of the same key after a retryable answer.
PAUSE = 0.25


def _code(exc: BaseException) -> tuple[str, bool]:
    """An exception's stable code, and whether calling again may succeed.
    What is not the ledger's own answer (a dropped connection, the
    database's error through the ORM) is retried, as an agent restarts."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        try:
            return code, errorcodes.row(code).retryable
        except KeyError:
            pass
    return type(exc).__name__, True


class Agent:
    def __init__(
        self,
        *,
        via: str,
        tenant: str,
        tools: list[dict[str, Any]],
        prefix: str,
        url: str = "",
        token: str = "",
        grace: float = 60.0,
        out: IO[str] = sys.stdout,
    ) -> None:
        self.via, self.tenant, self.tools, self.prefix = via, tenant, tools, prefix
        self.grace = grace
        self.out = out
        self.stop = threading.Event()
        self.stopped_at: float | None = None
        self.label = f"ha-agent:{prefix}"
        if via == "http":
            self.ledger = client.LedgerClient(url, token, agent=self.label, retries=2, timeout=10.0)

    def _tool(self, spec: dict[str, Any], key: str) -> Callable[..., Any]:
        if self.via == "process":
            return recording.provider_tool(spec["name"], key=lambda _args: key)
        return client_tool(spec, key)

    def _once(self, spec: dict[str, Any], key: str, args: dict[str, Any]) -> Any:
        tool = self._tool(spec, key)
        if self.via == "process":
            with recording.task(tenant=self.tenant, task_id=f"task-{key}", agent=self.label):
                return tool(**args)
        with client.task(task_id=f"task-{key}", client=self.ledger):
            return tool(**args)

    def call(self, n: int) -> dict[str, Any]:
        spec = self.tools[n % len(self.tools)]
        key = f"{self.prefix}-{n:06d}"
        args = {"to": f"customer-{n}@example.com", "amount_cents": 100 + n, "key": key}
        errors: Counter[str] = Counter()
        started = time.monotonic()
        tries = 0
        report: dict[str, Any] = {"key": key, "tool": spec["name"], "started": started}
        while True:
            tries += 1
            try:
                result = self._once(spec, key, args)
            except Exception as exc:  # every answer is counted; what the agent does next depends on it
                code, retryable = _code(exc)
                errors[code] += 1
                if not isinstance(getattr(exc, "code", None), str):
                    # Not one of the ledger's answers: its log says where it came from.
                    traceback.print_exception(exc, file=sys.stderr)
                if self.via == "process":
                    connections.close_all()  # a broken connection is not reused
                if not retryable:
                    report.update(acked=False, refused=code, last_error=str(exc)[:300])
                    break
                if self.stopped_at is not None and time.monotonic() - self.stopped_at > self.grace:
                    report.update(acked=False, refused=None, last_error=f"{code}: {str(exc)[:300]}")
                    break
                time.sleep(PAUSE)
                continue
            report.update(acked=True, id=(result or {}).get("id") if isinstance(result, dict) else None)
            break
        report.update(tries=tries, errors=dict(errors), ended=time.monotonic())
        return report

    def run(self) -> None:
        def on_term(_signum: int, _frame: Any) -> None:
            self.stopped_at = time.monotonic()
            self.stop.set()

        signal.signal(signal.SIGTERM, on_term)
        n = 0
        while not self.stop.is_set():
            self.out.write(json.dumps(self.call(n)) + "\n")
            self.out.flush()
            n += 1

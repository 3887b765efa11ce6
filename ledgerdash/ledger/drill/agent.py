"""The drill's agent worker: an ordinary agent that uses the recording API.

``manage.py drill_agent`` reads one JSON job per line on standard input and
runs each in a forked child process, the way a prefork worker pool runs
tasks. A child is a complete agent process: it records, dispatches and
reports through :func:`ledgerdash.ledger.recording.provider_tool`, exactly
as production agents do; or, for a job ``via`` ``http``, through the Python
client of the ingest API (:mod:`ledgerdash_client`), calling the provider
with the adapter the job names, without touching the database. A job may
ask to run its call inside a transaction it then rolls back, as a caller's
view or task would. The crash point comes from the job and reaches the
child as ``LEDGERDASH_CRASH_AT``; at that point the child announces itself
and the drill kills it with SIGKILL. Forking keeps a restart cheap (Django
is loaded once) without sharing anything: database connections are closed
before every fork, so each child opens its own.

Lines written to standard output:
- ``LEDGERDASH-CRASHPOINT <point> pid=<pid>`` from a child at its crash point;
- ``{"job": …, "pid": …, "outcome": …}`` from a child that finished;
- ``{"job": …, "pid": …, "exit": …, "signal": …}`` from the server when the child is gone.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from django.db import connections, transaction
from django.db.models import Q

import ledgerdash_client as client
from ledgerdash.ledger import recording
from ledgerdash.ledger.errors import AttemptBlocked, LedgerError
from ledgerdash.ledger.models import Attempt, AttemptEvent
from ledgerdash.ledger.providers.base import dispatch_through
from ledgerdash.ledger.providers.factory import ToolSpec, build_adapter
from ledgerdash_client import crashpoints, errorcodes


class RolledBack(Exception):
    """The caller's transaction was rolled back, as a failing view's would be."""


def client_tool(spec: dict[str, Any], key: str) -> Callable[..., Any]:
    """An HTTP agent's tool: the Python client's wrapper around the adapter
    ``spec`` (a :class:`ToolSpec`'s fields) describes, the reconciler's own,
    built in this process without the database; every call uses ``key``."""
    adapter = build_adapter(ToolSpec(**spec))

    def call_provider(call: client.ToolCall, **_arguments: Any) -> Any:
        return dispatch_through(adapter, call)

    return client.tool(spec["name"], key=lambda _args: key)(call_provider)


def _over_http(job: dict[str, Any], label: str) -> Any:
    tool = client_tool(job["adapter"], job["key"])
    ledger = client.LedgerClient(job["url"], job["token"], agent=label, retries=2)
    with client.task(task_id=job["task_id"], client=ledger):
        return tool(**job["args"])


#: How long the drill's gateway waits for its upstream MCP server to start: a loaded machine may
#: take far longer than the gateway's default; a start that never comes still ends the case.
UPSTREAM_START_WAIT = 120.0


def _over_mcp(job: dict[str, Any], label: str) -> Any:
    """The agent's call as an MCP client's ``tools/call`` through the
    gateway: this process is the gateway (the one the drill kills at the
    crash point), its upstream the drill's MCP server, a process of its own
    that sends the call to the sandbox provider."""
    import anyio
    import mcp_types

    from ledgerdash.ledger.drill import mcp_upstream
    from ledgerdash.ledger.gateway.config import GatewayConfig, ToolConfig, UpstreamConfig
    from ledgerdash.ledger.gateway.keys import META_ERROR, META_KEY
    from ledgerdash.ledger.gateway.server import Gateway

    env = {**os.environ, mcp_upstream.ADAPTER_ENV: json.dumps(job["adapter"])}
    env.pop(crashpoints.ENV, None)  # the upstream is not the process the drill kills
    upstream = UpstreamConfig(
        name="drill",
        command=(sys.executable, "-m", "ledgerdash.ledger.drill.mcp_upstream"),
        env=env,
        prefix=mcp_upstream.PREFIX,
    )
    # A sandbox call names its key in an argument; a preset's arguments are the provider's, so the
    # agent names the key in the call's metadata, as an MCP client may.
    preset = job["adapter"]["adapter"] == "preset"
    tool = ToolConfig(key="" if preset else "{key}", request_id="structuredContent.id", timeout=10.0)
    gateway = Gateway(
        GatewayConfig(tenant=job["tenant"], task_id=job["task_id"], upstreams=(upstream,), tools={job["tool"]: tool}),
        agent=label,
    )
    answers: list[mcp_types.CallToolResult] = []

    async def call(_server: Any) -> None:
        params = mcp_types.CallToolRequestParams.model_validate(
            {"name": job["tool"], "arguments": job["args"], **({"_meta": {META_KEY: job["key"]}} if preset else {})}
        )
        answers.append(await gateway.call_tool(None, params))  # type: ignore[arg-type]

    # How soon the upstream process starts is the machine's load, not what the drill judges: the
    # call waits for it as an agent's MCP client waits for a tool to be listed.
    anyio.run(functools.partial(gateway.serve, call, start_wait=UPSTREAM_START_WAIT))
    (result,) = answers
    if not result.is_error:
        return result.structured_content
    detail = dict((result.meta or {}).get(META_ERROR) or {})
    if not detail:
        raise RuntimeError(f"the tool answered with an error: {result.content}")
    row = errorcodes.BY_CODE.get(str(detail.get("code")))
    raise client.error_for(row.status if row else 502, detail)


def _in_process(job: dict[str, Any], label: str) -> Any:
    tool = recording.provider_tool(job["tool"], key=lambda _args: job["key"])
    with recording.task(tenant=job["tenant"], task_id=job["task_id"], agent=label):
        if not job.get("in_transaction"):
            return tool(**job["args"])
        with transaction.atomic():
            tool(**job["args"])
            raise RolledBack("the caller's work failed after the tool call; its transaction rolls back")


def _emit(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one task as an agent would; report what happened to this call."""
    label = f"drill-agent:{os.getpid()}"
    key = job["key"]
    outcome: dict[str, Any]
    try:
        {"http": _over_http, "mcp": _over_mcp}.get(job.get("via", ""), _in_process)(job, label)
        outcome = {"outcome": "done"}
    except (AttemptBlocked, client.AttemptBlocked) as exc:
        attempt_id = exc.attempt.pk if isinstance(exc, AttemptBlocked) else exc.attempt_id
        outcome = {"outcome": "blocked", "code": exc.code, "detail": str(exc), "attempt": attempt_id}
    except (LedgerError, client.ApiError) as exc:
        outcome = {"outcome": "refused", "code": exc.code, "detail": str(exc)}
        if getattr(exc, "attempt_id", None):
            outcome["attempt"] = exc.attempt_id  # type: ignore[union-attr]
    except Exception as exc:
        outcome = {"outcome": "error", "code": type(exc).__name__, "detail": str(exc)[:500]}
    connections.close_all()  # a rolled-back or broken connection is not reused for the report
    attempt = Attempt.objects.filter(idempotency_key=key, tenant__slug=job["tenant"]).order_by("-id").first()
    if attempt is not None:
        by_this_worker = Q(actor_label=label) | Q(actor_label__startswith=f"{label} via token ")
        sent = AttemptEvent.objects.filter(by_this_worker, attempt=attempt, to_state="DISPATCHED").exists()
        outcome.update({"attempt": attempt.pk, "state": attempt.state, "sent": sent})
        if outcome["outcome"] == "done":
            outcome["outcome"] = "sent" if sent else "replayed"
    return outcome


def serve(stdin: IO[str] = sys.stdin, stdout: IO[str] = sys.stdout) -> None:
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        connections.close_all()
        pid = os.fork()
        if pid == 0:  # the child: one agent process running one task
            code = 0
            try:
                os.environ[crashpoints.ENV] = job.get("crash_at") or ""
                _emit(stdout, {"job": job["id"], "pid": os.getpid(), **run_job(job)})
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        _emit(
            stdout,
            {
                "job": job["id"],
                "pid": pid,
                "exit": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            },
        )

"""The drill's agent worker: an ordinary agent that uses the recording API.

``manage.py drill_agent`` reads one JSON job per line on standard input and
runs each in a forked child process, the way a prefork worker pool runs
tasks. A child is a complete agent process: it records, dispatches and
reports through :func:`ledgerdash.ledger.recording.provider_tool`, exactly
as production agents do. The crash point comes from the job and reaches the
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

import json
import os
import sys
from typing import IO, Any

from django.db import connections

from ledgerdash.ledger import crashpoints, recording
from ledgerdash.ledger.errors import AttemptBlocked, LedgerError
from ledgerdash.ledger.models import Attempt, AttemptEvent


def _emit(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one task as an agent would; report what happened to this call."""
    label = f"drill-agent:{os.getpid()}"
    key = job["key"]
    tool = recording.provider_tool(job["tool"], key=lambda _args: key)
    outcome: dict[str, Any]
    try:
        with recording.task(tenant=job["tenant"], task_id=job["task_id"], agent=label):
            tool(**job["args"])
        outcome = {"outcome": "done"}
    except AttemptBlocked as exc:
        outcome = {"outcome": "blocked", "code": exc.code, "detail": str(exc), "attempt": exc.attempt.pk}
    except LedgerError as exc:
        outcome = {"outcome": "refused", "code": exc.code, "detail": str(exc)}
    except Exception as exc:
        outcome = {"outcome": "error", "code": type(exc).__name__, "detail": str(exc)[:500]}
    attempt = Attempt.objects.filter(idempotency_key=key, tenant__slug=job["tenant"]).order_by("-id").first()
    if attempt is not None:
        sent = AttemptEvent.objects.filter(attempt=attempt, to_state="DISPATCHED", actor_label=label).exists()
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

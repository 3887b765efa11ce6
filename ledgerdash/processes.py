"""Stopping a process the ledger started in a session of its own.

The crash drill's agents, sandbox and reconcilers, the test suite's live
servers and the benchmarks' gunicorn all start a child with
``start_new_session=True``, so its own children (gunicorn's workers, a
drill agent's tool) share its process group and stop with it. Nothing here
imports Django: the benchmarks use it before Django is set up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def stop_group(proc: subprocess.Popen[Any], *, timeout: float) -> int | None:
    """SIGTERM to ``proc``'s process group, then SIGKILL if ``proc`` has not
    exited within ``timeout`` seconds. Its exit code, or None when it had to
    be killed. A group already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None

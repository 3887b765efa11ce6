"""Named points where the crash drill kills an agent, chosen from outside.

A worker started with ``LEDGERDASH_CRASH_AT=<point>`` stops at that point,
tells whoever watches its standard output, and waits there to be killed
(SIGKILL), exactly as a crash would leave it: no handler runs, nothing is
flushed or committed. Nothing happens at any point when the variable is
unset, so production code paths carry the hooks at no cost.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

ENV = "LEDGERDASH_CRASH_AT"
#: after the intent commit, before dispatch is claimed
AFTER_INTENT = "after_intent"
#: after DISPATCHED was committed and the connection opened, before the request leaves
BEFORE_SEND = "before_send"
#: after the request left for the provider, before its response is read
AFTER_SEND = "after_send"
#: after the provider's response arrived, before the outcome is committed
AFTER_RESPONSE = "after_response"
#: a reconciler, after deciding the first attempt of a claimed batch, before the next
RECONCILER_MID_BATCH = "reconciler_mid_batch"
ANNOUNCE = "LEDGERDASH-CRASHPOINT"

#: ``LEDGERDASH_PAUSE_AT=<point>``: stop there once and wait for a line on
#: standard input before going on (the drill uses it to cut a reconciler's
#: database connection at a known moment).
PAUSE_ENV = "LEDGERDASH_PAUSE_AT"
PAUSE_ANNOUNCE = "LEDGERDASH-PAUSE"
_paused: set[str] = set()


def reached(point: str) -> None:
    if os.environ.get(ENV) != point:
        return
    sys.stdout.write(f"{ANNOUNCE} {point} pid={os.getpid()}\n")
    sys.stdout.flush()
    # Wait for the drill's SIGKILL; if nobody kills us, die the same way.
    deadline = time.monotonic() + float(os.environ.get("LEDGERDASH_CRASH_WAIT", "30"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), 9)


def pausing(point: str) -> bool:
    """Whether this process will pause at ``point`` (cheap: no work is done
    to describe the pause unless it will happen)."""
    return os.environ.get(PAUSE_ENV) == point and point not in _paused


def paused(point: str, *, detail: str = "", on_line: Callable[[str], None] | None = None) -> None:
    """Announce ``point`` (with ``detail``) and wait for one line on standard
    input; ``on_line`` gets that line before the process goes on."""
    if not pausing(point):
        return
    _paused.add(point)
    sys.stdout.write(f"{PAUSE_ANNOUNCE} {point} pid={os.getpid()} {detail}".rstrip() + "\n")
    sys.stdout.flush()
    line = sys.stdin.readline().strip()
    if on_line is not None:
        on_line(line)

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

ENV = "LEDGERDASH_CRASH_AT"
#: after the intent commit, before dispatch is claimed
AFTER_INTENT = "after_intent"
#: after DISPATCHED was committed and the connection opened, before the request leaves
BEFORE_SEND = "before_send"
#: after the request left for the provider, before its response is read
AFTER_SEND = "after_send"
#: after the provider's response arrived, before the outcome is committed
AFTER_RESPONSE = "after_response"
POINTS = (AFTER_INTENT, BEFORE_SEND, AFTER_SEND, AFTER_RESPONSE)
ANNOUNCE = "LEDGERDASH-CRASHPOINT"


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

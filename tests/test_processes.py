"""Stopping a process group: what the drill, the live servers and the
benchmarks rely on to leave nothing running behind them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ledgerdash.processes import stop_group

#: A parent that starts a child in its group, says the child's pid, then
#: sleeps (ignoring SIGTERM from before it says so, when told to).
PARENT = """
import subprocess, sys, time
{ignore}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
while True:
    time.sleep(1)
"""


def _start(ignore_term: bool) -> tuple[subprocess.Popen[str], int]:
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(ignore=ignore)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has stopped
    except FileNotFoundError:
        return False


def _gone(pid: int) -> bool:
    """Whether ``pid`` stops running: a killed process takes a moment to go,
    so it is given a minute, far more than that moment on any machine."""
    deadline = time.monotonic() + 60
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_group_stops_on_sigterm_children_included() -> None:
    proc, child = _start(ignore_term=False)
    assert stop_group(proc, timeout=60) == -signal.SIGTERM
    assert _gone(child)


def test_a_group_that_ignores_sigterm_is_killed() -> None:
    proc, child = _start(ignore_term=True)
    assert stop_group(proc, timeout=0.5) is None  # ignored SIGTERM: killed, however long it was given
    assert proc.returncode == -signal.SIGKILL
    assert _gone(child)


def test_a_process_that_already_exited_gives_its_exit_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    proc.wait()
    assert stop_group(proc, timeout=5) == 3

"""The simulation's watchdog calls a run hung when an actor keeps the baton for
WATCHDOG_SECONDS of the process's own running time: a process stopped meanwhile
(SIGSTOP, a suspended laptop, a starved machine) does not make a healthy history
fail. Each case runs in a process of its own, which the test stops and resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, threading, time
from ledgerdash.ledger.simulation import world as w
w.WATCHDOG_SECONDS = 5.0
world = w.World(1)
hang = sys.argv[1] == "hang"
def body(actor):
    print("in the actor", flush=True)
    if hang:
        threading.Event().wait()  # blocked on something outside the simulation
    time.sleep(0.5)  # real work, then the baton goes back
world.spawn("worker", "agent", body)
try:
    while not world.idle:
        world.run_one()
except w.Hung as exc:
    print(f"hung: {exc}", flush=True)
    sys.exit(3)
print("done", flush=True)
"""


def _run(mode: str, *, stop_for: float) -> tuple[int, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ledgerdash.settings", "DEBUG": "true"}
    child = subprocess.Popen(
        [sys.executable, "-c", "import django; django.setup()\n" + CHILD, mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "in the actor"
    if stop_for:
        child.send_signal(signal.SIGSTOP)
        time.sleep(stop_for)
        child.send_signal(signal.SIGCONT)
    out, _ = child.communicate(timeout=120)
    return child.returncode, out


@pytest.mark.slow
def test_a_process_stopped_while_an_actor_works_does_not_make_the_run_hung() -> None:
    code, out = _run("work", stop_for=8.0)
    assert (code, out.strip()) == (0, "done")


@pytest.mark.slow
def test_an_actor_that_never_hands_the_baton_back_is_still_found() -> None:
    code, out = _run("hang", stop_for=0.0)
    assert code == 3
    assert "worker did not hand the baton back within 5 s of running time while starting" in out

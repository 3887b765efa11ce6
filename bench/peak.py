"""A process's own peak memory, and a way to measure a program that cannot
report it itself: ``python -m bench.peak OUT program.py [args...]``.

The program runs in this process (as ``python program.py args`` would), and
at exit this process writes its peak resident set size in MiB to ``OUT``:
the figure is the program's own, read by the process itself, not a
parent's. Standard library only, so measuring adds nothing to the peak.
"""

from __future__ import annotations

import atexit
import math
import runpy
import sys
from pathlib import Path


def peak_rss_mib() -> float:
    """This process's own peak resident set size in MiB: ``VmHWM`` from
    /proc/self/status (Linux; NaN elsewhere).

    Not ``ru_maxrss``: the kernel carries that over exec, so a process started
    by fork+exec from a larger parent (the benchmark's orchestrator, a test
    runner) reports its parent's peak. ``VmHWM`` belongs to the address space,
    which exec replaces, so it counts this program alone.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # the kernel reports kB
    except OSError:
        pass
    return math.nan


def _report(out: Path) -> None:
    out.write_text(f"{peak_rss_mib():.1f}\n", encoding="ascii")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m bench.peak OUT program.py [args...]")
    out, program, *args = sys.argv[1:]
    # Registered first, so it runs last: after the program's own exit handlers.
    atexit.register(_report, Path(out))
    sys.argv = [program, *args]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()

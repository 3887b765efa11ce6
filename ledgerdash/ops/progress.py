"""A progress bar for long work run from a terminal: the crash drill, the simulation, the demo's
drills, archiving, backups and restores, large exports, the benchmarks.

Drawn with rich's progress display on standard error, and only where a person watches: never when
standard error is not a terminal (a log file, a pipe, CI, ``make run``'s background drills) nor
when the process logs JSON lines (``LOG_FORMAT=json``), where a redrawn line would be noise in every
line collector, nor when standard output goes elsewhere than the terminal (a file keeps every line).
There the command's own lines say how far it is, as before.

A command's lines go through :meth:`Progress.say`, printed above the bar while it is drawn (a
line written around it would leave torn copies of the bar in the scroll-back), or to the
command's own output otherwise::

    with Progress("crash drill", total=len(plan), write=self.stdout.write) as progress:
        for case in plan:
            progress.done(run(case))
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO


def shown(stream: TextIO | None = None) -> bool:
    """Whether a bar is drawn on ``stream`` (standard error by default): only when standard output
    is the same person's terminal too, so a command whose output goes to a file keeps every line."""
    if os.environ.get("LOG_FORMAT", "plain").strip().lower() == "json":
        return False
    return all(_is_terminal(each) for each in (stream if stream is not None else sys.stderr, sys.stdout))


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """``total`` steps of ``what`` (``None``: a count with no end known)."""

    def __init__(
        self,
        what: str,
        *,
        total: int | None,
        write: Callable[[str], Any] | None = None,
        stream: TextIO | None = None,
        capture_prints: bool = False,
    ) -> None:
        """``capture_prints``: what the work prints to standard output meanwhile (``print``, code
        that is not the command's own) goes above the bar too, instead of through it."""
        self.what = what
        self.total = total
        self._write = write if write is not None else print
        self._stream = stream if stream is not None else sys.stderr
        self._capture = capture_prints
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if shown(self._stream):
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self._stream),
                transient=True,  # gone when the work is: the command's summary follows
                redirect_stdout=self._capture,
                redirect_stderr=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, steps)

    def done(self, line: str) -> None:
        """One step done, and the command's line about it."""
        self.say(line)
        self.advance()

    def say(self, line: str) -> None:
        """One of the command's lines: above the bar while it is drawn, else to the command's output."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self._write(line)

"""The progress bar: drawn for a person at a terminal, never in a log, a pipe or JSON-log mode,
and a command's lines are never lost to it."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import pytest

from ledgerdash.ops.progress import Progress, shown
from tests.live import ROOT


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_not_drawn_where_nobody_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert shown(Terminal())
    assert not shown(io.StringIO())  # standard error is a file or a pipe
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not shown(Terminal())  # the output goes to a file: every line stays in it
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setenv("LOG_FORMAT", "json")
    assert not shown(Terminal())


def test_without_a_terminal_the_lines_go_to_the_commands_output() -> None:
    lines: list[str] = []
    with Progress("cases", total=2, write=lines.append, stream=io.StringIO()) as bar:
        bar.say("case 1 ok")
        bar.advance()
        assert not bar.drawn
    assert lines == ["case 1 ok"]


def test_at_a_terminal_a_bar_is_drawn_and_every_line_kept() -> None:
    """A process in a pseudo-terminal: the bar is drawn, each line printed above it."""
    leader, follower = pty.openpty()
    env = {**os.environ, "DEBUG": "true", "COLUMNS": "120"}
    env.pop("LOG_FORMAT", None)
    code = (
        "import sys, time\n"
        "from ledgerdash.ops.progress import Progress\n"
        "with Progress('crash drill', total=3) as bar:\n"
        "    for n in range(3):\n"
        "        bar.say(f'case {n} ok'); bar.advance(); time.sleep(0.2)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdin=follower, stdout=follower, stderr=follower
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=30) == 0
    text = seen.decode(errors="replace")
    for n in range(3):
        assert f"case {n} ok" in text
    assert "crash drill" in text  # the bar's own line, drawn while the work ran

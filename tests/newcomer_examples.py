"""The examples a newcomer runs against ``make run``'s demo, read from the pages that show them.

A page marks such an example with ``demo`` after the fence's language: a ``sh demo`` block is
commands, run in the page's order from the checkout; a block whose info names a file (```` ```python
demo agent.py ````) is that file's text, saved before the commands run (the page says to save it).
Every other fenced block of these pages says what it is instead (``reference``: a shape to adapt,
not something to run as it stands), so no example is left out of the run by forgetting the mark.

The commands run as a newcomer's shell would run them: ``set -eu``, no ``DEBUG``, ``SECRET_KEY`` or
``DATABASE_URL`` of the test's own, the demo's var directory, and the demo's ports where the pages
say 8000 and 8100.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The pages a newcomer reads in their first hour, in the order the README sends them.
PAGES = ("README.md", "docs/agents.md", "docs/api.md", "docs/recovery.md", "docs/decisions.md", "docs/dashboard.md")

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
KINDS = ("demo", "reference")
#: Languages whose blocks are pictures, not text to run or adapt (each checked by a test of its own).
PICTURES = ("mermaid",)


@dataclass
class Examples:
    page: str
    files: dict[str, str]
    commands: list[str]


def fences(page: str) -> list[tuple[str, str]]:
    """Every fenced block of ``page``: its info string and its text."""
    return FENCE.findall((ROOT / page).read_text())


def examples(page: str) -> Examples:
    files: dict[str, str] = {}
    commands: list[str] = []
    for info, body in fences(page):
        words = info.split()
        if len(words) < 2 or words[1] != "demo":
            continue
        if len(words) == 3:
            files[words[2]] = body
        elif words[0] == "sh":
            commands.append(body)
        else:
            raise ValueError(f"{page}: a {words[0]} demo block must name the file it is saved as")
    return Examples(page, files, commands)


def run(page: str, *, workdir: Path, port: int, sandbox_port: int, var_dir: Path, timeout: float = 300) -> str:
    """Run ``page``'s examples in ``workdir`` (the checkout's ``.venv``, ``manage.py`` and ``clients``
    linked into it, the page's files saved there); the commands' output, or AssertionError with it."""
    found = examples(page)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in (".venv", "manage.py", "clients"):
        link = workdir / name
        if not link.exists():
            link.symlink_to(ROOT / name)

    def ports(text: str) -> str:
        for host in ("127.0.0.1", "localhost"):
            text = text.replace(f"{host}:8000", f"{host}:{port}").replace(f"{host}:8100", f"{host}:{sandbox_port}")
        return text

    for name, text in found.files.items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ports(text))
    script = ports("set -eu\n" + "\n".join(found.commands))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DEBUG", "SECRET_KEY", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"}
        and not key.startswith(("LEDGERDASH_", "LEDGER_", "PYTEST", "COV_"))
    }
    env["LEDGERDASH_VAR_DIR"] = str(var_dir)
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"{page}'s examples stopped (exit {done.returncode}):\n{output[-6000:]}")
    return output

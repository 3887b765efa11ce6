"""Helpers for tests that start real processes (servers, workers) on loopback."""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ledgerdash.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
#: The interpreter running the tests: its virtualenv is the one the child processes need.
PYTHON = sys.executable
#: The screenshots the README and the docs show (docs/screenshots/<name>.png): `make screenshots`
#: runs the browser tests with LEDGERDASH_DOC_SHOTS set, and these shots are written there too,
#: so a picture in the docs is what the dashboard draws now.
DOC_SHOTS = frozenset({"overview", "unknown-queue-after-claim", "approvals-queue"})
DOC_SHOTS_DIR = ROOT / "docs" / "screenshots"


def manage(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``manage.py migrate`` then ``manage.py *args`` in a process of their own with ``env``; its output kept."""
    subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def output_tail(log: IO[bytes], limit: int = 20_000) -> str:
    """The last ``limit`` bytes a child wrote to ``log`` (a file open for reading)."""
    log.flush()
    size = log.seek(0, os.SEEK_END)
    log.seek(max(0, size - limit))
    return log.read().decode(errors="replace")


def _read_all(proc: subprocess.Popen[bytes]) -> str:
    return proc.stdout.read().decode(errors="replace") if proc.stdout else ""


def wait_for_http(
    url: str, *, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None, log: IO[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = output_tail(log) if log is not None else _read_all(proc)
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered:\n{out}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


@contextlib.contextmanager
def running(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    url: str | None = None,
    timeout: float = 60.0,
    output: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own process group until the block ends (once
    ``url`` answers, when given, within ``timeout`` seconds).

    The child gets the project's real settings module unless ``env`` names
    one: the test run's own (tests.settings) is not what a user runs.

    The child's output goes to a file, not a pipe nobody reads (a full pipe
    would stall a chatty server): ``output`` when given (kept, for the test
    to read), else a temporary one. When the block fails, its tail is
    printed to stderr, where pytest shows it beside the failure: what the
    server logged is the first thing to read when a request to it failed.
    """
    child_env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    child_env.update(env or {})
    with open(output, "w+b") if output else tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            if url:
                wait_for_http(url, timeout=timeout, proc=proc, log=log)
            yield proc
        except BaseException:
            sys.stderr.write(f"--- output of {' '.join(cmd)} (its tail)\n{output_tail(log)}\n---\n")
            raise
        finally:
            stop_group(proc, timeout=15)


class Browser:
    """A cookie-keeping HTTP client that logs in like a person with a form."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> tuple[int, dict[str, str], str]:
        try:
            with self.opener.open(self.base + path, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read().decode()

    def login(self, username: str, password: str) -> tuple[int, str]:
        _, _, page = self.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, "login page has no CSRF token"
        data = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token.group(1), "next": "/"}
        ).encode()
        request = urllib.request.Request(self.base + "/login/", data=data, headers={"Referer": self.base + "/login/"})
        with self.opener.open(request, timeout=10) as resp:
            return resp.status, resp.url

"""The processes a crash drill runs beside itself, each a real one: agent
workers, the sandbox provider, a web server for agents that use the HTTP
API, and reconcilers it can kill or cut off from the database."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from ledgerdash.processes import stop_group
from ledgerdash_client import crashpoints

JOB_TIMEOUT = 60.0
MANAGE = Path(settings.BASE_DIR) / "manage.py"


def database_url() -> str:
    """This process's database as a URL, for the agent processes to use the very same one."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db.get("USER") or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    hosts = str(db.get("HOST") or "localhost").split(",")
    ports = str(db.get("PORT") or "").split(",")
    where = ",".join(
        (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
        for host, port in zip(hosts, ports + [""] * (len(hosts) - len(ports)), strict=True)
    )
    options = db.get("OPTIONS") or {}
    # What finds the primary behind a multi-host URL goes to the children too.
    query = "&".join(f"{k}={options[k]}" for k in ("target_session_attrs", "sslmode") if k in options)
    return f"postgres://{auth}@{where}/{db['NAME']}" + (f"?{query}" if query else "")


def child_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", crashpoints.ENV)}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "ledgerdash.settings",
            "DATABASE_URL": database_url(),
            "DEBUG": "true" if settings.DEBUG else "false",
            "SECRET_KEY": settings.SECRET_KEY,
            "ALLOWED_HOSTS": ",".join(settings.ALLOWED_HOSTS) or "localhost",
            "LEDGERDASH_VAR_DIR": str(settings.VAR_DIR),
        }
    )
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AgentServer:
    """One drill_agent process and a thread reading its output."""

    def __init__(self, manage: Path = MANAGE) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py, fixed arguments
            [sys.executable, str(manage), "drill_agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_environment(),
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def send(self, job: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def collect(self, job_id: str, *, timeout: float = JOB_TIMEOUT) -> dict[str, Any]:
        """Follow one job to its end, killing the worker at its crash point."""
        result: dict[str, Any] = {"job": job_id}
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                result["error"] = f"the worker did not finish within {timeout:.0f}s"
                return result
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line.startswith(crashpoints.ANNOUNCE):
                _, point, pid_part = line.split()
                pid = int(pid_part.removeprefix("pid="))
                os.kill(pid, signal.SIGKILL)
                result.update({"crashed_at": point, "killed_pid": pid})
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("job") != job_id:
                continue
            if "exit" in message:
                result.update({"pid": message["pid"], "exit": message["exit"], "signal": message["signal"]})
                return result
            result.update({k: v for k, v in message.items() if k not in ("job",)})

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class SandboxControl:
    """The drill's view of the sandbox: switch faults, count effects."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310 - loopback sandbox
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return json.loads(response.read() or b"null")

    def faults(self, tool: str, **faults: Any) -> None:
        self._call("PUT", f"/faults/{tool}", faults)

    def clear(self) -> None:
        self._call("DELETE", "/faults")

    def count(self, key: str) -> int:
        return int(self._call("GET", "/effects/count?key=" + urllib.parse.quote(key, safe=""))["count"])

    def counts(self) -> dict[str, int]:
        """Effects performed, per key."""
        return {str(key): int(n) for key, n in self._call("GET", "/effects/counts").items()}

    def release(self, tool: str) -> int:
        """Perform the requests held for ``tool`` now; how many there were."""
        return int(self._call("POST", f"/faults/{urllib.parse.quote(tool, safe='')}/release")["performed"])

    def healthy(self) -> bool:
        try:
            self._call("GET", "/health")
        except OSError:
            return False
        return True


@contextlib.contextmanager
def sandbox_service(directory: Path, *, name: str = "sandbox") -> Iterator[str]:
    """Start a sandbox provider of the drill's own, with a store of its own
    (``<name>.sqlite3``, removed afterwards); yield its URL."""
    port = _free_port()
    store = directory / f"{name}.sqlite3"
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module, fixed arguments
        [sys.executable, "-m", "ledgerdash.sandbox", "--port", str(port), "--db", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        control = SandboxControl(url)
        deadline = time.monotonic() + 20
        while not control.healthy():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the sandbox provider did not start")
            time.sleep(0.05)
        yield url
    finally:
        stop_group(proc, timeout=10)
        for leftover in (store, Path(f"{store}-wal"), Path(f"{store}-shm")):
            leftover.unlink(missing_ok=True)


class ReplicaControl(SandboxControl):
    """A provider replica's control API: the sandbox's, and a clock and memory
    of its own. ``baseline``: faults that stay on when the others are cleared
    (a search index's lag)."""

    def __init__(self, url: str, *, baseline: dict[str, Any] | None = None) -> None:
        super().__init__(url)
        self.baseline = dict(baseline or {})
        self._baseline_sent = False

    def clear(self) -> None:
        if self.baseline and not self._baseline_sent:
            self._call("PUT", "/baseline", self.baseline)
            self._baseline_sent = True
        super().clear()

    def advance(self, seconds: float) -> None:
        """Move the replica's clock on (its timestamps, key retention, search lag)."""
        self._call("POST", "/clock", {"advance": seconds})

    def forget(self) -> None:
        """Drop every effect and every idempotency key the replica holds."""
        self._call("DELETE", "/effects")

    def effects(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/effects"))

    def modes(self, **settings: Any) -> dict[str, Any]:
        """Switch the provider's unkind behaviours (the replica's ``MODES``); none given: read them."""
        if not settings:
            return dict(self._call("GET", "/modes"))
        return dict(self._call("PUT", "/modes", settings))

    def kind(self) -> None:
        """Every mode back off."""
        self._call("DELETE", "/modes")


@contextlib.contextmanager
def replica_service(provider: str) -> Iterator[str]:
    """Start a replica of ``provider`` (``ledgerdash.replicas``) on a free port; yield its URL."""
    port = _free_port()
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module, fixed arguments
        [sys.executable, "-m", "ledgerdash.replicas", provider, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        control = ReplicaControl(url)
        deadline = time.monotonic() + 20
        while not control.healthy():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {provider} replica did not start")
            time.sleep(0.05)
        yield url
    finally:
        stop_group(proc, timeout=10)


def _wait_for(url: str, proc: subprocess.Popen[Any], what: str, *, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)


def web_environment() -> dict[str, str]:
    """The drill's web server's environment: the deployment's, on plain HTTP over loopback.

    It is the drill's own server, reached by its agents at 127.0.0.1: under
    production settings (``SECURE_SSL_REDIRECT``, ``ALLOWED_HOSTS`` naming
    only the public host) every request would be redirected to HTTPS, which
    nothing serves on that port, or refused for its host. TLS is the proxy's
    job in a deployment; the drill tests the ledger behind it.
    """
    env = child_environment()
    hosts = [host for host in env["ALLOWED_HOSTS"].split(",") if host]
    return env | {"SECURE_SSL_REDIRECT": "false", "ALLOWED_HOSTS": ",".join([*hosts, "127.0.0.1"])}


@contextlib.contextmanager
def web_service(directory: Path, *, env: dict[str, str] | None = None) -> Iterator[str]:
    """Serve the app itself (gunicorn, as deployed) on the drill's database
    (or ``env``'s), for agents that reach the ledger over the HTTP API; yield its URL."""
    port = _free_port()
    log = (directory / "web.log").open("w")
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module, fixed arguments
        [
            sys.executable,
            "-m",
            "gunicorn",
            "ledgerdash.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--timeout",
            "60",
        ],
        stdout=log,
        stderr=log,
        env=web_environment() | (env or {}),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url + "/readyz", proc, f"the web server (see {directory / 'web.log'})")
        yield url
    finally:
        stop_group(proc, timeout=15)
        log.close()


class ReconcilerProcess:
    """``manage.py reconcile`` as a process of its own, with a crash point
    (killed there) or a pause (held there until told to go on)."""

    def __init__(self, directory: Path, *, label: str, args: list[str], env: dict[str, str]) -> None:
        self.label = label
        self.log_path = directory / f"{label}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py, fixed arguments
            [sys.executable, str(MANAGE), "reconcile", "--label", label, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**child_environment(), **env},
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for_announce(self, *, timeout: float = JOB_TIMEOUT) -> dict[str, str] | None:
        """The crash point's or the pause's announcement, parsed; None if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    return None
                continue
            if line.startswith((crashpoints.ANNOUNCE, crashpoints.PAUSE_ANNOUNCE)):
                words = line.split()
                found = {"kind": words[0], "point": words[1]}
                for word in words[2:]:
                    name, _, value = word.partition("=")
                    found[name] = value
                return found
        return None

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> int:
        os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM, then wait: its exit code (None if it had to be killed)."""
        return stop_group(self.proc, timeout=timeout)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        self._log.close()


def cut_connection(announce: dict[str, str], process: ReconcilerProcess) -> str:
    """Cut the paused reconciler's database connection, as a server restart
    or a network fault would, then let it go on. PostgreSQL: the server
    terminates its session. SQLite (no server), or behind a transaction
    pooler (where the server's session serves whichever client runs a
    transaction, not the reconciler alone): the process closes its
    connection under the ORM's feet. Returns what was done, for the report."""
    if connection.vendor == "postgresql" and announce.get("backend") and not settings.DATABASE_TRANSACTION_POOLER:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [int(announce["backend"])])
            (done,) = cursor.fetchone()
        process.say("go")
        return f"the server terminated the reconciler's session (backend {announce['backend']}): {done}"
    process.say("drop")
    if connection.vendor == "postgresql":
        return "the reconciler's connection to the pooler was closed under it (its server session is the pooler's)"
    return "the reconciler's connection was closed under it (SQLite has no server session to terminate)"

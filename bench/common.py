"""What every benchmark shares: scratch databases, the environment of the
processes under test, statistics, and the verdict on each target."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: Ports this suite's servers listen on (gunicorn, the sandbox).
GUNICORN_PORT = int(os.environ.get("BENCH_GUNICORN_PORT", "8041"))
SANDBOX_PORT = int(os.environ.get("BENCH_SANDBOX_PORT", "8042"))


@dataclass(frozen=True)
class Databases:
    """The scratch databases of one run, all on the server of ``url``.

    ``main`` is re-created from ``template`` (migrated once) for each
    benchmark, so none sees another's rows; ``dbos`` is DBOS's system
    database. All three are dropped at the end.
    """

    url: str

    @property
    def main(self) -> str:
        return urlsplit(self.url).path.lstrip("/") or "ledgerdash_bench"

    @property
    def template(self) -> str:
        return f"{self.main}_tpl"

    @property
    def dbos(self) -> str:
        return f"{self.main}_dbos"

    def url_of(self, name: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url_of("postgres"), autocommit=True)

    def drop(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def create(self, name: str, *, template: str | None = None) -> None:
        self.drop(name)
        with self.admin() as conn:
            clause = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{clause}')

    def prepare_template(self) -> float:
        """Create the template database and migrate it; returns the seconds it took."""
        started = time.monotonic()
        self.create(self.template)
        run_manage(["migrate", "--noinput", "-v", "0"], self.url_of(self.template))
        return time.monotonic() - started

    def fresh_main(self) -> None:
        """A migrated, empty ``main`` (Django's connections to it must be closed first)."""
        from django.db import connections

        connections.close_all()
        self.create(self.main, template=self.template)

    def drop_all(self) -> None:
        from django.db import connections

        connections.close_all()
        for name in (self.main, self.template, self.dbos):
            self.drop(name)

    def server_facts(self) -> dict[str, str]:
        with self.admin() as conn:
            facts = {}
            for setting in ("server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections"):
                row = conn.execute(f"SHOW {setting}").fetchone()
                facts[setting] = str(row[0]) if row else "?"
            return facts


def django_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a process running the project against ``database_url``:
    production settings (DEBUG off), plain HTTP on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "ledgerdash.settings",
            "DATABASE_URL": database_url,
            "DEBUG": "false",
            "SECRET_KEY": "bench-only-" + "k" * 50,
            "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
            "SECURE_SSL_REDIRECT": "false",
            "SECURE_COOKIES": "false",
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


def setup_django(database_url: str) -> None:
    """Configure Django in this process (the orchestrator) against the bench database."""
    os.environ.update(django_env(database_url))
    import django

    django.setup()


def run_manage(args: Sequence[str], database_url: str, *, timeout: float = 600) -> str:
    result = subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=django_env(database_url),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


# --- statistics ---------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ratio(numerator: float, denominator: float) -> float:
    if not denominator or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


# --- verdicts -----------------------------------------------------------------------


@dataclass
class Target:
    """One of the issue's targets, and whether this run met it."""

    benchmark: str
    name: str
    value: float
    limit: float
    #: "<=" or ">=": how ``value`` must compare with ``limit``.
    op: str
    unit: str = ""
    met: bool = field(init=False)

    def __post_init__(self) -> None:
        if math.isnan(self.value):
            self.met = False
        else:
            self.met = self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def line(self) -> str:
        verdict = "MET" if self.met else "MISSED"
        wanted = f"target {self.op} {fmt(self.limit)}{self.unit}"
        return f"[{verdict}] {self.benchmark}: {self.name}: {fmt(self.value)}{self.unit} ({wanted})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[[fmt(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for index, row in enumerate(cells):
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Stop a process started in its own session, and its children: SIGTERM,
    then SIGKILL if it has not exited within ``timeout`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def say(text: str = "") -> None:
    print(text, flush=True)


def rss_mb_of_self() -> float:
    """Peak resident set of this process, in MB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

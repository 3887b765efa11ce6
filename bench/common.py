"""What every benchmark shares: scratch databases, the environment of the
processes under test, statistics, and the verdict on each target."""

from __future__ import annotations

import atexit
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from ledgerdash.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: Ports this suite's servers listen on (gunicorn, the sandbox).
GUNICORN_PORT = int(os.environ.get("BENCH_GUNICORN_PORT", "8041"))
SANDBOX_PORT = int(os.environ.get("BENCH_SANDBOX_PORT", "8042"))
#: Where the recording benchmark serves its HTTP floor (bench/http_floor.py).
HTTP_FLOOR_PORT = int(os.environ.get("BENCH_HTTP_FLOOR_PORT", "8043"))


#: PostgreSQL's limit on a database name, in bytes.
MAX_NAME = 63
#: The longest suffix a run adds to its main database's name.
_SUFFIXES = ("_tpl", "_dbos")


class DatabaseExists(RuntimeError):
    """A scratch database's name is taken: the run will not reuse or drop it."""


def new_run_id() -> str:
    """A name for one run, unique on the server for all practical purposes:
    the time it started, to the second, and 16 random bits."""
    return f"{datetime.now(UTC):%Y%m%d%H%M%S}_{secrets.token_hex(2)}"


class Databases:
    """The scratch databases of one run, all on the server of ``url``.

    ``url`` names the server and the names' prefix (its database name,
    default ``ledgerdash_bench``); the run's own databases are that prefix,
    the run's id, and a suffix: ``main`` (re-created from ``template``,
    migrated once, for each benchmark, so none sees another's rows),
    ``template`` and ``dbos`` (DBOS's system database). A name that already
    exists is refused, never dropped, and the run drops only the databases it
    created itself: two runs, or a run and a test run, never touch each
    other's databases.
    """

    def __init__(self, url: str, run_id: str | None = None) -> None:
        self.url = url
        self.run_id = run_id or new_run_id()
        prefix = urlsplit(url).path.lstrip("/") or "ledgerdash_bench"
        self.main = f"{prefix}_{self.run_id}"
        longest = self.main + max(_SUFFIXES, key=len)
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", self.main) or len(longest.encode()) > MAX_NAME:
            raise ValueError(
                f"scratch database names would be {self.main}…, which is not a plain lower-case PostgreSQL name"
                f" of at most {MAX_NAME} bytes with its suffixes ({longest}); choose a shorter prefix or run id"
            )
        #: The databases this run created and has not dropped yet.
        self.created: list[str] = []

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

    def exists(self, name: str) -> bool:
        with self.admin() as conn:
            return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None

    def drop(self, name: str) -> None:
        """Drop ``name`` if this run created it (WITH (FORCE): the run's own
        servers and agents may still hold connections to it); anything else
        is left alone."""
        if name not in self.created:
            return
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.remove(name)

    def create(self, name: str, *, template: str | None = None) -> None:
        """Create ``name``, re-creating it if this run made it before; refuse
        a name someone else holds."""
        self.drop(name)
        with self.admin() as conn:
            clause = f' TEMPLATE "{template}"' if template else ""
            try:
                conn.execute(f'CREATE DATABASE "{name}"{clause}')
            except psycopg.errors.DuplicateDatabase:
                raise DatabaseExists(
                    f"database {name} already exists and this run did not create it: it is left alone;"
                    " give the run another id (--run-id) or another prefix (BENCH_DATABASE_URL)"
                ) from None
        self.created.append(name)

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
        """Drop every database this run created (and only those)."""
        from django.conf import settings

        if settings.configured:
            from django.db import connections

            connections.close_all()
        for name in list(reversed(self.created)):
            self.drop(name)

    def server_facts(self) -> dict[str, str]:
        with self.admin() as conn:
            facts = {}
            for setting in ("server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections"):
                row = conn.execute(f"SHOW {setting}").fetchone()
                facts[setting] = str(row[0]) if row else "?"
            return facts

    def analyze(self) -> None:
        """ANALYZE each database this run created but its template (a
        connection to the template would hold up the next ``CREATE DATABASE …
        TEMPLATE``): statistics as autovacuum keeps them in a running
        deployment. Tables that grew since their last analysis (a run writes
        thousands of rows a minute, faster than autovacuum looks) can lead the
        planner to an index that walks a tenant's rows where the primary key
        answers: every peer runs with the statistics a deployment would have,
        not with what a young table left."""
        for name in self.created:
            if name == self.template:
                continue
            with psycopg.connect(self.url_of(name), autocommit=True) as conn:
                conn.execute("ANALYZE")

    def connections(self) -> int:
        """Connections the server holds to this run's databases now."""
        with self.admin() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s)", [self.created]
            ).fetchone()
            return int(row[0]) if row else 0


#: The environment variable naming where this run's static files are.
STATIC_ENV = "BENCH_STATIC_ROOT"


def bench_static() -> Path:
    """Where this benchmark run collects the static files: a folder of its own
    (its processes inherit the name), removed when the run ends. Two runs side
    by side (the smoke tests' workers) collecting into one folder rewrote each
    other's files mid-run."""
    given = os.environ.get(STATIC_ENV)
    if given:
        return Path(given)
    path = ROOT / "var" / "bench-static" / f"run-{os.getpid()}"
    os.environ[STATIC_ENV] = str(path)
    atexit.register(shutil.rmtree, path, True)
    return path


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
            # The benchmark's own collected static files: pages render with DEBUG off, which needs
            # them, and no other command's (or test's) collecting may be what makes it work.
            "STATIC_ROOT": str(bench_static()),
        }
    )
    env.update(extra)
    return env


def setup_django(database_url: str) -> None:
    """Configure Django in this process (the orchestrator) against the bench database,
    with the static files collected first: the dashboard pages it renders in this process
    and the servers it starts both need them."""
    collect_static(database_url)
    os.environ.update(django_env(database_url))
    import django

    django.setup()


#: Whether this process collected the bench's static files already: they do not change within a run.
_STATIC_COLLECTED: list[bool] = []


def collect_static(database_url: str) -> None:
    """``collectstatic`` into the bench's own folder, once per process."""
    if not _STATIC_COLLECTED:
        run_manage(["collectstatic", "--noinput", "-v", "0"], database_url)
        _STATIC_COLLECTED.append(True)


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
    """A target, and whether this run met it."""

    benchmark: str
    name: str
    value: float
    limit: float
    #: "<=" or ">=": how ``value`` must compare with ``limit``.
    op: str
    unit: str = ""
    #: A target set for later work: printed so the gap shows, not yet expected to be met.
    future: bool = False
    #: What else the reader needs to weigh the verdict (e.g. its spread over rounds).
    detail: str = ""
    met: bool = field(init=False)

    def __post_init__(self) -> None:
        if math.isnan(self.value):
            self.met = False
        else:
            self.met = self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def line(self) -> str:
        verdict = "MET" if self.met else "MISSED"
        wanted = f"target {self.op} {fmt(self.limit)}{self.unit}"
        if self.future:
            wanted += ", a future target"
        detail = f"; {self.detail}" if self.detail else ""
        return f"[{verdict}] {self.benchmark}: {self.name}: {fmt(self.value)}{self.unit} ({wanted}{detail})"

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


def start_gunicorn(
    database_url: str,
    *,
    workers: int = 2,
    threads: int = 1,
    settings_module: str = "ledgerdash.settings",
    port: int = GUNICORN_PORT,
    app: str = "ledgerdash.wsgi:application",
    **extra_env: str,
) -> subprocess.Popen[bytes]:
    """gunicorn serving the project against ``database_url`` on loopback, as
    deployed (static files collected first, deploy/gunicorn.conf.py, DEBUG
    off; ``threads`` as ``GUNICORN_THREADS``; ``extra_env`` in its
    environment), once it answers ``/healthz``; stop it with
    :func:`ledgerdash.processes.stop_group`. ``app``: another WSGI
    application served the same way (the recording benchmark's HTTP floor)."""
    collect_static(database_url)
    env = django_env(database_url, DJANGO_SETTINGS_MODULE=settings_module, GUNICORN_THREADS=str(threads), **extra_env)
    # This interpreter's gunicorn (the benchmark's environment has the app's packages): the
    # orchestrator and the server run the same code, and no other environment need exist.
    cmd = [
        sys.executable, "-m", "gunicorn",
        "--config", str(ROOT / "deploy" / "gunicorn.conf.py"), app,
        "--workers", str(workers), "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).close()
            return proc
        except urllib.error.HTTPError:
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited before it served (is port {port} taken?)") from None
            time.sleep(0.2)
    stop_group(proc, timeout=20)
    raise RuntimeError("gunicorn did not answer within 60s")


def say(text: str = "") -> None:
    print(text, flush=True)

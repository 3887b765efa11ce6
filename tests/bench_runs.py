"""Running the benchmarks from the tests, as a user runs them, on databases of the test run's own."""

from __future__ import annotations

import os
import subprocess

from django.conf import settings

from tests.database_roles import admin_url
from tests.live import PYTHON, ROOT


def bench_url() -> str:
    """The test server as the superuser the suite was given (the benchmarks
    create and drop databases), and a prefix for the benchmark's database
    names that says they are this test run's (the run adds an id of its own)."""
    name = str(settings.DATABASES["default"]["NAME"]).removeprefix("test_")[:20]
    return admin_url(f"test_{name}_bench")


def run_bench(args: list[str], *, timeout: float, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` on the benchmark's databases of this test run, as
    a user runs it (the project's settings, not the tests'); it must succeed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_") and k != "DATABASE_URL"}
    env.update(BENCH_DATABASE_URL=bench_url(), **extra_env)
    result = subprocess.run(
        [PYTHON, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result

"""docs/production.md's first deployment, run command by command.

The ``sh`` blocks of its "first deployment" section run in order, as one
shell script (``set -eu``: a failing command or a variable the page uses
without setting stops it), on a fresh database with role names of the run's
own. The page's ``sh values`` block is the one thing not run: this test gives
the same variables values of its own (a loopback address, no TLS proxy).
Then people sign in with the passwords the page set, open a queue, the agent
calls the API with the token the page printed, and the metrics show the
reconciler's passes; the web, reconciler and notifier processes the page
started are still running. A step the page leaves out, or one that no longer
works, fails here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from ledgerdash.processes import stop_group
from ledgerdash_client import LedgerClient
from tests.database_roles import admin_connect
from tests.live import PYTHON, ROOT, Browser, free_port, output_tail

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

GUIDE = ROOT / "docs" / "production.md"
SECTION = "## The first deployment, command by command"
BLOCK = re.compile(r"^```(sh[^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def guide_blocks() -> tuple[str, list[str]]:
    """The section's ``sh values`` block and its other ``sh`` blocks, in order."""
    text = GUIDE.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    values, steps = "", []
    for info, body in BLOCK.findall(section):
        if info.split()[1:] == ["values"]:
            values = body
        else:
            steps.append(body)
    return values, steps


def test_the_guide_names_every_value_its_steps_read() -> None:
    values, steps = guide_blocks()
    assert len(steps) >= 5
    given = set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", values))
    read = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", "\n".join(steps)))
    set_by_steps = set(re.findall(r"export ([A-Z][A-Z0-9_]*)=", "\n".join(steps)))
    assert read - given - set_by_steps == set()


@pytest.fixture
def scratch() -> Iterator[dict[str, str]]:
    """A database name and two role names of the run's own (made by the guide); all dropped at the end."""
    name = f"{settings.DATABASES['default']['NAME']}_guide"[:50] + secrets.token_hex(3)
    try:
        yield {"name": name, "owner": f"{name}_owner", "runtime": f"{name}_app"}
    finally:
        with admin_connect("postgres") as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            for role in (f"{name}_owner", f"{name}_app"):
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_the_first_deployment_runs_as_written(scratch: dict[str, str], tmp_path: Path) -> None:
    db = settings.DATABASES["default"]
    port = free_port()
    passwords = {
        "ADMIN_PASSWORD": "guide-Admin-pw-1",
        "OPERATOR_PASSWORD": "guide-Op-pw-2",
        "APPROVER_PASSWORD": "guide-Ap-pw-3",
    }
    metrics_token = "guide-metrics-token"
    ours = {
        "PGHOST": db["HOST"] or "127.0.0.1",
        "PGPORT": str(db["PORT"] or 5432),
        "DB_NAME": scratch["name"],
        "DB_OWNER_ROLE": scratch["owner"],
        "DB_RUNTIME_ROLE": scratch["runtime"],
        "OWNER_PASSWORD": "guide-owner-pw",
        "RUNTIME_PASSWORD": "guide-runtime-pw",
        "SECRET_KEY": "guide-test-" + secrets.token_hex(30),
        "ALLOWED_HOSTS": "127.0.0.1",
        "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}",
        "BEHIND_TLS_PROXY": "false",
        "LEDGERDASH_BASE_URL": f"http://127.0.0.1:{port}",
        "LEDGERDASH_BIND": f"127.0.0.1:{port}",
        "METRICS_TOKEN": metrics_token,
        **passwords,
    }
    values, steps = guide_blocks()
    assert set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", values)) == set(ours), "the page's values and this test's differ"
    script = "\n".join(
        [
            "set -eu",
            *(f"export {name}={shlex.quote(value)}" for name, value in ours.items()),
            *steps,
        ]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "DEBUG")}
    env |= {
        "PATH": f"{Path(PYTHON).parent}:{env.get('PATH', '')}",
        "PYTHON": PYTHON,
        # What only this machine needs: plain HTTP on loopback (no TLS proxy in front), a quick
        # reconciler loop, static files in the run's own folder; and the production knobs on.
        "SECURE_SSL_REDIRECT": "false",
        "SECURE_COOKIES": "false",
        "STATIC_ROOT": str(tmp_path / "static"),
        "WEB_CONCURRENCY": "2",
        "DATABASE_POOL": "true",
        "LOG_FORMAT": "json",
        "OIDC_ENABLED": "false",
    }
    log = tmp_path / "guide.log"
    with open(log, "w+b") as out:
        shell = subprocess.Popen(
            ["bash", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = shell.wait(timeout=600)
            assert code == 0, f"the guide's commands failed (exit {code}):\n{output_tail(out)}"
            _check_the_deployment(port, log.read_text(), passwords, metrics_token, shell.pid)
            # The tables belong to the owner role: the runtime role the processes use cannot alter them.
            with admin_connect(scratch["name"]) as admin:
                owned = admin.execute(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner = %s",
                    [scratch["owner"]],
                ).fetchone()
            assert owned is not None
            assert owned[0] > 10
        except BaseException:
            print(f"--- the guide's output (its tail)\n{output_tail(out)}")
            raise
        finally:
            stop_group(shell, timeout=15)


def _check_the_deployment(port: int, output: str, passwords: dict[str, str], metrics_token: str, group: int) -> None:
    base = f"http://127.0.0.1:{port}"
    for person, password in [("admin", passwords["ADMIN_PASSWORD"]), ("operator", passwords["OPERATOR_PASSWORD"]),
                             ("approver", passwords["APPROVER_PASSWORD"])]:  # fmt: skip
        browser = Browser(base)
        assert browser.login(person, password) == (200, f"{base}/"), person
    status, _, page = browser.get("/queues/unknown/")
    assert status == 200, page[:400]
    [token] = re.findall(r"^(ldk_[0-9a-f]{12}_\S+)$", output, re.MULTILINE)
    assert LedgerClient(base, token, retries=0).find("invoice-1") == []
    # The reconciler the page started has made passes, as the runtime role (metrics read the database).
    deadline = time.monotonic() + 120
    while True:
        request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            metrics = response.read().decode()
        assert "ledgerdash_database_up 1.0" in metrics
        passes = re.search(r"^ledgerdash_reconciler_passes_total (\S+)$", metrics, re.MULTILINE)
        if (passes and float(passes.group(1)) >= 1) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert passes, metrics[-2000:]
    assert float(passes.group(1)) >= 1
    # Every process the page started still runs (none exited on an error).
    running = subprocess.run(["ps", "-o", "args=", "-g", str(group)], capture_output=True, text=True).stdout
    for process in ("gunicorn", "manage.py reconcile", "manage.py notify"):
        assert process in running, running
    # Every log line they wrote is a JSON object (LOG_FORMAT=json); curl's answer, which ends in no
    # newline, may have a log line follow it on the same line.
    decoder = json.JSONDecoder()
    for line in output.splitlines():
        at = 0
        while line.startswith("{", at):
            _, at = decoder.raw_decode(line, at)
        assert at in (0, len(line)), line

"""The deployment guide's steps, run as written, against PostgreSQL.

Roles made by a superuser, migrations and grants as the owner
(deploy/migrate), static files and gunicorn through deploy/start-web with
DEBUG off and the connection pool on, a reconciler pass as the runtime
role; then /healthz, /readyz, a sign-in, a queue page, an API call and the
metrics, none of them a 500.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from ledgerdash.client import LedgerClient
from tests.database_roles import admin_connect, admin_url
from tests.live import PYTHON, ROOT, Browser, free_port, running

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PASSWORD = "smoke-test-Pa55word"
METRICS_TOKEN = "smoke-test-metrics-token"

PEOPLE = f"""
from django.contrib.auth.models import User
from ledgerdash.ledger.models import Membership, Tenant
user = User.objects.create_user("ops", "ops@example.com", {PASSWORD!r})
Membership.objects.create(user=user, tenant=Tenant.objects.create(slug="acme", name="Acme"), role="operator")
"""


def _url(user: str, password: str, dbname: str) -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{user}:{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{dbname}"


@pytest.fixture
def scratch() -> Iterator[dict[str, str]]:
    """An empty database and two role names of its own; all dropped at the end."""
    name = f"{settings.DATABASES['default']['NAME']}_smoke"[:50] + secrets.token_hex(3)
    owner, runtime = f"{name}_owner", f"{name}_app"
    with admin_connect("postgres") as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"name": name, "owner": owner, "runtime": runtime}
    finally:
        with admin_connect("postgres") as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            for role in (owner, runtime):
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def run(env: dict[str, str], *cmd: str) -> str:
    child = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | env
    done = subprocess.run(list(cmd), cwd=ROOT, env=child, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_deployment_guide_runs_as_written(scratch: dict[str, str], tmp_path: Path) -> None:
    name, owner, runtime = scratch["name"], scratch["owner"], scratch["runtime"]
    port = free_port()
    base_env = {
        "DEBUG": "false",
        "SECRET_KEY": "smoke-test-" + "x" * 50,
        "ALLOWED_HOSTS": "127.0.0.1",
        "STATIC_ROOT": str(tmp_path / "static"),
        "LEDGERDASH_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "2",
        "DATABASE_POOL": "true",
        "METRICS_TOKEN": METRICS_TOKEN,
        "LOG_FORMAT": "json",
        "OIDC_ENABLED": "false",
        "PYTHON": PYTHON,
        # Plain HTTP on loopback: the TLS proxy of a deployment is not here.
        "SECURE_SSL_REDIRECT": "false",
        "SECURE_COOKIES": "false",
    }
    # 1. As a superuser: both roles, the database handed to the owner.
    run(base_env | {"DATABASE_URL": admin_url(name)}, PYTHON, "manage.py", "db_roles",
        "--owner", owner, "--runtime", runtime, "--create-roles", "--apply")  # fmt: skip
    with admin_connect(name) as admin:
        admin.execute(f"ALTER ROLE \"{owner}\" PASSWORD 'owner-pw'")
        admin.execute(f"ALTER ROLE \"{runtime}\" PASSWORD 'runtime-pw'")
    # 2. As the owner: migrations and grants (deploy/migrate). The roles have names of their own,
    # which deploy/migrate reads from the two URLs (the app's environment has DATABASE_URL).
    app_env = base_env | {"DATABASE_URL": _url(runtime, "runtime-pw", name)}
    run(app_env | {"OWNER_DATABASE_URL": _url(owner, "owner-pw", name)}, str(ROOT / "deploy" / "migrate"))
    run(app_env, PYTHON, "manage.py", "shell", "-c", PEOPLE)
    token = run(app_env, PYTHON, "manage.py", "create_api_token", "--tenant", "acme", "--name", "smoke",
                "--no-expiry").strip().splitlines()[-1].strip()  # fmt: skip
    # 3. The web app and a reconciler pass, as the runtime role.
    with running(
        [str(ROOT / "deploy" / "start-web")], env=app_env, url=f"http://127.0.0.1:{port}/healthz", timeout=240
    ):
        out = run(app_env, PYTHON, "manage.py", "reconcile", "--once")
        assert out.startswith("reconcile pass:")
        browser = Browser(f"http://127.0.0.1:{port}")
        for probe in ("/healthz", "/readyz"):
            status, _, body = browser.get(probe)
            assert status == 200, body
        assert json.loads(body)["checks"] == {"database": "ok", "migrations": "ok"}
        status, final_url = browser.login("ops", PASSWORD)
        assert (status, final_url) == (200, f"http://127.0.0.1:{port}/")
        status, _, page = browser.get("/queues/unknown/")
        assert status == 200, page[:400]
        client = LedgerClient(f"http://127.0.0.1:{port}", token, retries=0)
        assert client.find("invoice-1") == []
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            metrics = response.read().decode()
        assert "ledgerdash_database_up 1.0" in metrics
        assert "ledgerdash_reconciler_passes_total 1.0" in metrics
        assert 'route="queues/<slug:queue>/",status="200"' in metrics
    # The app connected as the runtime role, through the pool, and never as the owner.
    with admin_connect(name) as admin:
        tables = admin.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner = %s", [owner]
        ).fetchone()
    assert tables is not None
    assert tables[0] > 10

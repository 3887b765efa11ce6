"""The web app under database trouble, on a real PostgreSQL through a cuttable link.

gunicorn (DEBUG off, deploy/gunicorn.conf.py) reaches the test database
through :class:`TcpProxy`: cutting it is the server going away, restoring it
the server coming back. Also: sessions terminated by pg_terminate_backend,
and a table locked longer than ``DATABASE_LOCK_TIMEOUT_MS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Membership, State, Tenant, TokenScope
from ledgerdash.ledger.tokens import token_create
from ledgerdash_client import LedgerClient, LedgerUnavailable
from tests.conftest import SERVER_OUTPUT
from tests.database_roles import admin_connect
from tests.live import PYTHON, ROOT, Browser, free_port, running
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "database-trouble-Pa55"
#: The app's sessions are found by this name plus a suffix of each server's own
#: (``App.sessions``): tests that terminate or count them must never reach the
#: sessions of another test's server, in this run or in another on the same
#: PostgreSQL.
APP_NAME = "ledgerdash-web-under-test"


@dataclass
class App:
    base: str
    browser: Browser
    client: LedgerClient
    proxy: TcpProxy
    token: str
    #: the ``application_name`` of this server's sessions, and of no one else's
    sessions: str
    #: what the server wrote (gunicorn's and the app's log)
    log: Path

    def logged(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DEBUG": "false", "STATIC_ROOT": str(root), "DATABASE_URL": ""})
    subprocess.run([PYTHON, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    return root


@pytest.fixture
def app(
    request: pytest.FixtureRequest,
    transactional_db: None,
    static_root: Path,
    django_user_model: Any,
    tmp_path: Path,
) -> Iterator[App]:
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    user = django_user_model.objects.create(
        username="operator", password=PBKDF2PasswordHasher().encode(PASSWORD, "trouble-salt")
    )
    Membership.objects.create(user=user, tenant=tenant, role="operator")
    _, raw_token = token_create(
        tenant=tenant, name="agent", scopes=[TokenScope.READ, TokenScope.WRITE], actor=Actor.system("tests")
    )
    db = settings.DATABASES["default"]
    proxy = TcpProxy((str(db["HOST"] or "127.0.0.1"), int(db["PORT"] or 5432)))
    proxy.start()
    auth = f"{db['USER']}:{db['PASSWORD']}" if db.get("PASSWORD") else str(db["USER"])
    port = free_port()
    sessions = f"{APP_NAME}-{secrets.token_hex(6)}"
    env = {
        "DEBUG": "false",
        "SECRET_KEY": "database-trouble-" + "t" * 40,
        "ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": f"postgres://{auth}@127.0.0.1:{proxy.port}/{db['NAME']}?application_name={sessions}",
        "DATABASE_LOCK_TIMEOUT_MS": "1000",
        "STATIC_ROOT": str(static_root),
        "LEDGERDASH_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "1",
        "SECURE_SSL_REDIRECT": "false",
        "SECURE_COOKIES": "false",
        "OIDC_ENABLED": "false",
        **getattr(request, "param", {}),
    }
    base = f"http://127.0.0.1:{port}"
    cmd = [PYTHON, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py", "ledgerdash.wsgi"]
    output = request.node.stash[SERVER_OUTPUT] = tmp_path / "gunicorn.log"
    try:
        with running(cmd, env=env, url=f"{base}/healthz", timeout=120, output=output):
            browser = Browser(base)
            browser.login("operator", PASSWORD)
            client = LedgerClient(base, raw_token, retries=0, timeout=15)
            yield App(base, browser, client, proxy, raw_token, sessions, output)
    finally:
        proxy.stop()


def assert_unavailable_page(app: App, path: str) -> None:
    status, headers, page = app.browser.get(path)
    assert status == 503, page[:400]
    assert int(headers["Retry-After"]) > 0
    assert "The ledger is unavailable" in page
    assert "/static/ledgerdash/app." in page  # in the dashboard's own look


def assert_unavailable_api(app: App) -> None:
    with pytest.raises(LedgerUnavailable) as caught:
        app.client.find("invoice-1")
    assert caught.value.status == 503
    request = urllib.request.Request(
        f"{app.base}/api/v1/attempts?idempotency_key=x", headers={"Authorization": f"Bearer {app.token}"}
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=15)
    assert answer.value.code == 503
    assert json.loads(answer.value.read())["code"] == "ledger_unavailable"
    assert int(answer.value.headers["Retry-After"]) > 0


def eventually_ok(app: App, path: str, *, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while True:
        status, _, page = app.browser.get(path)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200, page[:400]


def test_pages_and_the_api_answer_503_while_the_database_is_away_then_recover(app: App) -> None:
    eventually_ok(app, "/queues/unknown/")
    assert app.client.find("invoice-1") == []

    app.proxy.stop()
    assert_unavailable_page(app, "/queues/unknown/")
    assert_unavailable_page(app, "/")
    assert_unavailable_api(app)
    status, _, body = app.browser.get("/readyz")
    assert status == 503
    assert json.loads(body)["checks"]["database"].startswith("unreachable")
    # Each request was answered by the app itself: no worker was killed by gunicorn's timeout.
    assert "WORKER TIMEOUT" not in app.logged()

    app.proxy.start()  # the same port: the database is back
    eventually_ok(app, "/queues/unknown/")
    eventually_ok(app, "/readyz")
    assert app.client.find("invoice-1") == []


def test_terminated_sessions_are_replaced_without_an_error(app: App) -> None:
    eventually_ok(app, "/queues/unknown/")
    with admin_connect() as admin:
        # each waits until its session is gone, as a request that comes a moment later finds it
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity WHERE application_name = %s",
            [app.sessions],
        ).fetchone()
    assert killed is not None
    assert killed[0] >= 1  # the worker kept its connection between requests
    # The worker's kept connection is dead: the health check's SELECT 1 finds it so
    # (CONN_HEALTH_CHECKS), and the request connects afresh.
    status, _, page = app.browser.get("/queues/unknown/")
    assert status == 200, page[:400]
    assert app.client.find("invoice-1") == []


@pytest.mark.own_session
def test_a_table_locked_for_long_answers_503_within_the_lock_timeout(app: App) -> None:
    eventually_ok(app, "/queues/unknown/")
    with admin_connect() as admin, contextlib.closing(admin.cursor()) as cursor:
        admin.autocommit = False
        cursor.execute("LOCK TABLE ledger_attempt IN ACCESS EXCLUSIVE MODE")
        assert_unavailable_page(app, "/queues/unknown/")
        assert_unavailable_api(app)
        admin.rollback()
    # Three requests, each ended by the lock timeout (not by the statement timeout or gunicorn's).
    logged = app.logged()
    assert logged.count("canceling statement due to lock timeout") == 3, logged[-4000:]
    assert "WORKER TIMEOUT" not in logged
    eventually_ok(app, "/queues/unknown/")


AGENT = """
import sys
from ledgerdash_client import LedgerClient
client = LedgerClient(sys.argv[1], sys.argv[2], retries=0, timeout=60)
for n in range(5):
    assert client.find(f"invoice-{n}") == []
"""


@pytest.mark.parametrize(
    "app", [{"DATABASE_POOL": "true", "DATABASE_POOL_MAX_SIZE": "2", "WEB_CONCURRENCY": "2"}], indirect=True
)
def test_fifty_agent_processes_share_the_pooled_connections(app: App) -> None:
    agents = [
        subprocess.Popen([PYTHON, "-c", AGENT, app.base, app.token], cwd=ROOT, stderr=subprocess.PIPE)
        for _ in range(50)
    ]
    busiest: list[tuple[Any, ...]] = []  # this server's sessions when most were open
    with admin_connect() as admin:
        while any(agent.poll() is None for agent in agents):
            sessions = admin.execute(
                "SELECT pid, backend_start, state, left(query, 80) FROM pg_stat_activity "
                "WHERE application_name = %s ORDER BY pid",
                [app.sessions],
            ).fetchall()
            if len(sessions) > len(busiest):
                busiest = sessions
            time.sleep(0.05)
    failures = [agent.stderr.read().decode() for agent in agents if agent.returncode != 0 and agent.stderr]
    assert failures == []
    # 2 workers x a pool of at most 2, whatever the number of agents.
    assert 1 <= len(busiest) <= 4, "\n".join(map(str, busiest))


def _api(app: App, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(
        f"{app.base}/api/v1{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method.upper(),
        headers={"Authorization": f"Bearer {app.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


def _sweep(app: App, attempt_id: int, unknown_id: int) -> list[str]:
    """Every endpoint and page once; what answered other than 2xx-4xx or a 503 with Retry-After."""
    from tests.test_answers_under_trouble import PAGES, api_requests

    wrong = []
    asked = [("api", method, path, body) for method, path, body in api_requests(attempt_id, unknown_id)]
    asked += [("page", "get", path.format(unknown=unknown_id, tenant="acme"), None) for path in PAGES]
    for kind, method, path, body in asked:
        status, headers, text = _api(app, method, path, body) if kind == "api" else app.browser.get(path)
        if status >= 500 and not (status == 503 and int(headers.get("Retry-After", "0")) > 0):
            wrong.append(f"{method.upper()} {path}: {status} {text[:200]}")
    return wrong


@pytest.mark.own_session
@pytest.mark.parametrize("app", [{"DATABASE_LOCK_TIMEOUT_MS": "150"}], indirect=True)
def test_every_endpoint_answers_each_locked_table_and_terminated_sessions_cleanly(app: App) -> None:
    from ledgerdash.ledger.policies import policy_publish
    from tests.conftest import TOOLS_V1
    from tests.factories import attempt_in
    from tests.test_answers_under_trouble import TABLES

    eventually_ok(app, "/queues/unknown/")
    tenant = Tenant.objects.get(slug="acme")
    policy_publish(tenant=tenant, tools=TOOLS_V1, actor=Actor.system("tests"), note="initial")
    attempt = attempt_in(State.INTENT_RECORDED, tenant, key="invoice:7:send")
    unknown = attempt_in(State.UNKNOWN, tenant, key="locked-unknown")
    wrong: list[str] = []
    with admin_connect() as admin:
        for table in TABLES:
            with admin.transaction():
                admin.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
                wrong += [f"{table} locked: {line}" for line in _sweep(app, attempt.pk, unknown.pk)]
    # Sessions terminated every few milliseconds while every endpoint is asked, twice over.
    stop = threading.Event()

    def terminate() -> None:
        with admin_connect() as killer:
            while not stop.wait(0.02):
                killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    [app.sessions],
                )

    killer = threading.Thread(target=terminate)
    killer.start()
    try:
        for _ in range(2):
            wrong += [f"terminated: {line}" for line in _sweep(app, attempt.pk, unknown.pk)]
    finally:
        stop.set()
        killer.join()
    assert wrong == [], "\n".join(wrong)
    assert "Internal Server Error" not in app.logged()

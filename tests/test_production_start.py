"""The web process started as deploy/start-web starts it in production:
DEBUG off, collected static files, gunicorn with deploy/gunicorn.conf.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.live import PYTHON, ROOT, Browser, free_port, running

pytestmark = pytest.mark.slow

PASSWORD = "production-start-Pa55"
METRICS_TOKEN = "production-start-metrics-token"


def production_env(tmp_path: Path, port: int) -> dict[str, str]:
    """The environment deploy/README.md lists, on loopback and an SQLite file of its own.

    TLS is the proxy's job in a deployment; this test speaks plain HTTP to
    gunicorn, so the HTTPS redirect and secure-only cookies are off.
    """
    return {
        "DEBUG": "false",
        "SECRET_KEY": "production-start-test-" + "s" * 40,
        "ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.sqlite3'}",
        "LEDGERDASH_VAR_DIR": str(tmp_path / "var"),
        "STATIC_ROOT": str(tmp_path / "static"),
        "LEDGERDASH_BIND": f"127.0.0.1:{port}",
        "SECURE_SSL_REDIRECT": "false",
        "SECURE_COOKIES": "false",
        "OIDC_ENABLED": "false",
        "PYTHON": PYTHON,
        "WEB_CONCURRENCY": "2",
        "METRICS_TOKEN": METRICS_TOKEN,
        "LOG_FORMAT": "json",
    }


#: An operator of one tenant, made the way an admin would in /admin/.
MEMBER = f"""
from django.contrib.auth.models import User
from ledgerdash.ledger.models import Membership, Tenant
user = User.objects.create_superuser("root", "root@example.com", {PASSWORD!r})
Membership.objects.create(user=user, tenant=Tenant.objects.create(slug="acme", name="Acme"), role="operator")
"""


def manage(env: dict[str, str], *args: str) -> None:
    child = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | env
    subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=child, check=True, capture_output=True)


def test_the_web_process_refuses_to_start_without_collected_static_files(tmp_path: Path) -> None:
    env = production_env(tmp_path, free_port()) | {"LEDGERDASH_SKIP_COLLECTSTATIC": "true"}
    child = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | env
    done = subprocess.run(
        [str(ROOT / "deploy" / "start-web")], cwd=ROOT, env=child, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "static files are not collected" in done.stderr
    assert "manage.py collectstatic" in done.stderr


def test_the_documented_start_serves_pages_with_debug_off(tmp_path: Path) -> None:
    port = free_port()
    env = production_env(tmp_path, port)
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", MEMBER)
    with running([str(ROOT / "deploy" / "start-web")], env=env, url=f"http://127.0.0.1:{port}/login/", timeout=180):
        browser = Browser(f"http://127.0.0.1:{port}")
        status, _, page = browser.get("/login/")
        assert status == 200
        assert "/static/ledgerdash/app." in page  # the hashed name from the manifest
        status, final_url = browser.login("root", PASSWORD)
        assert final_url.endswith(f":{port}/")
        assert status == 200
        for path in ("/", "/queues/unknown/", "/incidents/", "/admin/"):
            status, _, page = browser.get(path)
            assert status == 200, (path, page[:500])
        status, headers, _ = browser.get("/static/ledgerdash/app.css")
        assert status == 200
        assert headers["Content-Type"].startswith("text/css")
        status, _, body = browser.get("/readyz")
        assert (status, json.loads(body)["status"]) == (200, "ready")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            metrics = response.read().decode()
        # The requests above, whichever of the two workers served them, in one scrape.
        assert 'ledgerdash_http_request_duration_seconds_count{method="GET",route="login/",status="200"}' in metrics
        assert "ledgerdash_attempts" in metrics
    assert (tmp_path / "static" / "staticfiles.json").exists()


def test_a_bare_gunicorn_without_static_files_says_so_and_serves_the_api(tmp_path: Path) -> None:
    port = free_port()
    env = production_env(tmp_path, port)
    manage(env, "migrate", "--noinput")
    cmd = [PYTHON, "-m", "gunicorn", "ledgerdash.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    output = tmp_path / "gunicorn.log"
    with running(cmd, env=env, url=f"http://127.0.0.1:{port}/healthz", timeout=120, output=output):
        status, _, body = Browser(f"http://127.0.0.1:{port}").get("/readyz")
        assert status == 200, body
    log = output.read_text()
    assert "static files are not collected" in log
    assert "the API is not affected" in log


def healthcheck_command(port: int) -> list[str]:
    """The container image's HEALTHCHECK command (deploy/Dockerfile), aimed at ``port`` instead of 8000."""
    line = next(
        line for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines() if line.startswith("HEALTHCHECK")
    )
    command = line.split(" CMD ", 1)[1].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    return ["sh", "-c", command.replace("python ", f"{PYTHON} ", 1)]


def test_the_images_health_check_passes_against_the_production_start(tmp_path: Path) -> None:
    """The image sends its probe by IP address; production allows only its own host names and
    redirects to HTTPS: the probe passes, and the server logs no refused host."""
    port = free_port()
    env = production_env(tmp_path, port) | {
        "ALLOWED_HOSTS": "ledger.example.com",
        "SECURE_SSL_REDIRECT": "true",
        "LOG_FORMAT": "plain",
    }
    manage(env, "migrate", "--noinput")
    log = tmp_path / "web.log"
    with running([str(ROOT / "deploy" / "start-web")], env=env, timeout=180, output=log):
        command = healthcheck_command(port)
        for _ in range(240):
            probe = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            if probe.returncode == 0:
                break
            time.sleep(0.5)
        assert probe.returncode == 0, probe.stderr[-2000:]
        assert subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0
    logged = log.read_text(errors="replace")
    assert "Invalid HTTP_HOST" not in logged
    assert "DisallowedHost" not in logged


def _container_runtime() -> str | None:
    """A container runtime whose daemon answers, or None."""
    for runtime in ("docker", "podman"):
        if shutil.which(runtime) is None:
            continue
        info = subprocess.run([runtime, "info"], capture_output=True, timeout=30, check=False)
        if info.returncode == 0:
            return runtime
    return None


def test_the_built_image_reports_itself_healthy(tmp_path: Path) -> None:
    runtime = _container_runtime()
    if runtime is None:
        pytest.skip("no container runtime answers here (docker or podman with its daemon)")
    tag = f"ledgerdash-health-test:{os.getpid()}"
    build = subprocess.run(
        [runtime, "build", "-f", "deploy/Dockerfile", "-t", tag, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if build.returncode != 0 and "pull" in build.stderr.lower():
        pytest.skip(f"the base image cannot be pulled here: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr[-3000:]
    name = f"ledgerdash-health-{os.getpid()}"
    env = {
        "SECRET_KEY": "image-health-" + "h" * 40,
        "ALLOWED_HOSTS": "ledger.example.com",
        "DATABASE_URL": "sqlite:////tmp/ledger.sqlite3",
    }
    run = [runtime, "run", "-d", "--name", name, "--health-interval=2s", "--health-start-period=60s"]
    for key, value in env.items():
        run += ["-e", f"{key}={value}"]
    subprocess.run([*run, tag], check=True, capture_output=True, timeout=120)
    try:
        status = ""
        for _ in range(120):
            status = subprocess.run(
                [runtime, "inspect", "--format", "{{.State.Health.Status}}", name],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if status in ("healthy", "unhealthy"):
                break
            time.sleep(1)
        logs = subprocess.run([runtime, "logs", name], capture_output=True, text=True, check=False)
        assert status == "healthy", (logs.stdout + logs.stderr)[-3000:]
        assert "Invalid HTTP_HOST" not in logs.stdout + logs.stderr
    finally:
        subprocess.run([runtime, "rm", "-f", name], capture_output=True, check=False)
        subprocess.run([runtime, "rmi", "-f", tag], capture_output=True, check=False)


def test_with_json_logs_every_line_is_json_and_a_request_is_one_line(tmp_path: Path) -> None:
    """gunicorn's own lines included; a refused request is not logged twice; nothing is written to the
    home directory (gunicorn's control socket is off)."""
    port = free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = production_env(tmp_path, port) | {"HOME": str(home), "LOG_FORMAT": "json"}
    manage(env, "migrate", "--noinput")
    log = tmp_path / "web.log"
    base = f"http://127.0.0.1:{port}"
    with running([str(ROOT / "deploy" / "start-web")], env=env, url=f"{base}/healthz", timeout=180, output=log):
        browser = Browser(base)
        answered = {}
        for path in ("/login/", "/no-such-page/", "/api/v1/attempts"):
            request = urllib.request.Request(base + path, headers={"X-Request-ID": f"probe-{len(answered)}"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    answered[path] = response.status
            except urllib.error.HTTPError as refused:
                answered[path] = refused.code
        assert answered == {"/login/": 200, "/no-such-page/": 404, "/api/v1/attempts": 401}
        assert browser.get("/healthz")[0] == 200
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line[:300]}")
    loggers = {entry.get("logger") for entry in parsed}
    assert "gunicorn.error" in loggers  # gunicorn's own start lines
    for n, path in enumerate(answered):
        about = [entry for entry in parsed if entry.get("request_id") == f"probe-{n}"]
        assert len(about) == 1, about
        assert [entry for entry in parsed if path in entry.get("message", "")] == about
    assert not any("control" in entry.get("message", "").lower() for entry in parsed), parsed
    assert list(home.iterdir()) == []


OIDC_WITHOUT_ROLES = {
    "OIDC_ENABLED": "true",
    "OIDC_GROUP_ROLES": "",
    **{
        name: "https://sso.example.com/x"
        for name in (
            "OIDC_OP_ISSUER", "OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT",
            "OIDC_OP_JWKS_ENDPOINT", "OIDC_RP_CLIENT_ID", "OIDC_RP_CLIENT_SECRET",
        )
    },
}  # fmt: skip


@pytest.mark.parametrize("command", [["reconcile", "--once"], ["notify", "--once"], ["verify_audit"]])
def test_with_json_logs_a_services_system_check_findings_are_json_lines_too(tmp_path: Path, command: list[str]) -> None:
    # A setting no one can sign in with is a system check error: the command must not start, and say so in JSON.
    env = production_env(tmp_path, free_port()) | OIDC_WITHOUT_ROLES
    child = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"} | env
    done = subprocess.run(
        [PYTHON, "manage.py", *command], cwd=ROOT, env=child, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    found = [json.loads(line) for line in lines]  # every line a JSON object
    assert found[0]["check"] == "ledgerdash.E011"
    assert found[0]["level"] == "ERROR"
    assert "not starting" in found[-1]["message"]
    assert done.stdout == ""

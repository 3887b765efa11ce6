"""Settings come from the environment and refuse nonsense at start-up."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from ledgerdash import env
from tests.live import PYTHON, ROOT

PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "a-production-secret-" + "x" * 40,
    "ALLOWED_HOSTS": "ledger.example.com",
    "PATH": "/usr/bin:/bin",
}


def start(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Start the real settings module in a fresh process with ``extra`` as its environment."""
    return subprocess.run(
        [PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**PRODUCTION, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DEBUG", "ture", "DEBUG='ture' is not a boolean"),
        ("SECRET_KEY", "", "SECRET_KEY must be set when DEBUG is off"),
        ("ALLOWED_HOSTS", "", "empty entry"),
        ("ALLOWED_HOSTS", "a,,b", "empty entry"),
        ("DATABASE_URL", "mysql://root@localhost/x", "supports sqlite:/// and postgres://"),
        ("DATABASE_URL", "nonsense", "is not a database URL"),
        ("LEDGER_DISPATCH_LEASE_SECONDS", "soon", "is not a whole number"),
        ("LEDGER_DISPATCH_LEASE_SECONDS", "0", "below the minimum"),
        ("LEDGER_CLOCK_READ_SECONDS", "0", "below the minimum"),
        ("LEDGER_PROVIDER_CLOCK_SKEW_SECONDS", "5m", "is not a whole number"),
        ("LEDGER_PROVIDER_CLOCK_SKEW_SECONDS", "-1", "below the minimum"),
        ("LOG_FORMAT", "xml", "use plain or json"),
        ("METRICS_TOKEN", "short", "at least 16 characters"),
    ],
)
def test_bad_values_fail_loudly_at_start_up(variable: str, value: str, message: str) -> None:
    result = start({variable: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr  # one line saying what is wrong


def test_a_commands_help_without_a_secret_key_says_what_is_missing() -> None:
    env = {k: v for k, v in PRODUCTION.items() if k != "SECRET_KEY"}
    result = subprocess.run(
        [PYTHON, "manage.py", "reconcile", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # the whole project's checks, in a process of its own
@pytest.mark.parametrize("email", [{"EMAIL_HOST": "smtp.example.com"}, {}], ids=["with email", "without email"])
def test_production_settings_pass_the_deploy_check(tmp_path: object, email: dict[str, str]) -> None:
    result = start({"DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3", **email})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_env_helpers() -> None:
    import os

    os.environ["LD_TEST_BOOL"] = "Yes"
    os.environ["LD_TEST_LIST"] = "a, b"
    try:
        assert env.env_bool("LD_TEST_BOOL", False) is True
        assert env.env_bool("LD_TEST_MISSING", True) is True
        assert env.env_list("LD_TEST_LIST", []) == ["a", "b"]
        with pytest.raises(ImproperlyConfigured):
            env.env_int("LD_TEST_LIST", 1)
    finally:
        del os.environ["LD_TEST_BOOL"], os.environ["LD_TEST_LIST"]


@pytest.mark.django_db
def test_migrations_match_the_models() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_the_database_check_names_tenants_whose_default_owner_cannot_act(tenant_a: object, operator_a: object) -> None:
    from ledgerdash.ledger.models import Tenant
    from reviews.checks import default_owners_are_members

    warnings = {w.id: w.msg for w in default_owners_are_members()}
    assert "acme's default owner oncall-a is not an operator" in warnings["ledgerdash.W002"]
    Tenant.objects.filter(slug="acme").update(default_owner=operator_a)
    assert default_owners_are_members() == []
    Tenant.objects.filter(slug="acme").update(default_owner=None)
    assert [w.id for w in default_owners_are_members()] == ["ledgerdash.W001"]


@pytest.mark.parametrize(("value", "expected"), [("", ROOT / "var"), ("/srv/ledgerdash", "/srv/ledgerdash")])
def test_an_empty_var_dir_means_the_default(value: str, expected: object) -> None:
    """A variable copied empty from .env.example is unset, not the current directory."""
    result = subprocess.run(
        [PYTHON, "-c", "from django.conf import settings; print(settings.VAR_DIR)"],
        cwd=ROOT,
        env={**PRODUCTION, "DJANGO_SETTINGS_MODULE": "ledgerdash.settings", "LEDGERDASH_VAR_DIR": value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)


@pytest.mark.parametrize(
    ("url", "kept", "added"),
    [
        ("postgres://u@db.example.com/ledger?sslmode=require", {"sslmode": "require"}, "server_side_binding"),
        ("sqlite:///{tmp}/db.sqlite3?timeout=5", {"timeout": 5}, "init_command"),
    ],
)
def test_options_in_the_database_url_are_kept(
    url: str, kept: dict[str, object], added: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerdash import settings

    monkeypatch.delenv("DATABASE_TRANSACTION_POOLER", raising=False)
    options = settings.database_config(url.format(tmp=tmp_path))["OPTIONS"]
    assert isinstance(options, dict)
    assert kept.items() <= options.items()
    assert added in options


def test_pages_answers_and_exports_are_never_stored_by_caches(client: Any, operator_a: Any, tenant_a: Any) -> None:
    from django.urls import reverse

    from tests.api_support import Api, issue_token
    from tests.conftest import as_user

    logged_in = as_user(operator_a)
    for response in (
        logged_in.get(reverse("reviews:home")),
        logged_in.get(reverse("reviews:search")),
        logged_in.post(reverse("reviews:export", args=["csv"]), {"tenant": "acme"}),
        Api(issue_token(tenant_a)).get("/attempts", {"needs_attention": "true"}),
        client.get(reverse("login")),
    ):
        assert "no-store" in response["Cache-Control"], response
    static = client.get("/static/ledgerdash/app.css")
    assert static.status_code == 200
    assert "no-store" not in static.get("Cache-Control", "")


@pytest.mark.parametrize("said", [{}, {"Cache-Control": "max-age=60, public"}, {"Expires": "0"}])
def test_no_store_writes_what_djangos_never_cache_writes(said: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The middleware's own way for an answer that says nothing of caching, and Django's merge for
    one that does, give the headers ``add_never_cache_headers`` gives (at one frozen moment)."""
    import time

    from django.http import HttpResponse
    from django.utils.cache import add_never_cache_headers

    from ledgerdash.middleware import NoStoreMiddleware

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    expected = HttpResponse(headers=said)
    add_never_cache_headers(expected)
    answered = NoStoreMiddleware(lambda request: HttpResponse(headers=said))(None)  # type: ignore[arg-type]
    assert dict(answered.headers) == dict(expected.headers)
    assert "no-store" in answered["Cache-Control"]


def test_postgres_connections_get_the_statement_and_lock_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerdash import settings

    monkeypatch.setenv("DATABASE_STATEMENT_TIMEOUT_MS", "2500")
    monkeypatch.setenv("DATABASE_LOCK_TIMEOUT_MS", "0")
    monkeypatch.delenv("DATABASE_TRANSACTION_POOLER", raising=False)
    config = settings.database_config("postgres://u@db.example.com/ledger?options=-c%20search_path%3Dledger")
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    # The URL's own server settings come last, so they win over the project's.
    assert options["options"] == "-c statement_timeout=2500 -c lock_timeout=0 -c search_path=ledger"
    assert config["CONN_HEALTH_CHECKS"] is True
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert "pool" not in options


def test_behind_a_transaction_pooler_nothing_outlives_a_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerdash import settings

    monkeypatch.setenv("DATABASE_TRANSACTION_POOLER", "true")
    config = settings.database_config("postgres://u@db.example.com/ledger")
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    assert "options" not in options  # PgBouncer refuses the startup parameter
    assert "server_side_binding" not in options
    assert config["DISABLE_SERVER_SIDE_CURSORS"] is True
    with pytest.raises(ImproperlyConfigured, match="a pooler in transaction mode refuses"):
        settings.database_config("postgres://u@db.example.com/ledger?options=-c%20search_path%3Dledger")


def test_the_connection_pool_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerdash import settings

    monkeypatch.setenv("DATABASE_POOL", "true")
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "3")
    config = settings.database_config("postgres://u@db.example.com/ledger")
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    assert options["pool"] == {"min_size": 1, "max_size": 3, "timeout": 10}
    assert config["CONN_MAX_AGE"] == 0  # Django refuses persistent connections beside a pool

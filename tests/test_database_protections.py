"""What the database itself refuses, whoever asks (PostgreSQL).

The app connects as the runtime role (tests/database_roles.py): it cannot
switch a trigger off, truncate, alter a table, or edit or remove history.
The tables' owner, who can switch a trigger off, still cannot empty a
ledger table with TRUNCATE (migration 0008): Django's flush included.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from ledgerdash.ledger import dbroles
from ledgerdash.ledger.models import Attempt, AttemptEvent, ChainHead, Tenant
from tests import database_roles
from tests.conftest import record
from tests.live import PYTHON, ROOT

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        os.environ.get("LEDGERDASH_TEST_DB_ROLES", "on").lower() in {"off", "0", "false", "no"},
        reason="the suite runs as the URL's own user (LEDGERDASH_TEST_DB_ROLES=off)",
    ),
]

LEDGER_TABLES = ("ledger_attemptevent", "ledger_attempt", "ledger_chainhead")


def refused(statement: str, params: list[Any] | None = None) -> str:
    """Run ``statement`` on the app's connection; return the database's refusal."""
    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)
    return str(caught.value)


@pytest.fixture
def ledger(tenant_a: Tenant) -> Attempt:
    return record(tenant_a)


def test_the_app_connects_as_a_role_that_is_no_superuser_and_owns_nothing(ledger: Attempt) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        )
        user, superuser, createrole, createdb = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM pg_class WHERE relowner = current_user::regrole")
        (owned,) = cursor.fetchone()
    assert user == database_roles._roles["runtime"][0]
    assert (superuser, createrole, createdb, owned) == (False, False, False, 0)


def test_the_runtime_role_carries_the_apps_timeouts(ledger: Attempt) -> None:
    """What a transaction pooler's connections run with: the app cannot send them when it connects there."""
    from django.conf import settings

    statement_ms, lock_ms = settings.DATABASE_TIMEOUTS_MS
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolconfig FROM pg_roles WHERE rolname = current_user")
        (config,) = cursor.fetchone()
    assert f"statement_timeout={statement_ms}" in config
    assert f"lock_timeout={lock_ms}" in config


def test_the_runtime_role_cannot_switch_a_trigger_off(ledger: Attempt) -> None:
    for table in LEDGER_TABLES:
        assert "must be owner" in refused(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
    assert "must be owner" in refused("DROP TRIGGER ledger_attemptevent_append_only ON ledger_attemptevent")
    assert "permission denied" in refused("SET session_replication_role = replica")


@pytest.mark.parametrize("table", [*LEDGER_TABLES, "ledger_tenant", "auth_user", "django_session"])
def test_the_runtime_role_cannot_truncate(ledger: Attempt, table: str) -> None:
    assert "permission denied" in refused(f"TRUNCATE {table} CASCADE")


def test_the_runtime_role_cannot_edit_or_remove_history(ledger: Attempt) -> None:
    event = AttemptEvent.objects.filter(attempt=ledger).get()
    assert "permission denied" in refused("UPDATE ledger_attemptevent SET reason = 'x' WHERE id = %s", [event.pk])
    assert "permission denied" in refused("DELETE FROM ledger_attemptevent WHERE id = %s", [event.pk])
    assert "permission denied" in refused("DELETE FROM ledger_attempt WHERE id = %s", [ledger.pk])
    assert "permission denied" in refused("DELETE FROM ledger_chainhead")
    # What archive_events recorded is the owner's to write: the walks and restore_events trust it.
    assert "permission denied" in refused("UPDATE ledger_eventarchive SET sha256 = 'x'")
    assert "permission denied" in refused(
        "INSERT INTO ledger_eventarchive (name, high, file, sha256, events, chains, archived_at) "
        "VALUES ('x', 1, 'x', 'x', 0, '[]', now())"
    )
    assert "permission denied" in refused("CREATE TABLE scratch (id int)")
    assert "must be owner" in refused("ALTER TABLE ledger_attemptevent ADD COLUMN forged text")
    assert AttemptEvent.objects.filter(attempt=ledger, reason="intent recorded").exists()
    assert ChainHead.objects.filter(tenant=ledger.tenant).exists()


@pytest.mark.django_db(transaction=True)  # the owner's connection sees what is committed
@pytest.mark.parametrize(
    "statement",
    [
        "TRUNCATE ledger_attemptevent",
        "TRUNCATE ledger_chainhead",
        *(f"TRUNCATE {table} CASCADE" for table in LEDGER_TABLES),
        "TRUNCATE ledger_tenant CASCADE",  # reaches the ledger's tables through their foreign keys
    ],
)
def test_not_even_the_owner_can_truncate_the_ledger(ledger: Attempt, statement: str) -> None:
    events = AttemptEvent.objects.count()
    with psycopg.connect(database_roles.owner_url(), autocommit=True) as owner:
        assert owner.execute("SELECT current_user").fetchone() == (database_roles._roles["owner"][0],)
        with pytest.raises(psycopg.errors.RestrictViolation, match="the ledger never loses rows: TRUNCATE refused"):
            owner.execute(statement)
    assert AttemptEvent.objects.count() == events > 0
    assert Attempt.objects.filter(pk=ledger.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_djangos_flush_is_refused_and_the_ledger_keeps_its_rows(ledger: Attempt, tmp_path: Any) -> None:
    events = AttemptEvent.objects.count()
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_roles.owner_url(), DEBUG="true", LEDGERDASH_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [PYTHON, "manage.py", "flush", "--no-input", "--traceback"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "the ledger never loses rows: TRUNCATE refused" in result.stderr
    assert AttemptEvent.objects.count() == events
    assert Tenant.objects.filter(pk=ledger.tenant_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_table_a_later_migration_creates_is_usable_by_the_runtime_role(ledger: Attempt) -> None:
    with psycopg.connect(database_roles.owner_url(), autocommit=True) as owner:
        owner.execute("CREATE TABLE later_feature (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, note text)")
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO later_feature (note) VALUES ('written by the app') RETURNING id")
        assert cursor.fetchone() is not None
        cursor.execute("UPDATE later_feature SET note = 'changed'")
        cursor.execute("SELECT note FROM later_feature")
        assert cursor.fetchall() == [("changed",)]
    assert "permission denied" in refused("TRUNCATE later_feature")
    assert "must be owner" in refused("DROP TABLE later_feature")


@pytest.mark.django_db(transaction=True)
def test_db_roles_applied_again_changes_nothing_the_app_needs(ledger: Attempt, tmp_path: Any) -> None:
    owner, runtime = database_roles._roles["owner"][0], database_roles._roles["runtime"][0]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_roles.admin_url(), DEBUG="true", LEDGERDASH_VAR_DIR=str(tmp_path))
    command = [PYTHON, "manage.py", "db_roles", "--owner", owner, "--runtime", runtime]
    printed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert (
        f'ALTER DEFAULT PRIVILEGES FOR ROLE "{owner}" IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE' in printed
    )
    assert f'REVOKE UPDATE, DELETE ON ledger_attemptevent FROM "{runtime}"' in printed
    applied = subprocess.run([*command, "--apply"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert applied.returncode == 0, applied.stderr
    record(ledger.tenant, "after-reapplying")  # the app still records
    assert "permission denied" in refused("DELETE FROM ledger_attemptevent")


def test_db_roles_refuses_names_it_would_have_to_quote() -> None:
    with pytest.raises(dbroles.RoleNameError):
        dbroles.identifier('app"; DROP TABLE ledger_attemptevent; --')


def test_the_deploy_check_warns_when_the_app_would_connect_as_a_superuser(db: None, tmp_path: Any) -> None:
    from reviews.checks import runtime_role_owns_nothing

    assert runtime_role_owns_nothing() == []  # the suite's own connection: the runtime role
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_roles.admin_url(), DEBUG="true", LEDGERDASH_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [PYTHON, "manage.py", "check", "--deploy", "--database", "default"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "ledgerdash.W010" in result.stderr + result.stdout
    assert "a superuser: it could switch the ledger's triggers off" in result.stderr + result.stdout


@pytest.mark.django_db
def test_applying_roles_that_do_not_exist_says_so_without_changing_anything() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as refused:
        call_command("db_roles", "--owner", "no_such_owner_role", "--runtime", "no_such_app_role", "--apply")
    message = str(refused.value)
    assert "no role no_such_owner_role or no_such_app_role on this server" in message
    assert "DB_OWNER_ROLE" in message

"""Backup -> wipe -> restore -> verify, on SQLite and on PostgreSQL; a
restore whose chains do not verify fails loudly, naming the break."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command

from ledgerdash.ledger.models import AttemptEvent, ChainHead, State, Tenant
from tests import tamper
from tests.database_roles import admin_url
from tests.factories import attempt_in
from tests.live import PYTHON, ROOT
from tests.tamper import _triggers

pytestmark = pytest.mark.slow  # every test runs manage.py, pg_dump or pg_restore in processes of their own


def manage(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    """manage.py in its own process, on the database at ``url``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DATABASE_URL": url, "DEBUG": "false", "SECRET_KEY": "k" * 50, "ALLOWED_HOSTS": "localhost"})
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def fill(tenant_a: Tenant, tenant_b: Tenant) -> dict[str, tuple[int, str]]:
    for n, state in enumerate([State.OUTCOME_CONFIRMED, State.MANUAL_REVIEW, State.FAILED, State.UNKNOWN]):
        attempt_in(state, tenant_a, key=f"a-{n}")
        attempt_in(state, tenant_b, key=f"b-{n}")
    return {h.tenant.slug: (h.seq, h.hash) for h in ChainHead.objects.select_related("tenant")}


def sqlite_heads(path: Path) -> dict[str, tuple[int, str]]:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT t.slug, h.seq, h.hash FROM ledger_chainhead h JOIN ledger_tenant t ON t.id = h.tenant_id"
        ).fetchall()
    return {slug: (seq, digest) for slug, seq, digest in rows}


# --- SQLite -----------------------------------------------------------------------------------
#
# On a database file of their own, through manage.py as an operator runs it
# (the suite's SQLite database is in memory, shared with its transaction).

FILL = """
from ledgerdash.ledger.models import State, Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.events import Actor
from tests.conftest import TOOLS_V1
from tests.factories import attempt_in

for slug in ("acme", "globex"):
    tenant = Tenant.objects.create(slug=slug, name=slug)
    policy_publish(tenant=tenant, tools=TOOLS_V1, actor=Actor.system("tests"))
    for n, state in enumerate([State.OUTCOME_CONFIRMED, State.MANUAL_REVIEW, State.FAILED, State.UNKNOWN]):
        attempt_in(state, tenant, key=f"{slug}-{n}")
"""


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "live" / "ledgerdash.sqlite3"
    url = f"sqlite:///{path}"
    for args in (["migrate", "-v0"], ["shell", "-c", FILL]):
        result = manage(*args, url=url)
        assert result.returncode == 0, result.stdout + result.stderr
    return path, url


def _wipe(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def test_sqlite_backup_wipe_restore_verify(sqlite_ledger: tuple[Path, str], tmp_path: Path) -> None:
    path, url = sqlite_ledger
    heads = sqlite_heads(path)
    with sqlite3.connect(path) as db:
        events = db.execute("SELECT count(*) FROM ledger_attemptevent").fetchone()
    backup = tmp_path / "ledger.backup.sqlite3"
    made = manage("backup_ledger", "--out", str(backup), url=url)
    assert made.returncode == 0, made.stderr
    assert f"acme: chain head at backup time seq {heads['acme'][0]} {heads['acme'][1]}" in made.stdout
    _wipe(path)
    result = manage("restore_ledger", str(backup), url=url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restored ledger verified: 2 chains" in result.stdout
    assert sqlite_heads(path) == heads
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM ledger_attemptevent").fetchone() == events
        triggers = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert {"ledger_attemptevent_no_update", "ledger_attemptevent_no_delete"} <= triggers  # still append-only
    assert manage("verify_audit", url=url).returncode == 0


def test_sqlite_restore_of_a_tampered_backup_fails_loudly(sqlite_ledger: tuple[Path, str], tmp_path: Path) -> None:
    path, url = sqlite_ledger
    backup = tmp_path / "ledger.backup.sqlite3"
    assert manage("backup_ledger", "--out", str(backup), url=url).returncode == 0
    with sqlite3.connect(backup) as db:
        (victim_id, seq) = db.execute(
            "SELECT e.id, e.seq FROM ledger_attemptevent e JOIN ledger_tenant t ON t.id = e.tenant_id "
            "WHERE t.slug = 'globex' ORDER BY e.seq LIMIT 1 OFFSET 3"
        ).fetchone()
        for statement in _triggers.SQLITE_REVERSE:
            db.execute(statement)
        db.execute("UPDATE ledger_attemptevent SET reason = 'rewritten' WHERE id = ?", [victim_id])
    _wipe(path)
    result = manage("restore_ledger", str(backup), url=url)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "THE RESTORED LEDGER DOES NOT VERIFY" in output
    assert f"tenant globex seq {seq} (event id {victim_id}) was edited" in output
    assert "acme: ok" in output


def test_restore_will_not_overwrite_a_ledger_unasked(sqlite_ledger: tuple[Path, str], tmp_path: Path) -> None:
    _, url = sqlite_ledger
    backup = tmp_path / "ledger.backup.sqlite3"
    assert manage("backup_ledger", "--out", str(backup), url=url).returncode == 0
    refused = manage("restore_ledger", str(backup), url=url)
    assert refused.returncode == 1
    assert "already holds ledger events" in refused.stderr
    assert manage("restore_ledger", "--replace", str(backup), url=url).returncode == 0
    again = manage("backup_ledger", "--out", str(backup), url=url)
    assert again.returncode == 1
    assert "exists; choose a new file" in again.stderr


def test_restore_refuses_what_is_not_a_backup(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a database")
    target = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    result = manage("restore_ledger", str(bogus), url=target)
    assert result.returncode == 1
    assert "is not a ledgerdash SQLite backup" in result.stderr
    assert manage("restore_ledger", str(tmp_path / "missing"), url=target).returncode == 1


# --- PostgreSQL --------------------------------------------------------------------------------


@pytest.fixture
def scratch_databases() -> Iterator[Any]:
    """Make empty databases of this test's own on the same server; drop them after. A restore
    creates tables, so it runs as the superuser, not as the app's runtime role."""
    made: list[str] = []
    base = admin_url("postgres").rsplit("/", 1)[0]

    def make() -> str:
        name = f"ledgerdash_restore_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return f"{base}/{name}"

    yield make
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        for name in made:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # pg_dump reads what is committed
def test_postgres_backup_wipe_restore_verify(
    tenant_a: Tenant, tenant_b: Tenant, tmp_path: Path, scratch_databases: Any
) -> None:
    heads = fill(tenant_a, tenant_b)
    events = AttemptEvent.objects.count()
    backup = tmp_path / "ledger.dump"
    call_command("backup_ledger", "--out", str(backup))
    target = scratch_databases()  # wiped: an empty database
    result = manage("restore_ledger", str(backup), url=target)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restored ledger verified: 2 chains" in result.stdout
    with psycopg.connect(target) as restored:
        rows = restored.execute(
            "SELECT t.slug, h.seq, h.hash FROM ledger_chainhead h JOIN ledger_tenant t ON t.id = h.tenant_id"
        ).fetchall()
        assert {slug: (seq, digest) for slug, seq, digest in rows} == heads
        assert restored.execute("SELECT count(*) FROM ledger_attemptevent").fetchone() == (events,)
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            restored.execute("DELETE FROM ledger_attemptevent")  # the trigger came back too
    # Restoring again over it needs saying so.
    again = manage("restore_ledger", str(backup), url=target)
    assert again.returncode == 1
    assert "already holds ledger events" in again.stderr
    assert manage("restore_ledger", "--replace", str(backup), url=target).returncode == 0


def _backed_up_and_restored(
    tenant_a: Tenant, tenant_b: Tenant, tmp_path: Path, scratch_databases: Any
) -> tuple[Path, str, int]:
    """Two tenants' ledger backed up and restored into a scratch database:
    the backup, the database's URL, and how many events it holds."""
    fill(tenant_a, tenant_b)
    events = AttemptEvent.objects.count()
    backup = tmp_path / "ledger.dump"
    call_command("backup_ledger", "--out", str(backup))
    target = scratch_databases()
    assert manage("restore_ledger", str(backup), url=target).returncode == 0
    return backup, str(target), events


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_restore_that_fails_halfway_leaves_the_database_as_it_was(
    tenant_a: Tenant, tenant_b: Tenant, tmp_path: Path, scratch_databases: Any
) -> None:
    backup, target, events = _backed_up_and_restored(tenant_a, tenant_b, tmp_path, scratch_databases)
    with psycopg.connect(target) as restored:  # what the backup does not hold, to tell a partial restore
        restored.execute("UPDATE ledger_tenant SET name = 'kept' WHERE slug = %s", [tenant_a.slug])
    # Cut short after the statements that drop the tables: pg_restore fails while reading the data.
    cut = tmp_path / "cut.dump"
    cut.write_bytes(backup.read_bytes()[: backup.stat().st_size * 3 // 4])
    result = manage("restore_ledger", "--replace", str(cut), url=target)
    assert result.returncode == 1
    assert "pg_restore failed" in result.stderr
    assert "the database was left as it was" in result.stderr
    with psycopg.connect(target) as restored:
        assert restored.execute("SELECT count(*) FROM ledger_attemptevent").fetchone() == (events,)
        assert restored.execute("SELECT name FROM ledger_tenant WHERE slug = %s", [tenant_a.slug]).fetchone() == (
            "kept",
        )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_restore_whose_statement_fails_says_why_and_changes_nothing(
    tenant_a: Tenant, tenant_b: Tenant, tmp_path: Path, scratch_databases: Any
) -> None:
    backup, target, events = _backed_up_and_restored(tenant_a, tenant_b, tmp_path, scratch_databases)
    with psycopg.connect(target) as restored:
        # A table the backup knows nothing of, whose key on the tenants stops their clean-up.
        restored.execute("CREATE TABLE blocks_the_drop (tenant_id bigint REFERENCES ledger_tenant (id))")
    result = manage("restore_ledger", "--replace", str(backup), url=target)
    assert result.returncode == 1
    assert "psql failed" in result.stderr
    assert "blocks_the_drop" in result.stderr
    with psycopg.connect(target) as restored:
        assert restored.execute("SELECT count(*) FROM ledger_attemptevent").fetchone() == (events,)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_postgres_restore_of_a_tampered_ledger_fails_loudly(
    tenant_a: Tenant, tenant_b: Tenant, tmp_path: Path, scratch_databases: Any
) -> None:
    fill(tenant_a, tenant_b)
    victim = AttemptEvent.objects.filter(tenant=tenant_a).order_by("seq")[5]
    tamper.delete(victim.pk)
    backup = tmp_path / "ledger.dump"
    call_command("backup_ledger", "--out", str(backup))
    result = manage("restore_ledger", str(backup), url=scratch_databases())
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "THE RESTORED LEDGER DOES NOT VERIFY" in output
    assert f"seq {victim.seq} missing before tenant acme seq {victim.seq + 1}" in output
    assert "globex: ok" in output


def _unit_command(unit: str, state: Path) -> str:
    """A systemd unit's ExecStart as its shell runs it: systemd's escapes undone (%% and $$),
    the deployment's paths pointed at this checkout and ``state`` (for /var/lib/ledgerdash)."""
    text = (ROOT / "deploy" / "systemd" / unit).read_text()
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    command = line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$")
    command = command.replace("/srv/ledgerdash/.venv/bin/python", PYTHON).replace("/var/lib/ledgerdash", str(state))
    assert command.startswith("/bin/sh -c '"), command
    assert command.endswith("'"), command
    return command.removeprefix("/bin/sh -c '")[:-1]


def test_the_units_keep_the_backups_heads_outside_the_database_and_verify_against_them(
    sqlite_ledger: tuple[Path, str], tmp_path: Path
) -> None:
    path, url = sqlite_ledger
    state = tmp_path / "state"
    for folder in ("backups", "heads"):
        (state / folder).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DEBUG": "true", "DATABASE_URL": url, "LEDGERDASH_VAR_DIR": str(tmp_path / "var")})

    def unit(name: str) -> subprocess.CompletedProcess[str]:
        command = _unit_command(name, state)
        return subprocess.run(["/bin/sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True)

    backup = unit("ledgerdash-backup.service")
    assert backup.returncode == 0, backup.stderr
    latest = state / "heads" / "latest.heads"
    heads = sqlite_heads(path)
    assert f"acme: chain head at backup time seq {heads['acme'][0]} {heads['acme'][1]}" in latest.read_text()
    assert list((state / "backups").iterdir())
    verified = unit("ledgerdash-verify-audit.service")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # The verifying unit reads the kept heads: one the chain does not pass through fails it.
    forged = state / "heads" / "forged.heads"
    forged.write_text(f"acme:{heads['acme'][0]}:{'0' * 64}\n")
    latest.unlink()
    latest.symlink_to(forged.name)
    refused = unit("ledgerdash-verify-audit.service")
    assert refused.returncode != 0, refused.stdout


def test_a_multi_host_urls_dump_and_restore_go_to_the_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    """pg_dump and pg_restore get the URL's hosts and its connection options as libpq's variables."""
    from django.db import connection

    from ledgerdash.ledger import backup
    from ledgerdash.settings import database_config

    monkeypatch.delenv("DATABASE_CONNECT_TIMEOUT", raising=False)
    config = database_config("postgres://app:pw@db1:5432,db2:5433/ledger?sslmode=require")
    monkeypatch.setattr(connection, "settings_dict", config)
    args, env = backup._pg_args()
    assert args == ["--dbname", "ledger", "--host", "db1,db2", "--port", "5432,5433", "--username", "app"]
    assert (env["PGTARGETSESSIONATTRS"], env["PGSSLMODE"], env["PGCONNECT_TIMEOUT"], env["PGPASSWORD"]) == (
        "read-write",
        "require",
        "10",
        "pw",
    )

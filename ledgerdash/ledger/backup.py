"""Backing up and restoring the whole database, ledger included.

PostgreSQL: ``pg_dump --format=custom`` and ``pg_restore`` (a consistent
snapshot taken while the app runs). SQLite: the online backup API, which
copies a consistent snapshot page by page while writers carry on.

A restore is only done when the restored chains verify: it runs the same
walk as ``verify_audit`` on the restored database and fails loudly, naming
the first break, if one does not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from django.db import DatabaseError, connection

from ledgerdash.ledger import audit
from ledgerdash.ledger.models import AttemptEvent, ChainHead


class BackupError(Exception):
    pass


def _pg_args() -> tuple[list[str], dict[str, str]]:
    db = connection.settings_dict
    args = ["--dbname", str(db["NAME"])]
    for flag, key in (("--host", "HOST"), ("--port", "PORT"), ("--username", "USER")):
        if db.get(key):
            args += [flag, str(db[key])]
    env = dict(os.environ)
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    # The URL's connection options reach pg_dump and pg_restore as libpq's
    # variables: a multi-host URL's dump is taken from, and a restore written
    # to, the primary (never a standby that may lag behind the heads printed).
    options = db.get("OPTIONS") or {}
    for option, variable in (
        ("target_session_attrs", "PGTARGETSESSIONATTRS"),
        ("sslmode", "PGSSLMODE"),
        ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ):
        if option in options:
            env[variable] = str(options[option])
    if "," in str(db.get("HOST") or "") and "target_session_attrs" not in options:
        env["PGTARGETSESSIONATTRS"] = "read-write"
    return args, env


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not installed (Debian: apt-get install postgresql-client)")
    return path


def _run(command: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)  # noqa: S603 - our own tools
    if result.returncode != 0:
        raise BackupError(f"{Path(command[0]).name} failed ({result.returncode}): {result.stderr.strip()}")


def heads() -> list[tuple[str, int, str]]:
    """Each chain's head (a tenant with several chains has a line for each):
    (slug, seq, hash), for the operator to note."""
    return list(ChainHead.objects.order_by("tenant__slug", "stripe").values_list("tenant__slug", "seq", "hash"))


def backup(out: Path) -> None:
    """Write a consistent snapshot of the whole database to ``out``."""
    if connection.vendor == "postgresql":
        args, env = _pg_args()
        _run([_tool("pg_dump"), "--format=custom", "--no-owner", "--no-privileges", "--file", str(out), *args], env)
        return
    connection.ensure_connection()
    source = connection.connection
    target = sqlite3.connect(out)
    try:
        with target:
            source.backup(target)
    finally:
        target.close()


def has_ledger() -> bool:
    try:
        return AttemptEvent.objects.exists()
    except DatabaseError:
        return False


def restore(path: Path) -> None:
    """Replace this database's contents with the backup at ``path``."""
    if not path.is_file():
        raise BackupError(f"no backup at {path}")
    if connection.vendor == "postgresql":
        args, env = _pg_args()
        connection.close()
        _restore_postgres(path, args, env)
        return
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        source.execute("SELECT count(*) FROM ledger_attemptevent").fetchone()
    except sqlite3.DatabaseError as exc:
        source.close()
        raise BackupError(f"{path} is not a ledgerdash SQLite backup: {exc}") from None
    connection.close()
    target = sqlite3.connect(str(connection.settings_dict["NAME"]))
    try:
        with target:
            source.backup(target)
    finally:
        target.close()
        source.close()


#: Run first, in the transaction the backup's own statements run in: the
#: events' partitions cannot be dropped one by one while attached (their
#: primary keys are the partitioned table's), which ``pg_restore --clean``
#: tries; dropping the partitioned table drops them all.
_DROP_PARTITIONED = "DROP TABLE IF EXISTS public.ledger_attemptevent CASCADE;\n"


def _restore_postgres(path: Path, args: list[str], env: dict[str, str]) -> None:
    """The backup's statements (``pg_restore --clean`` as a script) fed to
    ``psql`` between a ``BEGIN`` of ours and a ``COMMIT`` sent only once
    pg_restore has finished well (psql's own --single-transaction does not
    apply to what it reads from its input): all of it lands, or, when either
    program fails, psql ends without the ``COMMIT`` and nothing changes."""
    restore_cmd = [_tool("pg_restore"), "--clean", "--if-exists", "--no-owner", "--no-privileges", "--file", "-"]
    psql_cmd = [_tool("psql"), "--no-psqlrc", "--quiet", "--set", "ON_ERROR_STOP=1"]
    with tempfile.TemporaryFile() as restore_err, tempfile.TemporaryFile() as psql_err:
        psql = subprocess.Popen(  # noqa: S603 - our own tools
            [*psql_cmd, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=psql_err
        )
        assert psql.stdin is not None
        script = subprocess.Popen([*restore_cmd, str(path)], env=env, stdout=subprocess.PIPE, stderr=restore_err)  # noqa: S603
        assert script.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # psql stopped at an error: its own message says which
            psql.stdin.write(b"BEGIN;\n" + _DROP_PARTITIONED.encode())
            shutil.copyfileobj(script.stdout, psql.stdin, 1 << 20)
        script.stdout.close()
        script_rc = script.wait()
        psql_stopped = psql.poll()  # on an error of its own (ON_ERROR_STOP), before its input ended
        if script_rc != 0 or psql_stopped is not None:
            psql.kill()  # no COMMIT sent: its transaction is rolled back
        else:
            with contextlib.suppress(BrokenPipeError):
                psql.stdin.write(b"COMMIT;\n")
        with contextlib.suppress(BrokenPipeError):
            psql.stdin.close()
        psql_rc = psql.wait()
        # psql's error first when it stopped on its own: pg_restore then only saw its pipe close.
        order = [("psql", psql_rc, psql_err), ("pg_restore", script_rc, restore_err)]
        if psql_stopped is None:
            order.reverse()
        for name, rc, err in order:
            if rc != 0:
                err.seek(0)
                message = err.read().decode(errors="replace").strip()
                raise BackupError(f"{name} failed ({rc}): {message}; the database was left as it was")


def verify_restored(walked: Callable[[audit.ChainResult], object] | None = None) -> list[audit.ChainResult]:
    connection.close()  # read the restored database afresh
    return audit.verify(walked=walked)

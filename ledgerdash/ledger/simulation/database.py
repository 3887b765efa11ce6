"""The simulation's own databases.

A template is migrated once per process and given the world every run
starts from (:func:`ledgerdash.ledger.simulation.scenario.build_world`);
each run then gets a fresh copy of it: a file copy on SQLite,
``CREATE DATABASE … TEMPLATE`` on PostgreSQL. A run therefore starts from
the very same rows, ids and sequences every time, so a seed replays the same
history exactly, in this process or any other.

Names are the process's own (``ledgerdash_sim_<pid>_<random>``; a worker's,
``ledgerdash_sim_<run pid>_<worker pid>_<random>``, also carry the run's), so
runs side by side never touch each other's databases; every one is dropped
at the end.
On SQLite, a process may copy the migrated database another process of
the same code left in the folder ``LEDGERDASH_SIM_TEMPLATES`` names,
rather than migrate again (the test suite sets it: its dozens of runs
migrate the same code); the copy is keyed by a digest of the code and
of Django's and SQLite's versions, so code that changed is migrated anew.
Durability is traded for speed (``synchronous=OFF``, ``synchronous_commit=off``):
the simulation kills agents and reconcilers, never the database server.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from django.core.management import call_command
from django.db import connections

from ledgerdash.ledger import store

#: The folder where a run on SQLite keeps the migrated database for the next process of the same code.
TEMPLATES_ENV = "LEDGERDASH_SIM_TEMPLATES"
#: The code whose migrations make the database (every app of the project's lives here).
CODE = Path(__file__).resolve().parents[3]


def code_digest() -> str:
    """What the migrated database depends on: every Python file of the project (its migrations may
    read SQL from its modules), every installed app's migrations, and Django's and SQLite's versions."""
    import django
    from django.apps import apps

    files = {*(CODE / "ledgerdash").rglob("*.py"), *(CODE / "reviews").rglob("*.py")}
    for app in apps.get_app_configs():
        files.update((Path(app.path) / "migrations").glob("*.py"))
    digest = hashlib.sha256(f"{django.__version__} {sqlite3.sqlite_version}".encode())
    for path in sorted(files):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _forget() -> None:
    """Drop what this process remembers of the database it used before."""
    connections.close_all()
    store.forget()


class ScratchDatabases:
    """A template database and a fresh copy of it per run, for Django's
    ``default`` connection; ``url`` None: SQLite files in a folder of their own."""

    def __init__(self, url: str | None, *, prepare: Callable[[], None], owner: int | None = None) -> None:
        """``owner``: the pid of the run this process works for, when it is one of its workers."""
        from ledgerdash.settings import database_config

        self.url = url
        self.prepare = prepare
        self.config: dict[str, Any] = database_config(url or "sqlite:///:memory:")
        self.vendor = "postgresql" if "postgresql" in str(self.config["ENGINE"]) else "sqlite"
        pids = f"{owner}_{os.getpid()}" if owner is not None else str(os.getpid())
        self.prefix = f"ledgerdash_sim_{pids}_{secrets.token_hex(3)}"
        self.folder: Path | None = None
        self._saved: dict[str, Any] | None = None
        self.copies = 0

    # --- the connection Django uses ---------------------------------------------------

    def _use(self, name: str) -> None:
        """Point Django's ``default`` connection (every thread's) at database ``name``."""
        _forget()
        settings = connections["default"].settings_dict
        if self._saved is None:
            self._saved = dict(settings)
            settings.clear()
            settings.update(self.config)
            settings.setdefault("TEST", {})
            settings.setdefault("TIME_ZONE", None)
            settings.setdefault("CONN_HEALTH_CHECKS", False)
            settings.setdefault("CONN_MAX_AGE", 0)
            settings.setdefault("AUTOCOMMIT", True)
            settings.setdefault("ATOMIC_REQUESTS", False)
            options = dict(settings.get("OPTIONS") or {})
            if self.vendor == "sqlite":
                options["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; PRAGMA foreign_keys=ON;"
            else:
                options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()
                options.pop("pool", None)
            settings["OPTIONS"] = options
            settings["CONN_MAX_AGE"] = 0 if self.vendor == "sqlite" else 600
        settings["NAME"] = name
        # This thread's connection object was made for the settings before
        # (another backend, perhaps): the next use makes one for these.
        del connections["default"]

    # --- PostgreSQL -----------------------------------------------------------------------

    def _admin(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(
            host=self.config.get("HOST") or None,
            port=self.config.get("PORT") or None,
            user=self.config.get("USER") or None,
            password=self.config.get("PASSWORD") or None,
            dbname="postgres",
            autocommit=True,
        ) as admin:
            admin.execute(statement.encode())  # names of this process's own making

    # --- the template and its copies ----------------------------------------------------

    @property
    def template(self) -> str:
        assert self.folder is not None or self.vendor == "postgresql"
        return str(self.folder / "template.sqlite3") if self.folder else f"{self.prefix}_t"

    @property
    def run_name(self) -> str:
        return str(self.folder / "run.sqlite3") if self.folder else f"{self.prefix}_r"

    def __enter__(self) -> ScratchDatabases:
        try:
            self._build()
        except BaseException as error:
            # Stopped (SIGTERM) or failed while the template was being built: what was made goes all
            # the same, and the error told is the first one (a server gone fails the cleanup too).
            with contextlib.suppress(Exception):
                self.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def _build(self) -> None:
        if self.vendor == "sqlite":
            self.folder = Path(tempfile.mkdtemp(prefix="ledgerdash-sim-"))
        else:
            self._admin(f'CREATE DATABASE "{self.template}"')
        self._use(self.template)
        kept = os.environ.get(TEMPLATES_ENV, "")
        if self.vendor == "sqlite" and kept:
            self._migrated_from(Path(kept))
        else:
            call_command("migrate", verbosity=0, interactive=False)
        self.prepare()
        if self.vendor == "sqlite":
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _forget()

    def _migrated_from(self, folder: Path) -> None:
        """The template migrated: a copy of the one ``folder`` keeps for this code, made first when it
        keeps none (one process at a time: the others wait for it, then copy it). Only the newest
        code's is kept."""
        folder.mkdir(parents=True, exist_ok=True)
        kept = folder / f"migrated-{code_digest()}.sqlite3"
        with (folder / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not kept.exists():
                call_command("migrate", verbosity=0, interactive=False)
                from django.db import connection

                with connection.cursor() as cursor:
                    cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                _forget()
                part = kept.with_suffix(".part")
                shutil.copyfile(self.template, part)
                part.replace(kept)
                for other in folder.glob("migrated-*.sqlite3"):
                    if other != kept:
                        other.unlink(missing_ok=True)
                return
            # Still under the lock: a process of newer code cannot remove it midway.
            _forget()
            for suffix in ("-wal", "-shm"):
                Path(self.template + suffix).unlink(missing_ok=True)
            shutil.copyfile(kept, self.template)

    def fresh(self) -> str:
        """A new copy of the template for the next run, in use from now on; its name."""
        _forget()
        if self.vendor == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(self.run_name + suffix).unlink(missing_ok=True)
            shutil.copyfile(self.template, self.run_name)
        else:
            self._admin(f'DROP DATABASE IF EXISTS "{self.run_name}"')
            self._admin(f'CREATE DATABASE "{self.run_name}" TEMPLATE "{self.template}"')
        self._use(self.run_name)
        self.copies += 1
        return self.run_name

    def keep(self, destination: Path) -> str:
        """Keep the current run's database (to inspect a failure): where it is now."""
        _forget()
        if self.vendor == "sqlite":
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.run_name, destination)
            return str(destination)
        kept = f"{self.prefix}_kept{self.copies}"
        self._admin(f'ALTER DATABASE "{self.run_name}" RENAME TO "{kept}"')
        return f"postgres database {kept}"

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        _forget()
        if self._saved is not None:
            settings = connections["default"].settings_dict
            settings.clear()
            settings.update(self._saved)
            del connections["default"]
        if self.vendor == "sqlite":
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
        else:
            # FORCE: a run stopped midway (SIGTERM) may leave a session of its own open.
            self._admin(f'DROP DATABASE IF EXISTS "{self.run_name}" WITH (FORCE)')
            self._admin(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')

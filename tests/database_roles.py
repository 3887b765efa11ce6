"""The PostgreSQL pass runs as a deployment does: as the runtime role.

``DATABASE_URL`` names a superuser (the local server's ``postgres``). With it
the suite creates two roles of this run's own (``<test db>_owner_<run>``,
``<test db>_runtime_<run>``), creates the test database *as the owner*,
migrates as the owner, applies ``manage.py db_roles``' grants, and then
connects the app -- every test, live server, drill agent and reconciler
process it starts -- as the runtime role, which owns nothing and holds only
row privileges. At the end it drops the databases and both roles. Tests
that legitimately need more (tampering with events behind the ledger's
back, creating scratch databases, restoring a backup) ask for
:func:`admin_url` explicitly, so nothing runs as a superuser by accident.

**A clean slate without TRUNCATE.** Django ends every transactional test
(``django_db(transaction=True)``, ``live_server``) by flushing the database,
and its flush is a TRUNCATE, which the ledger's triggers refuse (migration
0008) whoever asks. The guard has no switch the suite could flip: a session
setting that lets TRUNCATE through would let the app's own role through as
well. So this module never flushes: after migrating it keeps a copy of the
fresh database as a template, and ends each transactional test by dropping
the test database and creating it again from the template (a file-level
copy of a few megabytes, well under a second). Tests that do not commit run
inside a transaction that is rolled back, as before.

``LEDGERDASH_TEST_DB_ROLES=off`` runs the pass as the URL's own user instead
(for a server where that user may not create roles); the template copies
still replace the flush.

**Through a pooler.** With ``LEDGERDASH_TEST_ADMIN_URL`` (the server itself,
as a superuser) the harness makes and drops databases and roles there,
while the app (``DATABASE_URL``: PgBouncer in front of that server) connects
through the pooler; a pooler's idle connections to the test database are
ended before it is copied (``scripts/pgbouncer.sh``, ``make test-pgbouncer``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connections
from django.test import TransactionTestCase

from ledgerdash.ledger import dbroles, store

RUN = secrets.token_hex(4)

#: The settings the suite was given (the superuser), kept before they change.
_admin: dict[str, Any] = {}
#: The roles of this run, once made: {"owner": (name, password), "runtime": (name, password)}.
_roles: dict[str, tuple[str, str]] = {}


def on_postgres() -> bool:
    return str(settings.DATABASES["default"]["ENGINE"]).endswith("postgresql")


def _conninfo(params: dict[str, Any], dbname: str) -> dict[str, Any]:
    return {
        "host": params.get("HOST") or None,
        "port": params.get("PORT") or None,
        "user": params.get("USER") or None,
        "password": params.get("PASSWORD") or None,
        "dbname": dbname,
    }


def _server() -> dict[str, Any]:
    """The server's settings as the harness reaches it: the superuser the
    suite was given, on the server itself when a pooler is in front."""
    if _admin:
        return _admin
    params = dict(settings.DATABASES["default"])
    direct = os.environ.get("LEDGERDASH_TEST_ADMIN_URL")
    if direct:
        import dj_database_url

        server = dj_database_url.parse(direct)
        params.update({k: server[k] for k in ("HOST", "PORT", "USER", "PASSWORD")})  # type: ignore[literal-required]
    return params


def _url(user: str, password: str | None, dbname: str) -> str:
    params = _server()
    auth = user + (f":{password}" if password else "")
    host = params.get("HOST") or "localhost"
    port = f":{params['PORT']}" if params.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{dbname}"


def admin_url(dbname: str | None = None) -> str:
    """The superuser the suite was given, on ``dbname`` (default: the test database)."""
    params = _server()
    return _url(str(params.get("USER") or "postgres"), params.get("PASSWORD"), dbname or _test_name())


def owner_url(dbname: str | None = None) -> str:
    """The role that owns the tables (the superuser when roles are off)."""
    if "owner" not in _roles:
        return admin_url(dbname)
    name, password = _roles["owner"]
    return _url(name, password, dbname or _test_name())


def admin_connect(dbname: str | None = None) -> psycopg.Connection[Any]:
    params = _server()
    return psycopg.connect(**_conninfo(params, dbname or _test_name()), autocommit=True)


def _test_name() -> str:
    return str(settings.DATABASES["default"]["NAME"])


def _template_name() -> str:
    return f"{_test_name()}_clean"[:63]


def _use(user: str, password: str | None) -> None:
    """Connect the app as ``user`` from now on."""
    connections.close_all()
    for params in (settings.DATABASES["default"], connections["default"].settings_dict):
        params["USER"] = user
        params["PASSWORD"] = password or ""


def _fresh_database(self: TransactionTestCase) -> None:
    """Instead of Django's flush (a TRUNCATE): the test database anew from the template."""
    connections.close_all()
    name, template = _test_name(), _template_name()
    owner = _roles["owner"][0] if "owner" in _roles else str(_admin.get("USER") or "postgres")
    with admin_connect("postgres") as admin:
        # FORCE ends what the test left connected (a live server's thread, a worker it killed).
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" OWNER "{owner}"')
    # The copy's sequences start again: ids this process reserved from the old ones must not be used,
    # and a tenant id may name another tenant, with another number of chains.
    store.forget()


def _no_dead_connection() -> None:
    """Before a transactional test: drop a connection the last template copy
    terminated. ``connections.close_all()`` in :func:`_fresh_database`
    closes the connections of the context it runs in, and a transactional
    test can run in another context than the tests before it (the browser
    tests do): the connection an earlier test left open in this one was
    ended by the ``DROP DATABASE … WITH (FORCE)``, and the next statement on
    it would fail with "terminating connection due to administrator command"."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()


def _make_roles(test_name: str) -> None:
    base = test_name[:40]
    owner, runtime = f"{base}_owner_{RUN}", f"{base}_runtime_{RUN}"
    passwords = {owner: secrets.token_urlsafe(24), runtime: secrets.token_urlsafe(24)}
    with admin_connect("postgres") as admin:
        for statement in dbroles.create_role_statements(owner=owner, runtime=runtime):
            admin.execute(statement)
        for role, password in passwords.items():
            admin.execute(f"ALTER ROLE \"{role}\" PASSWORD '{password}'")
        # Only the test harness's owner creates databases (the test database, its template copies).
        admin.execute(f'ALTER ROLE "{owner}" CREATEDB')
    _roles["owner"] = (owner, passwords[owner])
    _roles["runtime"] = (runtime, passwords[runtime])


def _drop_roles() -> None:
    with admin_connect("postgres") as admin:
        for name, _ in _roles.values():
            admin.execute(f'DROP ROLE IF EXISTS "{name}"')
    _roles.clear()


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker: Any,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """pytest-django's database set-up, with the roles and the template on PostgreSQL."""
    from django.test.utils import setup_databases, teardown_databases

    verbosity = request.config.option.verbose
    if not on_postgres():
        with django_db_blocker.unblock():
            config = setup_databases(verbosity=verbosity, interactive=False, aliases={"default"})
        yield
        with django_db_blocker.unblock():
            teardown_databases(config, verbosity=verbosity)
        return

    _admin.update(_server())
    split = os.environ.get("LEDGERDASH_TEST_DB_ROLES", "on").lower() not in {"off", "0", "false", "no"}
    original_teardown = TransactionTestCase._fixture_teardown
    original_setup = TransactionTestCase.__dict__["_fixture_setup"]  # a classmethod
    with django_db_blocker.unblock():
        test_name = "test_" + str(_admin["NAME"])
        with admin_connect("postgres") as admin:  # a database an earlier, killed run left behind
            for name in (test_name, f"{test_name}_clean"[:63]):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if split:
            _make_roles(test_name)
            _use(*_roles["owner"])
        config = setup_databases(verbosity=verbosity, interactive=False, aliases={"default"}, serialized_aliases=set())
        if split:
            owner, runtime = _roles["owner"][0], _roles["runtime"][0]
            with admin_connect() as admin:
                for statement in dbroles.grant_statements(owner=owner, runtime=runtime, database=_test_name()):
                    admin.execute(statement)
        connections.close_all()
        with admin_connect("postgres") as admin:
            # A pooler keeps the server's connections to the test database open after the app let go.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [_test_name()],
            )
            admin.execute(f'CREATE DATABASE "{_template_name()}" TEMPLATE "{_test_name()}"')
        if split:
            _use(*_roles["runtime"])
    TransactionTestCase._fixture_teardown = _fresh_database  # type: ignore[method-assign]

    def fixture_setup(cls: type[TransactionTestCase]) -> None:
        _no_dead_connection()
        original_setup.__func__(cls)

    TransactionTestCase._fixture_setup = classmethod(fixture_setup)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        TransactionTestCase._fixture_teardown = original_teardown  # type: ignore[method-assign]
        TransactionTestCase._fixture_setup = original_setup  # type: ignore[method-assign]
        with django_db_blocker.unblock():
            connections.close_all()
            with admin_connect("postgres") as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{_template_name()}" WITH (FORCE)')
                admin.execute(f'DROP DATABASE IF EXISTS "{_test_name()}" WITH (FORCE)')
            for params in (settings.DATABASES["default"], connections["default"].settings_dict):
                params.update({k: _admin[k] for k in ("NAME", "USER", "PASSWORD")})
            if split:
                _drop_roles()
        del config

"""Personas and helpers shared by the suite.

Tenant A ("acme") has an operator, an approver, a viewer and an admin;
tenant B ("globex") has an outsider who must never see A's work.

The suite runs twice under ``make test``: on SQLite, then on PostgreSQL
(``DATABASE_URL=postgres://…``). Tests marked ``postgres`` need the latter;
on SQLite they are skipped with a reason, and under ``CI=true`` a test that
would be skipped for want of PostgreSQL fails instead. Tests marked ``bench``
need the benchmark peers (``.venv-bench``, made by ``make bench``) and are
treated the same way. ``slow`` marks what ``make check`` leaves out.

Each run names its PostgreSQL test databases for itself (``test_<name>_run<pid>``,
plus ``_gw0``… per xdist worker), so two runs on one server never drop each
other's databases.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from ledgerdash.ledger import recording, tokens
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.store import copies as store_copies
from ledgerdash.ledger.store import statements as store_statements
from tests.database_roles import django_db_setup  # noqa: F401 - PostgreSQL as the runtime role
from tests.live import output_tail

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

#: Names this run's test databases; set by the process that starts the run,
#: inherited by its xdist workers.
RUN_ENV = "LEDGERDASH_TEST_RUN"
#: PostgreSQL cuts longer names short, and two runs could then share one.
MAX_NAME = 63

TOOLS_V1 = {
    "send_email": ["email:send"],
    "charge_card": ["payments:charge", "payments:refund"],
    "open_ticket": ["tickets:write"],
}


def _vendor() -> str:
    return str(settings.DATABASES["default"]["ENGINE"]).rsplit(".", 1)[-1]


def _postgres_unreachable() -> str | None:
    import psycopg

    db = settings.DATABASES["default"]
    try:
        psycopg.connect(
            host=db.get("HOST") or None,
            port=db.get("PORT") or None,
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            dbname="postgres",
            connect_timeout=3,
        ).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {db.get('HOST')}:{db.get('PORT')} is not reachable ({exc})"
    return None


def pytest_configure(config: pytest.Config) -> None:
    # Set before xdist starts its workers, so they all carry the same run name.
    os.environ.setdefault(RUN_ENV, f"run{os.getpid()}")


#: Where a test's live server writes its output (set by the fixture that starts it).
SERVER_OUTPUT = pytest.StashKey[Path]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failed test that ran a live server shows the server's own log beside
    the failure: the reason for a 503 or a 500 is there, not in the test."""
    report: pytest.TestReport = yield
    output = item.stash.get(SERVER_OUTPUT, None)
    if report.failed and output is not None and output.exists():
        with output.open("rb") as log:
            report.sections.append(("live server output (its tail)", output_tail(log)))
    return report


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix(request: pytest.FixtureRequest) -> None:
    """``test_<name>_run<pid>`` (``_gw0``… under xdist) instead of pytest-django's
    ``test_<name>``, which every run on the server would share."""
    suffix = os.environ[RUN_ENV]
    worker = getattr(request.config, "workerinput", {}).get("workerid")
    if worker:
        suffix += f"_{worker}"
    for db in settings.DATABASES.values():
        test = db.setdefault("TEST", {})
        if str(db["ENGINE"]).endswith("sqlite3") and not test.get("NAME"):
            continue  # in memory: nothing to share
        name = f"{test.get('NAME') or 'test_' + str(db['NAME'])}_{suffix}"
        if len(name) > MAX_NAME:
            raise pytest.UsageError(f"test database name {name!r} is over {MAX_NAME} characters; shorten the URL's")
        test["NAME"] = name


def _bench_peers_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("dbos") is None


def _grouping_lost(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker under ``--dist loadgroup``, fail the run when the
    grouping did not reach the node ids xdist schedules by: the crash drills
    (tests/test_crashdrill.py) would then run side by side, unannounced (it
    happened with pytest 9.2)."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        message = (
            f"--dist loadgroup: {len(lost)} grouped tests carry no group in their node id ({lost[0]}, ...); "
            "this pytest and pytest-xdist do not group, and the grouped tests would run side by side"
        )
        # xdist reports a worker that stops in its collection only as an
        # internal error naming a test; its own stderr reaches the terminal.
        os.write(2, f"\n{message}\n".encode())
        raise pytest.UsageError(message)


# Last: after -m has deselected what this run does not want, and after xdist
# has written each test's group into its node id.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The longest tests first: xdist hands tests out in this order, so each starts on a worker of
    # its own while the others share the rest, instead of running alone at the end of the pass.
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)
    _grouping_lost(config, items)
    needs_peers = [item for item in items if item.get_closest_marker("bench")]
    if needs_peers and _bench_peers_missing():
        reason = "needs the benchmark peers: run with .venv-bench/bin/pytest (make bench-venv makes it)"
        if IN_CI:
            raise pytest.UsageError(f"{len(needs_peers)} bench tests collected; {reason}, or deselect -m 'not bench'")
        for item in needs_peers:
            item.add_marker(pytest.mark.skip(reason=reason))
    if _vendor() == "postgresql":
        problem = _postgres_unreachable()
        if problem is None:
            from django.conf import settings

            if settings.DATABASE_TRANSACTION_POOLER:
                skip = pytest.mark.skip(reason="its database session is the pooler's (DATABASE_TRANSACTION_POOLER)")
                for item in items:
                    if item.get_closest_marker("own_session"):
                        item.add_marker(skip)
            return
        if IN_CI:
            raise pytest.UsageError(f"{problem}; CI must run the PostgreSQL tests")
        skip = pytest.mark.skip(reason=f"{problem}; set DATABASE_URL to a reachable server to run these")
        for item in items:
            item.add_marker(skip)
        return
    needs_pg = [item for item in items if item.get_closest_marker("postgres")]
    if not needs_pg:
        return
    if IN_CI:
        raise pytest.UsageError(
            f"{len(needs_pg)} PostgreSQL tests collected on SQLite; deselect them with -m 'not postgres' "
            "or run with DATABASE_URL=postgres://…"
        )
    skip = pytest.mark.skip(reason="needs PostgreSQL: run with DATABASE_URL=postgres://postgres@127.0.0.1/ledgerdash")
    for item in needs_pg:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _nothing_remembered_of_earlier_tests() -> None:
    """Each test starts with no attempt ids reserved and no tenant's chains
    remembered (what a process keeps of its database: ``statements``), so
    what it counts or sees does not depend on the tests its worker ran
    before (how many ids of a block they used; a tenant id they made with
    another number of chains, rolled back since; a copy of an attempt they
    wrote)."""
    store_statements.forget_database()
    store_copies.forget()


@pytest.fixture
def make_user(django_user_model: Any) -> Any:
    def make(username: str, **extra: Any) -> Any:
        return django_user_model.objects.create_user(username=username, password="pw-" + username, **extra)

    return make


@pytest.fixture
def tenant_a(db: None, make_user: Any) -> Tenant:
    owner = make_user("oncall-a")
    tenant = Tenant.objects.create(slug="acme", name="Acme", default_owner=owner)
    policy_publish(tenant=tenant, tools=TOOLS_V1, actor=Actor.system("tests"), note="initial")
    return tenant


@pytest.fixture
def tenant_b(db: None, make_user: Any) -> Tenant:
    owner = make_user("oncall-b")
    tenant = Tenant.objects.create(slug="globex", name="Globex", default_owner=owner)
    policy_publish(tenant=tenant, tools=TOOLS_V1, actor=Actor.system("tests"), note="initial")
    return tenant


@pytest.fixture
def tenant_striped(db: None, make_user: Any) -> Tenant:
    """A tenant whose events are kept in four chains."""
    owner = make_user("oncall-s")
    tenant = Tenant.objects.create(slug="initech", name="Initech", default_owner=owner, chain_stripes=4)
    policy_publish(tenant=tenant, tools=TOOLS_V1, actor=Actor.system("tests"), note="initial")
    return tenant


def member(make_user: Any, username: str, tenant: Tenant, role: str) -> Any:
    from ledgerdash.ledger.models import Membership

    user = make_user(username)
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


@pytest.fixture
def viewer_a(make_user: Any, tenant_a: Tenant) -> Any:
    return member(make_user, "viewer-a", tenant_a, "viewer")


@pytest.fixture
def operator_a(make_user: Any, tenant_a: Tenant) -> Any:
    return member(make_user, "operator-a", tenant_a, "operator")


@pytest.fixture
def approver_a(make_user: Any, tenant_a: Tenant) -> Any:
    return member(make_user, "approver-a", tenant_a, "approver")


@pytest.fixture
def admin_a(make_user: Any, tenant_a: Tenant) -> Any:
    return member(make_user, "admin-a", tenant_a, "admin")


@pytest.fixture
def outsider_b(make_user: Any, tenant_b: Tenant) -> Any:
    return member(make_user, "outsider-b", tenant_b, "approver")


AGENT = Actor.agent("agent-test")
RECONCILER = Actor.reconciler("reconciler-test")


#: A policy condition: charges over 500.00 wait for an approver.
THRESHOLD = {"charge_card": "amount_cents > `50000`"}


@pytest.fixture
def guarded(tenant_a: Tenant) -> Tenant:
    """tenant_a with a policy under which big charges wait for an approver."""
    policy_publish(tenant=tenant_a, tools=TOOLS_V1, approvals=THRESHOLD, actor=Actor.system("t"), note="big charges")
    return tenant_a


@pytest.fixture
def stuck(tenant_a: Tenant, tenant_b: Tenant) -> dict[str, Attempt]:
    """Work spread over two tenants: two queues' worth in A, one in B, one done."""
    from tests.factories import attempt_in  # factories import this module

    return {
        "a_unknown": attempt_in(State.UNKNOWN, tenant_a, key="a-unknown"),
        "a_review": attempt_in(State.MANUAL_REVIEW, tenant_a, key="a-review"),
        "a_done": attempt_in(State.OUTCOME_CONFIRMED, tenant_a, key="a-done"),
        "b_unknown": attempt_in(State.UNKNOWN, tenant_b, key="b-unknown"),
    }


def together(work: Callable[[Any], None], items: Sequence[Any]) -> None:
    """Call ``work(item)`` for each item in a thread of its own, all released
    at once by a barrier, and wait for them; each thread closes its own
    database connection. What ``work`` raises is its own to catch and record."""
    barrier = threading.Barrier(len(items))

    def run(item: Any) -> None:
        try:
            barrier.wait()
            work(item)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def as_user(user: Any) -> Client:
    """A test client logged in as ``user``."""
    client = Client()
    client.force_login(user)
    return client


def record(tenant: Tenant, key: str = "invoice:7:send", **overrides: Any) -> Attempt:
    fields: dict[str, Any] = {
        "tenant": tenant,
        "task_id": "task-1",
        "tool_name": "send_email",
        "idempotency_key": key,
        "args": {"to": "ap@example.com", "invoice": 7},
        "actor": AGENT,
    }
    fields.update(overrides)
    return recording.record_intent(**fields).attempt


def events_of(attempt: Attempt) -> list[AttemptEvent]:
    return list(AttemptEvent.objects.filter(attempt=attempt).order_by("seq"))


def ledger_snapshot() -> tuple[int, int, list[tuple[Any, ...]]]:
    """Counts and states: equal before and after means nothing was written."""
    return (
        Attempt.objects.count(),
        AttemptEvent.objects.count(),
        list(Attempt.objects.order_by("id").values_list("id", "state", "fence", "owner_id")),
    )


STATES = list(State)


@pytest.fixture
def kept_for_5s(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The per-worker token cache on (5 s), with a clock the test moves."""
    settings.LEDGER_TOKEN_CACHE_SECONDS = 5
    tokens.token_forget_all()
    clock = [1000.0]
    monkeypatch.setattr(tokens, "_monotonic", lambda: clock[0])
    yield clock
    tokens.token_forget_all()


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.sandboxes import sandbox_process

    with sandbox_process(tmp_path_factory.mktemp("sandbox")) as running_sandbox:
        yield running_sandbox


@pytest.fixture
def sandbox_tools(sandbox: Any, db: None) -> Any:
    """send_email and open_ticket idempotent at the sandbox, charge_card not
    (the sandbox ignores its keys), all reached through the generic HTTP
    adapter configured for the sandbox."""
    from ledgerdash.ledger.models import Tool
    from ledgerdash.sandbox import http_adapter_config

    sandbox.clear()
    sandbox.faults("charge_card", non_idempotent=True)
    config = http_adapter_config(sandbox.url, lookup_timeout=1.0)
    for name, idempotent in (("send_email", True), ("open_ticket", True), ("charge_card", False)):
        Tool.objects.create(name=name, config=config, idempotent=idempotent, key_retention_seconds=3600)
    return sandbox

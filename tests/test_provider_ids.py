"""A provider's id is the outcome of one side effect.

The database refuses an attempt naming a provider request id that an
attempt at another side effect of the tenant's tool named first, whichever
way the row is written; attempts at one side effect share it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from ledgerdash.ledger import moves, provider_ids, recording
from ledgerdash.ledger.models import Attempt, ProviderId, State, Tenant
from tests.conftest import AGENT, RECONCILER, record
from tests.live import PYTHON, ROOT

S = State


def dispatched(tenant: Tenant, key: str, **overrides: Any) -> Attempt:
    args = overrides.pop("args", {"to": "ap@example.com", "key": key})
    return recording.mark_dispatched(record(tenant, key, args=args, **overrides), actor=AGENT)


def linked_retry_of(attempt: Attempt) -> Attempt:
    """A linked retry of ``attempt`` (its key, its arguments), as the reconciler makes one under review."""
    return moves.attempt_create_linked(
        parent=attempt,
        new=moves.NewAttempt(
            tenant_id=attempt.tenant_id,
            task_id=attempt.task_id,
            tool_name=attempt.tool_name,
            idempotency_key=attempt.idempotency_key,
            args=attempt.args,
            args_hash=attempt.args_hash,
            policy_version=attempt.policy_version,
            scopes=attempt.scopes,
        ),
        actor=RECONCILER,
        reason="a retry, for review",
    )


# --- the database's rule --------------------------------------------------------------------


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """The block's statement is refused by the database's rule, and by nothing else."""
    with pytest.raises(IntegrityError) as caught:
        yield
    assert provider_ids.refused(caught.value), caught.value


@pytest.mark.django_db
def test_the_database_refuses_a_second_side_effect_naming_a_provider_id(tenant_a: Tenant) -> None:
    first = dispatched(tenant_a, "k-first")
    second = dispatched(tenant_a, "k-second")
    Attempt.objects.filter(pk=first.pk).update(provider_request_id="req-shared")

    with refused(), transaction.atomic():
        Attempt.objects.filter(pk=second.pk).update(provider_request_id="req-shared")
    with refused(), transaction.atomic(), connection.cursor() as sql:
        sql.execute("UPDATE ledger_attempt SET provider_request_id = %s WHERE id = %s", ["req-shared", second.pk])
    with refused(), transaction.atomic():
        # A row inserted with the id, as a copy of another side effect's attempt would be.
        Attempt.objects.create(
            **{f.attname: getattr(second, f.attname) for f in Attempt._meta.concrete_fields if f.attname != "id"}
            | {"idempotency_key": "k-third", "provider_request_id": "req-shared"}
        )

    assert Attempt.objects.get(pk=second.pk).provider_request_id == ""
    held = ProviderId.objects.get(tenant=tenant_a, tool_name="send_email", provider_request_id="req-shared")
    assert (held.idempotency_key, held.attempt_id) == ("k-first", first.pk)


@pytest.mark.django_db
def test_attempts_at_one_side_effect_share_an_id_and_other_tools_and_tenants_have_their_own(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    original = dispatched(tenant_a, "k-1")
    Attempt.objects.filter(pk=original.pk).update(provider_request_id="req-1")
    retry = linked_retry_of(original)

    Attempt.objects.filter(pk=retry.pk).update(provider_request_id="req-1")  # a replayed key's answer
    other_tool = dispatched(tenant_a, "k-2", tool_name="open_ticket")
    Attempt.objects.filter(pk=other_tool.pk).update(provider_request_id="req-1")
    other_tenant = dispatched(tenant_b, "k-3")
    Attempt.objects.filter(pk=other_tenant.pk).update(provider_request_id="req-1")

    assert Attempt.objects.filter(provider_request_id="req-1").count() == 4
    assert ProviderId.objects.filter(provider_request_id="req-1").count() == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_transactions_naming_one_id_under_two_keys_at_once_one_is_refused(tenant_a: Tenant) -> None:
    """The first holds its id uncommitted while the second names it: the
    second waits for the first's commit, then is refused. A rule read
    before writing would let both through, each seeing the other not yet."""
    first = dispatched(tenant_a, "k-first")
    second = dispatched(tenant_a, "k-second")
    written = threading.Event()
    outcome: dict[str, Any] = {}

    def hold_then_commit() -> None:
        try:
            with transaction.atomic():
                Attempt.objects.filter(pk=first.pk).update(provider_request_id="req-race")
                written.set()
                time.sleep(0.5)
        finally:
            connection.close()

    def name_it_meanwhile() -> None:
        try:
            written.wait(5)
            started = time.monotonic()
            try:
                with transaction.atomic():
                    Attempt.objects.filter(pk=second.pk).update(provider_request_id="req-race")
            except IntegrityError as exc:
                outcome["refused"] = provider_ids.refused(exc)
            outcome["waited"] = time.monotonic() - started
        finally:
            connection.close()

    threads = [threading.Thread(target=hold_then_commit), threading.Thread(target=name_it_meanwhile)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert outcome.get("refused") is True
    assert outcome["waited"] > 0.3  # it waited on the first transaction, then read its row
    assert list(Attempt.objects.filter(provider_request_id="req-race").values_list("pk", flat=True)) == [first.pk]


# --- the migration ----------------------------------------------------------------------------

#: Three side effects confirmed before the rule: two name one SMS.
BEFORE_THE_RULE = """
import json
from ledgerdash.ledger import recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Tenant
from ledgerdash.ledger.policies import policy_publish

tenant = Tenant.objects.create(slug="acme", name="Acme")
policy_publish(tenant=tenant, tools={"sms": []}, actor=Actor.system("setup"), note="sms")
agent, made = Actor.agent("setup"), {}
for key, sid in (("first", "SM-shared"), ("second", "SM-shared"), ("third", "SM-own")):
    attempt = recording.record_intent(
        tenant=tenant, task_id="t", tool_name="sms", idempotency_key=key, args={"key": key}, actor=agent
    ).attempt
    attempt = recording.mark_dispatched(attempt, actor=agent)
    made[key] = recording.confirm(attempt, provider_request_id=sid, actor=agent).pk
print(json.dumps(made))
"""
AFTER_THE_RULE = """
import json
from ledgerdash.ledger.models import ProviderId

rows = {p.provider_request_id: [p.idempotency_key, p.attempt_id] for p in ProviderId.objects.all()}
print(json.dumps({"rows": rows}))
"""


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _migration_over_existing_rows(env: dict[str, str]) -> None:
    _manage(env, "migrate", "-v0", "ledger", "0026")
    made = json.loads(_manage(env, "shell", "-c", BEFORE_THE_RULE).strip().splitlines()[-1])

    said = _manage(env, "migrate", "ledger", "0027")

    assert (
        f"attempt #{made['second']} (tenant 1, key 'second') names provider request 'SM-shared' of sms, which "
        f"attempt #{made['first']} (key 'first') named first: left as it is" in said
    )
    assert f"#{made['third']}" not in said
    after = json.loads(_manage(env, "shell", "-c", AFTER_THE_RULE).strip().splitlines()[-1])
    assert after["rows"] == {"SM-shared": ["first", made["first"]], "SM-own": ["third", made["third"]]}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="the SQLite run")
def test_the_migration_gives_each_id_to_its_first_attempt_and_lists_the_pairs_already_there(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path), "DATABASE_URL": ""})
    _migration_over_existing_rows(env)


@pytest.mark.slow
@pytest.mark.postgres
def test_on_postgresql_the_migration_gives_each_id_to_its_first_attempt_and_lists_the_pairs(tmp_path: Path) -> None:
    url = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    name = f"ledgerdash_provider_ids_{os.getpid()}"
    with psycopg.connect(urllib.parse.urlunsplit(url._replace(path="/postgres")), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(
            {
                "DEBUG": "true",
                "LEDGERDASH_VAR_DIR": str(tmp_path),
                "DATABASE_URL": urllib.parse.urlunsplit(url._replace(path=f"/{name}")),
            }
        )
        _migration_over_existing_rows(env)
    finally:
        with psycopg.connect(urllib.parse.urlunsplit(url._replace(path="/postgres")), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

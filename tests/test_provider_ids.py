"""A provider's id is the outcome of one side effect.

The database refuses an attempt naming a provider request id that an
attempt at another side effect of the tenant's tool named first, whichever
way the row is written; every move that records an id meets a named error
for it; a dispatcher's report carrying one is kept as evidence with an
incident naming both attempts; and the reconciler takes no lookup result
naming one for the call it looks for.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from ledgerdash.ledger import moves, provider_ids, recording
from ledgerdash.ledger.drill.processes import ReplicaControl, replica_service
from ledgerdash.ledger.errors import RequestIdTaken
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, Incident, ProviderId, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers import registry
from ledgerdash.ledger.providers.presets import PRESETS
from ledgerdash.ledger.reconciler import Reconciler
from tests.api_support import Api, issue_token
from tests.conftest import AGENT, RECONCILER, TOOLS_V1, record, together
from tests.live import PYTHON, ROOT
from tests.replicas import config_for, provider_secrets
from tests.sandboxes import Sandbox, unique_key

__all__ = ["provider_secrets"]

S = State


def dispatched(tenant: Tenant, key: str, **overrides: Any) -> Attempt:
    args = overrides.pop("args", {"to": "ap@example.com", "key": key})
    return recording.mark_dispatched(record(tenant, key, args=args, **overrides), actor=AGENT)


def confirmed(tenant: Tenant, key: str, request_id: str, **overrides: Any) -> Attempt:
    return recording.confirm(dispatched(tenant, key, **overrides), provider_request_id=request_id, actor=AGENT)


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


def under_review(tenant: Tenant, key: str) -> Attempt:
    attempt = recording.mark_unknown(dispatched(tenant, key), reason="timeout", actor=AGENT)
    return moves.attempt_escalate(attempt=attempt, actor=RECONCILER, fence=attempt.fence, reason="a person decides")


# --- the database's rule --------------------------------------------------------------------


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """The block's statement is refused by the database's rule, and by nothing else."""
    with pytest.raises(IntegrityError) as caught:
        yield
    assert provider_ids.refused(caught.value), caught.value


#: The triggers SQLite keeps on the ledger's tables. Django makes a SQLite table again to add a
#: column that is not null, and the table's triggers go with the old one: a migration that does
#: must make them again.
SQLITE_TRIGGERS = {
    "ledger_attempt": {"ledger_attempt_provider_id_inserted", "ledger_attempt_provider_id_changed"},
    "ledger_attemptevent": {"ledger_attemptevent_no_update", "ledger_attemptevent_no_delete"},
    "ledger_tenant": {"ledger_tenant_stripes_fixed"},
}


def _sqlite_triggers(cursor: Any) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, table in cursor.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        found.setdefault(table, set()).add(name)
    return found


@pytest.mark.django_db
def test_every_trigger_survives_the_migrations_on_sqlite() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite makes a table again to change it; PostgreSQL alters it in place")
    with connection.cursor() as cursor:
        assert _sqlite_triggers(cursor) == SQLITE_TRIGGERS


@pytest.mark.slow
def test_migrating_back_past_a_made_again_table_keeps_its_triggers(tmp_path: Path) -> None:
    database = tmp_path / "ledger.sqlite3"
    env = {**os.environ, "DEBUG": "true", "DATABASE_URL": f"sqlite:///{database}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    for target in ("0030", "0029", "0028"):
        done = subprocess.run(
            [PYTHON, "manage.py", "migrate", "ledger", target, "--no-input", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        with sqlite3.connect(database) as db:
            assert _sqlite_triggers(db.cursor())["ledger_attempt"] == SQLITE_TRIGGERS["ledger_attempt"], target


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


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_agents_recording_one_id_under_two_keys_at_once_exactly_one_wins(tenant_a: Tenant) -> None:
    pairs = [(dispatched(tenant_a, f"k-{n}-a"), dispatched(tenant_a, f"k-{n}-b")) for n in range(10)]
    won: list[int] = []
    refused: list[RequestIdTaken] = []
    others: list[BaseException] = []
    lock = threading.Lock()

    def agent(attempt: Attempt) -> None:
        n = attempt.idempotency_key.split("-")[1]
        try:
            recording.record_request_id(attempt, f"req-{n}", actor=AGENT)
            with lock:
                won.append(attempt.pk)
        except RequestIdTaken as exc:
            with lock:
                refused.append(exc)
        except BaseException as exc:
            with lock:
                others.append(exc)

    for a, b in pairs:
        together(agent, [a, b])

    assert others == []
    assert (len(won), len(refused)) == (10, 10)
    for (a, b), n in zip(pairs, range(10), strict=True):
        holders = Attempt.objects.filter(provider_request_id=f"req-{n}").values_list("pk", flat=True)
        assert len(holders) == 1
        loser = b if holders[0] == a.pk else a
        assert AttemptEvent.objects.filter(attempt=loser, kind=EventKind.REQUEST_ID_TAKEN).count() == 1


# --- every move that records an id ----------------------------------------------------------


@pytest.mark.django_db
def test_an_agents_receipt_naming_another_side_effects_id_is_kept_as_evidence_with_an_incident(
    tenant_a: Tenant,
) -> None:
    holder = confirmed(tenant_a, "k-holder", "SM-shared")
    attempt = dispatched(tenant_a, "k-other")

    with pytest.raises(RequestIdTaken) as refused:
        recording.confirm(attempt, provider_request_id="SM-shared", actor=AGENT)

    assert refused.value.holder_id == holder.pk
    assert f"attempt {holder.pk} (idempotency key 'k-holder')" in str(refused.value)
    after = Attempt.objects.get(pk=attempt.pk)
    assert (after.state, after.provider_request_id, after.fence) == (S.DISPATCHED, "", attempt.fence)
    kept = AttemptEvent.objects.get(attempt=attempt, kind=EventKind.REQUEST_ID_TAKEN)
    assert kept.details["report"] == {"outcome": "confirmed", "provider_request_id": "SM-shared"}
    assert kept.details["held_by"]["attempt_id"] == holder.pk
    incident = Incident.objects.get(attempt=attempt)
    assert incident.kind == Incident.Kind.CONTRADICTION
    assert f"#{attempt.pk}" in incident.summary
    assert f"#{holder.pk}" in incident.summary
    assert incident.details["holder_id"] == holder.pk

    # The same report again (its answer was lost): the same refusal, kept once.
    with pytest.raises(RequestIdTaken):
        recording.confirm(attempt, provider_request_id="SM-shared", fence=attempt.fence, actor=AGENT)
    # The id on its own: evidence of its own, the incident already open.
    with pytest.raises(RequestIdTaken):
        recording.record_request_id(attempt, "SM-shared", actor=AGENT)
    kinds = list(AttemptEvent.objects.filter(attempt=attempt).order_by("seq").values_list("kind", flat=True))
    assert kinds.count(EventKind.REQUEST_ID_TAKEN) == 2
    assert Incident.objects.filter(attempt=attempt).count() == 1


@pytest.mark.django_db
def test_a_late_receipt_naming_another_side_effects_id_leaves_the_review_to_a_person(tenant_a: Tenant) -> None:
    holder = confirmed(tenant_a, "k-holder", "SM-late")
    attempt = under_review(tenant_a, "k-review")

    with pytest.raises(RequestIdTaken):
        recording.confirm(attempt, provider_request_id="SM-late", fence=attempt.dispatch_fence, actor=AGENT)

    after = Attempt.objects.get(pk=attempt.pk)
    assert (after.state, after.provider_request_id) == (S.MANUAL_REVIEW, "")
    assert Incident.objects.get(attempt=attempt).details["holder_id"] == holder.pk


@pytest.mark.django_db
@pytest.mark.usefixtures("sandbox_tools")
def test_the_reconcilers_send_answered_with_another_side_effects_id_is_kept_as_evidence(
    tenant_a: Tenant, sandbox: Sandbox
) -> None:
    """The reconciler is the dispatcher when it sends again. The sandbox
    acted on A's first request, its agent was told it did not (a retryable
    refusal); the id of that effect is recorded on B. Sent again with A's
    key, the sandbox answers with that id: not A's to confirm."""
    key = unique_key("mail")
    args = {"to": "ap@example.com", "key": key}
    attempt = recording.mark_dispatched(record(tenant_a, key, args=args), actor=AGENT)
    status, effect = sandbox.perform("send_email", attempt.provider_key, args)
    assert status == 201
    attempt = recording.fail_retryable(attempt, reason="HTTP 429 from a proxy", actor=AGENT)
    holder = confirmed(tenant_a, unique_key("other"), effect["id"])
    assert attempt.next_check_at is not None

    Reconciler(label="provider-ids", clock=lambda: attempt.next_check_at + timedelta(seconds=1)).run_pass()

    attempt.refresh_from_db()
    assert (attempt.state, attempt.provider_request_id, attempt.dispatch_count) == (S.UNKNOWN, "", 2)
    kept = AttemptEvent.objects.get(attempt=attempt, kind=EventKind.REQUEST_ID_TAKEN)
    assert (kept.actor_kind, kept.details["report"]["provider_request_id"]) == ("reconciler", effect["id"])
    assert Incident.objects.get(attempt=attempt).details["holder_id"] == holder.pk
    assert f"attempt {holder.pk}" in attempt.last_note
    assert sandbox.lookup("send_email", attempt.provider_key)[1]["count"] == 1


@pytest.mark.django_db
def test_a_persons_verification_with_another_side_effects_id_is_refused_naming_its_attempt(
    tenant_a: Tenant, operator_a: Any
) -> None:
    holder = confirmed(tenant_a, "k-holder", "SM-verified")
    attempt = under_review(tenant_a, "k-review")

    with pytest.raises(RequestIdTaken, match=f"already recorded on attempt {holder.pk} "):
        moves.attempt_verify(
            attempt=attempt,
            actor=Actor.user(operator_a),
            evidence="seen in the console",
            provider_request_id="SM-verified",
        )
    after = Attempt.objects.get(pk=attempt.pk)
    assert (after.state, after.provider_request_id) == (S.MANUAL_REVIEW, "")

    # An id an attempt at the same side effect named (a linked retry's dispatcher) is the side effect's own.
    shared = under_review(tenant_a, "k-same")
    Attempt.objects.filter(pk=linked_retry_of(shared).pk).update(provider_request_id="SM-same")
    verified = moves.attempt_verify(
        attempt=shared, actor=Actor.user(operator_a), evidence="the same message", provider_request_id="SM-same"
    )
    assert (verified.state, verified.provider_request_id) == (S.OUTCOME_CONFIRMED, "SM-same")


@pytest.mark.django_db
def test_over_the_api_an_id_another_side_effect_holds_is_a_409_naming_it(tenant_a: Tenant) -> None:
    api = Api(issue_token(tenant_a))
    holder = confirmed(tenant_a, "k-holder", "SM-api")
    created = api.record("k-api")
    claimed = api.dispatch(created["id"]).json()

    for response in (
        api.post(f"/attempts/{created['id']}/request-id", {"fence": claimed["fence"], "provider_request_id": "SM-api"}),
        api.outcome(created["id"], "confirmed", claimed["fence"], provider_request_id="SM-api"),
    ):
        assert response.status_code == 409, response.content
        body = response.json()
        assert (body["code"], body["holder_id"], body["attempt_id"]) == ("request_id_taken", holder.pk, created["id"])
        assert f"attempt {holder.pk}" in body["message"]
    assert Attempt.objects.get(pk=created["id"]).state == S.DISPATCHED


# --- what the reconciler takes for the call ---------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("sandbox_tools")
def test_a_lookup_finding_another_side_effects_id_is_not_found_for_any_adapter(
    tenant_a: Tenant, sandbox: Sandbox
) -> None:
    """The generic HTTP adapter finds what the sandbox holds for the key;
    the ledger recorded that id on another side effect (its dispatcher
    said so first), so it is not taken for this call."""
    key = unique_key("charge")
    args = {"amount_cents": 500, "key": key}
    attempt = recording.mark_dispatched(record(tenant_a, key, tool_name="charge_card", args=args), actor=AGENT)
    status, effect = sandbox.perform("charge_card", attempt.provider_key, args)
    assert status == 201
    holder = confirmed(tenant_a, unique_key("other"), effect["id"], tool_name="charge_card")
    assert attempt.lands_by is not None

    Reconciler(label="provider-ids", clock=lambda: attempt.lands_by + timedelta(seconds=1)).run_pass()

    attempt.refresh_from_db()
    assert (attempt.state, attempt.provider_request_id, attempt.last_lookup) == (S.MANUAL_REVIEW, "", "not_found")
    escalated = AttemptEvent.objects.filter(attempt=attempt).order_by("seq").last()
    assert escalated is not None
    assert f"found {effect['id']}, but the ledger recorded it on attempt #{holder.pk}" in escalated.reason
    (left_out,) = escalated.details["lookup"]["left_out"]
    assert (left_out["request_id"], left_out["attempt_id"]) == (effect["id"], holder.pk)


@pytest.mark.django_db
def _twilio_sms(tenant: Tenant, url: str) -> None:
    """The tenant's ``sms`` tool: Twilio's preset against its replica at ``url``, not idempotent, a 1 s request time."""
    Tool.objects.create(
        name="sms",
        adapter=Tool.Adapter.PRESET,
        config=config_for("twilio.message", url),
        idempotent=False,
        max_request_seconds=1.0,
        dispatch_lease_seconds=1.5,
    )
    policy_publish(tenant=tenant, tools={**TOOLS_V1, "sms": []}, actor=Actor.system("tests"), note="sms")


def test_twilio_the_unsent_one_of_two_alike_messages_is_not_confirmed_with_the_others_sid(tenant_a: Tenant) -> None:
    """Two calls send the same text to the same number under two keys. B is
    sent and confirmed with its SID; A's agent dies after A's DISPATCHED
    commit, before its request leaves. Twilio has one message, B's. After
    A's lease and the lookup's lag, the reconciler's search by content finds
    that one message: the ledger recorded its SID on B, so it is not A's.
    For A it is "not found", and since an SMS is not idempotent, a person
    decides, told which message was left out and why."""
    with replica_service("twilio") as url:
        _twilio_sms(tenant_a, url)
        args = {"to": "+15550003333", "from": "+15017122661", "body": "Your code is 123456"}
        a = recording.mark_dispatched(record(tenant_a, "sms:a", tool_name="sms", args=args), actor=AGENT)

        send_b = recording.provider_tool("sms", key=lambda _: "sms:b")
        with recording.task(tenant=tenant_a, task_id="task-b"):
            message = send_b(**args)
        b = Attempt.objects.get(tenant=tenant_a, idempotency_key="sms:b")
        assert (b.state, b.provider_request_id) == (S.OUTCOME_CONFIRMED, message["sid"])
        assert [e["id"] for e in ReplicaControl(url).effects()] == [message["sid"]]

        assert a.lands_by is not None
        lag = PRESETS["twilio.message"].documented_lag_seconds
        Reconciler(label="twilio-alike", clock=lambda: a.lands_by + timedelta(seconds=lag + 1)).run_pass()

    a.refresh_from_db()
    assert (a.state, a.provider_request_id, a.last_lookup) == (S.MANUAL_REVIEW, "", "not_found"), a.last_note
    assert a.owner_id == tenant_a.default_owner_id
    escalated = AttemptEvent.objects.filter(attempt=a).order_by("seq").last()
    assert escalated is not None
    assert escalated.to_state == S.MANUAL_REVIEW
    assert f"found {message['sid']}, but the ledger recorded it on attempt #{b.pk}" in escalated.reason
    assert "sms is not idempotent" in escalated.reason
    (left_out,) = escalated.details["lookup"]["left_out"]
    assert left_out == {"request_id": message["sid"], "attempt_id": b.pk, "idempotency_key": "sms:b"}
    assert f"{message['sid']} left out" in escalated.details["lookup"]["detail"]
    assert Attempt.objects.get(pk=b.pk).provider_request_id == message["sid"]


def test_twilio_a_match_by_content_is_ambiguous_while_an_alike_call_sent_has_no_receipt_yet(
    tenant_a: Tenant,
) -> None:
    """As above, but B's dispatcher has not reported yet: B was sent and the
    provider acted, and the ledger holds no SID for B. The one message the
    search by content finds may be B's as well as A's: not evidence for A
    (and never recorded on it), so a person decides."""
    with replica_service("twilio") as url:
        _twilio_sms(tenant_a, url)
        args = {"to": "+15550004444", "from": "+15017122661", "body": "Your code is 654321"}
        a = recording.mark_dispatched(record(tenant_a, "sms:a2", tool_name="sms", args=args), actor=AGENT)
        b = recording.mark_dispatched(record(tenant_a, "sms:b2", tool_name="sms", args=args), actor=AGENT)
        adapter = registry.build_adapter(Tool.objects.get(name="sms"), tenant_id=tenant_a.pk)
        sent = adapter.dispatch(key=b.provider_key, args=args)  # B's request acts; its dispatcher has not reported
        assert a.lands_by is not None
        lag = PRESETS["twilio.message"].documented_lag_seconds
        Reconciler(label="twilio-in-flight", clock=lambda: a.lands_by + timedelta(seconds=lag + 1)).run_pass()

    a.refresh_from_db()
    assert a.provider_request_id == ""
    assert (a.state, a.last_lookup) == (S.MANUAL_REVIEW, "ambiguous"), a.last_note
    assert f"#{b.pk}" in a.last_note
    # B's receipt, when it comes, is B's.
    recording.confirm(b, provider_request_id=sent.request_id, actor=AGENT)
    assert Attempt.objects.get(pk=b.pk).provider_request_id == sent.request_id


# --- the migration ----------------------------------------------------------------------------

#: Three side effects confirmed before the rule: two name one SMS.
#: Rows as the schema before the rule had them: written through that migration's own models,
#: not today's (a later column would not be in its table yet).
BEFORE_THE_RULE = """
import json
from django.db import connection
from django.db.migrations.loader import MigrationLoader

state = MigrationLoader(connection).project_state(("ledger", "0027_approval_binding_and_retries_not_sent"))
Tenant, Attempt = state.apps.get_model("ledger", "Tenant"), state.apps.get_model("ledger", "Attempt")
tenant = Tenant.objects.create(slug="acme", name="Acme")
made = {}
for n, (key, sid) in enumerate((("first", "SM-shared"), ("second", "SM-shared"), ("third", "SM-own"))):
    made[key] = Attempt.objects.create(
        tenant=tenant, task_id="t", tool_name="sms", idempotency_key=key, provider_key=key, args={"key": key},
        args_hash=f"{n:064x}", state="OUTCOME_CONFIRMED", policy_version=1, provider_request_id=sid,
    ).pk
print(json.dumps(made))
"""
AFTER_THE_RULE = """
import json
from ledgerdash.ledger import recording
from ledgerdash.ledger.errors import RequestIdTaken
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ProviderId, Tenant
from ledgerdash.ledger.policies import policy_publish

agent = Actor.agent("setup")
policy_publish(tenant=Tenant.objects.get(slug="acme"), tools={"sms": []}, actor=Actor.system("setup"), note="sms")
attempt = recording.record_intent(
    tenant="acme", task_id="t", tool_name="sms", idempotency_key="fourth", args={"key": "fourth"}, actor=agent
).attempt
try:
    recording.confirm(recording.mark_dispatched(attempt, actor=agent), provider_request_id="SM-own", actor=agent)
    refused = ""
except RequestIdTaken as exc:
    refused = str(exc)
rows = {p.provider_request_id: [p.idempotency_key, p.attempt_id] for p in ProviderId.objects.all()}
print(json.dumps({"rows": rows, "refused": refused}))
"""


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _migration_over_existing_rows(env: dict[str, str]) -> None:
    _manage(env, "migrate", "-v0", "ledger", "0027")
    made = json.loads(_manage(env, "shell", "-c", BEFORE_THE_RULE).strip().splitlines()[-1])

    said = _manage(env, "migrate", "ledger", "0028")

    assert (
        f"attempt #{made['second']} (tenant 1, key 'second') names provider request 'SM-shared' of sms, which "
        f"attempt #{made['first']} (key 'first') named first: left as it is" in said
    )
    assert f"#{made['third']}" not in said
    _manage(env, "migrate", "-v0")  # today's code, on today's schema
    after = json.loads(_manage(env, "shell", "-c", AFTER_THE_RULE).strip().splitlines()[-1])
    assert after["rows"] == {"SM-shared": ["first", made["first"]], "SM-own": ["third", made["third"]]}
    assert f"already recorded on attempt {made['third']} (idempotency key 'third')" in after["refused"]


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

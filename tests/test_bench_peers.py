"""The recording benchmark's floor (bench/peers.py ``MinimalPeer``) does the
ledger's job, only with fewer round trips: it writes the rows the ledger
writes, keeps a tenant's chain verifiable under concurrent agents, commits a
change with its event or not at all, and re-checks the authority at dispatch.
A floor that skipped any of this would flatter nobody but itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings

from bench.peers import SCOPES, STRIPES, TOOL, TOOL_CLAIMED, MinimalPeer, StripedPeer, prepare_striped, tool_args
from ledgerdash.ledger import audit, recording
from ledgerdash.ledger.drill.runner import database_url
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, AttemptEvent, State, Tenant, Tool
from ledgerdash.ledger.moves.evidence import Evidence, report_mark
from ledgerdash.ledger.policies import policy_publish
from tests.conftest import together

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LABEL = "bench-agent@host"
#: Columns that differ between two calls by design: identity, keys, and when.
PER_CALL = {"id", "idempotency_key", "provider_key", "provider_request_id", "created_at", "updated_at", "lands_by"}


def _connect(url: str) -> psycopg.Connection[Any]:
    """The peers' own connection; without prepared statements behind a
    transaction pooler, whose server sessions the peers' would not own."""
    threshold = None if settings.DATABASE_TRANSACTION_POOLER else 5
    return psycopg.connect(url, autocommit=True, prepare_threshold=threshold)


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    with _connect(database_url()) as connection:
        yield connection


def _tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.create(slug=slug, name=slug)
    policy_publish(tenant=tenant, tools={TOOL: SCOPES, TOOL_CLAIMED: SCOPES}, actor=Actor.system("test"))
    return tenant


def _tenant_without_chain(slug: str) -> Tenant:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_tenant (slug, name, is_active, created_at) VALUES (%s, %s, true, now()) RETURNING id",
            [slug, slug],
        )
        (tenant_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO ledger_policy (tenant_id, version, tools, note, created_at) VALUES (%s, 1, %s, '', now())",
            [tenant_id, json.dumps({TOOL: SCOPES})],
        )
    return Tenant.objects.get(pk=tenant_id)


def _attempt_row(attempt_id: int) -> dict[str, Any]:
    row = Attempt.objects.filter(pk=attempt_id).values().get()
    assert row["first_dispatched_at"] is not None
    row["first_dispatched_at"] = "set"
    # The confirmation kept on the row names the call's own request id: the same report, call by call.
    confirmed = report_mark(1, Evidence("confirmed", provider_request_id=row["provider_request_id"]))
    row["reports_heard"] = ["<its confirmation>" if mark == confirmed else mark for mark in row["reports_heard"]]
    return {k: v for k, v in row.items() if k not in PER_CALL}


def _event_rows(attempt_id: int, key: str, request_id: str) -> list[dict[str, Any]]:
    rows = []
    for event in AttemptEvent.objects.filter(attempt_id=attempt_id).order_by("seq"):
        details = {
            name: {key: "<key>", request_id: "<request id>"}.get(value, value) if isinstance(value, str) else value
            for name, value in event.details.items()
        }
        rows.append(
            {
                "kind": event.kind,
                "actor": (event.actor_kind, event.actor_user_id, event.actor_label),
                "move": (event.from_state, event.to_state, event.fence),
                "reason": event.reason,
                "details": details,
            }
        )
    return rows


def test_the_minimal_peer_writes_the_rows_the_ledger_writes(conn: psycopg.Connection[Any]) -> None:
    tenant = _tenant("floor")
    actor = Actor.agent(LABEL)
    recorded = recording.record_intent(
        tenant=tenant, task_id="task-1", tool_name=TOOL, idempotency_key="k-ledger", args=tool_args(7), actor=actor
    )
    dispatched = recording.mark_dispatched(recorded.attempt, actor=actor)
    recording.confirm(dispatched, provider_request_id="req-ledger", actor=actor)

    peer = MinimalPeer(conn, LABEL)
    floor_id = peer.call(
        tenant_id=tenant.pk, task_id="task-1", key="k-floor", args=tool_args(7), request_id="req-floor"
    )

    assert _attempt_row(floor_id) == _attempt_row(recorded.attempt.pk)
    assert Attempt.objects.get(pk=floor_id).state == State.OUTCOME_CONFIRMED
    assert _event_rows(floor_id, "k-floor", "req-floor") == _event_rows(recorded.attempt.pk, "k-ledger", "req-ledger")
    result = audit.verify_tenant(tenant)
    assert result.ok, result.describe()
    assert result.events == 2 + 3 + 3  # the tenant's creation and its policy, then each call's three


def test_the_minimal_peers_two_commit_path_writes_the_rows_the_ledger_writes(conn: psycopg.Connection[Any]) -> None:
    from ledgerdash.sandbox import http_adapter_config

    Tool.objects.create(
        name=TOOL_CLAIMED, config=http_adapter_config("http://127.0.0.1:9"), idempotent=True, claim_with_intent=True
    )
    tenant = _tenant("floor-two")
    actor = Actor.agent(LABEL)
    recorded = recording.record_intent(
        tenant=tenant,
        task_id="task-1",
        tool_name=TOOL_CLAIMED,
        idempotency_key="k-ledger",
        args=tool_args(7),
        actor=actor,
        claim=True,
    )
    assert recorded.claimed
    recording.confirm(recorded.attempt, provider_request_id="req-ledger", actor=actor)

    peer = MinimalPeer(conn, LABEL)
    floor_id = peer.call(
        tenant_id=tenant.pk, task_id="task-1", key="k-floor", args=tool_args(7), request_id="req-floor", claim=True
    )

    assert _attempt_row(floor_id) == _attempt_row(recorded.attempt.pk)
    assert _event_rows(floor_id, "k-floor", "req-floor") == _event_rows(recorded.attempt.pk, "k-ledger", "req-ledger")
    result = audit.verify_tenant(tenant)
    assert result.ok, result.describe()
    assert result.events == 2 + 3 + 3


def _agents_at_once(kind: type[MinimalPeer], url: str, tenant: Tenant, agents: int, calls: int) -> None:
    """``agents`` peers of ``kind``, each on a connection of its own to ``url``, making ``calls`` tool calls
    in ``tenant`` at the same time."""

    def work(index: int) -> None:
        with _connect(url) as own:
            peer = kind(own, f"agent-{index}")
            for i in range(calls):
                key = f"a{index}:{i}"
                peer.call(tenant_id=tenant.pk, task_id="t", key=key, args=tool_args(i), request_id=f"req-{key}")

    together(work, list(range(agents)))


def test_concurrent_minimal_agents_keep_one_tenants_chain_intact() -> None:
    tenant = _tenant("floor-busy")
    agents, calls = 6, 10
    _agents_at_once(MinimalPeer, database_url(), tenant, agents, calls)

    result = audit.verify_tenant(tenant)
    assert result.ok, result.describe()
    assert result.events == 2 + agents * calls * 3
    assert Attempt.objects.filter(tenant=tenant, state=State.OUTCOME_CONFIRMED).count() == agents * calls


def test_the_striped_peer_keeps_each_stripe_a_whole_chain() -> None:
    """The peer that measures what striped chains would buy: concurrent
    agents of one tenant, every call's three events in the stripe its
    attempt's id picks, each stripe numbered from 1 without a gap and linked
    from the start, its head at its last event. (Its tables are the peer's
    own, so it runs as the database's owner, as the benchmark does.)"""
    from ledgerdash.ledger import chain
    from tests.database_roles import owner_url

    tenant = _tenant("floor-striped")
    prepare_striped(owner_url(), [tenant.slug])
    agents, calls = 6, 10
    _agents_at_once(StripedPeer, owner_url(), tenant, agents, calls)

    with _connect(owner_url()) as conn:
        rows = conn.execute(
            "SELECT stripe, seq, attempt_id, content_hash, prev_hash, hash FROM bench_striped_event"
            " WHERE tenant_id = %s ORDER BY stripe, seq",
            [tenant.pk],
        ).fetchall()
        heads = {
            stripe: (seq, digest)
            for stripe, seq, digest in conn.execute(
                "SELECT stripe, seq, hash FROM bench_stripe_head WHERE tenant_id = %s", [tenant.pk]
            )
        }
    assert len(rows) == agents * calls * 3
    assert set(heads) == set(range(STRIPES))
    used = set()
    for stripe in range(STRIPES):
        prev, seq = chain.GENESIS, 0
        for row_stripe, row_seq, attempt_id, content_hash, prev_hash, this_hash in rows:
            if row_stripe != stripe:
                continue
            assert attempt_id % STRIPES == stripe
            assert (row_seq, prev_hash, this_hash) == (seq + 1, prev, chain.link(prev, content_hash))
            prev, seq = this_hash, row_seq
            used.add(stripe)
        assert heads[stripe] == (seq, prev)
    assert len(used) > 1  # the calls spread over stripes
    assert Attempt.objects.filter(tenant=tenant, state=State.OUTCOME_CONFIRMED).count() == agents * calls


def test_the_minimal_peer_writes_no_change_without_its_event(conn: psycopg.Connection[Any]) -> None:
    # Rows written behind the application's back (raw SQL, no configuration
    # event), so this tenant has no chain head to link to.
    tenant = _tenant_without_chain("no-head")

    with pytest.raises(psycopg.errors.NotNullViolation):
        MinimalPeer(conn, LABEL).record_intent(tenant_id=tenant.pk, task_id="t", key="k", args=tool_args(1))

    assert not Attempt.objects.filter(tenant=tenant).exists()
    assert not AttemptEvent.objects.filter(tenant=tenant).exists()


def test_the_minimal_peer_refuses_to_dispatch_after_the_policy_changed(conn: psycopg.Connection[Any]) -> None:
    tenant = _tenant("floor-policy")
    peer = MinimalPeer(conn, LABEL)
    attempt = peer.record_intent(tenant_id=tenant.pk, task_id="t", key="k", args=tool_args(1))
    policy_publish(tenant=tenant, tools={"open_ticket": ["tickets:write"]}, actor=Actor.system("test"))

    with pytest.raises(RuntimeError, match="authority changed"):
        peer.dispatch(attempt)

    assert Attempt.objects.get(pk=attempt["id"]).state == State.INTENT_RECORDED
    assert AttemptEvent.objects.filter(attempt_id=attempt["id"]).count() == 1
    assert audit.verify_tenant(tenant).ok


# --- the HTTP floor (bench/http_floor.py) ---------------------------------------------


def _floor_request(
    method: str, path: str, body: Any = None, *, token: str, agent: str = "billing-worker-3"
) -> tuple[str, dict[str, Any]]:
    """One request to the HTTP floor's WSGI application, as gunicorn hands it over."""
    import io

    from bench import http_floor

    data = b"" if body is None else json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "CONTENT_LENGTH": str(len(data)),
        "wsgi.input": io.BytesIO(data),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "HTTP_LEDGERDASH_AGENT": agent,
    }
    answered: list[str] = []
    chunks = http_floor.application(environ, lambda status, headers: answered.append(status))
    return answered[0], json.loads(b"".join(chunks))


@pytest.fixture
def http_floor(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from bench import http_floor as floor

    monkeypatch.setenv("DATABASE_URL", database_url())
    floor._tokens.clear()
    floor._copies.clear()
    yield
    peer = getattr(floor._local, "peer", None)
    if peer is not None:
        peer.conn.close()
        del floor._local.peer


@pytest.mark.parametrize("claim", [False, True], ids=["three requests", "two-commit path"])
def test_the_http_floor_writes_what_the_ingest_api_writes(http_floor: None, claim: bool) -> None:
    from bench.http_floor import TOKEN_PREFIX, WRITE
    from ledgerdash.ledger.models import TokenScope
    from ledgerdash.ledger.tokens import TOKEN_PREFIX as LEDGER_TOKEN_PREFIX
    from ledgerdash.sandbox import http_adapter_config
    from tests.api_support import Api, issue_token

    assert (LEDGER_TOKEN_PREFIX, TokenScope.WRITE.value) == (TOKEN_PREFIX, WRITE)
    tool = TOOL_CLAIMED if claim else TOOL
    if claim:
        Tool.objects.create(
            name=TOOL_CLAIMED, config=http_adapter_config("http://127.0.0.1:9"), idempotent=True, claim_with_intent=True
        )
    tenant = _tenant("http-floor")
    token = issue_token(tenant)
    body = {"task_id": "task-1", "tool_name": tool, "args": tool_args(7), **({"claim": True} if claim else {})}
    answers = {}
    api = Api(token)
    agent = {"Ledgerdash-Agent": "billing-worker-3"}
    recorded = api.post("/attempts", {**body, "idempotency_key": "k-ledger"}, headers=agent).json()
    if not claim:
        assert api.post(f"/attempts/{recorded['id']}/dispatch", {"fence": 0}, headers=agent).status_code == 200
    confirm = {
        "outcome": "confirmed",
        "fence": 1,
        "provider_request_id": "req-ledger",
        "result_ref": "",
        "result": None,
    }
    answers["ledger"] = api.post(f"/attempts/{recorded['id']}/outcome", confirm, headers=agent).json()

    status, floor = _floor_request("POST", "/api/v1/attempts", {**body, "idempotency_key": "k-floor"}, token=token)
    assert status.startswith("201"), floor
    assert floor["state"] == ("DISPATCHED" if claim else "INTENT_RECORDED")
    if not claim:
        status, _ = _floor_request("POST", f"/api/v1/attempts/{floor['id']}/dispatch", {"fence": 0}, token=token)
        assert status.startswith("200")
    confirm["provider_request_id"] = "req-floor"
    status, answers["floor"] = _floor_request("POST", f"/api/v1/attempts/{floor['id']}/outcome", confirm, token=token)
    assert status.startswith("200"), answers["floor"]

    assert _attempt_row(floor["id"]) == _attempt_row(recorded["id"])
    assert _event_rows(floor["id"], "k-floor", "req-floor") == _event_rows(recorded["id"], "k-ledger", "req-ledger")
    # The floor answers every field the client's Attempt reads, as the API does.
    from ledgerdash_client import Attempt as ClientAttempt

    fields = set(ClientAttempt.__dataclass_fields__) - {"data", "args", "events", "owner"}
    assert fields <= set(answers["floor"])
    same = {"state", "fence", "dispatch_fence", "result_source", "parent_id", "result", "tool_name", "args_hash"}
    assert {k: answers["floor"][k] for k in same} == {k: answers["ledger"][k] for k in same}
    result = audit.verify_tenant(tenant)
    assert result.ok, result.describe()


def test_the_http_floor_checks_the_token_and_the_tenant_and_writes_nothing_it_refuses(http_floor: None) -> None:
    from bench import http_floor as floor
    from ledgerdash.ledger.models import ApiToken
    from ledgerdash.ledger.tokens import token_revoke
    from tests.api_support import READ, issue_token

    mine, theirs = _tenant("http-floor-a"), _tenant("http-floor-b")
    token, other = issue_token(mine), issue_token(theirs)
    body = {"task_id": "t", "tool_name": TOOL, "idempotency_key": "k", "args": tool_args(1)}
    before = AttemptEvent.objects.count()
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    assert _floor_request("POST", "/api/v1/attempts", body, token=forged)[1]["code"] == "invalid_token"
    status, answer = _floor_request("POST", "/api/v1/attempts", body, token=issue_token(mine, READ))
    assert (status[:3], answer["code"]) == ("403", "insufficient_scope")
    assert AttemptEvent.objects.count() == before + 1  # the read-only token's own creation

    status, attempt = _floor_request("POST", "/api/v1/attempts", body, token=token)
    assert status.startswith("201")
    # The token's last use is written, as the ledger writes it (at most once a minute).
    assert ApiToken.objects.get(prefix=token[4:].partition("_")[0]).last_used_at is not None
    # Another tenant's token finds no such attempt (not even in the worker's copy).
    status, answer = _floor_request("POST", f"/api/v1/attempts/{attempt['id']}/dispatch", {"fence": 0}, token=other)
    assert (status[:3], answer["code"]) == ("404", "attempt_not_found")
    assert Attempt.objects.get(pk=attempt["id"]).state == State.INTENT_RECORDED
    # A repeated key and a stale fence write nothing.
    assert _floor_request("POST", "/api/v1/attempts", body, token=token)[1]["code"] == "idempotency_key_reused"
    status, answer = _floor_request("POST", f"/api/v1/attempts/{attempt['id']}/dispatch", {"fence": 3}, token=other)
    assert status.startswith("404")
    status, answer = _floor_request("POST", f"/api/v1/attempts/{attempt['id']}/dispatch", {"fence": 3}, token=token)
    assert (status[:3], answer["code"]) == ("409", "stale_fence")
    # A confirmation needs its receipt.
    assert (
        _floor_request("POST", f"/api/v1/attempts/{attempt['id']}/dispatch", {"fence": 0}, token=token)[0][:3] == "200"
    )
    confirm = {"outcome": "confirmed", "fence": 1, "provider_request_id": ""}
    status, answer = _floor_request("POST", f"/api/v1/attempts/{attempt['id']}/outcome", confirm, token=token)
    assert (status[:3], answer["code"]) == ("422", "missing_evidence")
    assert Attempt.objects.get(pk=attempt["id"]).state == State.DISPATCHED

    # A revoked token is refused once the worker's check of it is older than the ledger's cache allows.
    token_revoke(token=ApiToken.objects.get(prefix=token[4:].partition("_")[0]), actor=Actor.system("test"))
    floor._tokens.clear()  # as if LEDGER_TOKEN_CACHE_SECONDS had passed
    confirm["provider_request_id"] = "req-1"
    status, answer = _floor_request("POST", f"/api/v1/attempts/{attempt['id']}/outcome", confirm, token=token)
    assert (status[:3], answer["code"]) == ("401", "token_revoked")
    assert Attempt.objects.get(pk=attempt["id"]).state == State.DISPATCHED


def test_the_http_floor_refuses_a_tool_that_needs_an_approval(http_floor: None) -> None:
    """The floor does not judge approval conditions: where the ledger would ask a person, it writes nothing."""
    from tests.api_support import issue_token

    tenant = Tenant.objects.create(slug="http-floor-approvals", name="approvals")
    policy_publish(tenant=tenant, tools={TOOL: SCOPES}, approvals={TOOL: ""}, actor=Actor.system("test"))
    body = {"task_id": "t", "tool_name": TOOL, "idempotency_key": "k", "args": tool_args(1)}
    status, answer = _floor_request("POST", "/api/v1/attempts", body, token=issue_token(tenant))
    assert (status[:3], answer["code"]) == ("403", "tool_not_allowed")
    assert not Attempt.objects.filter(tenant=tenant).exists()

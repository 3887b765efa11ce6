"""The agents the recording benchmark runs: one tool call each, five ways.

Every agent is built in its own process by a factory ``(cfg, index) ->
Agent``; ``agent.call(i, spread)`` makes tool call ``i`` (intent ->
dispatched -> confirmed) in the shared tenant, or with ``spread`` in the
agent's own, and ``agent.release()`` closes the agent's database
connections until its next call, so that peers waiting their turn hold none.

- :func:`ledgerdash_agent`: the recording API, in process.
- :func:`http_agent`: the same steps over the ingest API, with the Python
  client (:class:`ledgerdash_client.LedgerClient`), against gunicorn.
- :func:`minimal_agent`: the floor. Hand-written SQL over psycopg 3 that
  writes the rows the ledger writes (the attempt, its three events with
  their RFC 8785 content hashes, links computed by the server under the
  tenant's chain-head lock) in three autocommitted statements per call, one
  round trip each.
- :func:`naive_agent`: raw psycopg with naive transactions: the same rows in
  three explicit transactions of six round trips each (BEGIN, the change,
  SELECT … FOR UPDATE on the chain head, the event, the head, COMMIT), the
  head locked across the client's round trips.
- :func:`dbos_agent`: DBOS Transact, one workflow with one no-op step.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

TOOL = "send_email"
#: The same tool, set to claim its dispatch with the intent (``Tool.claim_with_intent``): two commits per call.
TOOL_CLAIMED = "send_email_claimed"
SCOPES = ["email:send"]

Call = Callable[[int, bool], None]


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Agent:
    call: Call
    #: Close the agent's database connections; its next call opens them again.
    release: Callable[[], None] = _nothing
    #: Shut the agent down (before its process exits).
    stop: Callable[[], None] = _nothing


class _Connection:
    """A psycopg connection (autocommit) opened on first use and again after :meth:`release`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Any = None

    def get(self) -> Any:
        import psycopg

        if self._conn is None:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn

    def release(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def tool_args(i: int) -> dict[str, Any]:
    return {"to": "ap@example.com", "invoice": f"INV-{i}", "amount_cents": 1000 + i % 977, "body": "Your invoice."}


def _tenants(cfg: dict[str, Any], peer: str, index: int) -> tuple[str, str]:
    """The slugs of the tenant all of ``peer``'s agents share and of agent ``index``'s own."""
    slugs = cfg["tenants"][peer]
    return slugs[0], slugs[1 + index]


# --- ledgerdash, in process and over HTTP ---------------------------------------------


def ledgerdash_agent(cfg: dict[str, Any], index: int, *, peer: str = "ledgerdash", claim: bool = False) -> Agent:
    os.environ.update(cfg["env"])
    import django

    django.setup()
    from ledgerdash.ledger import recording
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant

    shared_slug, own_slug = _tenants(cfg, peer, index)
    shared, own = Tenant.objects.get(slug=shared_slug), Tenant.objects.get(slug=own_slug)
    actor = Actor.agent(f"bench-agent-{index}@{os.getpid()}")
    prefix = f"{cfg['run']}-{os.getpid()}"

    def call(i: int, spread: bool) -> None:
        recorded = recording.record_intent(
            tenant=own if spread else shared,
            task_id=f"task-{prefix}",
            tool_name=TOOL_CLAIMED if claim else TOOL,
            idempotency_key=f"{prefix}:{i}",
            args=tool_args(i),
            actor=actor,
            claim=claim,
        )
        if claim:
            assert recorded.claimed, "the tool is set to claim its dispatch with the intent"
            attempt = recorded.attempt
        else:
            attempt = recording.mark_dispatched(recorded.attempt, actor=actor)
        recording.confirm(attempt, provider_request_id=f"req-{prefix}-{i}", actor=actor)

    from django.db import connection

    return Agent(call, release=connection.close)


def ledgerdash_two_commit_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The recording API in process for a tool whose intent and claim commit together."""
    return ledgerdash_agent(cfg, index, peer="ledgerdash 2-commit", claim=True)


def http_agent(
    cfg: dict[str, Any], index: int, *, peer: str = "ledgerdash HTTP", claim: bool = False, floor: bool = False
) -> Agent:
    """The ingest API's requests with the Python client; with ``floor``, the
    same requests to the HTTP floor (bench/http_floor.py)."""
    from ledgerdash_client import LedgerClient

    shared_slug, own_slug = _tenants(cfg, peer, index)
    label = f"bench-http-{index}@{os.getpid()}"
    url = cfg["floor_url"] if floor else cfg["base_url"]
    clients = {slug: LedgerClient(url, cfg["tokens"][slug], agent=label) for slug in (shared_slug, own_slug)}
    prefix = f"{cfg['run']}-{os.getpid()}"

    def call(i: int, spread: bool) -> None:
        client = clients[own_slug if spread else shared_slug]
        recorded = client.record_intent(
            task_id=f"task-{prefix}",
            tool_name=TOOL_CLAIMED if claim else TOOL,
            idempotency_key=f"{prefix}:{i}",
            args=tool_args(i),
            claim=claim,
        )
        if claim:
            assert recorded.claimed, "the tool is set to claim its dispatch with the intent"
            attempt = recorded.attempt
        else:
            attempt = client.dispatch(recorded.attempt.id, fence=recorded.attempt.fence)
        client.confirm(attempt.id, fence=attempt.fence, provider_request_id=f"req-{prefix}-{i}")

    return Agent(call)  # it holds no database connection: gunicorn's workers do


def http_two_commit_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The ingest API with the record-and-claim request: two requests per call."""
    return http_agent(cfg, index, peer="ledgerdash HTTP 2-commit", claim=True)


def http_floor_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The client's three requests answered by the HTTP floor."""
    return http_agent(cfg, index, peer="HTTP floor", floor=True)


def http_floor_two_commit_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The client's two requests of the two-commit path answered by the HTTP floor."""
    return http_agent(cfg, index, peer="HTTP floor 2-commit", claim=True, floor=True)


# --- the floor: three statements per call ------------------------------------------------
#
# Each step is one autocommitted statement, a data-modifying CTE: the
# attempt's change (the intent's INSERT, or a compare-and-set UPDATE on
# (id, state, fence)) guarded by the tenant's current authority, then, only
# if the change happened, the tenant's chain head locked (FOR UPDATE waits
# for the latest committed head and reads it), the event's link computed
# from it by the server, the head moved and the event inserted. The change
# and its event commit together or not at all (a missing chain head makes
# the event's seq NULL and the whole statement fails), the intent commits
# before the dispatch is claimed, and the head stays locked only while the
# server executes and commits, never across a round trip.

#: The tenant is active and keeps one chain, and its current policy (checked
#: to be the version the agent recorded under) allows the tool with these
#: scopes without anyone's approval (the floor does not judge approval
#: conditions: it refuses a tool that has one, where the ledger would ask).
_AUTHORITY = """
    SELECT FROM ledger_tenant t JOIN ledger_policy p ON p.tenant_id = t.id
    WHERE t.id = %(tenant)s AND t.is_active AND t.chain_stripes = 1 AND p.version = %(version)s
      AND p.version = (SELECT max(version) FROM ledger_policy WHERE tenant_id = t.id)
      AND (p.tools -> %(tool)s) @> %(scopes)s::jsonb AND NOT p.approvals ? %(tool)s
"""


def _append(events: int = 1, *, striped: bool = False) -> str:
    """The part of the floor's statements that appends ``events`` events of
    the changed attempt: the tenant's chain head locked, each event linked
    to the one before, the head moved past the last, the events inserted.
    The first event's values are the parameters ``%(from_state)s`` and so
    on, the second's ``%(from_state2)s``. ``striped``: the chain is the
    tenant's stripe ``%(stripe)s``, in the striped peer's tables."""
    head, event = (
        ("bench_stripe_head", "bench_striped_event") if striped else ("ledger_chainhead", "ledger_attemptevent")
    )
    head_stripe = f" AND {head}.stripe = %(stripe)s" if striped else ""
    suffixes = ["", *(str(n) for n in range(2, events + 1))]
    links = [
        f"""link{n} AS (
    SELECT seq + 1 AS seq, hash AS prev_hash,
           encode(sha256(decode(hash, 'hex') || decode(%(content_hash{n})s, 'hex')), 'hex') AS hash
    FROM {previous}
)"""
        for previous, n in zip(["head", *(f"link{n}" for n in suffixes[:-1])], suffixes, strict=True)
    ]
    rows = [
        f"""SELECT %(tenant)s,{" %(stripe)s," if striped else ""} link{n}.seq, changed.id, 'transition', 'agent',
       NULL::integer, %(label)s,
       %(from_state{n})s, %(to_state{n})s, %(fence{n})s, %(reason{n})s, %(details{n})s, %(now)s,
       %(content_hash{n})s, link{n}.prev_hash, link{n}.hash
FROM changed LEFT JOIN link{n} ON true"""
        for n in suffixes
    ]
    last = f"link{suffixes[-1]}"
    union = "\nUNION ALL\n".join(rows)
    return f"""
head AS (
    SELECT seq, hash FROM {head}
    WHERE {head}.tenant_id = %(tenant)s{head_stripe} AND EXISTS (SELECT FROM changed) FOR UPDATE
), {", ".join(links)}, head_moved AS (
    UPDATE {head} SET seq = {last}.seq, hash = {last}.hash FROM {last}
    WHERE {head}.tenant_id = %(tenant)s{head_stripe}
)
INSERT INTO {event} (
    tenant_id,{" stripe," if striped else ""} seq, attempt_id, kind, actor_kind, actor_user_id, actor_label,
    from_state, to_state, fence, reason, details, created_at, content_hash, prev_hash, hash
)
{union}
RETURNING seq
"""


_APPEND = _append()

MINIMAL_INTENT = f"""
WITH changed AS (
    INSERT INTO ledger_attempt (
        id, tenant_id, task_id, tool_name, idempotency_key, provider_key, args, args_hash, state, policy_version,
        credential_scope, parent_id, owner_id, requested_by_id, approved_by_id, approved_at, fence, dispatch_fence,
        dispatch_count, first_dispatched_at, provider_request_id, result_ref, result, next_check_at, check_count,
        last_error, last_lookup, last_note, created_at, updated_at, api_token_id
    )
    SELECT %(id)s, %(tenant)s, %(task)s, %(tool)s, %(key)s, %(key)s, %(args)s, %(args_hash)s, 'INTENT_RECORDED',
           %(version)s, %(scope)s, NULL, NULL, NULL, NULL, NULL, 0, NULL, 0, NULL, '', '', NULL, %(lease)s, 0,
           '', '', 'intent recorded', %(now)s, %(now)s, %(api_token)s
    WHERE EXISTS ({_AUTHORITY})
    ON CONFLICT (tenant_id, idempotency_key) WHERE parent_id IS NULL DO NOTHING
    RETURNING id
), {_APPEND}"""

MINIMAL_DISPATCH = f"""
WITH changed AS (
    UPDATE ledger_attempt SET fence = fence + 1, state = 'DISPATCHED', updated_at = %(now)s, last_note = 'dispatched',
        dispatch_fence = fence + 1, dispatch_count = dispatch_count + 1, check_count = 0,
        next_check_at = %(now)s + make_interval(secs => %(lease_seconds)s),
        lands_by = %(now)s + make_interval(secs => %(max_request)s),
        first_dispatched_at = coalesce(first_dispatched_at, %(now)s)
    WHERE id = %(id)s AND tenant_id = %(tenant)s AND state = 'INTENT_RECORDED' AND fence = 0
      AND EXISTS ({_AUTHORITY})
    RETURNING id
), {_APPEND}"""

MINIMAL_CONFIRM = f"""
WITH changed AS (
    UPDATE ledger_attempt SET fence = fence + 1, state = 'OUTCOME_CONFIRMED', updated_at = %(now)s,
        last_note = 'outcome confirmed', provider_request_id = %(request_id)s, result_ref = '', result = NULL,
        result_source = 'tool', lands_by = %(now)s, next_check_at = NULL, reports_heard = %(heard)s
    WHERE id = %(id)s AND tenant_id = %(tenant)s AND state = 'DISPATCHED' AND fence = 1
    RETURNING id
), {_APPEND}"""

#: The intent recorded already DISPATCHED, with both events: the two-commit path.
MINIMAL_INTENT_CLAIMED = f"""
WITH changed AS (
    INSERT INTO ledger_attempt (
        id, tenant_id, task_id, tool_name, idempotency_key, provider_key, args, args_hash, state, policy_version,
        credential_scope, parent_id, owner_id, requested_by_id, approved_by_id, approved_at, fence, dispatch_fence,
        dispatch_count, first_dispatched_at, provider_request_id, result_ref, result, next_check_at, lands_by,
        check_count, last_error, last_lookup, last_note, created_at, updated_at, api_token_id
    )
    SELECT %(id)s, %(tenant)s, %(task)s, %(tool)s, %(key)s, %(key)s, %(args)s, %(args_hash)s, 'DISPATCHED',
           %(version)s, %(scope)s, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, %(now)s, '', '', NULL,
           %(now)s + make_interval(secs => %(lease_seconds)s), %(now)s + make_interval(secs => %(max_request)s),
           0, '', '', %(reason2)s, %(now)s, %(now)s, %(api_token)s
    WHERE EXISTS ({_AUTHORITY})
    ON CONFLICT (tenant_id, idempotency_key) WHERE parent_id IS NULL DO NOTHING
    RETURNING id
), {_append(2)}"""

#: Every parameter's type, written into the statements: a parameter used in
#: several places must have one type for the server to prepare the statement.
_TYPES = {
    "tenant": "bigint", "id": "bigint", "version": "integer", "fence": "bigint", "tool": "varchar",
    "task": "varchar", "key": "varchar", "args": "jsonb", "args_hash": "varchar", "scope": "varchar",
    "scopes": "jsonb", "label": "varchar", "from_state": "varchar", "to_state": "varchar", "reason": "text",
    "details": "jsonb", "content_hash": "varchar", "request_id": "varchar", "now": "timestamptz",
    "lease": "timestamptz", "lease_seconds": "float8", "max_request": "float8",
    "from_state2": "varchar", "to_state2": "varchar", "fence2": "bigint", "reason2": "text", "details2": "jsonb",
    "content_hash2": "varchar", "stripe": "smallint", "api_token": "bigint", "heard": "jsonb",
}  # fmt: skip


def _typed(sql: str) -> str:
    return re.sub(r"%\((\w+)\)s(?!::)", lambda m: f"%({m[1]})s::{_TYPES[m[1]]}", sql)


assert all(sql.endswith(_APPEND) for sql in (MINIMAL_INTENT, MINIMAL_DISPATCH, MINIMAL_CONFIRM))
#: The floor's three statements appending to the tenant's stripe of its chain (see :class:`StripedPeer`).
STRIPED_INTENT, STRIPED_DISPATCH, STRIPED_CONFIRM = (
    _typed(sql.removesuffix(_APPEND) + _append(striped=True))
    for sql in (MINIMAL_INTENT, MINIMAL_DISPATCH, MINIMAL_CONFIRM)
)
MINIMAL_INTENT, MINIMAL_DISPATCH, MINIMAL_CONFIRM, MINIMAL_INTENT_CLAIMED = (
    _typed(sql) for sql in (MINIMAL_INTENT, MINIMAL_DISPATCH, MINIMAL_CONFIRM, MINIMAL_INTENT_CLAIMED)
)

#: Attempt ids are taken from the table's sequence in blocks, one round trip per block.
ID_BLOCK = 256


def _content_hash(tenant_id: int, attempt_id: int, label: str, step: dict[str, Any], now: datetime) -> str:
    """The event's content hash, as ledgerdash.ledger.chain computes it (RFC 8785 JSON, sha256)."""
    import rfc8785

    content = {
        "tenant_id": tenant_id,
        "attempt_id": attempt_id,
        "kind": "transition",
        "actor_kind": "agent",
        "actor_user_id": None,
        "actor_label": label,
        "from_state": step["from_state"],
        "to_state": step["to_state"],
        "fence": step["fence"],
        "reason": step["reason"],
        "details": step["details"],
        "created_at": now.astimezone(UTC).isoformat(timespec="microseconds"),
    }
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


class MinimalPeer:
    """The floor's tool call on one psycopg connection in autocommit mode:
    each step one statement, so one round trip and one commit."""

    INTENT, DISPATCH, CONFIRM = MINIMAL_INTENT, MINIMAL_DISPATCH, MINIMAL_CONFIRM

    def __init__(
        self,
        conn: Any,
        label: str,
        *,
        dispatch_lease: float = 60.0,
        max_request: float = 30.0,
        intent_lease: float = 900.0,
    ) -> None:
        self.conn = conn
        self.label = label
        # The ledger's rule: the lease always exceeds the maximum request time.
        self.max_request = max_request
        self.dispatch_lease = max(dispatch_lease, max_request + max(1.0, max_request / 4))
        self.intent_lease = timedelta(seconds=intent_lease)
        self._ids: Iterator[int] = iter(())
        #: tenant id -> its policy version as last read (every statement re-checks it is still current)
        self._versions: dict[int, int] = {}

    def _next_id(self) -> int:
        for attempt_id in self._ids:
            return attempt_id
        rows = self.conn.execute(
            "SELECT nextval(pg_get_serial_sequence('ledger_attempt', 'id')) FROM generate_series(1, %s)", [ID_BLOCK]
        ).fetchall()
        self._ids = iter(int(row[0]) for row in rows)
        return next(self._ids)

    def _step(self, sql: str, params: dict[str, Any], step: dict[str, Any], refused: str) -> None:
        from psycopg.types.json import Jsonb

        now = datetime.now(UTC)
        content_hash = _content_hash(params["tenant"], params["id"], self.label, step, now)
        then = params.pop("then", None)  # a second event in the same statement
        if then is not None:
            params.update(
                from_state2=then["from_state"],
                to_state2=then["to_state"],
                fence2=then["fence"],
                reason2=then["reason"],
                details2=Jsonb(then["details"]),
                content_hash2=_content_hash(params["tenant"], params["id"], self.label, then, now),
            )
        params.update(step, details=Jsonb(step["details"]), now=now, content_hash=content_hash, label=self.label)
        if self.conn.execute(sql, params).fetchone() is None:
            raise RuntimeError(f"attempt {params['id']}: {refused}; nothing was written")

    def _base(self, attempt: dict[str, Any]) -> dict[str, Any]:
        from psycopg.types.json import Jsonb

        return {
            "tenant": attempt["tenant_id"],
            "id": attempt["id"],
            "tool": attempt.get("tool", TOOL),
            "version": attempt["policy_version"],
            "scopes": Jsonb(sorted(SCOPES)),
        }

    def record_intent(
        self,
        *,
        tenant_id: int,
        task_id: str,
        key: str,
        args: dict[str, Any],
        claim: bool = False,
        api_token: int | None = None,
    ) -> dict[str, Any]:
        """INSERT the attempt in INTENT_RECORDED with its event; returns the attempt as the next steps need it.
        With ``claim``, INSERT it DISPATCHED with both events (the intent's, then the claim's) instead.
        ``api_token``: the id of the token a request to record it came with (the HTTP floor)."""
        import rfc8785
        from psycopg.types.json import Jsonb

        if tenant_id not in self._versions:
            self._versions[tenant_id] = _policy_version(self.conn, tenant_id)
        attempt = {"id": self._next_id(), "tenant_id": tenant_id, "policy_version": self._versions[tenant_id]}
        tool = TOOL_CLAIMED if claim else TOOL
        args_hash = hashlib.sha256(rfc8785.dumps(args)).hexdigest()
        scope = " ".join(sorted(SCOPES))
        step = {
            "from_state": "",
            "to_state": "INTENT_RECORDED",
            "fence": 0,
            "reason": "intent recorded",
            "details": {
                "task_id": task_id,
                "tool_name": tool,
                "idempotency_key": key,
                "args_hash": args_hash,
                "policy_version": attempt["policy_version"],
                "credential_scope": scope,
            },
        }
        params = {
            **self._base(attempt),
            "tool": tool,
            "task": task_id,
            "key": key,
            "args": Jsonb(args),
            "args_hash": args_hash,
            "scope": scope,
            "lease": datetime.now(UTC) + self.intent_lease,
            "api_token": api_token,
        }
        sql = self.INTENT
        if claim:
            sql = MINIMAL_INTENT_CLAIMED
            claimed = self._claim_step(attempt, key, reason="dispatched (claimed with its intent)")
            claimed["details"]["claimed_with_intent"] = True
            params.update(lease_seconds=self.dispatch_lease, max_request=self.max_request, then=claimed)
        try:
            self._step(sql, params, step, "the key is recorded already, or the authority does not allow it")
        except RuntimeError:
            self._versions.pop(tenant_id, None)  # read the policy again next time
            raise
        return {**attempt, "key": key, "tool": tool, "task_id": task_id, "args_hash": args_hash}

    def _claim_step(self, attempt: dict[str, Any], key: str, *, reason: str) -> dict[str, Any]:
        return {
            "from_state": "INTENT_RECORDED",
            "to_state": "DISPATCHED",
            "fence": 1,
            "reason": reason,
            "details": {
                "provider_key": key,
                "dispatch": 1,
                "policy_version": attempt["policy_version"],
                "lease_seconds": self.dispatch_lease,
                "max_request_seconds": self.max_request,
            },
        }

    def dispatch(self, attempt: dict[str, Any]) -> None:
        """Claim the attempt (INTENT_RECORDED, fence 0) for dispatch, re-checking the authority."""
        step = self._claim_step(attempt, attempt["key"], reason="dispatched")
        params = {**self._base(attempt), "lease_seconds": self.dispatch_lease, "max_request": self.max_request}
        self._step(self.DISPATCH, params, step, "lost the claim, or the authority changed")

    def confirm(self, attempt: dict[str, Any], *, request_id: str) -> None:
        """DISPATCHED (fence 1) -> OUTCOME_CONFIRMED with the provider's request id."""
        step = {
            "from_state": "DISPATCHED",
            "to_state": "OUTCOME_CONFIRMED",
            "fence": 2,
            "reason": "outcome confirmed",
            "details": {"provider_request_id": request_id, "result_ref": ""},
        }
        import rfc8785
        from psycopg.types.json import Jsonb

        # The report the ledger keeps on the row (so the same report sent again is known as a replay):
        # the dispatch's fence and the digest of what it said.
        said = rfc8785.dumps({"outcome": "confirmed", "provider_request_id": request_id})
        heard = [f"1:{hashlib.sha256(said).hexdigest()[:24]}"]
        params = {**self._base(attempt), "request_id": request_id, "heard": Jsonb(heard)}
        self._step(self.CONFIRM, params, step, "stale fence")

    def call(
        self, *, tenant_id: int, task_id: str, key: str, args: dict[str, Any], request_id: str, claim: bool = False
    ) -> int:
        """One tool call: intent, dispatch, confirm (with ``claim``: intent and
        dispatch in one statement, then confirm); returns the attempt's id."""
        attempt = self.record_intent(tenant_id=tenant_id, task_id=task_id, key=key, args=args, claim=claim)
        if not claim:
            self.dispatch(attempt)
        self.confirm(attempt, request_id=request_id)
        return int(attempt["id"])


# --- the floor with a tenant's chain in stripes ---------------------------------------------
#
# Not the ledger's format: what one busy tenant would gain from it. Each
# tenant's events form STRIPES chains; an attempt's events all go to the
# chain its id picks, each chain with a head row of its own, so agents
# working on different attempts of one tenant wait for each other's commits
# only when their attempts share a stripe. The statements are the floor's;
# the tables are the peer's own, built like the ledger's: the event table's
# columns, checks, indexes and foreign keys, the stripe beside the tenant
# in the unique position.

STRIPES = 8
#: The striped peer's name.
STRIPED = f"minimal psycopg {STRIPES} stripes"
#: The ledger itself with each of its tenants' events kept in as many chains.
LEDGER_STRIPED = f"ledgerdash {STRIPES} stripes"

STRIPED_TABLES = """
CREATE TABLE bench_stripe_head (
    tenant_id bigint NOT NULL REFERENCES ledger_tenant (id) DEFERRABLE INITIALLY DEFERRED,
    stripe smallint NOT NULL CHECK (stripe >= 0),
    seq bigint NOT NULL CHECK (seq >= 0),
    hash varchar(64) NOT NULL,
    PRIMARY KEY (tenant_id, stripe)
);
CREATE TABLE bench_striped_event (LIKE ledger_attemptevent INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS);
ALTER TABLE bench_striped_event
    ADD COLUMN stripe smallint NOT NULL CHECK (stripe >= 0),
    ADD PRIMARY KEY (id),
    ADD UNIQUE (tenant_id, stripe, seq),
    ADD FOREIGN KEY (tenant_id) REFERENCES ledger_tenant (id) DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (attempt_id) REFERENCES ledger_attempt (id) DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (actor_user_id) REFERENCES auth_user (id) DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX ON bench_striped_event (attempt_id, seq);
CREATE INDEX ON bench_striped_event (actor_user_id);
"""


def prepare_striped(database_url: str, slugs: list[str]) -> None:
    """The striped peer's tables, and every stripe's head for these tenants (at the start of its chain)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(STRIPED_TABLES)
        conn.execute(
            "INSERT INTO bench_stripe_head (tenant_id, stripe, seq, hash)"
            " SELECT t.id, s, 0, repeat('0', 64) FROM ledger_tenant t, generate_series(0, %s) s"
            " WHERE t.slug = ANY(%s)",
            [STRIPES - 1, slugs],
        )


class StripedPeer(MinimalPeer):
    """The floor with each tenant's chain in :data:`STRIPES` stripes."""

    INTENT, DISPATCH, CONFIRM = STRIPED_INTENT, STRIPED_DISPATCH, STRIPED_CONFIRM

    def _base(self, attempt: dict[str, Any]) -> dict[str, Any]:
        return {**super()._base(attempt), "stripe": attempt["id"] % STRIPES}


def _policy_version(conn: Any, tenant_id: int) -> int:
    row = conn.execute("SELECT max(version) FROM ledger_policy WHERE tenant_id = %s", [tenant_id]).fetchone()
    if row is None or row[0] is None:
        raise RuntimeError(f"tenant {tenant_id} has no policy")
    return int(row[0])


def _tenant_ids(conn: Any, slugs: tuple[str, str]) -> tuple[int, int]:
    ids = dict(conn.execute("SELECT slug, id FROM ledger_tenant WHERE slug = ANY(%s)", [list(slugs)]).fetchall())
    return int(ids[slugs[0]]), int(ids[slugs[1]])


def minimal_agent(
    cfg: dict[str, Any],
    index: int,
    *,
    peer: str = "minimal psycopg",
    claim: bool = False,
    kind: type[MinimalPeer] = MinimalPeer,
) -> Agent:
    conn = _Connection(cfg["database_url"])
    shared, own = _tenant_ids(conn.get(), _tenants(cfg, peer, index))
    floor = kind(
        None,
        f"bench-minimal-{index}@{os.getpid()}",
        dispatch_lease=float(cfg["dispatch_lease_seconds"]),
        max_request=float(cfg["max_request_seconds"]),
        intent_lease=float(cfg["intent_lease_seconds"]),
    )
    prefix = f"{cfg['run']}-{os.getpid()}"

    def call(i: int, spread: bool) -> None:
        key = f"{prefix}:{i}"
        floor.conn = conn.get()
        floor.call(
            tenant_id=own if spread else shared,
            task_id=f"task-{prefix}",
            key=key,
            args=tool_args(i),
            request_id=f"req-{key}",
            claim=claim,
        )

    return Agent(call, release=conn.release)


def ledgerdash_striped_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The in-process agent in tenants whose events are kept in several chains."""
    return ledgerdash_agent(cfg, index, peer=LEDGER_STRIPED)


def striped_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The floor with each tenant's chain in stripes (three commits per call)."""
    return minimal_agent(cfg, index, peer=STRIPED, kind=StripedPeer)


def minimal_two_commit_agent(cfg: dict[str, Any], index: int) -> Agent:
    """The floor of the two-commit path: the intent and its claim in one statement, then the outcome."""
    return minimal_agent(cfg, index, peer="minimal psycopg 2-commit", claim=True)


# --- raw psycopg, naive transactions ----------------------------------------------------

NAIVE_INSERT_ATTEMPT = """
INSERT INTO ledger_attempt (
    tenant_id, task_id, tool_name, idempotency_key, provider_key, args, args_hash, state, policy_version,
    credential_scope, fence, dispatch_count, provider_request_id, result_ref, next_check_at, check_count,
    last_error, last_lookup, last_note, created_at, updated_at
) VALUES (%s, %s, %s, %s, %s, %s, %s, 'INTENT_RECORDED', %s, %s, 0, 0, '', '', %s, 0, '', '', 'intent recorded', %s, %s)
RETURNING id
"""
NAIVE_DISPATCH = """
UPDATE ledger_attempt SET state = 'DISPATCHED', fence = fence + 1, dispatch_fence = fence + 1,
    dispatch_count = dispatch_count + 1, check_count = 0, next_check_at = %s, first_dispatched_at = %s,
    updated_at = %s, last_note = 'dispatched'
WHERE id = %s AND state = 'INTENT_RECORDED' AND fence = 0
"""
NAIVE_CONFIRM = """
UPDATE ledger_attempt SET state = 'OUTCOME_CONFIRMED', fence = fence + 1, provider_request_id = %s,
    result_ref = '', next_check_at = NULL, updated_at = %s, last_note = 'outcome confirmed'
WHERE id = %s AND state = 'DISPATCHED' AND fence = 1
"""
NAIVE_LOCK_HEAD = "SELECT seq, hash FROM ledger_chainhead WHERE tenant_id = %s FOR UPDATE"
NAIVE_INSERT_EVENT = """
INSERT INTO ledger_attemptevent (
    tenant_id, seq, attempt_id, kind, actor_kind, actor_label, from_state, to_state, fence, reason, details,
    created_at, content_hash, prev_hash, hash
) VALUES (%s, %s, %s, 'transition', 'agent', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
NAIVE_UPDATE_HEAD = "UPDATE ledger_chainhead SET seq = %s, hash = %s WHERE tenant_id = %s"


def naive_agent(cfg: dict[str, Any], index: int) -> Agent:
    import rfc8785
    from psycopg.types.json import Jsonb

    connection = _Connection(cfg["database_url"])
    shared, own = _tenant_ids(connection.get(), _tenants(cfg, "naive psycopg", index))
    label = f"bench-naive-{index}@{os.getpid()}"
    prefix = f"{cfg['run']}-{os.getpid()}"
    versions = {tenant_id: _policy_version(connection.get(), tenant_id) for tenant_id in (shared, own)}

    def event(tenant_id: int, cur: Any, attempt_id: int, step: dict[str, Any], now: datetime) -> None:
        seq, prev = cur.execute(NAIVE_LOCK_HEAD, [tenant_id]).fetchone()
        content_hash = _content_hash(tenant_id, attempt_id, label, step, now)
        this = hashlib.sha256(bytes.fromhex(prev) + bytes.fromhex(content_hash)).hexdigest()
        cur.execute(
            NAIVE_INSERT_EVENT,
            [
                tenant_id, seq + 1, attempt_id, label, step["from_state"], step["to_state"], step["fence"],
                step["reason"], Jsonb(step["details"]), now, content_hash, prev, this,
            ],
        )  # fmt: skip
        cur.execute(NAIVE_UPDATE_HEAD, [seq + 1, this, tenant_id])

    def call(i: int, spread: bool) -> None:
        tenant_id = own if spread else shared
        key = f"{prefix}:{i}"
        args = tool_args(i)
        args_hash = hashlib.sha256(rfc8785.dumps(args)).hexdigest()
        scope = " ".join(sorted(SCOPES))
        version = versions[tenant_id]
        conn = connection.get()
        cur = conn.cursor()
        now = datetime.now(UTC)
        with conn.transaction():
            inserted = cur.execute(
                NAIVE_INSERT_ATTEMPT,
                [
                    tenant_id, f"task-{prefix}", TOOL, key, key, Jsonb(args), args_hash, version, scope,
                    now + timedelta(minutes=15), now, now,
                ],
            ).fetchone()  # fmt: skip
            assert inserted is not None
            attempt_id = int(inserted[0])
            details = {
                "task_id": f"task-{prefix}",
                "tool_name": TOOL,
                "idempotency_key": key,
                "args_hash": args_hash,
                "policy_version": version,
                "credential_scope": scope,
            }
            intent = {"from_state": "", "to_state": "INTENT_RECORDED", "fence": 0, "reason": "intent recorded"}
            event(tenant_id, cur, attempt_id, {**intent, "details": details}, now)
        now = datetime.now(UTC)
        with conn.transaction():
            cur.execute(NAIVE_DISPATCH, [now + timedelta(seconds=60), now, now, attempt_id])
            if cur.rowcount != 1:
                raise RuntimeError("lost the dispatch claim")
            dispatch = {"from_state": "INTENT_RECORDED", "to_state": "DISPATCHED", "fence": 1, "reason": "dispatched"}
            event(tenant_id, cur, attempt_id, {**dispatch, "details": {"provider_key": key, "dispatch": 1}}, now)
        now = datetime.now(UTC)
        with conn.transaction():
            cur.execute(NAIVE_CONFIRM, [f"req-{key}", now, attempt_id])
            if cur.rowcount != 1:
                raise RuntimeError("stale fence at confirm")
            confirm = {
                "from_state": "DISPATCHED",
                "to_state": "OUTCOME_CONFIRMED",
                "fence": 2,
                "reason": "outcome confirmed",
                "details": {"provider_request_id": f"req-{key}", "result_ref": ""},
            }
            event(tenant_id, cur, attempt_id, confirm, now)

    return Agent(call, release=connection.release)


# --- DBOS -------------------------------------------------------------------------------

#: Connections each DBOS process may hold in its system database's pool (its
#: default is 20): one agent runs one workflow at a time.
DBOS_POOL = 2


def dbos_agent(cfg: dict[str, Any], index: int) -> Agent:
    from dbos import DBOS

    DBOS(
        config={
            "name": "ledgerdash-bench",
            "system_database_url": cfg["dbos_url"],
            "sys_db_pool_size": DBOS_POOL,
            "executor_id": f"bench-{index}-{os.getpid()}",
            "application_version": "bench",
            "log_level": "WARNING",
            "enable_otlp": False,
        }
    )

    @DBOS.step()
    def no_op_step(i: int) -> int:
        return i

    @DBOS.workflow()
    def tool_call(i: int) -> int:
        return no_op_step(i)

    DBOS.launch()

    def call(i: int, spread: bool) -> None:
        tool_call(i)

    # DBOS keeps its pool and its LISTEN connection for as long as it runs.
    return Agent(call, stop=DBOS.destroy)


AGENTS: dict[str, Callable[[dict[str, Any], int], Agent]] = {
    "ledgerdash": ledgerdash_agent,
    "ledgerdash HTTP": http_agent,
    "HTTP floor": http_floor_agent,
    "minimal psycopg": minimal_agent,
    "ledgerdash 2-commit": ledgerdash_two_commit_agent,
    "ledgerdash HTTP 2-commit": http_two_commit_agent,
    "HTTP floor 2-commit": http_floor_two_commit_agent,
    "minimal psycopg 2-commit": minimal_two_commit_agent,
    STRIPED: striped_agent,
    LEDGER_STRIPED: ledgerdash_striped_agent,
    "naive psycopg": naive_agent,
    "DBOS": dbos_agent,
}

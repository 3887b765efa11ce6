"""Benchmark 1: what the ledger costs per tool call.

One call is intent -> dispatched -> confirmed. Three peers do it side by
side, each in its own pool of agent processes that stay up for the whole
benchmark (connections warm, nothing imported twice):

- ``ledgerdash``: the recording API agents use (``record_intent``,
  ``mark_dispatched``, ``confirm``), with everything it guarantees: the
  tenant's policy checked at intent and re-checked at dispatch, each step
  its own committed transaction with its event appended to the tenant's
  hash chain, every transition a compare-and-set on (id, state, fence).
- ``raw psycopg``: the same three transactions written by hand with
  psycopg 3 (attempt row, chain-head lock, event row with its RFC 8785
  hash, chain-head update), and nothing else: the floor on this machine.
- ``DBOS``: DBOS Transact running one workflow with one no-op step, its
  system database on the same PostgreSQL server.

Rounds interleave the peers (rotating who goes first) at 1 and at 8
concurrent agents. Each peer writes to tenants of its own, so no two peers
share a chain. At 8 agents the ledger peers run twice: all agents in one
tenant (every event queues for that tenant's chain head, the worst case)
and each agent in a tenant of its own (DBOS has no tenants: it runs once).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import multiprocessing
import os
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import Target, django_env, median, percentile, ratio, say, table

PEERS = ("ledgerdash", "raw psycopg", "DBOS")
#: (label, agents, whether each agent has a tenant of its own)
LEVELS = (("1", 1, False), ("8", 8, False), ("8, 8 tenants", 8, True))
AGENTS_MAX = 8
TOOL = "send_email"
SCOPES = ["email:send"]


def _args(i: int) -> dict[str, Any]:
    return {"to": "ap@example.com", "invoice": f"INV-{i}", "amount_cents": 1000 + i % 977, "body": "Your invoice."}


# --- the agents (each runs in its own process) -------------------------------------


def _ledgerdash_agent(cfg: dict[str, Any], index: int) -> Callable[[int, bool], None]:
    os.environ.update(cfg["env"])
    import django

    django.setup()
    from ledgerdash.ledger import recording
    from ledgerdash.ledger.models import Tenant
    from ledgerdash.ledger.transitions import Actor

    shared = Tenant.objects.get(slug=cfg["tenants"]["ledgerdash"][0])
    own = Tenant.objects.get(slug=cfg["tenants"]["ledgerdash"][1 + index])
    actor = Actor.agent(f"bench-agent-{index}@{os.getpid()}")
    prefix = f"{cfg['run']}-{os.getpid()}"

    def call(i: int, spread: bool) -> None:
        recorded = recording.record_intent(
            tenant=own if spread else shared,
            task_id=f"task-{prefix}",
            tool_name=TOOL,
            idempotency_key=f"{prefix}:{i}",
            args=_args(i),
            actor=actor,
        )
        attempt = recording.mark_dispatched(recorded.attempt, actor=actor)
        recording.confirm(attempt, provider_request_id=f"req-{prefix}-{i}", actor=actor)

    return call


RAW_INSERT_ATTEMPT = """
INSERT INTO ledger_attempt (
    tenant_id, task_id, tool_name, idempotency_key, provider_key, args, args_hash, state, policy_version,
    credential_scope, fence, dispatch_count, provider_request_id, result_ref, next_check_at, check_count,
    last_error, last_lookup, last_note, created_at, updated_at
) VALUES (%s, %s, %s, %s, %s, %s, %s, 'INTENT_RECORDED', %s, %s, 0, 0, '', '', %s, 0, '', '', 'intent recorded', %s, %s)
RETURNING id
"""
RAW_DISPATCH = """
UPDATE ledger_attempt SET state = 'DISPATCHED', fence = fence + 1, dispatch_fence = fence + 1,
    dispatch_count = dispatch_count + 1, check_count = 0, next_check_at = %s, first_dispatched_at = %s,
    updated_at = %s, last_note = 'dispatched'
WHERE id = %s AND state = 'INTENT_RECORDED' AND fence = 0
"""
RAW_CONFIRM = """
UPDATE ledger_attempt SET state = 'OUTCOME_CONFIRMED', fence = fence + 1, provider_request_id = %s,
    result_ref = '', next_check_at = NULL, updated_at = %s, last_note = 'outcome confirmed'
WHERE id = %s AND state = 'DISPATCHED' AND fence = 1
"""
RAW_LOCK_HEAD = "SELECT seq, hash FROM ledger_chainhead WHERE tenant_id = %s FOR UPDATE"
RAW_INSERT_EVENT = """
INSERT INTO ledger_attemptevent (
    tenant_id, seq, attempt_id, kind, actor_kind, actor_label, from_state, to_state, fence, reason, details,
    created_at, content_hash, prev_hash, hash
) VALUES (%s, %s, %s, 'transition', 'agent', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
RAW_UPDATE_HEAD = "UPDATE ledger_chainhead SET seq = %s, hash = %s WHERE tenant_id = %s"


def _raw_agent(cfg: dict[str, Any], index: int) -> Callable[[int, bool], None]:
    import psycopg
    import rfc8785
    from psycopg.types.json import Jsonb

    conn = psycopg.connect(cfg["database_url"], autocommit=True)
    slugs = cfg["tenants"]["raw psycopg"]
    ids: dict[str, int] = dict(
        conn.execute("SELECT slug, id FROM ledger_tenant WHERE slug = ANY(%s)", [slugs]).fetchall()
    )
    shared, own = int(ids[slugs[0]]), int(ids[slugs[1 + index]])
    label = f"bench-raw-{index}@{os.getpid()}"
    prefix = f"{cfg['run']}-{os.getpid()}"

    def event(
        tenant_id: int,
        cur: Any,
        attempt_id: int,
        from_state: str,
        to_state: str,
        fence: int,
        reason: str,
        details: dict[str, Any],
        now: datetime,
    ) -> None:
        seq, prev = cur.execute(RAW_LOCK_HEAD, [tenant_id]).fetchone()
        content: dict[str, Any] = {
            "tenant_id": tenant_id,
            "attempt_id": attempt_id,
            "kind": "transition",
            "actor_kind": "agent",
            "actor_user_id": None,
            "actor_label": label,
            "from_state": from_state,
            "to_state": to_state,
            "fence": fence,
            "reason": reason,
            "details": details,
            "created_at": now.isoformat(timespec="microseconds"),
        }
        content_hash = hashlib.sha256(rfc8785.dumps(content)).hexdigest()
        this = hashlib.sha256(bytes.fromhex(prev) + bytes.fromhex(content_hash)).hexdigest()
        cur.execute(
            RAW_INSERT_EVENT,
            [
                tenant_id,
                seq + 1,
                attempt_id,
                label,
                from_state,
                to_state,
                fence,
                reason,
                Jsonb(details),
                now,
                content_hash,
                prev,
                this,
            ],
        )
        cur.execute(RAW_UPDATE_HEAD, [seq + 1, this, tenant_id])

    def call(i: int, spread: bool) -> None:
        tenant_id = own if spread else shared
        key = f"{prefix}:{i}"
        args = _args(i)
        args_hash = hashlib.sha256(rfc8785.dumps(args)).hexdigest()
        cur = conn.cursor()
        now = datetime.now(UTC)
        with conn.transaction():
            inserted = cur.execute(
                RAW_INSERT_ATTEMPT,
                [
                    tenant_id,
                    f"task-{prefix}",
                    TOOL,
                    key,
                    key,
                    Jsonb(args),
                    args_hash,
                    1,
                    " ".join(SCOPES),
                    now + timedelta(minutes=15),
                    now,
                    now,
                ],
            ).fetchone()
            assert inserted is not None
            attempt_id = int(inserted[0])
            event(
                tenant_id,
                cur,
                attempt_id,
                "",
                "INTENT_RECORDED",
                0,
                "intent recorded",
                {"idempotency_key": key, "args_hash": args_hash},
                now,
            )
        now = datetime.now(UTC)
        with conn.transaction():
            cur.execute(RAW_DISPATCH, [now + timedelta(seconds=60), now, now, attempt_id])
            if cur.rowcount != 1:
                raise RuntimeError("lost the dispatch claim")
            event(
                tenant_id, cur, attempt_id, "INTENT_RECORDED", "DISPATCHED", 1, "dispatched", {"provider_key": key}, now
            )
        now = datetime.now(UTC)
        with conn.transaction():
            cur.execute(RAW_CONFIRM, [f"req-{key}", now, attempt_id])
            if cur.rowcount != 1:
                raise RuntimeError("stale fence at confirm")
            event(
                tenant_id,
                cur,
                attempt_id,
                "DISPATCHED",
                "OUTCOME_CONFIRMED",
                2,
                "outcome confirmed",
                {"provider_request_id": f"req-{key}"},
                now,
            )

    return call


def _dbos_agent(cfg: dict[str, Any], index: int) -> Callable[[int, bool], None]:
    from dbos import DBOS

    DBOS(
        config={
            "name": "ledgerdash-bench",
            "system_database_url": cfg["dbos_url"],
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

    return call


AGENTS: dict[str, Callable[[dict[str, Any], int], Callable[[int, bool], None]]] = {
    "ledgerdash": _ledgerdash_agent,
    "raw psycopg": _raw_agent,
    "DBOS": _dbos_agent,
}


def serve(peer: str, index: int, cfg: dict[str, Any], conn: Any) -> None:
    """An agent process: set up, warm up, then run timed bursts on command."""
    try:
        call = AGENTS[peer](cfg, index)
        counter = 0
        for n in range(cfg["warmup"]):
            call(counter, n % 2 == 0)
            counter += 1
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
        return
    conn.send(("ready", None))
    while True:
        command = conn.recv()
        if command[0] == "stop":
            break
        _, start_at, duration, spread = command
        time.sleep(max(0.0, start_at - time.time()))
        deadline = start_at + duration
        latencies: list[float] = []
        errors = 0
        while time.time() < deadline:
            began = time.perf_counter()
            try:
                call(counter, spread)
            except Exception:
                errors += 1
            latencies.append(time.perf_counter() - began)
            counter += 1
        conn.send(("done", {"latencies": latencies, "errors": errors}))
    if peer == "DBOS":
        from dbos import DBOS

        DBOS.destroy()


class Pool:
    """``size`` agent processes of one peer."""

    def __init__(self, peer: str, size: int, cfg: dict[str, Any]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.peer = peer
        self.pipes = []
        self.procs = []
        for index in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(peer, index, cfg, child), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        self.error: str | None = None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for pipe in self.pipes:
            if not pipe.poll(max(0.1, deadline - time.monotonic())):
                self.error = f"an agent process did not start within {timeout:.0f}s"
                return
            kind, detail = pipe.recv()
            if kind == "error":
                self.error = detail
                return

    def burst(self, agents: int, duration: float, spread: bool) -> dict[str, Any]:
        start_at = time.time() + 0.3
        for pipe in self.pipes[:agents]:
            pipe.send(("run", start_at, duration, spread))
        latencies: list[float] = []
        errors = 0
        for pipe in self.pipes[:agents]:
            if not pipe.poll(duration + 60):
                raise RuntimeError(f"{self.peer}: an agent did not report back")
            _, result = pipe.recv()
            latencies += result["latencies"]
            errors += result["errors"]
        return {"calls": len(latencies), "seconds": duration, "latencies": latencies, "errors": errors}

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(BrokenPipeError, OSError):
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def _prepare_tenants(run: str) -> dict[str, list[str]]:
    """Tenants for the peers that write to the ledger's tables: one shared by
    all agents, then one per agent; each with a policy and the tool."""
    from ledgerdash.ledger.models import Tenant, Tool
    from ledgerdash.ledger.policies import policy_publish
    from ledgerdash.ledger.transitions import Actor
    from ledgerdash.sandbox import http_adapter_config

    Tool.objects.get_or_create(
        name=TOOL, defaults={"config": http_adapter_config("http://127.0.0.1:9"), "idempotent": True}
    )
    slugs: dict[str, list[str]] = {}
    for peer in ("ledgerdash", "raw psycopg"):
        slugs[peer] = []
        for n in ["shared", *range(AGENTS_MAX)]:
            slug = f"bench-{peer.split()[0]}-{run}-{n}"
            tenant = Tenant.objects.create(slug=slug, name=f"bench {peer} {n}")
            # Publishing the policy records an event, which creates the tenant's chain head.
            policy_publish(tenant=tenant, tools={TOOL: SCOPES}, actor=Actor.system("bench"), note="bench")
            slugs[peer].append(slug)
    return slugs


def run(ctx: Any) -> dict[str, Any]:
    quick = ctx.quick
    rounds = 2 if quick else 4
    duration = 1.0 if quick else 3.0
    run_id = uuid.uuid4().hex[:8]
    ctx.dbs.fresh_main()
    ctx.dbs.create(ctx.dbs.dbos)
    tenants = _prepare_tenants(run_id)
    cfg = {
        "env": django_env(ctx.dbs.url_of(ctx.dbs.main)),
        "database_url": ctx.dbs.url_of(ctx.dbs.main),
        "dbos_url": ctx.dbs.url_of(ctx.dbs.dbos).replace("postgres://", "postgresql://", 1),
        "tenants": tenants,
        "run": run_id,
        "warmup": 20,
    }
    levels = ", ".join(label for label, _, _ in LEVELS)
    say(f"recording: {rounds} rounds x {len(PEERS)} peers x agents ({levels}), {duration:.0f}s each; starting agents")
    pools = {peer: Pool(peer, AGENTS_MAX, cfg) for peer in PEERS}
    for pool in pools.values():
        pool.wait_ready(180)
        if pool.error:
            say(f"  {pool.peer} could not run: {pool.error.splitlines()[0]}")
    raw: dict[tuple[str, str], list[dict[str, Any]]] = {(p, label): [] for p in PEERS for label, _, _ in LEVELS}
    try:
        for round_no in range(rounds):
            order = PEERS[round_no % len(PEERS) :] + PEERS[: round_no % len(PEERS)]
            for label, agents, spread in LEVELS:
                for peer in order:
                    if pools[peer].error or (spread and peer == "DBOS"):
                        continue
                    raw[(peer, label)].append(pools[peer].burst(agents, duration, spread))
            say(f"  round {round_no + 1}/{rounds} done")
    finally:
        for pool in pools.values():
            pool.stop()
    return _summarize(raw, pools, rounds, duration)


def _summarize(
    raw: dict[tuple[str, str], list[dict[str, Any]]], pools: dict[str, Pool], rounds: int, duration: float
) -> dict[str, Any]:
    figures: dict[str, dict[str, Any]] = {}
    for (peer, label), bursts in raw.items():
        key = f"{peer}@{label}"
        if pools[peer].error:
            figures[key] = {"peer": peer, "agents": label, "unavailable": pools[peer].error}
            continue
        if not bursts:
            continue
        latencies = [x for b in bursts for x in b["latencies"]]
        rates = [b["calls"] / b["seconds"] for b in bursts]
        figures[key] = {
            "peer": peer,
            "agents": label,
            "calls_per_s": median(rates),
            "calls_per_s_rounds": rates,
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            "calls": len(latencies),
            "errors": sum(b["errors"] for b in bursts),
        }

    def get(peer: str, label: str, what: str) -> float:
        value = figures.get(f"{peer}@{label}", {}).get(what)
        return float(value) if value is not None else math.nan

    rows: list[list[Any]] = []
    for label, _agents, spread in LEVELS:
        for peer in PEERS:
            f = figures.get(f"{peer}@{label}")
            if f is None:
                continue
            if "unavailable" in f:
                rows.append([peer, label, "unavailable", "", "", "", ""])
                continue
            # With tenants of their own, the ledger peers are compared with DBOS's 8 agents.
            versus = "8" if spread and peer == "DBOS" else label
            rows.append(
                [
                    peer,
                    label,
                    f["calls_per_s"],
                    f["p50_ms"],
                    f["p99_ms"],
                    ratio(get("ledgerdash", label, "p50_ms"), get(peer, versus, "p50_ms")),
                    ratio(get("ledgerdash", label, "calls_per_s"), get(peer, versus, "calls_per_s")),
                ]
            )
    p50_vs_raw = ratio(get("ledgerdash", "1", "p50_ms"), get("raw psycopg", "1", "p50_ms"))
    dbos_8 = get("DBOS", "8", "calls_per_s")
    targets = [
        Target("recording", "p50 at 1 agent vs raw psycopg", p50_vs_raw, 1.5, "<=", "x"),
        Target(
            "recording",
            "calls/s at 8 agents (one tenant) vs DBOS",
            ratio(get("ledgerdash", "8", "calls_per_s"), dbos_8),
            1.5,
            ">=",
            "x",
        ),
        Target(
            "recording",
            "calls/s at 8 agents (8 tenants) vs DBOS",
            ratio(get("ledgerdash", "8, 8 tenants", "calls_per_s"), dbos_8),
            1.5,
            ">=",
            "x",
        ),
    ]
    text = table(["peer", "agents", "calls/s", "p50 ms", "p99 ms", "ours/peer p50", "ours/peer calls/s"], rows)
    return {
        "rounds": rounds,
        "seconds_per_burst": duration,
        "figures": figures,
        "table": text,
        "targets": targets,
    }

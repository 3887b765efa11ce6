"""Benchmark 1: what the ledger costs per tool call.

One call is intent -> dispatched -> confirmed. The peers do it side by
side (bench/peers.py; docs/benchmarks.md describes each), each in its own pool of agent processes that stay up
for the whole benchmark (connections warm, nothing imported twice):

- ``ledgerdash``: the recording API agents use in process (``record_intent``,
  ``mark_dispatched``, ``confirm``), with everything it guarantees: the
  tenant's policy checked at intent and re-checked at dispatch, each step
  its own committed transaction with its event appended to the tenant's
  hash chain, every transition a compare-and-set on (id, state, fence).
- ``ledgerdash HTTP``: the same three steps over the ingest API with the
  Python client (one kept connection per agent), against gunicorn as a
  host serving agents is deployed (deploy/gunicorn.conf.py: 2 workers of 4
  threads each, ``GUNICORN_THREADS=4``).
- ``HTTP floor``: the least a service could do over the same transport
  (bench/http_floor.py): a minimal WSGI application under the same gunicorn
  configuration, called by the same client on its kept connection, checking
  the token against its hash and sending the minimal peer's one statement
  per step. The HTTP peers are stated against it.
- ``minimal psycopg``, the floor the in-process ratios are stated against: the same
  rows, hashes and chain links, and the same authority checks, in three
  autocommitted statements per call (one round trip each).
- ``naive psycopg``: raw psycopg with naive transactions, the same rows in
  three explicit transactions of six round trips each, the chain head
  locked across the client's round trips.
- ``DBOS``: DBOS Transact running one workflow with one no-op step, its
  system database on the same PostgreSQL server.
- ``ledgerdash 8 stripes`` and ``minimal psycopg 8 stripes``: the ledger,
  and the floor, with each tenant's events in 8 chains, at 8 agents only:
  what a busy tenant made with several chains gets.

Rounds interleave the peers (rotating who goes first) at 1 and at 8
concurrent agents. Each peer writes to tenants of its own, so no two peers
share a chain. At 8 agents the in-process ledger and the psycopg peers run
twice: all agents in one tenant (every event queues for that tenant's chain
head, the worst case) and each agent in a tenant of its own. DBOS has no
tenants and the HTTP peer runs in one tenant: they run at 8 agents once.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import (
    GUNICORN_PORT,
    HTTP_FLOOR_PORT,
    Target,
    django_env,
    median,
    percentile,
    ratio,
    say,
    start_gunicorn,
    table,
)
from bench.peers import AGENTS, LEDGER_STRIPED, SCOPES, STRIPED, STRIPES, TOOL, TOOL_CLAIMED, prepare_striped
from ledgerdash.processes import stop_group

PEERS = (
    "ledgerdash",
    "ledgerdash HTTP",
    "HTTP floor",
    "minimal psycopg",
    "ledgerdash 2-commit",
    "ledgerdash HTTP 2-commit",
    "HTTP floor 2-commit",
    "minimal psycopg 2-commit",
    STRIPED,
    LEDGER_STRIPED,
    "naive psycopg",
    "DBOS",
)
#: The peer every ratio is stated against.
FLOOR = "minimal psycopg"
#: The floor of the two-commit path (a tool whose intent and claim commit together).
FLOOR_TWO = "minimal psycopg 2-commit"
#: The floors of the HTTP peers: the same requests answered by bench/http_floor.py.
HTTP_FLOOR, HTTP_FLOOR_TWO = "HTTP floor", "HTTP floor 2-commit"
#: (label, agents, whether each agent has a tenant of its own)
LEVELS = (("1", 1, False), ("8", 8, False), ("8, 8 tenants", 8, True))
#: The levels each peer runs at (DBOS has no tenants to spread over).
RUNS_AT: dict[str, tuple[str, ...]] = {
    "ledgerdash": ("1", "8", "8, 8 tenants"),
    "ledgerdash HTTP": ("1", "8"),
    HTTP_FLOOR: ("1", "8"),
    "minimal psycopg": ("1", "8", "8, 8 tenants"),
    "ledgerdash 2-commit": ("1", "8"),
    "ledgerdash HTTP 2-commit": ("1", "8"),
    HTTP_FLOOR_TWO: ("1", "8"),
    "minimal psycopg 2-commit": ("1", "8"),
    # Only where a tenant's agents could wait for each other: what stripes would buy one busy tenant.
    STRIPED: ("8", "8, 8 tenants"),
    LEDGER_STRIPED: ("8", "8, 8 tenants"),
    "naive psycopg": ("1", "8", "8, 8 tenants"),
    "DBOS": ("1", "8"),
}
#: The peers that write to the ledger's own tables, in tenants of their own.
LEDGER_PEERS = tuple(peer for peer in PEERS if peer != "DBOS")
#: Peers whose processes keep connections and background threads while idle:
#: started for their turn in each round and stopped after it.
STARTED_PER_TURN = frozenset({"DBOS"})
HTTP_PEERS = ("ledgerdash HTTP", "ledgerdash HTTP 2-commit")
#: Every peer whose agents call a server with an API token.
TOKEN_PEERS = (*HTTP_PEERS, HTTP_FLOOR, HTTP_FLOOR_TWO)
AGENTS_MAX = 8
#: The machine's cores: calls/s per core is stated beside every rate (agents, servers and PostgreSQL share them).
CORES = os.cpu_count() or 1
#: gunicorn workers serving the HTTP peer, as ``make run`` serves, each with
#: the threads deploy/gunicorn.conf.py advises for hosts serving mostly agents.
HTTP_WORKERS = 2
HTTP_THREADS = 4


def serve(peer: str, index: int, cfg: dict[str, Any], conn: Any) -> None:
    """An agent process: set up and warm up, then on command warm up again,
    run a timed burst, or release its database connections."""
    try:
        agent = AGENTS[peer](cfg, index)
        counter = 0
        for n in range(cfg["warmup"]):
            agent.call(counter, n % 2 == 0)
            counter += 1
        agent.release()
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
        return
    conn.send(("ready", None))
    while True:
        command = conn.recv()
        if command[0] == "stop":
            break
        if command[0] == "warm":
            # Untimed calls on fresh connections: connected, statements prepared, caches full.
            for n in range(command[1]):
                agent.call(counter, n % 2 == 0)
                counter += 1
            conn.send(("warm", None))
            continue
        if command[0] == "release":
            agent.release()
            conn.send(("released", None))
            continue
        _, start_at, duration, spread = command
        time.sleep(max(0.0, start_at - time.time()))
        deadline = start_at + duration
        latencies: list[float] = []
        errors = 0
        first_error = ""
        while time.time() < deadline:
            began = time.perf_counter()
            try:
                agent.call(counter, spread)
            except Exception as exc:
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
            latencies.append(time.perf_counter() - began)
            counter += 1
        conn.send(("done", {"latencies": latencies, "errors": errors, "first_error": first_error}))
    agent.release()
    agent.stop()


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

    def _all(self, command: tuple[Any, ...], timeout: float = 120) -> None:
        for pipe in self.pipes:
            pipe.send(command)
        for pipe in self.pipes:
            if not pipe.poll(timeout):
                raise RuntimeError(f"{self.peer}: an agent did not answer {command[0]}")
            pipe.recv()

    def warm(self, calls: int) -> None:
        self._all(("warm", calls))

    def release(self) -> None:
        self._all(("release",))

    def burst(self, agents: int, duration: float, spread: bool) -> dict[str, Any]:
        start_at = time.time() + 0.3
        for pipe in self.pipes[:agents]:
            pipe.send(("run", start_at, duration, spread))
        latencies: list[float] = []
        errors = 0
        first_error = ""
        for pipe in self.pipes[:agents]:
            if not pipe.poll(duration + 60):
                raise RuntimeError(f"{self.peer}: an agent did not report back")
            _, result = pipe.recv()
            latencies += result["latencies"]
            errors += result["errors"]
            first_error = first_error or result["first_error"]
        return {
            "calls": len(latencies),
            "seconds": duration,
            "latencies": latencies,
            "errors": errors,
            "first_error": first_error,
        }

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
    all of a peer's agents, then one per agent; each with a policy and the tool."""
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant, Tool
    from ledgerdash.ledger.policies import policy_publish
    from ledgerdash.sandbox import http_adapter_config

    config = http_adapter_config("http://127.0.0.1:9")  # never reached: nothing is reconciled here
    Tool.objects.get_or_create(name=TOOL, defaults={"config": config, "idempotent": True})
    Tool.objects.get_or_create(
        name=TOOL_CLAIMED, defaults={"config": config, "idempotent": True, "claim_with_intent": True}
    )
    slugs: dict[str, list[str]] = {}
    for peer in LEDGER_PEERS:
        slugs[peer] = []
        for n in ["shared", *range(AGENTS_MAX)]:
            slug = f"bench-{peer.replace(' ', '-').lower()}-{run}-{n}"
            stripes = STRIPES if peer == LEDGER_STRIPED else 1
            tenant = Tenant.objects.create(slug=slug, name=f"bench {peer} {n}", chain_stripes=stripes)
            # Publishing the policy records an event, which creates the tenant's chain head.
            tools = {TOOL: SCOPES, TOOL_CLAIMED: SCOPES}
            policy_publish(tenant=tenant, tools=tools, actor=Actor.system("bench"), note="bench")
            slugs[peer].append(slug)
    return slugs


def _tokens(slugs: list[str]) -> dict[str, str]:
    """An API token with the write scope for each of these tenants."""
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant, TokenScope
    from ledgerdash.ledger.tokens import token_create

    tokens = {}
    for slug in slugs:
        tenant = Tenant.objects.get(slug=slug)
        _, raw = token_create(tenant=tenant, name="bench agent", scopes=[TokenScope.WRITE], actor=Actor.system("bench"))
        tokens[slug] = raw
    return tokens


def chosen_peers() -> tuple[str, ...]:
    """The peers to run: ``BENCH_RECORDING_PEERS`` (comma-separated names from
    :data:`PEERS`), default all. A subset is for profiling one change beside
    the floor; ``make bench`` runs them all."""
    given = os.environ.get("BENCH_RECORDING_PEERS", "")
    if not given.strip():
        return PEERS
    names = tuple(name.strip() for name in given.split(",") if name.strip())
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise ValueError(f"BENCH_RECORDING_PEERS names no peer {', '.join(unknown)}; the peers: {', '.join(PEERS)}")
    return tuple(peer for peer in PEERS if peer in names)


def run(ctx: Any) -> dict[str, Any]:
    from django.conf import settings

    quick = ctx.quick
    # The smoke run shows every peer runs at every level; one round does that.
    rounds = 1 if quick else 4
    duration = 1.0 if quick else 2.0
    run_id = uuid.uuid4().hex[:8]
    ctx.dbs.fresh_main()
    ctx.dbs.create(ctx.dbs.dbos)
    tenants = _prepare_tenants(run_id)
    database_url = ctx.dbs.url_of(ctx.dbs.main)
    prepare_striped(database_url, tenants[STRIPED])
    cfg = {
        "env": django_env(database_url),
        "database_url": database_url,
        "dbos_url": ctx.dbs.url_of(ctx.dbs.dbos).replace("postgres://", "postgresql://", 1),
        "tenants": tenants,
        "tokens": _tokens([slug for peer in TOKEN_PEERS if peer in tenants for slug in tenants[peer]]),
        "base_url": f"http://127.0.0.1:{GUNICORN_PORT}",
        "floor_url": f"http://127.0.0.1:{HTTP_FLOOR_PORT}",
        "dispatch_lease_seconds": settings.LEDGER_DISPATCH_LEASE_SECONDS,
        "intent_lease_seconds": settings.LEDGER_INTENT_LEASE_SECONDS,
        "max_request_seconds": settings.LEDGER_MAX_REQUEST_SECONDS,
        "run": run_id,
        "warmup": 20,
    }
    rewarm = 10
    peers = chosen_peers()
    bursts = sum(len(RUNS_AT[peer]) for peer in peers)
    say(
        f"recording: {rounds} rounds x {bursts} bursts (peers x agents), {duration:g}s each;"
        f" gunicorn with {HTTP_WORKERS} workers of {HTTP_THREADS} threads for the HTTP peer; starting agents"
    )
    server = start_gunicorn(database_url, workers=HTTP_WORKERS, threads=HTTP_THREADS)
    servers = [server]
    if HTTP_FLOOR in peers or HTTP_FLOOR_TWO in peers:
        # The HTTP floor under the same configuration, with the ledger's leases (its events state them).
        leases = {
            "LEDGER_DISPATCH_LEASE_SECONDS": str(settings.LEDGER_DISPATCH_LEASE_SECONDS),
            "LEDGER_MAX_REQUEST_SECONDS": str(settings.LEDGER_MAX_REQUEST_SECONDS),
            "LEDGER_INTENT_LEASE_SECONDS": str(settings.LEDGER_INTENT_LEASE_SECONDS),
            "LEDGER_TOKEN_CACHE_SECONDS": str(settings.LEDGER_TOKEN_CACHE_SECONDS),
        }
        try:
            servers.append(
                start_gunicorn(
                    database_url,
                    workers=HTTP_WORKERS,
                    threads=HTTP_THREADS,
                    port=HTTP_FLOOR_PORT,
                    app="bench.http_floor:application",
                    **leases,
                )
            )
        except BaseException:
            stop_group(server, timeout=20)
            raise
    no_op: list[float] = []
    pools: dict[str, Pool] = {}
    connections: list[int] = []
    raw: dict[tuple[str, str], list[dict[str, Any]]] = {(p, label): [] for p in PEERS for label in RUNS_AT[p]}
    began = time.monotonic()
    startup = math.nan

    def started(peer: str) -> Pool:
        pool = Pool(peer, AGENTS_MAX, cfg)
        pool.wait_ready(300)
        if pool.error:
            say(f"  {pool.peer} could not run: {pool.error.splitlines()[0]}")
        return pool

    try:
        pools = {peer: started(peer) for peer in peers if peer not in STARTED_PER_TURN}
        startup = time.monotonic() - began
        say(f"  {len(pools) * AGENTS_MAX} agents ready in {startup:.0f}s")
        for round_no in range(rounds):
            # Each peer in turn connects, warms up, runs its bursts and lets its
            # connections go, so that only the running peer's agents hold
            # connections; who goes first rotates. DBOS's processes cannot
            # let go of their pools and pollers: they are started for DBOS's
            # turn and stopped after it, so they never run beside another peer.
            order = peers[round_no % len(peers) :] + peers[: round_no % len(peers)]
            if any(peer in HTTP_PEERS for peer in peers):
                no_op += no_op_requests(cfg["base_url"], 100)  # while every agent is idle
            for peer in order:
                if peer in pools and pools[peer].error:
                    continue
                pool = pools[peer] = pools[peer] if peer not in STARTED_PER_TURN else started(peer)
                if pool.error:
                    continue
                ctx.dbs.analyze()
                pool.warm(rewarm)
                for label, agents, spread in LEVELS:
                    if label in RUNS_AT[peer]:
                        burst = pool.burst(agents, duration, spread)
                        burst["round"] = round_no
                        raw[(peer, label)].append(burst)
                connections.append(ctx.dbs.connections())
                pool.release()
                if peer in STARTED_PER_TURN:
                    pool.stop()
            say(f"  round {round_no + 1}/{rounds} done")
    finally:
        for pool in pools.values():
            pool.stop()
        for each in servers:
            stop_group(each, timeout=20)
    from django.db import connections as django_connections

    django_connections.close_all()
    result = _summarize(raw, pools, rounds, duration, percentile(no_op, 50) * 1000)
    result["connections_max"] = max(connections)
    result["startup_s"] = round(startup, 1)
    result["notes"] = [
        f"connections to the run's databases: at most {max(connections)} (the server allows"
        f" {ctx.dbs.server_facts()['max_connections']}): the running peer's {AGENTS_MAX} agents,"
        f" {HTTP_WORKERS} gunicorn workers (a connection for each of their threads that served) and this process;"
        " a peer's agents connect when its turn comes and"
        " disconnect after it (DBOS's processes, which keep a pool and a LISTEN connection, are started for"
        " its turn and stopped after it)"
    ]
    if math.isfinite(result["no_op_request_ms"]):
        result["notes"].append(
            f"a request that needs no database (GET /healthz on a kept connection, 100 a round while every agent"
            f" is idle): p50 {result['no_op_request_ms']:.2f} ms"
        )
    two_vs_three = result["two_commits_vs_floor_p50"]
    result["notes"].append(
        "the '/ floor' columns state the ledger over HTTP against the HTTP floor and every other peer (the HTTP"
        " floor too: what HTTP itself costs) against the minimal peer, each on its own path (the 2-commit rows"
        f" against '{HTTP_FLOOR_TWO}' and '{FLOOR_TWO}')"
        + (
            f"; the 2-commit path's p50 at 1 agent is {two_vs_three:.2f}x the 3-commit minimal peer's"
            if math.isfinite(two_vs_three)
            else ""
        )
    )
    if STRIPED in peers:
        shares = result["one_tenant_vs_8_tenants"]
        result["notes"].append(
            "calls/s of 8 agents in one tenant over the same 8 in 8 tenants: ledgerdash"
            f" {shares['ledgerdash']:.2f}x, the minimal peer {shares[FLOOR]:.2f}x, the minimal peer with"
            f" each tenant's chain in stripes {shares[STRIPED]:.2f}x"
            + (
                f", ledgerdash with each tenant's events in {STRIPES} chains {shares[LEDGER_STRIPED]:.2f}x"
                if math.isfinite(shares[LEDGER_STRIPED])
                else ""
            )
            + " (one chain-head lock per tenant is what the first two wait on; a tenant keeps one chain"
            " unless it is made with several; the target states the ledger with 8 chains in one tenant"
            " against the plain ledger over 8 tenants)"
        )
    if peers != PEERS:
        result["notes"].append(f"only these peers ran (BENCH_RECORDING_PEERS): {', '.join(peers)}")
    return result


def no_op_requests(base_url: str, count: int) -> list[float]:
    """Seconds each of ``count`` ``GET /healthz`` took, sent one after another
    on one kept connection as the Python client sends its requests (after a
    few untimed ones): what a request costs that needs no database, through
    gunicorn, Django's handler and the dashboard's middleware (a few more
    layers than an API request passes, all of them cheap for a GET without
    a session cookie)."""
    from ledgerdash_client.httpconn import Connections

    connections = Connections(base_url)
    took: list[float] = []
    try:
        for i in range(count + 10):
            began = time.perf_counter()
            answer = connections.request(
                "GET", f"{base_url}/healthz", body=None, headers={"Accept": "application/json"}, timeout=10
            )
            if answer.status != 200:
                raise RuntimeError(f"GET /healthz answered {answer.status}: {answer.body[:200]!r}")
            if i >= 10:
                took.append(time.perf_counter() - began)
    finally:
        connections.close()
    return took


def _http_target(get: Callable[[str, str, str], float], path: str, label: str) -> tuple[Target, tuple[str, str]]:
    """The HTTP path (``path``: "" or " 2-commit") against the HTTP floor, and
    the two peers it states: its p50 at 1 agent, or at ``label`` "8" the
    floor's calls/s over the ledger's in one tenant; 1.3x at most either way."""
    ours, floor = f"ledgerdash HTTP{path}", f"{HTTP_FLOOR}{path}"
    if label == "1":
        name, value = "p50 at 1 agent vs the HTTP floor", ratio(get(ours, "1", "p50_ms"), get(floor, "1", "p50_ms"))
    else:
        name = f"the HTTP floor's calls/s at {label} agents (one tenant) over the ledger's"
        value = ratio(get(floor, label, "calls_per_s"), get(ours, label, "calls_per_s"))
    target = Target("recording", f"HTTP{path}: {name}", value, 1.3, "<=", "x", detail=_http_detail(get, path, label))
    return target, (ours, floor)


def _http_detail(get: Callable[[str, str, str], float], path: str, label: str) -> str:
    """Where the HTTP path's time goes at ``label`` agents: the floor over the
    in-process floor (what HTTP itself costs), the ledger over HTTP against in process."""
    floor = ratio(get(f"{HTTP_FLOOR}{path}", label, "p50_ms"), get(FLOOR_TWO if path else FLOOR, label, "p50_ms"))
    ours = ratio(get(f"ledgerdash HTTP{path}", label, "p50_ms"), get(f"ledgerdash{path}", label, "p50_ms"))
    if math.isnan(floor) and math.isnan(ours):
        return ""
    return f"p50 over HTTP against in process: the floor {floor:.2f}x, the ledger {ours:.2f}x"


def _floor_of(peer: str) -> str:
    """The floor a peer's figures are stated against: the ledger over HTTP
    against the HTTP floor, every other peer (the HTTP floor too: what HTTP
    itself costs) against the minimal peer; each on the same path."""
    two = peer.endswith("2-commit")
    if peer.startswith("ledgerdash HTTP"):
        return HTTP_FLOOR_TWO if two else HTTP_FLOOR
    return FLOOR_TWO if two else FLOOR


def _round_ratios(
    raw: dict[tuple[str, str], list[dict[str, Any]]], ours: tuple[str, str], theirs: tuple[str, str]
) -> list[float]:
    """calls/s of ``ours`` over ``theirs``, round by round (each pair ran within seconds of each other)."""
    mine = {b["round"]: b["calls"] / b["seconds"] for b in raw.get(ours, [])}
    other = {b["round"]: b["calls"] / b["seconds"] for b in raw.get(theirs, [])}
    return [ratio(mine[r], other[r]) for r in sorted(mine) if r in other]


def _spread(values: list[float]) -> str:
    shown = ", ".join(f"{v:.2f}x" for v in values)
    return f"rounds {shown}" if values else "no rounds"


def _summarize(
    raw: dict[tuple[str, str], list[dict[str, Any]]],
    pools: dict[str, Pool],
    rounds: int,
    duration: float,
    no_op_ms: float = math.nan,
) -> dict[str, Any]:
    """The figures, the table and the targets of a run; ``no_op_ms``: the p50 of
    :func:`no_op_requests` in it (NaN when no HTTP peer ran)."""
    figures: dict[str, dict[str, Any]] = {}
    for (peer, label), bursts in raw.items():
        key = f"{peer}@{label}"
        if peer in pools and pools[peer].error:
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
            "calls_per_s_per_core": median(rates) / CORES,
            "calls_per_s_rounds": rates,
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            "calls": len(latencies),
            "errors": sum(b["errors"] for b in bursts),
            "first_error": next((b["first_error"] for b in bursts if b["first_error"]), ""),
        }

    def get(peer: str, label: str, what: str) -> float:
        value = figures.get(f"{peer}@{label}", {}).get(what)
        return float(value) if value is not None else math.nan

    rows: list[list[Any]] = []
    for label, _agents, _each_own in LEVELS:
        for peer in PEERS:
            f = figures.get(f"{peer}@{label}")
            if f is None:
                continue
            if "unavailable" in f:
                rows.append([peer, label, "unavailable", "", "", "", "", ""])
                continue
            rows.append(
                [
                    peer,
                    label,
                    f["calls_per_s"],
                    f["calls_per_s_per_core"],
                    f["p50_ms"],
                    f["p99_ms"],
                    ratio(f["p50_ms"], get(_floor_of(peer), label, "p50_ms")),
                    ratio(f["calls_per_s"], get(_floor_of(peer), label, "calls_per_s")),
                ]
            )
    vs_floor = ratio(get("ledgerdash", "1", "p50_ms"), get(FLOOR, "1", "p50_ms"))
    dbos_one = _round_ratios(raw, ("ledgerdash", "8"), ("DBOS", "8"))
    dbos_spread = _round_ratios(raw, ("ledgerdash", "8, 8 tenants"), ("DBOS", "8"))

    def dbos_detail(values: list[float]) -> str:
        met = sum(1 for v in values if v >= 1.5)
        return f"median of per-round ratios; {_spread(values)}: met in {met} of {len(values)}"

    # Each target with the peers it states: a run of some peers (BENCH_RECORDING_PEERS) states only those it measured.
    stated: list[tuple[Target, tuple[str, ...]]] = [
        (Target("recording", "p50 at 1 agent vs the minimal peer", vs_floor, 1.3, "<=", "x"), ("ledgerdash", FLOOR)),
        (
            Target(
                "recording",
                "2-commit path: p50 at 1 agent vs the minimal peer's 2-commit path",
                ratio(get("ledgerdash 2-commit", "1", "p50_ms"), get(FLOOR_TWO, "1", "p50_ms")),
                1.2,
                "<=",
                "x",
            ),
            ("ledgerdash 2-commit", FLOOR_TWO),
        ),
        (
            Target(
                "recording",
                "calls/s at 8 agents (one tenant) vs DBOS",
                median(dbos_one),
                1.5,
                ">=",
                "x",
                detail=dbos_detail(dbos_one),
            ),
            ("ledgerdash", "DBOS"),
        ),
        (
            Target(
                "recording",
                "calls/s at 8 agents (8 tenants) vs DBOS at 8",
                median(dbos_spread),
                1.5,
                ">=",
                "x",
                detail=dbos_detail(dbos_spread),
            ),
            ("ledgerdash", "DBOS"),
        ),
        *(_http_target(get, path, label) for label in ("1", "8") for path in ("", " 2-commit")),
        (
            Target(
                "recording",
                f"calls/s of 8 agents in one tenant with {STRIPES} chains vs the same 8 over 8 tenants",
                ratio(get(LEDGER_STRIPED, "8", "calls_per_s"), get("ledgerdash", "8, 8 tenants", "calls_per_s")),
                0.9,
                ">=",
                "x",
                detail="the 8 tenants keep one chain each, as tenants do unless made with more",
            ),
            (LEDGER_STRIPED, "ledgerdash"),
        ),
    ]
    ran = {peer for peer, _label in raw if raw[(peer, _label)]} | {p for p in pools if pools[p].error}
    targets = [target for target, needs in stated if all(peer in ran for peer in needs)]
    two_vs_three = ratio(get("ledgerdash 2-commit", "1", "p50_ms"), get(FLOOR, "1", "p50_ms"))
    one_tenant = {
        peer: ratio(get(peer, "8", "calls_per_s"), get(peer, "8, 8 tenants", "calls_per_s"))
        for peer in ("ledgerdash", FLOOR, STRIPED, LEDGER_STRIPED)
    }
    text = table(["peer", "agents", "calls/s", "per core", "p50 ms", "p99 ms", "p50 / floor", "calls/s / floor"], rows)
    return {
        "rounds": rounds,
        "seconds_per_burst": duration,
        "floor": FLOOR,
        "http_workers": HTTP_WORKERS,
        "http_threads": HTTP_THREADS,
        "no_op_request_ms": no_op_ms,
        "dbos_ratio_rounds": {"8": dbos_one, "8, 8 tenants": dbos_spread},
        "figures": figures,
        "table": text,
        "targets": targets,
        "two_commits_vs_floor_p50": two_vs_three,
        "one_tenant_vs_8_tenants": one_tenant,
    }

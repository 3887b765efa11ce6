"""Benchmark: what each of the store's fast paths gains (ledgerdash/ledger/store).

The same tool call (intent -> dispatched -> confirmed) by one agent, with
every fast path on and with each one switched off in turn
(``LEDGER_FAST_PATHS_OFF``), in process and over HTTP (gunicorn as
deployed, one server per setting, the Python client on a kept connection).
Rounds interleave the settings, rotating who goes first. A fast path's gain
is its call's p50 with it off over the p50 with all on, minus one, on the
path it was made for (in process, or HTTP where it works across requests);
one that gains under 5% there does not earn its place.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import Target, collect_static, django_env, median, percentile, say, start_gunicorn, table
from bench.peers import SCOPES, TOOL
from bench.recording import HTTP_THREADS, HTTP_WORKERS, Pool
from ledgerdash.processes import stop_group

#: Each fast path, and the path its gain is judged on.
TARGET_OF = {
    "one_statement": "in process",
    "id_blocks": "in process",
    "remembered_authority": "in process",
    "compiled_read": "HTTP",
    "remembered_attempt": "HTTP",
}
#: A fast path judged where another one is off: the attempt read is built once
#: for the reads a kept copy does not save (a request another worker's copy
#: would have served, a read of the attempt), so it is judged with no copies
#: kept, against no copies kept.
ALSO_OFF = {"compiled_read": ("remembered_attempt",)}
ALL_ON = "all on"
SETTINGS = (ALL_ON, *TARGET_OF)
#: The least a fast path must gain on its path to stay.
GAIN_FLOOR_PCT = 5.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _prepare(run: str) -> dict[str, dict[str, list[str]]]:
    """Two tenants (shared, own) per setting and path, each with the tool allowed."""
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant, Tool
    from ledgerdash.ledger.policies import policy_publish
    from ledgerdash.sandbox import http_adapter_config

    Tool.objects.get_or_create(
        name=TOOL, defaults={"config": http_adapter_config("http://127.0.0.1:9"), "idempotent": True}
    )
    tenants: dict[str, dict[str, list[str]]] = {}
    for index, setting in enumerate(SETTINGS):
        tenants[setting] = {}
        for peer in ("ledgerdash", "ledgerdash HTTP"):
            slugs = []
            for n in ("shared", "own"):
                slug = f"fastpaths-{run}-{index}-{'http' if 'HTTP' in peer else 'local'}-{n}"
                tenant = Tenant.objects.create(slug=slug, name=f"fast paths {setting} {peer} {n}")
                policy_publish(tenant=tenant, tools={TOOL: SCOPES}, actor=Actor.system("bench"), note="bench")
                slugs.append(slug)
            tenants[setting][peer] = slugs
    return tenants


def run(ctx: Any) -> dict[str, Any]:
    from bench.recording import _tokens

    quick = ctx.quick
    rounds = 2 if quick else 6
    duration = 0.5 if quick else 2.0
    run_id = uuid.uuid4().hex[:8]
    ctx.dbs.fresh_main()
    database_url = ctx.dbs.url_of(ctx.dbs.main)
    tenants = _prepare(run_id)
    say(f"fast paths: {rounds} rounds x {len(SETTINGS)} settings x 2 paths, {duration:g}s each; starting")
    servers: dict[str, Any] = {}
    pools: dict[tuple[str, str], Pool] = {}
    latencies: dict[tuple[str, str], list[float]] = {(s, path): [] for s in SETTINGS for path in ("in process", "HTTP")}
    off_of = {s: "" if s == ALL_ON else ",".join((s, *ALSO_OFF.get(s, ()))) for s in SETTINGS}
    ports = {setting: _free_port() for setting in SETTINGS}

    def serve(setting: str) -> Any:
        return start_gunicorn(
            database_url,
            workers=HTTP_WORKERS,
            threads=HTTP_THREADS,
            port=ports[setting],
            LEDGER_FAST_PATHS_OFF=off_of[setting],
        )

    try:
        # Every setting's server and agents start at once (untimed): one after another, starting
        # them took longer than measuring them, one core idle meanwhile.
        collect_static(database_url)  # once, before the servers need it
        with ThreadPoolExecutor(max_workers=len(SETTINGS)) as starting:
            started = {setting: starting.submit(serve, setting) for setting in SETTINGS}
            for setting, future in started.items():
                with contextlib.suppress(Exception):
                    servers[setting] = future.result()
            for future in started.values():
                future.result()  # the first server that could not start says why
        for index, setting in enumerate(SETTINGS):
            cfg = {
                "env": django_env(database_url, LEDGER_FAST_PATHS_OFF=off_of[setting]),
                "tenants": tenants[setting],
                "tokens": _tokens(tenants[setting]["ledgerdash HTTP"]),
                "base_url": f"http://127.0.0.1:{ports[setting]}",
                "run": f"{run_id}-{index}",
                "warmup": 20,
            }
            for path, peer in (("in process", "ledgerdash"), ("HTTP", "ledgerdash HTTP")):
                pools[setting, path] = Pool(peer, 1, cfg)
        for (setting, path), pool in pools.items():
            pool.wait_ready(300)
            if pool.error:
                raise RuntimeError(f"{setting}, {path}: {pool.error.splitlines()[0]}")
            pool.release()
        for round_no in range(rounds):
            order = SETTINGS[round_no % len(SETTINGS) :] + SETTINGS[: round_no % len(SETTINGS)]
            ctx.dbs.analyze()
            for setting in order:
                for path in ("in process", "HTTP"):
                    pool = pools[setting, path]
                    pool.warm(5)
                    burst = pool.burst(1, duration, False)
                    if burst["errors"]:
                        raise RuntimeError(f"{setting}, {path}: {burst['first_error']}")
                    latencies[setting, path] += burst["latencies"]
                    pool.release()
            say(f"  round {round_no + 1}/{rounds} done")
    finally:
        for pool in pools.values():
            pool.stop()
        for server in servers.values():
            with contextlib.suppress(Exception):
                stop_group(server, timeout=20)
    from django.db import connections

    connections.close_all()
    return _summarize(latencies)


def _summarize(latencies: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    p50 = {key: median(values) * 1000 for key, values in latencies.items()}
    p95 = {key: percentile(values, 95) * 1000 for key, values in latencies.items()}
    rows = [[ALL_ON, "", p50[ALL_ON, "in process"], "", p50[ALL_ON, "HTTP"], "", ""]]
    targets = []
    gains: dict[str, dict[str, float]] = {}
    for name, judged_on in TARGET_OF.items():
        against = ALSO_OFF[name][0] if name in ALSO_OFF else ALL_ON
        setting = " + ".join((name, *ALSO_OFF.get(name, ()))) + " off"
        if name in ALSO_OFF:
            setting += f" (against {against} off)"
        gain = {
            path: (p50[name, path] / p50[against, path] - 1) * 100 if p50[against, path] else float("nan")
            for path in ("in process", "HTTP")
        }
        gains[name] = gain
        verdict = "keeps its place" if gain[judged_on] >= GAIN_FLOOR_PCT else "gains too little"
        rows.append(
            [
                setting,
                judged_on,
                p50[name, "in process"],
                gain["in process"],
                p50[name, "HTTP"],
                gain["HTTP"],
                verdict,
            ]
        )
        targets.append(
            Target(
                "fastpaths",
                f"{name}: the call's p50 {judged_on} with it off over "
                + (f"{against} off" if name in ALSO_OFF else "all on")
                + ", minus one",
                gain[judged_on],
                GAIN_FLOOR_PCT,
                ">=",
                unit="%",
            )
        )
    text = table(
        ["setting", "judged on", "in process p50 ms", "gain %", "HTTP p50 ms", "gain %", "verdict"],
        rows,
    )
    return {
        "table": text,
        "targets": targets,
        "p50_ms": {f"{s} / {path}": v for (s, path), v in p50.items()},
        "p95_ms": {f"{s} / {path}": v for (s, path), v in p95.items()},
        "calls": {f"{s} / {path}": len(v) for (s, path), v in latencies.items()},
        "gain_pct": gains,
        "notes": [
            "each fast path's gain: p50 with it switched off over p50 with all on, minus one, on its path; "
            f"under {GAIN_FLOOR_PCT:g}% it does not earn its place",
            "the compiled read is judged with no attempt copies kept, against no copies kept: a copy saves the "
            "read it makes faster",
            "one agent; the settings interleaved, who goes first rotating each round",
        ],
    }

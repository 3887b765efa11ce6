"""Benchmark 2: the UNKNOWN queue page on a ledger of a million attempts.

1,000,000 attempts over 50 tenants (10,000 UNKNOWN, 2,000 MANUAL_REVIEW,
the rest terminal) are bulk-loaded with COPY. An operator who is a member of
all 50 tenants and a superuser then read the same three views through
gunicorn (2 sync workers, DEBUG off, as deployed), with wrk as the load
generator (a Python one with real HTTP if wrk cannot be had):

- first page: the dashboard's UNKNOWN queue vs the admin changelist
  filtered to state UNKNOWN;
- deep page: a keyset page 90% of the way through the queue vs the admin's
  page 90% of the way through (its OFFSET pagination);
- filtered: one tenant and the operator's own work, vs the admin with the
  same tenant and owner filters.

The admin shows 100 rows a page, the dashboard 50: each as shipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.common import (
    GUNICORN_PORT,
    ROOT,
    Target,
    django_env,
    median,
    percentile,
    ratio,
    run_manage,
    say,
    stop_group,
    table,
)
from bench.loader import ATTEMPT_COLUMNS, bulk_load, reserve_ids

TENANTS = 50
OWNERS = 5
TOOLS = ("send_email", "charge_card", "open_ticket", "deploy_service")


def attempt_rows(total: int, tenant_ids: list[int], owner_ids: list[int], first_id: int) -> Iterator[tuple[Any, ...]]:
    """``total`` attempts, tenant by tenant in turn, one every 3 seconds up
    to now. Per tenant: 1 in 100 UNKNOWN and 1 in 500 MANUAL_REVIEW (each
    owned, a fifth of them by the operator), 1 in 25 FAILED, the rest
    OUTCOME_CONFIRMED."""
    start = datetime.now(UTC) - timedelta(seconds=3 * total)
    count = len(tenant_ids)
    for i in range(total):
        j = i // count
        tenant_id = tenant_ids[i % count]
        created = start + timedelta(seconds=3 * i)
        if j % 100 == 7:
            state, owner, next_check = "UNKNOWN", owner_ids[(j // 100) % len(owner_ids)], created + timedelta(days=400)
        elif j % 500 == 13:
            state, owner, next_check = "MANUAL_REVIEW", owner_ids[(j // 500) % len(owner_ids)], None
        elif j % 25 == 3:
            state, owner, next_check = "FAILED", None, None
        else:
            state, owner, next_check = "OUTCOME_CONFIRMED", None, None
        key = f"invoice:{i}:send"
        args = f'{{"invoice": "INV-{i}", "to": "ap@example.com"}}'
        yield (
            first_id + i, tenant_id, f"task-{j // 10}", TOOLS[j % 4], key, key, args,
            hashlib.sha256(args.encode()).hexdigest(), state, 1, "email:send", 2, 1, 1,
            f"req-{i}" if state == "OUTCOME_CONFIRMED" else "", "", 0, "", "", "bulk-loaded",
            owner, next_check, created, created, created,
        )  # fmt: skip


def _prepare(ctx: Any, total: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from ledgerdash.ledger.models import Tenant
    from ledgerdash.ledger.policies import policy_publish
    from ledgerdash.ledger.transitions import Actor
    from reviews.models import Membership

    users = get_user_model()
    operator = users.objects.create_user("bench-operator", password="bench-operator-pw")  # noqa: S106
    admin = users.objects.create_superuser("bench-admin", password="bench-admin-pw")  # noqa: S106
    owners = [operator] + [users.objects.create_user(f"bench-owner-{n}") for n in range(1, OWNERS)]
    tenants = []
    for n in range(TENANTS):
        tenant = Tenant.objects.create(slug=f"t{n:02d}", name=f"Tenant {n:02d}", default_owner=operator)
        policy_publish(tenant=tenant, tools={t: ["email:send"] for t in TOOLS}, actor=Actor.system("bench"))
        Membership.objects.create(user=operator, tenant=tenant, role="operator")
        tenants.append(tenant)
    with psycopg.connect(ctx.dbs.url_of(ctx.dbs.main), autocommit=True) as conn:
        first_id = reserve_ids(conn, "ledger_attempt", total)
        rows = attempt_rows(total, [t.pk for t in tenants], [u.pk for u in owners], first_id)
        loaded = bulk_load(conn, "ledger_attempt", ATTEMPT_COLUMNS, rows)
        counts: dict[str, int] = dict(
            conn.execute("SELECT state, count(*) FROM ledger_attempt GROUP BY state").fetchall()
        )
    return {"operator": operator, "admin": admin, "tenants": tenants, "load": loaded, "counts": counts}


def _session_cookie(user: Any) -> str:
    """A logged-in session for ``user``, as the login form would leave it."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


def _pages(prepared: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The three views, for the dashboard and for the admin."""
    from ledgerdash.ledger.models import Attempt
    from reviews.queries import Cursor

    operator, tenant = prepared["operator"], prepared["tenants"][7]
    unknown = Attempt.objects.filter(state="UNKNOWN")
    total = unknown.count()
    deep_row = unknown.order_by("created_at", "id").values_list("created_at", "id")[int(total * 0.9)]
    cursor = Cursor(*deep_row)
    admin_page = max(1, int(total * 0.9) // 100)  # the admin counts pages from 1, 100 rows each
    base = "/admin/ledger/attempt/?state__exact=UNKNOWN"
    return {
        "first page": {"ours": "/queues/unknown/", "admin": base},
        "deep page": {"ours": f"/queues/unknown/?after={cursor}", "admin": f"{base}&p={admin_page}"},
        "tenant + owner": {
            "ours": f"/queues/unknown/?tenant={tenant.slug}&owner=me",
            "admin": f"{base}&tenant__id__exact={tenant.pk}&owner__id__exact={operator.pk}",
        },
    }


def _explain(prepared: dict[str, Any], pages: dict[str, dict[str, str]]) -> str:
    """EXPLAIN ANALYZE of the dashboard's keyset read for each view (one of
    its per-tenant reads), and of the admin's slowest query for each."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    lines = []
    for view, urls in pages.items():
        for who in ("ours", "admin"):
            client = Client()
            client.force_login(prepared["operator"] if who == "ours" else prepared["admin"])
            with CaptureQueriesContext(connection) as captured:
                response = client.get(urls[who])
            assert response.status_code == 200, (urls[who], response.status_code)
            queries = captured.captured_queries
            if who == "ours":
                keyset = [q["sql"] for q in queries if "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]]
                title = f"{view}, dashboard: {len(queries)} queries; the keyset read:"
                chosen = keyset[0]
            else:
                chosen = max(queries, key=lambda q: float(q["time"]))["sql"]
                title = f"{view}, admin: {len(queries)} queries; the slowest:"
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + chosen)
                plan = "\n".join(f"    {line}" for (line,) in cursor.fetchall())
            lines.append(f"-- {title}\n    {chosen[:400]}\n{plan}")
    return "\n\n".join(lines)


def _gunicorn(ctx: Any) -> subprocess.Popen[bytes]:
    env = django_env(ctx.dbs.url_of(ctx.dbs.main))
    cmd = [
        str(ROOT / ".venv" / "bin" / "gunicorn") if (ROOT / ".venv" / "bin" / "gunicorn").exists() else "gunicorn",
        "ledgerdash.wsgi:application",
        "--workers", "2", "--bind", f"127.0.0.1:{GUNICORN_PORT}", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{GUNICORN_PORT}/login/", timeout=2).close()
            return proc
        except urllib.error.HTTPError:
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("gunicorn exited before it served") from None
            time.sleep(0.2)
    stop_group(proc)
    raise RuntimeError("gunicorn did not answer within 60s")


def find_wrk() -> str | None:
    """wrk from PATH, or installed from Debian's packages when this is root."""
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    say("  installing wrk (apt-get install wrk)")
    install = ["apt-get", "install", "-y", "-qq", "wrk"]
    subprocess.run(install, capture_output=True, check=False, timeout=300)
    if not shutil.which("wrk"):  # the package lists may be stale or missing
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False, timeout=300)
        subprocess.run(install, capture_output=True, check=False, timeout=300)
    return shutil.which("wrk")


def _wrk(wrk: str, url: str, cookie: str, seconds: float, connections: int) -> dict[str, float]:
    result = subprocess.run(
        [
            wrk, "-t", "1", "-c", str(connections), "-d", f"{seconds:.0f}s", "--timeout", "10s",
            "-s", str(ROOT / "bench" / "wrk_report.lua"), "-H", f"Cookie: {cookie}", url,
        ],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    )  # fmt: skip
    line = [line for line in result.stdout.splitlines() if line.startswith("{")][-1]
    raw = json.loads(line)
    return {
        "requests": raw["requests"],
        "req_per_s": raw["requests"] / (raw["duration_us"] / 1e6),
        "errors": raw["errors"] + raw["non_2xx"],
        "p50_ms": raw["p50_us"] / 1000,
        "p95_ms": raw["p95_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
    }


def _python_load(url: str, cookie: str, seconds: float, connections: int) -> dict[str, float]:
    """The fallback load generator: ``connections`` threads, each a real HTTP
    client sending requests back to back for ``seconds``."""
    latencies: list[float] = []
    errors = [0]
    deadline = time.monotonic() + seconds
    lock = threading.Lock()

    def worker() -> None:
        while time.monotonic() < deadline:
            began = time.perf_counter()
            request = urllib.request.Request(url, headers={"Cookie": cookie})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
                    ok = response.status == 200
            except OSError:
                ok = False
            with lock:
                latencies.append(time.perf_counter() - began)
                errors[0] += 0 if ok else 1

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "requests": len(latencies),
        "req_per_s": len(latencies) / seconds,
        "errors": errors[0],
        "p50_ms": percentile(latencies, 50) * 1000,
        "p95_ms": percentile(latencies, 95) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def _settle(ctx: Any) -> None:
    """Wait until the server has finished what the previous run left in
    flight (wrk stops sending at its deadline, but an admin page takes the
    best part of a second), so no run pays for another's tail."""
    deadline = time.monotonic() + 10
    with psycopg.connect(ctx.dbs.url_of(ctx.dbs.main), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
    time.sleep(0.3)


def _check_page(url: str, cookie: str, marker: str) -> None:
    request = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read().decode()
    if response.status != 200 or marker not in body:
        raise RuntimeError(f"{url} did not answer with the expected page (status {response.status})")


def run(ctx: Any) -> dict[str, Any]:
    quick = ctx.quick
    total = 20_000 if quick else 1_000_000
    rounds = 2 if quick else 3
    seconds = 1.0 if quick else 4.0
    connections = 2  # one per gunicorn worker: latency without queueing
    ctx.dbs.fresh_main()
    say(f"queue: loading {total:,} attempts over {TENANTS} tenants with COPY")
    prepared = _prepare(ctx, total)
    say(f"  loaded: {prepared['load']}; states {prepared['counts']}")
    pages = _pages(prepared)
    cookies = {"ours": _session_cookie(prepared["operator"]), "admin": _session_cookie(prepared["admin"])}
    run_manage(["collectstatic", "--noinput", "-v", "0"], ctx.dbs.url_of(ctx.dbs.main))
    explain_text = _explain(prepared, pages)
    wrk = find_wrk()
    generator = "wrk" if wrk else "python (wrk unavailable)"
    say(f"  load generator: {generator}; {rounds} rounds x {len(pages)} views x 2, {seconds:.0f}s each")
    server = _gunicorn(ctx)
    base = f"http://127.0.0.1:{GUNICORN_PORT}"
    samples: dict[tuple[str, str], list[dict[str, float]]] = {(v, w): [] for v in pages for w in ("ours", "admin")}
    try:
        for urls in pages.values():
            _check_page(base + urls["ours"], cookies["ours"], "attempt")
            _check_page(base + urls["admin"], cookies["admin"], "result_list")
        for round_no in range(rounds):
            for view, urls in pages.items():
                order = ("ours", "admin") if round_no % 2 == 0 else ("admin", "ours")
                for who in order:
                    _settle(ctx)
                    url = base + urls[who]
                    if wrk:
                        sample = _wrk(wrk, url, cookies[who], seconds, connections)
                    else:
                        sample = _python_load(url, cookies[who], seconds, connections)
                    samples[(view, who)].append(sample)
            say(f"  round {round_no + 1}/{rounds} done")
    finally:
        stop_group(server)
    return _summarize(samples, pages, prepared, explain_text, generator, rounds, seconds)


def _summarize(
    samples: dict[tuple[str, str], list[dict[str, float]]],
    pages: dict[str, dict[str, str]],
    prepared: dict[str, Any],
    explain_text: str,
    generator: str,
    rounds: int,
    seconds: float,
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    rows = []
    targets = []
    for view in pages:
        stats: dict[str, dict[str, Any]] = {}
        for who in ("ours", "admin"):
            runs = samples[(view, who)]
            stats[who] = {
                "url": pages[view][who],
                "req_per_s": median(r["req_per_s"] for r in runs),
                "p50_ms": median(r["p50_ms"] for r in runs),
                "p95_ms": median(r["p95_ms"] for r in runs),
                "p99_ms": median(r["p99_ms"] for r in runs),
                "requests": sum(r["requests"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
            }
        figures[view] = stats
        ours, admin = stats["ours"], stats["admin"]
        for who, label in (("ours", "dashboard"), ("admin", "admin changelist")):
            s = stats[who]
            rows.append([f"{view}: {label}", s["req_per_s"], s["p50_ms"], s["p95_ms"], s["p99_ms"], s["errors"]])
        speedup = ratio(admin["p50_ms"], ours["p50_ms"])
        rows.append([f"{view}: admin/ours", "", "", ratio(admin["p95_ms"], ours["p95_ms"]), "", f"p50 x{speedup:.1f}"])
        targets.append(Target("queue", f"{view}: p95", ours["p95_ms"], 50.0, "<=", " ms"))
        targets.append(Target("queue", f"{view}: admin p50 / dashboard p50", speedup, 5.0, ">=", "x"))
    text = table(["view", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors"], rows)
    return {
        "attempts": prepared["load"]["rows"],
        "states": prepared["counts"],
        "load": prepared["load"],
        "tenants": TENANTS,
        "generator": generator,
        "rounds": rounds,
        "seconds_per_run": seconds,
        "figures": figures,
        "explain": explain_text,
        "table": text,
        "targets": targets,
    }

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

The admin runs twice: as shipped (``/admin/``: its filter sidebar runs a
full-table ``SELECT DISTINCT tool_name`` on every page, first or deep) and
without the sidebar and the full-table count (``/bench-admin/``, a second
admin site the benchmark's gunicorn serves: bench/urls.py), which leaves
its paging. Ratios are stated against the latter.

The admin shows 100 rows a page, the dashboard 50: each as shipped.
The same run also times one attempt's page with a long history (703
events: an UNKNOWN attempt looked up hourly for a month, recorded through
the ledger's own moves), against its audit report, which lists every event.

Percentiles are taken over all the requests of all rounds together; each
side runs long enough for at least ``MIN_REQUESTS`` of them (a time cap
bounds the slowest side, and the table says how many each had).
"""

from __future__ import annotations

import hashlib
import json
import math
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
    median,
    ratio,
    say,
    start_gunicorn,
    table,
)
from bench.loader import ATTEMPT_COLUMNS, bulk_load, reserve_ids
from ledgerdash.processes import stop_group

TENANTS = 50
OWNERS = 5
#: The sides of each view: the dashboard, the admin as shipped, the admin's paging alone.
SIDES = ("ours", "admin", "admin paging")
LABELS = {"ours": "dashboard", "admin": "admin as shipped", "admin paging": "admin, no filters/count"}
#: Requests each side should have, over all rounds, for its p95 to mean something.
MIN_REQUESTS = 150
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

    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Membership, Tenant
    from ledgerdash.ledger.policies import policy_publish

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


#: An UNKNOWN attempt looked up hourly for a month, plus its record, dispatch and UNKNOWN move.
LONG_HISTORY_CHECKS = 700
#: The long history's pages: the attempt page (folded, paged) and its audit report (every event).
HISTORY_PAGES = {"attempt page": "/attempts/{pk}/", "audit report (every event)": "/attempts/{pk}/report/"}


def _long_history(tenant: Any) -> Any:
    """An attempt of ``tenant`` with 703 events, made by the ledger's own moves."""
    from ledgerdash.ledger import moves, recording
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Attempt

    agent, reconciler = Actor.agent("bench-agent"), Actor.reconciler("bench-reconciler")
    args = {"invoice": "INV-long", "to": "ap@example.com"}
    attempt = recording.record_intent(
        tenant=tenant, task_id="task-long", tool_name=TOOLS[0], idempotency_key="invoice:long:send", args=args,
        credential_scope="email:send", actor=agent,
    ).attempt  # fmt: skip
    attempt = recording.mark_dispatched(attempt, actor=agent)
    attempt = recording.mark_unknown(attempt, reason="no response within 30 s", actor=agent)
    for n in range(LONG_HISTORY_CHECKS):
        # Mostly the same answer, now and then another: the page folds both into one run.
        reason = "lookup timed out after 10 s" if n % 24 == 5 else "provider unavailable (HTTP 503)"
        attempt = moves.attempt_check_later(
            attempt=attempt, actor=reconciler, fence=attempt.fence, reason=reason, lookup={"status": "unavailable"}
        )
    return Attempt.objects.get(pk=attempt.pk)


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
    query = "ledger/attempt/?state__exact=UNKNOWN"
    filters = f"&tenant__id__exact={tenant.pk}&owner__id__exact={operator.pk}"
    pages = {
        "first page": {"ours": "/queues/unknown/", "admin": query},
        "deep page": {"ours": f"/queues/unknown/?after={cursor}", "admin": f"{query}&p={admin_page}"},
        "tenant + owner": {"ours": f"/queues/unknown/?tenant={tenant.slug}&owner=me", "admin": query + filters},
    }
    for urls in pages.values():
        urls["admin"], urls["admin paging"] = f"/admin/{urls['admin']}", f"/bench-admin/{urls['admin']}"
    return pages


def _explain(prepared: dict[str, Any], pages: dict[str, dict[str, str]]) -> str:
    """EXPLAIN ANALYZE of the dashboard's keyset read for each view (one of
    its per-tenant reads), and of the admin's slowest query for each."""
    from django.db import connection
    from django.test import Client, override_settings
    from django.test.utils import CaptureQueriesContext

    lines = []
    for view, urls in pages.items():
        for who in SIDES:
            client = Client()
            client.force_login(prepared["operator"] if who == "ours" else prepared["admin"])
            with CaptureQueriesContext(connection) as captured, override_settings(ROOT_URLCONF="bench.urls"):
                response = client.get(urls[who])
            assert response.status_code == 200, (urls[who], response.status_code)
            queries = captured.captured_queries
            if who == "ours":
                keyset = [q["sql"] for q in queries if "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]]
                title = f"{view}, dashboard: {len(queries)} queries; the keyset read:"
                chosen = keyset[0]
            else:
                chosen = max(queries, key=lambda q: float(q["time"]))["sql"]
                title = f"{view}, {LABELS[who]}: {len(queries)} queries; the slowest:"
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + chosen)
                plan = "\n".join(f"    {line}" for (line,) in cursor.fetchall())
            lines.append(f"-- {title}\n    {chosen[:400]}\n{plan}")
    return "\n\n".join(lines)


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


def _wrk(wrk: str, url: str, cookie: str, seconds: float, connections: int) -> dict[str, Any]:
    result = subprocess.run(
        [
            wrk, "-t", "1", "-c", str(connections), "-d", f"{seconds:.0f}s", "--timeout", "10s",
            "-s", str(ROOT / "bench" / "wrk_report.lua"), "-H", f"Cookie: {cookie}", url,
        ],
        capture_output=True, text=True, check=True, timeout=seconds + 120,
    )  # fmt: skip
    line = [line for line in result.stdout.splitlines() if line.startswith("{")][-1]
    raw = json.loads(line)
    return {
        "requests": raw["requests"],
        "req_per_s": raw["requests"] / (raw["duration_us"] / 1e6),
        "errors": raw["errors"] + raw["non_2xx"],
        "latency_us": [(int(us), int(count)) for us, count in raw["latency_us"]],
    }


def _python_load(url: str, cookie: str, seconds: float, connections: int) -> dict[str, Any]:
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
        "latency_us": [(round(x * 1e6), 1) for x in latencies],
    }


def pooled_percentile(runs: list[dict[str, Any]], q: float) -> float:
    """Nearest-rank percentile (ms) over the latencies of all ``runs`` together."""
    counts: dict[int, int] = {}
    for run_ in runs:
        for us, count in run_["latency_us"]:
            counts[us] = counts.get(us, 0) + count
    total = sum(counts.values())
    if not total:
        return math.nan
    rank = max(1, math.ceil(q / 100 * total))
    seen = 0
    for us in sorted(counts):
        seen += counts[us]
        if seen >= rank:
            return us / 1000
    return math.nan


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


def _check_page(url: str, cookie: str, marker: str, sized: bool = False) -> Any:
    """Fetch the page three times, check it is the expected one; the fastest
    time it took, in seconds (to size the timed runs), and with ``sized``
    its size in bytes too."""
    times = []
    body = ""
    for _ in range(3):
        request = urllib.request.Request(url, headers={"Cookie": cookie})
        began = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read().decode()
        times.append(time.perf_counter() - began)
        if response.status != 200 or marker not in body:
            raise RuntimeError(f"{url} did not answer with the expected page (status {response.status})")
    return (min(times), len(body.encode())) if sized else min(times)


def run(ctx: Any) -> dict[str, Any]:
    quick = ctx.quick
    total = 20_000 if quick else 1_000_000
    rounds = 2 if quick else 3
    # The admin as shipped takes a second a page or more at 1,000,000
    # attempts: its runs are capped at max_seconds, so that make bench stays
    # within 15 minutes (some 40 requests over the rounds; the table says).
    seconds, max_seconds = (1.0, 3.0) if quick else (3.0, 6.0)
    min_requests = 20 if quick else MIN_REQUESTS
    connections = 2  # one per gunicorn worker: latency without queueing
    ctx.dbs.fresh_main()
    say(f"queue: loading {total:,} attempts over {TENANTS} tenants with COPY")
    prepared = _prepare(ctx, total)
    say(f"  loaded: {prepared['load']}; states {prepared['counts']}")
    pages = _pages(prepared)
    long = _long_history(prepared["tenants"][7])
    history_pages = {name: path.format(pk=long.pk) for name, path in HISTORY_PAGES.items()}
    say(f"  long history: attempt #{long.pk}, {long.events.count()} events")
    cookies = {"ours": _session_cookie(prepared["operator"]), "admin": _session_cookie(prepared["admin"])}
    cookies["admin paging"] = cookies["admin"]
    explain_text = _explain(prepared, pages)
    wrk = find_wrk()
    generator = "wrk" if wrk else "python (wrk unavailable)"
    server = start_gunicorn(ctx.dbs.url_of(ctx.dbs.main), workers=2, settings_module="bench.settings")
    base = f"http://127.0.0.1:{GUNICORN_PORT}"
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {(v, w): [] for v in pages for w in SIDES}
    durations: dict[tuple[str, str], float] = {}
    sizes: dict[str, int] = {}
    try:
        for view, urls in pages.items():
            for who in SIDES:
                took = _check_page(base + urls[who], cookies[who], "attempt" if who == "ours" else "result_list")
                # Long enough for min_requests over all rounds, within [seconds, max_seconds].
                wanted = min_requests / rounds * took / connections * 1.3
                durations[(view, who)] = float(min(max_seconds, max(seconds, math.ceil(wanted))))
        for name, path in history_pages.items():
            took, sizes[name] = _check_page(base + path, cookies["ours"], "invoice:long:send", sized=True)
            wanted = min_requests / rounds * took / connections * 1.3
            durations[(name, "ours")] = float(min(max_seconds, max(seconds, math.ceil(wanted))))
            samples[(name, "ours")] = []
        planned = sum(durations.values()) * rounds
        say(f"  load generator: {generator}; {rounds} rounds x {len(pages)} views x {len(SIDES)}: {planned:.0f}s")
        for round_no in range(rounds):
            for view, urls in pages.items():
                order = SIDES[round_no % len(SIDES) :] + SIDES[: round_no % len(SIDES)]
                for who in order:
                    _settle(ctx)
                    url, cookie, duration = base + urls[who], cookies[who], durations[(view, who)]
                    if wrk:
                        sample = _wrk(wrk, url, cookie, duration, connections)
                    else:
                        sample = _python_load(url, cookie, duration, connections)
                    samples[(view, who)].append(sample)
            for name, path in history_pages.items():
                _settle(ctx)
                url, duration = base + path, durations[(name, "ours")]
                if wrk:
                    samples[(name, "ours")].append(_wrk(wrk, url, cookies["ours"], duration, connections))
                else:
                    samples[(name, "ours")].append(_python_load(url, cookies["ours"], duration, connections))
            say(f"  round {round_no + 1}/{rounds} done")
    finally:
        stop_group(server, timeout=20)
    result = _summarize(samples, pages, prepared, explain_text, generator, rounds, durations)
    _summarize_history(result, samples, history_pages, sizes, durations, long.events.count())
    return result


def _summarize_history(
    result: dict[str, Any],
    samples: dict[tuple[str, str], list[dict[str, Any]]],
    history_pages: dict[str, str],
    sizes: dict[str, int],
    durations: dict[tuple[str, str], float],
    events: int,
) -> None:
    """The long history's rows, figures and target, added to the queue's result."""
    rows = []
    figures = {}
    for name, path in history_pages.items():
        runs = samples[(name, "ours")]
        figures[name] = {
            "url": path,
            "seconds_per_run": durations[(name, "ours")],
            "req_per_s": median(r["req_per_s"] for r in runs),
            "p50_ms": pooled_percentile(runs, 50),
            "p95_ms": pooled_percentile(runs, 95),
            "p99_ms": pooled_percentile(runs, 99),
            "requests": sum(r["requests"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
            "kib": round(sizes[name] / 1024, 1),
        }
        f = figures[name]
        rows.append([f"{events} events: {name}", f["req_per_s"], f["p50_ms"], f["p95_ms"], f["p99_ms"], f["requests"],
                     f["errors"], f["kib"]])  # fmt: skip
    result["long_history"] = {"events": events, "figures": figures}
    result["table"] += "\n\n" + table(
        ["long history", "req/s", "p50 ms", "p95 ms", "p99 ms", "requests", "errors", "KiB"], rows
    )
    page = figures["attempt page"]
    name = f"attempt page, {events} events: p95 ({page['kib']} KiB)"
    result["targets"].append(Target("queue", name, page["p95_ms"], 100.0, "<=", " ms"))


def _summarize(
    samples: dict[tuple[str, str], list[dict[str, Any]]],
    pages: dict[str, dict[str, str]],
    prepared: dict[str, Any],
    explain_text: str,
    generator: str,
    rounds: int,
    durations: dict[tuple[str, str], float],
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    rows = []
    targets = []
    for view in pages:
        stats: dict[str, dict[str, Any]] = {}
        for who in SIDES:
            runs = samples[(view, who)]
            stats[who] = {
                "url": pages[view][who],
                "seconds_per_run": durations[(view, who)],
                "req_per_s": median(r["req_per_s"] for r in runs),
                "p50_ms": pooled_percentile(runs, 50),
                "p95_ms": pooled_percentile(runs, 95),
                "p99_ms": pooled_percentile(runs, 99),
                "requests": sum(r["requests"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
            }
        figures[view] = stats
        ours = stats["ours"]
        for who in SIDES:
            s = stats[who]
            versus = "" if who == "ours" else f"x{ratio(s['p50_ms'], ours['p50_ms']):.1f}"
            rows.append(
                [f"{view}: {LABELS[who]}", s["req_per_s"], s["p50_ms"], s["p95_ms"], s["p99_ms"], s["requests"],
                 s["errors"], versus]
            )  # fmt: skip
        speedup = ratio(stats["admin paging"]["p50_ms"], ours["p50_ms"])
        targets.append(Target("queue", f"{view}: p95", ours["p95_ms"], 35.0, "<=", " ms"))
        name = f"{view}: admin (no filters/count) p50 / dashboard p50"
        targets.append(Target("queue", name, speedup, 5.0, ">=", "x"))
    text = table(["view", "req/s", "p50 ms", "p95 ms", "p99 ms", "requests", "errors", "p50 / dashboard"], rows)
    return {
        "attempts": prepared["load"]["rows"],
        "states": prepared["counts"],
        "load": prepared["load"],
        "tenants": TENANTS,
        "generator": generator,
        "rounds": rounds,
        "figures": figures,
        "explain": explain_text,
        "table": text,
        "targets": targets,
    }

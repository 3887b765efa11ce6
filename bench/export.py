"""Benchmark 4: exporting a million events as CSV.

One tenant's 1,000,000 events (three per attempt, hash-chained exactly as
the ledger chains them, so an export that verifies the chain can) are
bulk-loaded with COPY. The project's streaming export (through
bench/export_adapter.py) and PostgreSQL's ``COPY (same query) TO STDOUT
WITH CSV`` then each export them, alternately, in a process of their own:
rows/s and that process's own peak RSS (``VmHWM``, read by the process as it
finishes; see bench/peak.py).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg

from bench.common import PYTHON, ROOT, Target, django_env, median, ratio, say, table
from bench.loader import ATTEMPT_COLUMNS, EVENT_COLUMNS, bulk_load, reserve_ids

TENANT = "audited"
STEPS = (
    ("", "INTENT_RECORDED", "intent recorded"),
    ("INTENT_RECORDED", "DISPATCHED", "dispatched"),
    ("DISPATCHED", "OUTCOME_CONFIRMED", "outcome confirmed"),
)


#: Every this many events, the fast canonical form is checked against the ledger's own.
CHECK_EVERY = 1000


def _canonical(content: dict[str, Any], seq: int) -> bytes:
    """The RFC 8785 bytes of an event's content, the fast way.

    For what these events hold (ASCII strings that need no escaping,
    integers, null, an object of such strings) the canonical form is
    Python's own compact JSON with sorted keys, which its C encoder writes
    several times faster than the ledger's RFC 8785 encoder: a million
    events load a minute sooner. Checked against the ledger's encoder every
    ``CHECK_EVERY`` events; a difference stops the load.
    """
    from ledgerdash.ledger.canonical import canonical_bytes

    data = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if seq % CHECK_EVERY == 1 and data != canonical_bytes(content):
        raise RuntimeError(f"event {seq}: its fast canonical form differs from RFC 8785: {data!r}")
    return data


def _event_rows(
    tenant_id: int, first_attempt: int, total: int, seq: int, prev: str, start: datetime, last: list[Any]
) -> Iterator[tuple[Any, ...]]:
    """Three chained events per attempt (``total`` in all); ``last`` receives
    the final (seq, hash)."""
    from ledgerdash.ledger import chain

    attempts = -(-total // len(STEPS))
    for n in range(attempts):
        attempt_id = first_attempt + n
        for fence, (from_state, to_state, reason) in enumerate(STEPS):
            if n * len(STEPS) + fence >= total:
                break
            seq += 1
            created = start + timedelta(milliseconds=3 * seq)
            details = {"provider_request_id": f"req-{attempt_id}"} if fence == 2 else {}
            event = SimpleNamespace(
                tenant_id=tenant_id, attempt_id=attempt_id, kind="transition", actor_kind="agent",
                actor_user_id=None, actor_label="agent@bench", from_state=from_state, to_state=to_state,
                fence=fence, reason=reason, details=details, created_at=created,
            )  # fmt: skip
            content_hash = hashlib.sha256(_canonical(chain.event_content(event), seq)).hexdigest()
            this = chain.link(prev, content_hash)
            yield (
                tenant_id, seq, attempt_id, "transition", "agent", None, "agent@bench", from_state, to_state,
                fence, reason, json.dumps(details), created.isoformat(), content_hash, prev, this,
            )  # fmt: skip
            prev = this
    last[:] = [seq, prev]


def _prepare(ctx: Any, events: int) -> dict[str, Any]:
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import ChainHead, Tenant
    from ledgerdash.ledger.policies import policy_publish

    ctx.dbs.fresh_main()
    tenant = Tenant.objects.create(slug=TENANT, name="Audited")
    policy_publish(tenant=tenant, tools={"send_email": ["email:send"]}, actor=Actor.system("bench"))
    head = ChainHead.objects.get(tenant=tenant)
    attempts = -(-events // len(STEPS))
    start = datetime.now(UTC) - timedelta(milliseconds=3 * events + 60_000)
    with psycopg.connect(ctx.dbs.url_of(ctx.dbs.main), autocommit=True) as conn:
        first = reserve_ids(conn, "ledger_attempt", attempts)

        def attempt_rows() -> Iterator[tuple[Any, ...]]:
            for n in range(attempts):
                yield (
                    first + n, tenant.pk, f"task-{n // 10}", "send_email", f"k:{n}", f"k:{n}", "{}", "0" * 64,
                    "OUTCOME_CONFIRMED", 1, "email:send", 2, 1, 1, f"req-{first + n}", "", 0, "", "",
                    "outcome confirmed", None, None, start, start, start,
                )  # fmt: skip

        bulk_load(conn, "ledger_attempt", ATTEMPT_COLUMNS, attempt_rows())
        last: list[Any] = []
        loaded = bulk_load(
            conn,
            "ledger_attemptevent",
            EVENT_COLUMNS,
            _event_rows(tenant.pk, first, events, head.seq, head.hash, start, last),
        )
        conn.execute("UPDATE ledger_chainhead SET seq = %s, hash = %s WHERE tenant_id = %s", [*last, tenant.pk])
    return {"events": loaded["rows"], "load": loaded}


def _export_once(ctx: Any, mode: str) -> dict[str, Any]:
    result = subprocess.run(
        [PYTHON, "-m", "bench.export_runner", mode, TENANT],
        cwd=ROOT,
        env=django_env(ctx.dbs.url_of(ctx.dbs.main)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"mode": mode, "error": f"exited {result.returncode}: {(result.stderr or result.stdout)[-800:]}"}
    return dict(json.loads(lines[-1]))


def run(ctx: Any) -> dict[str, Any]:
    quick = ctx.quick
    events = 30_000 if quick else 1_000_000
    rounds = 2 if quick else 3
    say(f"export: loading {events:,} chained events of one tenant with COPY")
    prepared = _prepare(ctx, events)
    say(f"  loaded: {prepared['load']}")
    samples: dict[str, list[dict[str, Any]]] = {"export": [], "copy": []}
    unavailable = ""
    for round_no in range(rounds):
        for mode in ("export", "copy") if round_no % 2 == 0 else ("copy", "export"):
            if mode == "export" and unavailable:
                continue
            sample = _export_once(ctx, mode)
            if "error" in sample:
                if mode == "copy":
                    raise RuntimeError(f"COPY export failed: {sample['error']}")
                unavailable = sample["error"]
                say(f"  {unavailable}")
                continue
            sample["rows_per_s"] = sample["rows"] / sample["seconds"] if sample["seconds"] else float("nan")
            samples[mode].append(sample)
    return _summarize(samples, prepared, unavailable, rounds)


def _summarize(
    samples: dict[str, list[dict[str, Any]]], prepared: dict[str, Any], unavailable: str, rounds: int
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for mode, runs in samples.items():
        if not runs:
            figures[mode] = {"unavailable": unavailable}
            continue
        figures[mode] = {
            "rows": runs[0]["rows"],
            "rows_per_s": median(r["rows_per_s"] for r in runs),
            "seconds": median(r["seconds"] for r in runs),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "peak_rss_mib_rounds": [r["peak_rss_mib"] for r in runs],
            "mb": runs[0]["bytes"] / 1e6,
            "entry_point": runs[0].get("entry_point", "COPY TO STDOUT"),
            "runs": runs,
        }
    rows: list[list[Any]] = []
    labels = {"export": "streaming export", "copy": "COPY TO STDOUT CSV"}
    for mode in ("export", "copy"):
        f = figures[mode]
        if "unavailable" in f:
            rows.append([labels[mode], "not available in this build", "", "", "", ""])
        else:
            rows.append([labels[mode], f["rows"], f["rows_per_s"], f["seconds"], f["peak_rss_mib"], f["mb"]])
    targets = []
    notes = []
    if "unavailable" in figures["export"]:
        notes.append(f"export targets not measured: {unavailable}")
    else:
        share = ratio(figures["export"]["rows_per_s"], figures["copy"]["rows_per_s"])
        rows.append(["export / COPY", "", share, "", "", ""])
        targets.append(
            Target(
                "export",
                "peak RSS of the exporting process (its own VmHWM, highest of the rounds)",
                figures["export"]["peak_rss_mib"],
                150.0,
                "<=",
                " MiB",
            )
        )
        targets.append(Target("export", "rate vs COPY", share, 0.5, ">=", "x"))
        if figures["export"]["rows"] != figures["copy"]["rows"]:
            notes.append(
                f"the export wrote {figures['export']['rows']} rows, COPY {figures['copy']['rows']}: the export"
                " adds an opening 'export' record and a closing 'head' record, and every export appends its"
                " own audit event to the chain, which later runs of both include"
            )
    text = table(["exporter", "rows", "rows/s", "seconds", "peak RSS MiB", "output MB"], rows)
    return {
        "events": prepared["events"],
        "load": prepared["load"],
        "rounds": rounds,
        "figures": figures,
        "table": text,
        "targets": targets,
        "notes": notes,
    }

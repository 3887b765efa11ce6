"""Benchmark: what notifications cost a tool call, and how fast the outbox delivers.

1. **Tool-call overhead.** One tool call (intent -> dispatched -> confirmed,
   the in-process recording API) in a tenant with no notification rules,
   against the same in a tenant with rules on every event kind and a
   ``manage.py notify`` worker polling the event log every 0.2 s beside it.
   Rounds alternate the two; the verdict is on the median ratio. The outbox
   reads the event log after the fact, so a call that triggers nothing
   writes nothing more: the target is at most 10% slower.
2. **Delivery throughput.** N attempts enter MANUAL_REVIEW (one delivery
   each); one worker pass turns the events into deliveries (collect) and
   sends them to a local webhook receiver (send), signed, one try each.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.common import PYTHON, ROOT, Target, django_env, median, ratio, say, table

TOOL = "send_email"


class _Sink(BaseHTTPRequestHandler):
    count = 0
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with _Sink.lock:
            _Sink.count += 1
        self.send_response(204)
        self.end_headers()


def _tenant(slug: str) -> Any:
    from django.contrib.auth import get_user_model

    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant
    from ledgerdash.ledger.policies import policy_publish

    owner = get_user_model().objects.create_user(f"{slug}-oncall")
    tenant = Tenant.objects.create(slug=slug, name=slug, default_owner=owner)
    policy_publish(tenant=tenant, tools={TOOL: ["email:send"]}, actor=Actor.system("bench"))
    return tenant


def _rules(tenant: Any, url: str) -> None:
    from ledgerdash.ledger.events import Actor
    from ledgerdash.notify import services
    from ledgerdash.notify.models import RuleEvent

    actor = Actor.system("bench")
    channel = services.channel_create(tenant=tenant, name="sink", kind="webhook", target=url, actor=actor)
    for event in RuleEvent:
        services.rule_create(tenant=tenant, actor=actor, event=event, channel_id=channel.pk, repeat_minutes=0)


def _calls(tenant: Any, prefix: str, n: int) -> float:
    """Seconds per tool call, over ``n`` calls."""
    from ledgerdash.ledger import recording
    from ledgerdash.ledger.events import Actor

    actor = Actor.agent("bench-agent")
    started = time.perf_counter()
    for i in range(n):
        attempt = recording.record_intent(
            tenant=tenant,
            task_id="t",
            tool_name=TOOL,
            idempotency_key=f"{prefix}-{i}",
            args={"to": "a@example.com", "n": i},
            actor=actor,
        ).attempt
        attempt = recording.mark_dispatched(attempt, actor=actor)
        recording.confirm(attempt, provider_request_id=f"r-{prefix}-{i}", actor=actor)
    return (time.perf_counter() - started) / n


def _to_review(tenant: Any, n: int) -> None:
    from ledgerdash.ledger import moves, recording
    from ledgerdash.ledger.events import Actor

    agent, reconciler = Actor.agent("bench-agent"), Actor.reconciler("bench")
    for i in range(n):
        attempt = recording.record_intent(
            tenant=tenant, task_id="t", tool_name=TOOL, idempotency_key=f"review-{i}", args={"n": i}, actor=agent
        ).attempt
        attempt = recording.mark_unknown(recording.mark_dispatched(attempt, actor=agent), reason="lost", actor=agent)
        moves.attempt_escalate(attempt=attempt, actor=reconciler, fence=attempt.fence, reason="bench")


def run(ctx: Any) -> dict[str, Any]:
    import subprocess

    from ledgerdash.notify import outbox, worker
    from ledgerdash.notify.models import Delivery, DeliveryStatus

    quick = ctx.quick
    rounds, per_round, deliveries = (4, 100, 200) if quick else (10, 300, 2000)
    ctx.dbs.fresh_main()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    plain, notified = _tenant("plain"), _tenant("notified")
    _rules(notified, url)
    say(f"notify: {rounds} rounds of {per_round} tool calls, without and with notification rules + a worker")
    worker_proc = subprocess.Popen(
        [PYTHON, str(ROOT / "manage.py"), "notify", "--interval", "0.2"],
        cwd=ROOT,
        env=django_env(ctx.dbs.url_of(ctx.dbs.main)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    without: list[float] = []
    with_rules: list[float] = []
    try:
        _calls(plain, "warm", 20)
        _calls(notified, "warm", 20)
        for r in range(rounds):
            order = [(plain, without), (notified, with_rules)]
            for tenant, into in order if r % 2 == 0 else reversed(order):
                into.append(_calls(tenant, f"round{r}", per_round))
    finally:
        worker_proc.terminate()
        worker_proc.wait(timeout=30)
    ratios = [ratio(w, p) for w, p in zip(with_rules, without, strict=True)]
    overhead = median(ratios) - 1.0

    say(f"notify: {deliveries} attempts into MANUAL_REVIEW, then one worker pass to the local receiver")
    reviewed = _tenant("reviewed")
    _rules(reviewed, url)
    Delivery.objects.all().delete()
    _to_review(reviewed, deliveries)
    started = time.perf_counter()
    # Each attempt is four events (intent, dispatched, unknown, review): read them all in one pass.
    collected = outbox.collect_events(limit=10 * deliveries)
    collect_s = time.perf_counter() - started
    _Sink.count = 0
    started = time.perf_counter()
    while Delivery.objects.filter(status=DeliveryStatus.PENDING).exists():
        worker.run_pass(worker="bench", batch_size=50)
    send_s = time.perf_counter() - started
    server.shutdown()
    sent = Delivery.objects.filter(status=DeliveryStatus.SENT).count()
    rows = [
        ["tool call, no rules", median(without) * 1000, "", ""],
        ["tool call, rules + worker", median(with_rules) * 1000, f"{overhead * 100:+.1f}%", ""],
        ["collect events -> deliveries", "", "", ratio(collected, collect_s)],
        ["send (webhook, signed)", "", "", ratio(sent, send_s)],
    ]
    text = table(["what", "ms per call (median)", "overhead (median of rounds)", "per second"], rows)
    return {
        "rounds": rounds,
        "calls_per_round": per_round,
        "ms_without": [x * 1000 for x in without],
        "ms_with": [x * 1000 for x in with_rules],
        "overhead": overhead,
        "deliveries": deliveries,
        "collected_per_s": ratio(collected, collect_s),
        "sent_per_s": ratio(sent, send_s),
        "received": _Sink.count,
        "table": text,
        "targets": [
            Target("notify", "tool-call overhead with rules and a worker", overhead * 100, 10.0, "<=", "%"),
            Target("notify", "deliveries sent", float(sent), float(deliveries), ">=", ""),
        ],
    }

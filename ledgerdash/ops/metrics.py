"""``/metrics``: Prometheus metrics, behind a bearer token (``METRICS_TOKEN``).

Two kinds:

- the ledger's state, read from the database at scrape time (queues by
  tenant and state, the oldest UNKNOWN and MANUAL_REVIEW, attempts due for
  recovery and dispatch leases run out, open incidents, the reconciler
  workers' passes and decisions, the last verification of each tenant's
  chain, notification deliveries by result and how long the outbox's
  oldest has been due): every web process answers
  the same, so any one may be scraped;
- the HTTP requests this deployment served (count and latency by route,
  method and status), kept by prometheus-client. Under gunicorn, with
  ``PROMETHEUS_MULTIPROC_DIR`` set (deploy/gunicorn.conf.py does it), the
  workers share them through files, so one scrape sees them all.

Without ``METRICS_TOKEN`` the endpoint answers 404: metrics name tenants
and their queue sizes, which are not for everyone who can reach the host.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Max, Min, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ledgerdash.ledger import clock
from ledgerdash.ledger.models import (
    IN_FLIGHT_STATES,
    OWNED_STATES,
    Attempt,
    ChainCheck,
    Incident,
    ReconcilerWorker,
    State,
    Tenant,
)
from ledgerdash.notify.models import Delivery, DeliveryStatus

log = logging.getLogger(__name__)

REQUEST_SECONDS = Histogram(
    "ledgerdash_http_request_duration_seconds",
    "Requests served, by URL route, method and status, and how long each took.",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

#: A worker that finished a pass this recently counts as running.
WORKER_ACTIVE = timedelta(minutes=5)


def _every(
    tenants: list[str], values: dict[tuple[str, str], float], labels: list[str]
) -> Iterator[tuple[str, str, float]]:
    """``values`` by tenant and label, with 0 for every tenant and label it has no value for."""
    for tenant in tenants:
        for label in labels:
            yield tenant, str(label), values.get((tenant, str(label)), 0)


class LedgerCollector(Collector):
    """The ledger's state, read at scrape time with a handful of grouped queries."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("ledgerdash_database_up", "1 when the metrics could be read from the database.")
        try:
            families = list(self._ledger())
        except DatabaseError as exc:
            log.warning("metrics: the database is unavailable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _ledger(self) -> Iterable[Metric]:
        now = clock.now()
        # Every tenant has each series, 0 when there is nothing to count: a queue that empties
        # stays a line at 0 on a graph, and "no samples" keeps meaning the metrics are broken.
        tenants = list(Tenant.objects.order_by("slug").values_list("slug", flat=True))
        attempts = GaugeMetricFamily("ledgerdash_attempts", "Attempts by tenant and state.", labels=["tenant", "state"])
        counted = {
            (row["tenant__slug"], row["state"]): row["n"]
            for row in Attempt.objects.order_by().values("tenant__slug", "state").annotate(n=Count("id"))
        }
        for tenant, state, n in _every(tenants, counted, list(State)):
            attempts.add_metric([tenant, state], n)
        yield attempts

        oldest = GaugeMetricFamily(
            "ledgerdash_oldest_attempt_age_seconds",
            "Age of the oldest attempt waiting in UNKNOWN or MANUAL_REVIEW, by tenant and state.",
            labels=["tenant", "state"],
        )
        waiting = (
            Attempt.objects.filter(state__in=OWNED_STATES)
            .order_by()
            .values("tenant__slug", "state")
            .annotate(first=Min("created_at"))
        )
        ages = {(w["tenant__slug"], w["state"]): (now - w["first"]).total_seconds() for w in waiting}
        for tenant, state, age in _every(tenants, ages, list(OWNED_STATES)):
            oldest.add_metric([tenant, state], age)
        yield oldest

        due = GaugeMetricFamily(
            "ledgerdash_attempts_due", "In-flight attempts due for the reconciler now, by tenant.", labels=["tenant"]
        )
        overdue = GaugeMetricFamily(
            "ledgerdash_oldest_due_seconds",
            "How long the longest-waiting due attempt has been due, by tenant (a stalled reconciler shows here).",
            labels=["tenant"],
        )
        rows = (
            Attempt.objects.filter(state__in=IN_FLIGHT_STATES, next_check_at__lte=now)
            .order_by()
            .values("tenant__slug")
            .annotate(n=Count("id"), first=Min("next_check_at"))
        )
        by_tenant = {d["tenant__slug"]: d for d in rows}
        for tenant in tenants:
            d = by_tenant.get(tenant)
            due.add_metric([tenant], d["n"] if d else 0)
            overdue.add_metric([tenant], (now - d["first"]).total_seconds() if d else 0)
        yield due
        yield overdue

        expired = GaugeMetricFamily(
            "ledgerdash_dispatch_leases_expired",
            "DISPATCHED attempts whose dispatcher's lease ran out and that recovery has not taken over yet, by tenant.",
            labels=["tenant"],
        )
        lapsed = (
            Attempt.objects.filter(state=State.DISPATCHED, next_check_at__lt=now)
            .order_by()
            .values("tenant__slug")
            .annotate(n=Count("id"))
        )
        lapsed_by = {lease["tenant__slug"]: lease["n"] for lease in lapsed}
        for tenant in tenants:
            expired.add_metric([tenant], lapsed_by.get(tenant, 0))
        yield expired

        incidents = GaugeMetricFamily(
            "ledgerdash_incidents_open",
            "Open incidents (duplicates and others), by tenant and kind.",
            labels=["tenant", "kind"],
        )
        open_rows = (
            Incident.objects.filter(status=Incident.Status.OPEN)
            .order_by()
            .values("tenant__slug", "kind")
            .annotate(n=Count("id"))
        )
        opened = {(i["tenant__slug"], i["kind"]): i["n"] for i in open_rows}
        for tenant, kind, n in _every(tenants, opened, list(Incident.Kind)):
            incidents.add_metric([tenant, kind], n)
        yield incidents

        yield from self._reconciler()
        yield from self._chains()
        yield from self._notifications(now, tenants)

    def _notifications(self, now: datetime, tenants: list[str]) -> Iterable[Metric]:
        deliveries = GaugeMetricFamily(
            "ledgerdash_notify_deliveries",
            "Notification deliveries by tenant and result: pending (the outbox), sent, dead (an admin may resend).",
            labels=["tenant", "status"],
        )
        by_status = {
            (row["tenant__slug"], row["status"]): row["n"]
            for row in Delivery.objects.order_by().values("tenant__slug", "status").annotate(n=Count("id"))
        }
        for tenant, status, n in _every(tenants, by_status, list(DeliveryStatus)):
            deliveries.add_metric([tenant, status], n)
        yield deliveries
        waiting = GaugeMetricFamily(
            "ledgerdash_notify_oldest_due_seconds",
            "How long the longest-waiting pending delivery has been due (a stalled notifier shows here).",
        )
        first = Delivery.objects.filter(status=DeliveryStatus.PENDING, next_try_at__lte=now).aggregate(
            first=Min("next_try_at")
        )["first"]
        waiting.add_metric([], (now - first).total_seconds() if first else 0)
        yield waiting

    def _reconciler(self) -> Iterable[Metric]:
        totals = ReconcilerWorker.objects.aggregate(
            passes=Sum("passes"), last=Max("last_pass_at"), errors=Sum("errors")
        )
        last = GaugeMetricFamily(
            "ledgerdash_reconciler_last_pass_timestamp_seconds",
            "When any reconciler worker last finished a pass (Unix time; 0: never).",
        )
        last.add_metric([], totals["last"].timestamp() if totals["last"] else 0)
        yield last
        passes = CounterMetricFamily("ledgerdash_reconciler_passes", "Passes finished by every reconciler worker.")
        passes.add_metric([], totals["passes"] or 0)
        yield passes
        errors = CounterMetricFamily(
            "ledgerdash_reconciler_errors", "Attempts a reconciler pass could not decide (retried after their claim)."
        )
        errors.add_metric([], totals["errors"] or 0)
        yield errors
        decisions = CounterMetricFamily(
            "ledgerdash_reconciler_decisions",
            "Reconciler decisions by outcome, over every worker.",
            labels=["decision"],
        )
        by_decision: dict[str, int] = {}
        for counts in ReconcilerWorker.objects.values_list("decisions", flat=True):
            for name, n in (counts or {}).items():
                by_decision[name] = by_decision.get(name, 0) + int(n)
        for name, n in sorted(by_decision.items()):
            decisions.add_metric([name], n)
        yield decisions
        active = GaugeMetricFamily(
            "ledgerdash_reconciler_workers_active", "Reconciler workers that finished a pass in the last 5 minutes."
        )
        active.add_metric([], ReconcilerWorker.objects.filter(last_pass_at__gte=clock.now() - WORKER_ACTIVE).count())
        yield active

    def _chains(self) -> Iterable[Metric]:
        ok = GaugeMetricFamily(
            "ledgerdash_chain_ok",
            "1 when the tenant's last verify_audit found its chain whole, else 0.",
            labels=["tenant"],
        )
        checked = GaugeMetricFamily(
            "ledgerdash_chain_checked_timestamp_seconds",
            "When verify_audit last walked the tenant's chain.",
            labels=["tenant"],
        )
        clean = GaugeMetricFamily(
            "ledgerdash_chain_last_clean_timestamp_seconds",
            "When a verify_audit walk of the tenant's chain last held (Unix time); for a tenant never walked "
            "clean, when it was made (its chain was empty then), so an alert on its age fires for it too.",
            labels=["tenant"],
        )
        checks = {check.tenant_id: check for check in ChainCheck.objects.all()}
        for tenant_id, slug, created_at in Tenant.objects.values_list("pk", "slug", "created_at"):
            check = checks.get(tenant_id)
            if check is not None:
                ok.add_metric([slug], 1 if check.ok else 0)
                checked.add_metric([slug], check.checked_at.timestamp())
            clean_at = check.reached_at if check is not None and check.reached_at else created_at
            clean.add_metric([slug], clean_at.timestamp())
        yield ok
        yield checked
        yield clean


class _ThisProcess(Collector):
    """The request metrics of this process alone (no PROMETHEUS_MULTIPROC_DIR: one process serves)."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(LedgerCollector())
    return registry


def _authorized(request: HttpRequest) -> bool:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), settings.METRICS_TOKEN.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not settings.METRICS_TOKEN:
        raise Http404("metrics are off: set METRICS_TOKEN")
    if not _authorized(request):
        response = HttpResponse("metrics need the bearer token METRICS_TOKEN\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)

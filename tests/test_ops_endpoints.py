"""/healthz, /readyz and /metrics, and the request log line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from pythonjsonlogger.json import JsonFormatter

from ledgerdash.ledger import clock, moves, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, ReconcilerWorker
from ledgerdash.ledger.reconciler import PassSummary
from ledgerdash.ledger.workers import WorkerTotals
from ledgerdash.notify import services, worker
from ledgerdash.notify.models import Delivery, DeliveryStatus, RuleEvent
from ledgerdash.ops import health
from tests.conftest import AGENT, RECONCILER, record
from tests.live import ROOT

TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture
def metrics_on(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_healthz_answers_without_the_database(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_probes_answer_whatever_the_host_header_while_pages_still_refuse_it(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A container's health check asks by IP address, which ALLOWED_HOSTS refuses for every page."""
    settings.ALLOWED_HOSTS = ["ledger.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    for probe in ("/healthz", "/readyz"):
        response = client.get(probe, HTTP_HOST="127.0.0.1:8000")
        assert response.status_code == 200, response.content
    assert "Invalid HTTP_HOST" not in caplog.text
    assert client.get("/login/", HTTP_HOST="127.0.0.1:8000").status_code == 400


def test_health_endpoints_refuse_other_methods(client: Client) -> None:
    assert client.post("/healthz").status_code == 405
    assert client.post("/readyz").status_code == 405


@pytest.mark.django_db
def test_readyz_checks_the_database_and_migrations(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "checks": {"database": "ok", "migrations": "ok"}}


@pytest.mark.django_db
def test_readyz_names_migrations_not_applied(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_migrations_applied", False)
    from django.db.migrations.loader import MigrationLoader

    ((_, newest),) = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("ledger")
    MigrationRecorder.Migration.objects.filter(app="ledger", name=newest).delete()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert "1 not applied" in body["checks"]["migrations"]
    assert f"ledger.{newest}" in body["checks"]["migrations"]


def test_metrics_are_off_without_a_token(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404


@pytest.mark.usefixtures("metrics_on")
def test_metrics_refuse_a_missing_or_wrong_token(client: Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_metrics_show_the_queues_by_tenant_and_state(client: Client, stuck: dict[str, Attempt]) -> None:
    samples = scrape(client)
    assert samples[("ledgerdash_database_up", ())] == 1
    assert samples[("ledgerdash_attempts", (("state", "UNKNOWN"), ("tenant", "acme")))] == 1
    assert samples[("ledgerdash_attempts", (("state", "MANUAL_REVIEW"), ("tenant", "acme")))] == 1
    assert samples[("ledgerdash_attempts", (("state", "OUTCOME_CONFIRMED"), ("tenant", "acme")))] == 1
    assert samples[("ledgerdash_attempts", (("state", "UNKNOWN"), ("tenant", "globex")))] == 1
    age = samples[("ledgerdash_oldest_attempt_age_seconds", (("state", "UNKNOWN"), ("tenant", "acme")))]
    assert 0 <= age < 600
    assert (
        "ledgerdash_oldest_attempt_age_seconds",
        (("state", "OUTCOME_CONFIRMED"), ("tenant", "acme")),
    ) not in samples


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_a_quiet_tenant_has_every_series_at_zero_not_missing(client: Client, tenant_a: Any) -> None:
    """An empty queue is a line at 0 on a graph; no samples at all means the metrics are broken."""
    samples = scrape(client)
    acme = ("tenant", "acme")
    for state in ("INTENT_RECORDED", "UNKNOWN", "MANUAL_REVIEW", "OUTCOME_CONFIRMED"):
        assert samples[("ledgerdash_attempts", (("state", state), acme))] == 0
    for state in ("UNKNOWN", "MANUAL_REVIEW"):
        assert samples[("ledgerdash_oldest_attempt_age_seconds", (("state", state), acme))] == 0
    for name in ("ledgerdash_attempts_due", "ledgerdash_oldest_due_seconds", "ledgerdash_dispatch_leases_expired"):
        assert samples[(name, (acme,))] == 0
    assert samples[("ledgerdash_incidents_open", (("kind", "duplicate"), acme))] == 0
    for status in ("pending", "sent", "dead"):
        assert samples[("ledgerdash_notify_deliveries", (("status", status), acme))] == 0


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_a_tenant_never_verified_has_a_chain_sample_so_its_alert_can_fire(client: Client, tenant_a: Any) -> None:
    from django.core.management import call_command

    from ledgerdash.ledger.models import ChainCheck

    clean = ("ledgerdash_chain_last_clean_timestamp_seconds", (("tenant", "acme"),))
    samples = scrape(client)
    assert samples[clean] == tenant_a.created_at.timestamp()  # clean since it was made, and no later
    assert ("ledgerdash_chain_ok", (("tenant", "acme"),)) not in samples  # never walked
    call_command("verify_audit", "--tenant", "acme", stdout=io.StringIO())
    samples = scrape(client)
    assert samples[clean] == ChainCheck.objects.get(tenant=tenant_a).reached_at.timestamp()
    assert samples[("ledgerdash_chain_ok", (("tenant", "acme"),))] == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_metrics_show_the_reconciler_workers_passes_and_decisions(client: Client) -> None:
    before = scrape(client)
    assert before[("ledgerdash_reconciler_last_pass_timestamp_seconds", ())] == 0
    assert before[("ledgerdash_reconciler_workers_active", ())] == 0
    one = WorkerTotals("reconciler@a:1")
    one.record(PassSummary(decisions=Counter({"confirmed": 2, "escalated": 1}), claimed=3))
    one.record(PassSummary(decisions=Counter({"confirmed": 1}), claimed=1))
    WorkerTotals("reconciler@b:2").record(PassSummary(decisions=Counter({"backed off": 4}), claimed=4, errors=1))
    assert ReconcilerWorker.objects.get(label="reconciler@a:1").passes == 2
    after = scrape(client)
    assert after[("ledgerdash_reconciler_passes_total", ())] == 3
    assert after[("ledgerdash_reconciler_errors_total", ())] == 1
    assert after[("ledgerdash_reconciler_decisions_total", (("decision", "confirmed"),))] == 3
    assert after[("ledgerdash_reconciler_decisions_total", (("decision", "backed off"),))] == 4
    assert after[("ledgerdash_reconciler_workers_active", ())] == 2
    assert after[("ledgerdash_reconciler_last_pass_timestamp_seconds", ())] > 0


@pytest.mark.usefixtures("metrics_on")
def test_metrics_show_lapsed_dispatch_leases_and_the_outbox(client: Client, tenant_a: Any) -> None:
    # A dispatcher that died: its lease runs out before any reconciler takes over.
    with clock.frozen_at(clock.now() - timedelta(minutes=10)):
        recording.mark_dispatched(record(tenant_a, "lost-worker"), actor=AGENT)
    # A rule whose channel nobody listens on: its delivery fails and waits in the outbox.
    channel = services.channel_create(
        tenant=tenant_a, name="hook", kind="webhook", target="http://127.0.0.1:9/hook", actor=Actor.system("t")
    )
    services.rule_create(
        tenant=tenant_a, actor=Actor.system("t"), event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk
    )
    recording.mark_unknown(recording.mark_dispatched(record(tenant_a, "stuck"), actor=AGENT), reason="t", actor=AGENT)
    stuck = Attempt.objects.get(idempotency_key="stuck")
    moves.attempt_escalate(attempt=stuck, actor=RECONCILER, fence=stuck.fence, reason="checks exhausted")
    worker.run_pass(worker="metrics-test")
    assert Delivery.objects.get().status == DeliveryStatus.PENDING
    Delivery.objects.update(next_try_at=clock.now() - timedelta(seconds=90))
    samples = scrape(client)
    assert samples[("ledgerdash_dispatch_leases_expired", (("tenant", "acme"),))] == 1
    assert samples[("ledgerdash_notify_deliveries", (("status", "pending"), ("tenant", "acme")))] == 1
    assert samples[("ledgerdash_notify_oldest_due_seconds", ())] >= 90


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_metrics_count_requests_by_route_and_status(client: Client) -> None:
    client.get("/healthz")
    client.get("/no-such-page/")
    samples = scrape(client)
    served = samples[
        ("ledgerdash_http_request_duration_seconds_count", (("method", "GET"), ("route", "healthz"), ("status", "200")))
    ]
    assert served >= 1
    assert any(
        name == "ledgerdash_http_request_duration_seconds_count" and ("status", "404") in labels
        for name, labels in samples
    )


@pytest.mark.django_db
def test_each_request_is_logged_with_its_request_id(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="ledgerdash.requests"):
        response = client.get("/login/", HTTP_X_REQUEST_ID="req-42")
        client.get("/healthz")
    assert response["X-Request-ID"] == "req-42"
    login, probe = [r for r in caplog.records if r.name == "ledgerdash.requests"]
    assert login.levelno == logging.INFO
    assert probe.levelno == logging.DEBUG  # probes stay out of the info log
    assert (login.request_id, login.status, login.route) == ("req-42", 200, "login/")  # type: ignore[attr-defined]
    line = json.loads(JsonFormatter("%(levelname)s %(name)s %(message)s").format(login))
    assert (line["request_id"], line["status"], line["method"]) == ("req-42", 200, "GET")


def test_a_made_up_request_id_is_replaced(client: Client) -> None:
    response = client.get("/healthz", HTTP_X_REQUEST_ID="bad id\n")
    assert response["X-Request-ID"] != "bad id\n"
    assert len(response["X-Request-ID"]) == 32


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_the_example_alerts_use_metrics_the_endpoint_exposes(client: Client) -> None:
    client.get("/healthz")  # so the request histogram has a sample
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    exposed: set[str] = set()
    for family in text_string_to_metric_families(response.content.decode()):
        exposed.add(family.name)
        exposed.update(sample.name for sample in family.samples)
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus-alerts.yml").read_text())["groups"][0]["rules"]
    assert len(rules) >= 8
    used = {name for rule in rules for name in re.findall(r"\bledgerdash_[a-z_]+", rule["expr"])}
    assert "ledgerdash_reconciler_last_pass_timestamp_seconds" in used
    assert used <= exposed, used - exposed

"""Each alert of deploy/prometheus-alerts.yml fires from the app's own metrics.

For each alert the ledger is put into the trouble the alert is about (an
attempt UNKNOWN for two hours, a reconciler that stopped, a broken chain, …),
``/metrics`` is scraped as Prometheus would, and ``promtool test rules`` is
given those samples as its input series: the alert must fire, with its
labels and summary. So a renamed metric, a lost label or a threshold the
app's numbers never cross fails here, not on a night the alert was needed.

How samples become series: a gauge holds its value; a counter grows by what
it grew between two scrapes, per minute; a Unix timestamp is taken relative
to the scrape (promtool's clock starts at 0, the scrape's at its time).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import OperationalError, connection
from django.test import Client

from ledgerdash.ledger import clock, recording
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import ChainCheck, Incident, State, Tenant
from ledgerdash.ledger.reconciler import PassSummary
from ledgerdash.ledger.workers import WorkerTotals
from ledgerdash.notify import services, worker
from ledgerdash.notify.models import Delivery, DeliveryStatus, RuleEvent
from tests.conftest import AGENT, IN_CI, record
from tests.factories import attempt_in
from tests.live import ROOT
from tests.test_ops_endpoints import metrics_on, scrape  # noqa: F401 - metrics_on is a fixture

S = State
RULES = ROOT / "deploy" / "prometheus-alerts.yml"
Sample = tuple[str, tuple[tuple[str, str], ...]]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool not installed: scripts/promtool.sh installs Debian's prometheus package"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def rules() -> dict[str, dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in loaded["groups"] for rule in group["rules"]}


def test_the_rules_pass_promtools_check() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    inside = ",".join(f"{key}={json.dumps(value)}" for key, value in labels)
    return f"{name}{{{inside}}}"


def input_series(before: dict[Sample, float], after: dict[Sample, float], at: float) -> list[dict[str, str]]:
    """The samples of ``after`` (scraped at Unix time ``at``) as promtool input series over 30 minutes."""
    series = []
    for (name, labels), value in sorted(after.items()):
        if name.endswith("_created"):
            continue
        step = 0.0
        if name.endswith(("_total", "_count", "_sum", "_bucket")):
            step = max(0.0, value - before.get((name, labels), 0.0))  # a counter not there yet was 0
        elif name.endswith("_timestamp_seconds"):
            value -= at
        series.append({"series": _series(name, labels), "values": f"{value:f}+{step:f}x30"})
    return series


def fires(alert: str, series: list[dict[str, str]], labels: dict[str, str], tmp_path: Path) -> None:
    """promtool says ``alert`` fires with ``labels`` once its ``for`` has passed, from ``series``."""
    rule = rules()[alert]
    wait = rule.get("for", "0m")
    assert wait.endswith("m")
    summary = rule["annotations"]["summary"]
    for key, value in labels.items():
        summary = summary.replace(f"{{{{ $labels.{key} }}}}", value)
    expected = [{"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": {"summary": summary}}]
    promtool_test(
        series, [{"eval_time": f"{int(wait[:-1]) + 6}m", "alertname": alert, "exp_alerts": expected}], tmp_path
    )


def promtool_test(series: list[dict[str, str]], alert_rule_tests: list[dict[str, Any]], tmp_path: Path) -> None:
    """``promtool test rules`` over the rules with ``series`` as input, one minute apart; it must pass."""
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alert_rule_tests}],
    }
    path = tmp_path / "alert-test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@contextmanager
def database_down() -> Iterator[None]:
    def refuse(*args: Any) -> Any:
        raise OperationalError("connection to server failed: Connection refused")

    with connection.execute_wrapper(refuse):
        yield


def _outbox(tenant: Tenant) -> None:
    """A rule whose channel nobody listens on: its delivery fails and waits to be tried again."""
    channel = services.channel_create(
        tenant=tenant, name="hook", kind="webhook", target="http://127.0.0.1:9/hook", actor=Actor.system("t")
    )
    services.rule_create(
        tenant=tenant, actor=Actor.system("t"), event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk
    )
    attempt_in(S.MANUAL_REVIEW, tenant, key="stuck")
    worker.run_pass(worker="alert-test")
    assert Delivery.objects.get().status == DeliveryStatus.PENDING


def _duplicate(tenant: Tenant) -> None:
    Incident.objects.create(
        tenant=tenant,
        attempt=attempt_in(S.MANUAL_REVIEW, tenant, key="twice"),
        kind=Incident.Kind.DUPLICATE,
        summary="the provider has two effects for one key",
        opened_at=clock.now(),
    )


def _broken_chain(tenant: Tenant) -> None:
    ChainCheck.objects.create(tenant=tenant, checked_at=clock.now(), ok=False, problem="edited", message="seq 3")


def _stopped_reconciler(tenant: Tenant) -> None:
    WorkerTotals("reconciler@a:1").record(PassSummary(decisions={"confirmed": 1}, claimed=1))  # type: ignore[arg-type]


#: alert: (how the ledger gets into that trouble, how long after it the scrape is, the alert's labels)
CASES: dict[str, tuple[Callable[[Tenant], Any], timedelta, dict[str, str]]] = {
    "LedgerdashUnknownOlderThanSla": (
        lambda t: attempt_in(S.UNKNOWN, t, key="k"),
        timedelta(hours=2),
        {"tenant": "acme", "state": "UNKNOWN"},
    ),
    "LedgerdashManualReviewOlderThanSla": (
        lambda t: attempt_in(S.MANUAL_REVIEW, t, key="k"),
        timedelta(hours=5),
        {"tenant": "acme", "state": "MANUAL_REVIEW"},
    ),
    "LedgerdashRecoveryBacklog": (
        lambda t: recording.mark_dispatched(record(t, "k"), actor=AGENT),
        timedelta(minutes=40),
        {"tenant": "acme"},
    ),
    "LedgerdashReconcilerStalled": (_stopped_reconciler, timedelta(minutes=20), {}),
    "LedgerdashNotifierStalled": (_outbox, timedelta(minutes=40), {}),
    "LedgerdashNotificationsDead": (
        lambda t: (_outbox(t), Delivery.objects.update(status=DeliveryStatus.DEAD)),
        timedelta(0),
        {"tenant": "acme"},
    ),
    "LedgerdashDuplicateIncident": (_duplicate, timedelta(0), {"tenant": "acme"}),
    "LedgerdashChainBroken": (_broken_chain, timedelta(0), {"tenant": "acme"}),
    # A tenant verify_audit never walked: its age counts from when it was made.
    "LedgerdashChainNotVerified": (lambda t: None, timedelta(days=3), {"tenant": "acme"}),
}


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
@pytest.mark.parametrize("alert", sorted(CASES))
def test_the_alert_fires_from_the_apps_metrics(alert: str, client: Client, tenant_a: Tenant, tmp_path: Path) -> None:
    make_trouble, later, labels = CASES[alert]
    before = scrape(client)
    make_trouble(tenant_a)
    with clock.frozen_at(clock.now() + later) as at:
        after = scrape(client)
    fires(alert, input_series(before, after, at.timestamp()), labels, tmp_path)


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_database_unavailable_fires_when_the_metrics_cannot_read_it(client: Client, tmp_path: Path) -> None:
    before = scrape(client)
    with database_down():
        after = scrape(client)
    assert after[("ledgerdash_database_up", ())] == 0
    fires("LedgerdashDatabaseUnavailable", input_series(before, after, clock.now().timestamp()), {}, tmp_path)


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_server_errors_fire_when_requests_answer_503(client: Client, tmp_path: Path) -> None:
    client.force_login(_operator())
    before = scrape(client)
    with database_down():
        for _ in range(5):
            assert client.get("/queues/unknown/").status_code == 503
    client.get("/healthz")
    after = scrape(client)
    fires("LedgerdashServerErrors", input_series(before, after, clock.now().timestamp()), {}, tmp_path)


def _operator() -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("alert-operator", password="x-alert-pw-1")


def test_ledgerdash_down_fires_on_a_failed_scrape(tmp_path: Path) -> None:
    series = [{"series": 'up{job="ledgerdash",instance="web:8000"}', "values": "0x30"}]
    fires("LedgerdashDown", series, {"job": "ledgerdash", "instance": "web:8000"}, tmp_path)


def test_every_alert_has_a_test_that_makes_it_fire() -> None:
    tested = {*CASES, "LedgerdashDatabaseUnavailable", "LedgerdashServerErrors", "LedgerdashDown"}
    assert set(rules()) == tested


@pytest.mark.django_db
@pytest.mark.usefixtures("metrics_on")
def test_a_healthy_ledger_fires_none(client: Client, tenant_a: Tenant, tmp_path: Path) -> None:
    record(tenant_a, "fresh")
    _stopped_reconciler(tenant_a)  # a pass just now
    ChainCheck.objects.create(tenant=tenant_a, checked_at=clock.now(), ok=True, reached_at=clock.now())
    before = scrape(client)
    client.get("/healthz")
    after = scrape(client)
    series = input_series(before, after, clock.now().timestamp())
    series.append({"series": 'up{job="ledgerdash",instance="web:8000"}', "values": "1x30"})
    # Right after the scrape: every condition has had its chance but the reconciler's pass is recent.
    promtool_test(series, [{"eval_time": "1m", "alertname": name, "exp_alerts": []} for name in rules()], tmp_path)

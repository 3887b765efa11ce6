"""The notify worker as operators run it: real processes on PostgreSQL,
killed mid-batch, against a real receiver process that verifies signatures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from ledgerdash.ledger.drill.runner import database_url
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Tenant
from ledgerdash.notify import services
from ledgerdash.notify.models import Delivery, DeliveryStatus, RuleEvent
from tests.live import PYTHON, ROOT, free_port, wait_for_http
from tests.test_notify import to_review

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"DATABASE_URL": database_url(), "DEBUG": "true", "LEDGERDASH_VAR_DIR": str(tmp_path), **extra})
    return env


def _worker(tmp_path: Path, label: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PYTHON, "manage.py", "notify", "--interval", "0.2", "--batch-size", "5", "--label", label],
        cwd=ROOT,
        env=_env(tmp_path, NOTIFY_SEND_TIMEOUT_SECONDS="2", NOTIFY_CLAIM_SECONDS="3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _received(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_killed_worker_loses_no_delivery(tenant_a: Tenant, tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "received.jsonl"
    url = f"http://127.0.0.1:{port}/hook"
    channel = services.channel_create(tenant=tenant_a, name="hook", kind="webhook", target=url, actor=Actor.system())
    services.rule_create(
        tenant=tenant_a, actor=Actor.system(), event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk
    )
    # Twenty transitions commit while no worker runs (everything after the
    # transition "crashed"): the events are the outbox.
    attempts = [to_review(tenant_a, f"crash-{n}") for n in range(20)]
    assert not Delivery.objects.exists()
    receiver = subprocess.Popen(
        [PYTHON, "-m", "tests.notify_receiver", str(port), channel.secret, str(log), "0.3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    workers: list[subprocess.Popen[bytes]] = []
    try:
        wait_for_http(url, proc=receiver)
        first = _worker(tmp_path, "first")
        workers.append(first)
        deadline = time.monotonic() + 120
        while len(_received(log)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # mid-batch: some claimed deliveries unsent, one maybe unrecorded
        first.wait()
        assert 3 <= len(_received(log)) < 20
        assert Delivery.objects.count() == 20
        assert Delivery.objects.filter(status=DeliveryStatus.PENDING).exists()
        workers.append(_worker(tmp_path, "second"))
        while Delivery.objects.exclude(status=DeliveryStatus.SENT).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        received = _received(log)
    finally:
        for proc in [*workers, receiver]:
            proc.kill()
            proc.wait()
    assert set(Delivery.objects.values_list("status", flat=True)) == {DeliveryStatus.SENT}
    ids = {str(pk) for pk in Delivery.objects.values_list("pk", flat=True)}
    got = Counter(str(entry["delivery"]) for entry in received)
    assert set(got) == ids, "a delivery id never reached the receiver"
    # At most the send in flight when the worker died is repeated, with its id.
    assert sum(got.values()) - len(ids) <= 1
    assert sorted(Delivery.objects.values_list("attempt_id", flat=True)) == sorted(a.pk for a in attempts)
    assert all(entry["signed"] for entry in received)


@pytest.mark.own_session
def test_the_worker_survives_terminated_connections(tenant_a: Tenant, tmp_path: Path) -> None:
    from django.db import connection

    from tests.notify_receiver import Receiver

    receiver = Receiver().start()
    channel = services.channel_create(
        tenant=tenant_a, name="hook", kind="webhook", target=receiver.url, actor=Actor.system()
    )
    receiver.secret = channel.secret
    services.rule_create(
        tenant=tenant_a, actor=Actor.system(), event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk
    )
    proc = _worker(tmp_path, "survivor")
    try:
        to_review(tenant_a, "before")
        deadline = time.monotonic() + 60
        while len(receiver.received) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(receiver.received) == 1
        # Every other session on this database is cut, the worker's among them.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (cut,) = cursor.fetchone()
        assert cut >= 1
        to_review(tenant_a, "after")
        while len(receiver.received) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, "the worker exited"
        assert len(receiver.received) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
        receiver.stop()
    assert proc.returncode == 0, out
    # Either the health check found the dead connection before a pass, or a
    # pass hit it and the loop backed off: both ways the worker carried on.
    assert "Traceback" not in out


def test_two_workers_share_the_outbox_and_send_each_delivery_once(tenant_a: Tenant, tmp_path: Path) -> None:
    from ledgerdash.notify.models import Heartbeat
    from tests.notify_receiver import Receiver

    receiver = Receiver().start()
    # Each request takes a little while, so neither worker can drain the outbox alone.
    receiver.mode, receiver.hang_seconds = "hang", 0.1
    channel = services.channel_create(
        tenant=tenant_a, name="hook", kind="webhook", target=receiver.url, actor=Actor.system()
    )
    receiver.secret = channel.secret
    services.rule_create(
        tenant=tenant_a, actor=Actor.system(), event=RuleEvent.ENTERED_MANUAL_REVIEW, channel_id=channel.pk
    )
    workers = [_worker(tmp_path, f"w{n}") for n in (1, 2)]
    try:
        deadline = time.monotonic() + 120
        # Both workers are up (each completed a pass) before there is work.
        while Heartbeat.objects.filter(worker__in=["w1", "w2"]).count() < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for n in range(40):
            to_review(tenant_a, f"shared-{n}")
        while (
            Delivery.objects.count() < 40 or Delivery.objects.exclude(status=DeliveryStatus.SENT).exists()
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        receiver.stop()
    assert Delivery.objects.filter(status=DeliveryStatus.SENT).count() == 40
    got = Counter(entry["delivery"] for entry in receiver.received)
    assert len(got) == 40
    assert set(got.values()) == {1}, "a delivery was sent twice"
    assert receiver.refused == []
    senders = Counter(
        Delivery.objects.values_list("attempts_made__worker", flat=True)  # both workers took a share
    )
    assert set(senders) == {"w1", "w2"}

"""The delivery worker: claim due deliveries, send each, record the try.

A claim pushes the delivery's ``next_try_at`` a lease ahead, in its own
short transaction (``SKIP LOCKED`` on PostgreSQL, so any number of workers
share the outbox), then the send happens with no transaction open. If the
worker dies after sending and before recording, the lease runs out and the
delivery is sent again with the same delivery id: at least once, never
lost, and the receiver drops the repeat.

Back-off after a failed try ``n`` is ``NOTIFY_BACKOFF_SECONDS * 2**(n-1)``
(at most ``NOTIFY_MAX_BACKOFF_SECONDS``), read from the ledger's clock; after
``NOTIFY_MAX_TRIES`` failed tries the delivery is dead: shown to the
tenant's admins, who can send it again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction

from ledgerdash.ledger import clock
from ledgerdash.ledger.events import Actor, EventKind
from ledgerdash.ledger.store import event_record
from ledgerdash.notify import heartbeat, outbox, senders
from ledgerdash.notify.models import Delivery, DeliveryStatus, DeliveryTry

log = logging.getLogger("ledgerdash.notify")

NOT_DEAD = "delivery {id} is {status}, not dead: only a dead delivery is sent again"


class NotDead(ValueError):
    pass


def worker_label() -> str:
    return f"notify@{socket.gethostname()}:{os.getpid()}"


def lease() -> timedelta:
    """How long a claimed delivery is left to its worker: longer than any send can take."""
    return timedelta(seconds=settings.NOTIFY_CLAIM_SECONDS)


def backoff(tries: int) -> timedelta:
    seconds = settings.NOTIFY_BACKOFF_SECONDS * 2 ** min(max(tries - 1, 0), 30)
    return timedelta(seconds=min(seconds, settings.NOTIFY_MAX_BACKOFF_SECONDS))


def claim(*, limit: int, now: datetime | None = None) -> list[Delivery]:
    """Take up to ``limit`` due deliveries for this worker for one lease."""
    now = now or clock.now()
    with transaction.atomic():
        rows = list(
            Delivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("channel")
            .filter(status=DeliveryStatus.PENDING, next_try_at__lte=now)
            .order_by("next_try_at")[:limit]
        )
        if rows:
            Delivery.objects.filter(pk__in=[r.pk for r in rows]).update(next_try_at=now + lease())
    for row in rows:
        row.next_try_at = now + lease()
    return rows


def record(*, delivery: Delivery, error: str | None, status_code: int | None, duration_ms: int, worker: str) -> str:
    """Record one try of ``delivery`` and what it means: sent, try again later, or dead.
    Returns the delivery's status after it."""
    now = clock.now()
    with transaction.atomic():
        row = Delivery.objects.select_for_update().filter(pk=delivery.pk).first()
        if row is None or row.status != DeliveryStatus.PENDING:
            return row.status if row else "gone"
        number = row.attempts_made.count() + 1
        DeliveryTry.objects.create(
            delivery=row,
            number=number,
            at=now,
            ok=error is None,
            status_code=status_code,
            error=error or "",
            duration_ms=duration_ms,
            worker=worker[:255],
        )
        tries = row.tries + 1
        if error is None:
            values = {"status": DeliveryStatus.SENT, "sent_at": now, "last_error": ""}
        elif tries >= settings.NOTIFY_MAX_TRIES:
            values = {"status": DeliveryStatus.DEAD, "last_error": error}
        else:
            values = {"next_try_at": now + backoff(tries), "last_error": error}
        Delivery.objects.filter(pk=row.pk).update(tries=tries, **values)
        return str(values.get("status", DeliveryStatus.PENDING))


def deliver(delivery: Delivery, *, worker: str) -> str:
    started = time.monotonic()
    try:
        sent = senders.send(delivery)
        error, status_code = None, sent.status_code
    except senders.SendFailed as exc:
        error, status_code = str(exc) or type(exc).__name__, exc.status_code
    except DatabaseError:
        raise  # the loop's business: close the connection, back off
    except Exception as exc:  # one bad delivery must not stop the worker: it is a failed try
        log.exception("%s: delivery %s raised", worker, delivery.pk)
        error, status_code = f"{type(exc).__name__}: {exc}"[:1000], None
    duration_ms = int((time.monotonic() - started) * 1000)
    status = record(delivery=delivery, error=error, status_code=status_code, duration_ms=duration_ms, worker=worker)
    if error:
        log.warning("%s: delivery %s to %s failed (%s): %s", worker, delivery.pk, delivery.channel, status, error)
    return status


@dataclass
class PassSummary:
    collected: int = 0
    sent: int = 0
    failed: int = 0
    dead: int = 0

    def line(self) -> str:
        return f"notify pass: {self.collected} new, {self.sent} sent, {self.failed} to retry, {self.dead} dead"


def run_pass(*, worker: str, batch_size: int = 50, stop: threading.Event | None = None) -> PassSummary:
    """Collect new deliveries, then send what is due, batch after batch."""
    summary = PassSummary()
    summary.collected = outbox.collect_events() + outbox.collect_timed()
    while not (stop is not None and stop.is_set()):
        batch = claim(limit=batch_size)
        if not batch:
            break
        for delivery in batch:
            status = deliver(delivery, worker=worker)
            if status == DeliveryStatus.SENT:
                summary.sent += 1
            elif status == DeliveryStatus.DEAD:
                summary.dead += 1
            else:
                summary.failed += 1
        if len(batch) < batch_size:
            break
    heartbeat.beat(worker=worker)
    return summary


def delivery_resend(*, delivery: Delivery, actor: Actor) -> Delivery:
    """Send a dead delivery again (same delivery id), recorded in the tenant's chain."""
    now = clock.now()
    with transaction.atomic():
        changed = Delivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.DEAD).update(
            status=DeliveryStatus.PENDING, tries=0, next_try_at=now
        )
        if not changed:
            current = Delivery.objects.filter(pk=delivery.pk).values_list("status", flat=True).first()
            raise NotDead(NOT_DEAD.format(id=delivery.pk, status=current or "gone"))
        event_record(
            tenant=delivery.tenant_id,
            kind=EventKind.NOTIFY_RESEND,
            actor=actor,
            reason=f"dead delivery {delivery.pk} to channel {delivery.channel.name!r} sent again",
            details={"delivery_id": str(delivery.pk), "channel_id": delivery.channel_id, "event": delivery.event},
        )
    delivery.refresh_from_db()
    return delivery

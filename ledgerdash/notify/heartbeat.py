"""The notification workers say when they last completed a pass (the
reconciler's own record is :mod:`ledgerdash.ledger.workers`)."""

from __future__ import annotations

from datetime import datetime

from ledgerdash.ledger import clock
from ledgerdash.notify.models import Heartbeat

NOTIFIER = "notify"


def beat(*, worker: str, kind: str, now: datetime | None = None) -> None:
    """Record that ``worker`` (one row per worker) completed a pass now."""
    Heartbeat.objects.update_or_create(worker=worker[:255], defaults={"kind": kind, "last_pass_at": now or clock.now()})


def last_pass(kind: str) -> datetime | None:
    row = Heartbeat.objects.filter(kind=kind).order_by("-last_pass_at").first()
    return row.last_pass_at if row else None

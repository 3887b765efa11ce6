"""Each notification worker says when it last completed a pass (the
reconcilers' own record is :mod:`ledgerdash.ledger.workers`)."""

from __future__ import annotations

from datetime import datetime

from ledgerdash.ledger import clock
from ledgerdash.notify.models import Heartbeat


def beat(*, worker: str, now: datetime | None = None) -> None:
    """Record that ``worker`` (one row per worker) completed a pass now."""
    Heartbeat.objects.update_or_create(worker=worker[:255], defaults={"last_pass_at": now or clock.now()})

"""Which of the store's fast paths are on.

``LEDGER_FAST_PATHS_OFF`` (comma-separated names of :data:`FAST_PATHS`)
switches some off: the benchmark that measures what each one gains does,
and anyone who wants the plain way may. A name that is not one of them is
refused by ``manage.py check`` (and every service's start)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register

#: Each fast path, and what it saves (:mod:`ledgerdash.ledger.store` says how; the
#: health check's is :mod:`ledgerdash.ops.postgresql.base`).
FAST_PATHS: dict[str, str] = {
    "one_statement": "a change and its events in one statement, not a transaction of several round trips",
    "id_blocks": "attempt ids reserved 32 at a time, not a round trip per intent",
    "remembered_authority": "the authority read last, guarded in the write, not a read per intent and dispatch",
    "compiled_read": "an attempt read by a statement built once per process, not a query compiled per read",
    "remembered_attempt": "the attempt this process wrote last, guarded in the write by the row's version, not a "
    "read per dispatch and outcome over the API",
    "quiet_health_check": "a kept connection found usable a moment ago, with nothing to read, used again without a "
    "SELECT 1 round trip",
}


def enabled(name: str) -> bool:
    """Whether the fast path ``name`` is on (they all are unless ``LEDGER_FAST_PATHS_OFF`` names it)."""
    return name not in settings.LEDGER_FAST_PATHS_OFF


@register()
def unknown_fast_paths(app_configs: Any, **kwargs: Any) -> list[Error]:
    unknown = sorted(set(settings.LEDGER_FAST_PATHS_OFF) - set(FAST_PATHS))
    if not unknown:
        return []
    return [
        Error(
            f"LEDGER_FAST_PATHS_OFF names {', '.join(unknown)}, which is not a fast path",
            hint=f"the fast paths are: {', '.join(FAST_PATHS)}",
            id="ledgerdash.E012",
        )
    ]

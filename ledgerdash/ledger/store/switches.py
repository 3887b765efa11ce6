"""Which of the store's fast paths are on.

``LEDGER_FAST_PATHS_OFF`` (comma-separated names of :data:`FAST_PATHS`)
switches some off: the benchmark that measures what each one gains does,
and anyone who wants the plain way may. A name that is not one of them is
refused by ``manage.py check`` (and every service's start)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.checks import CheckMessage, Error, register

#: Each fast path, and what it saves (:mod:`ledgerdash.ledger.store` says how).
FAST_PATHS: dict[str, str] = {
    "one_statement": "a change and its events in one statement, not a transaction of several round trips",
    "id_blocks": "attempt ids reserved 32 at a time, not a round trip per intent",
    "remembered_authority": "the authority read last, guarded in the write, not a read per intent and dispatch",
    "compiled_read": "an attempt read by a statement built once per process, not a query compiled per read",
    "remembered_attempt": "the attempt this process wrote last, guarded in the write by the row's version, not a "
    "read per dispatch and outcome over the API",
}


#: Fast paths taken out after measuring under 5% (docs/benchmarks.md): naming one
#: in ``LEDGER_FAST_PATHS_OFF`` still starts, with a warning, as it is off for good.
TAKEN_OUT: dict[str, str] = {
    "quiet_health_check": "every kept connection is asked SELECT 1 before a request uses it",
}


def enabled(name: str) -> bool:
    """Whether the fast path ``name`` is on (they all are unless ``LEDGER_FAST_PATHS_OFF`` names it)."""
    return name not in settings.LEDGER_FAST_PATHS_OFF


@register()
def unknown_fast_paths(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    named = set(settings.LEDGER_FAST_PATHS_OFF)
    found: list[CheckMessage] = [
        checks.Warning(
            f"LEDGER_FAST_PATHS_OFF names {name}, a fast path taken out: {TAKEN_OUT[name]}",
            hint="remove it from LEDGER_FAST_PATHS_OFF",
            id="ledgerdash.W012",
        )
        for name in sorted(named & set(TAKEN_OUT))
    ]
    unknown = sorted(named - set(FAST_PATHS) - set(TAKEN_OUT))
    if unknown:
        found.append(
            Error(
                f"LEDGER_FAST_PATHS_OFF names {', '.join(unknown)}, which is not a fast path",
                hint=f"the fast paths are: {', '.join(FAST_PATHS)}",
                id="ledgerdash.E012",
            )
        )
    return found

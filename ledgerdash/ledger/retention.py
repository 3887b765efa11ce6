"""How long a provider keeps what a preset's lookup reads, as the tool said
it at each moment.

Some providers let an account choose how long they keep what they did
(Postmark 7 to 365 days, Twilio 7 to 400): the tool's ``retention_days``
says what the account chose. Changing it is a configuration change like any
other (an event in the chains of the tenants that use the tool,
:mod:`ledgerdash.ledger.configuration`); here it also becomes a row
(:class:`~ledgerdash.ledger.models.ToolRetention`) that says from when the
new value holds. A "not found" is evidence only while the provider still
keeps the call, and which setting keeps a call depends on when it was sent:

- Postmark applies a change "only to messages processed going forward": an
  email is kept as long as the setting in force when Postmark processed it
  (``WHEN_SENT``). The emails a call may have made were processed between
  its first dispatch and the moment its last request could no longer land.
- Twilio's is a window over what its API shows; its pages do not say that a
  shorter one spares the messages already kept (``WHEN_READ``). A message
  counts as kept only as long as the shortest window in force from its
  first dispatch until the lookup.

Either way the answer is the shortest setting in force over that stretch,
from the one clock (:mod:`ledgerdash.ledger.clock`). The tool hears of a
change when a person makes it here, not when the account changed: making a
shorter retention here first and a longer one at the provider first keeps
every error on the side of "proves nothing" (docs/providers.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ledgerdash.ledger import clock
from ledgerdash.ledger.models import Attempt, Tool, ToolRetention
from ledgerdash.ledger.providers.base import ProviderAdapter
from ledgerdash.ledger.providers.factory import ToolSpec, preset_facts
from ledgerdash.ledger.providers.presets import PresetAdapter
from ledgerdash.ledger.providers.presets.common import WHEN_SENT

#: When the value a tool had before its first recorded change is taken to hold from.
BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)


def _days(tool: Tool, config: Any) -> int | None:
    """What ``tool`` configured as ``config`` says its provider keeps, in days (None: its preset lets no
    account choose)."""
    preset = preset_facts(ToolSpec(tool.name, tool.adapter, config))
    if preset is None or preset.retention_range is None:
        return None
    try:
        return int(preset.parse_config(config)["retention_days"])
    except (TypeError, ValueError):
        return None


def note(tool: Tool, before_config: Mapping[str, Any] | None) -> None:
    """Record from now on what ``tool`` (just written) says its provider keeps, when that changed;
    ``before_config``: its configuration before the write (None: it was just made). Called by the
    configuration recorder inside the write's transaction."""
    days = _days(tool, tool.config)
    if days is None:
        return
    before = _days(tool, before_config) if before_config is not None else None
    if before == days:
        return
    known = ToolRetention.objects.filter(tool_name=tool.name)
    if before is not None and not known.exists():
        # A tool older than its history: what it said before holds from the start.
        ToolRetention.objects.create(tool_name=tool.name, days=before, since=BEGINNING)
    ToolRetention.objects.create(tool_name=tool.name, days=days, since=clock.now())


def kept(tool_name: str, adapter: ProviderAdapter, attempt: Attempt, asked_at: datetime) -> timedelta | None:
    """How long after ``attempt``'s first dispatch its provider surely still keeps what the lookup
    reads, for a lookup asked at ``asked_at`` (None: for as long as it matters)."""
    first = attempt.first_dispatched_at
    if not isinstance(adapter, PresetAdapter) or adapter.retention_range is None or first is None:
        return adapter.lookup_retention
    until = asked_at
    if adapter.retention_applies == WHEN_SENT and attempt.lands_by is not None:
        until = min(attempt.lands_by, asked_at)
    in_force: list[int] = []
    rows = ToolRetention.objects.filter(tool_name=tool_name, since__lte=until).order_by("-since", "-id")
    for since, days in rows.values_list("since", "days"):
        in_force.append(days)
        if since <= first:
            break
    if not in_force:
        return adapter.lookup_retention  # no change since the tool was made before its history began
    return timedelta(days=min(in_force))

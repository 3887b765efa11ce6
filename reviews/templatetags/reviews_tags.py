"""Small helpers for the dashboard's templates."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils.safestring import SafeString

from ledgerdash.ledger.models import Attempt, AttemptEvent
from reviews import display, history, queries, rows

register = template.Library()


@register.simple_tag(takes_context=True)
def queue_counts(context: template.Context) -> dict[str, int]:
    """The live counts of the user's queues (for the navigation)."""
    if "counts" in context:
        return context["counts"]
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return {}
    return queries.queue_counts(request.user)


@register.filter
def short_hash(value: str, length: int = 12) -> str:
    return value[:length]


@register.filter
def age(value: datetime | None, now: datetime | None = None) -> str:
    """A compact age: 45s, 12m, 3h, 4d."""
    return display.age(value, now)


@register.simple_tag(takes_context=True)
def attempt_row(context: template.Context, attempt: Attempt) -> SafeString:
    """One row of an attempt list, written by ``reviews.rows`` (a queue
    page's rows, drawn cell by cell in the template, were most of its time)."""
    return rows.row(attempt, rows.setting_for(context))


@register.filter
def duration_words(value: timedelta | None) -> str:
    """A duration for people: "4 hours", "90 minutes", "2 days"."""
    if value is None:
        return ""
    minutes = int(value.total_seconds() // 60)
    for unit, size in (("day", 1440), ("hour", 60)):
        if minutes >= size and minutes % size == 0:
            n = minutes // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON text; autoescaped by the template like any string."""
    from reviews.diffs import as_json

    return as_json(value)


@register.filter
def count_label(value: int | None) -> str:
    """A queue count for people: "999+" past the cap."""
    if value is None:
        return "0"
    return f"{queries.COUNT_CAP}+" if value > queries.COUNT_CAP else str(value)


@register.filter
def tool_kind(case: dict[str, Any]) -> str:
    """How a drill case's tool records, in words. Reports stored before
    cases said ``claimed`` read as not claiming, which they did not."""
    if case.get("claimed"):
        return "idempotent, its dispatch claimed with the intent"
    return "idempotent" if case.get("idempotent") else "not idempotent"


@register.filter
def compact_json(value: Any) -> str:
    """One-line JSON with sorted keys: dense enough for a printed report."""
    return display.compact_json(value)


def _limit(arg: Any) -> int | None:
    # Templates pass a number, or a context variable that is empty where
    # nothing is cut (the screen) and a number where it is (a PDF).
    try:
        return int(arg) if arg else None
    except (TypeError, ValueError):
        return None


@register.filter
def untrusted(value: Any, limit: Any = None) -> SafeString:
    """Untrusted text on one line: escaped, isolated (``<bdi>``), hidden
    characters marked, cut after ``limit`` characters if given."""
    return display.untrusted(value, _limit(limit))


@register.filter
def untrusted_block(value: Any, limit: Any = None) -> SafeString:
    """Untrusted text in a ``<pre>``: as :func:`untrusted`, line feeds and tabs kept."""
    return display.untrusted(value, _limit(limit), block=True)


@register.filter
def untrusted_more(value: Any, limit: Any = 300) -> SafeString:
    """Untrusted text cut after ``limit`` characters, the rest one click away."""
    return display.expandable(value, _limit(limit) or 300, block=True)


@register.filter
def visible(value: Any) -> str:
    """Untrusted text where markup cannot go (attributes, ``<title>``,
    ``<option>``): hidden characters written as ``[U+202E]``."""
    return display.visible_text(value)


@register.filter
def owner_change(event: AttemptEvent, names: dict[int, str]) -> history.OwnerChange | None:
    return history.owner_change(event, names or {})

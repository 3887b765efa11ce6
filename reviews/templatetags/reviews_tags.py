"""Small helpers for the dashboard's templates."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from reviews import queries

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
    if value is None:
        return ""
    seconds = max(0, int(((now or timezone.now()) - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


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
def compact_json(value: Any) -> str:
    """One-line JSON with sorted keys: dense enough for a printed report."""
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))

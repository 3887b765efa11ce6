"""The one place the export benchmark calls the project's streaming export.

The streaming CSV export is its own piece of work; this adapter looks for
its entry point and writes one tenant's audit CSV to a binary stream. When
the export's API settles, adjust ``stream_export`` (and, if its query
differs, ``COPY_QUERY``) here; nothing else in bench/ needs to change.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO

#: What the peer, PostgreSQL's COPY, exports: the same rows as the export
#: (one tenant's events in chain order), as CSV.
COPY_QUERY = """
SELECT e.seq, e.created_at, e.attempt_id, a.tool_name, a.idempotency_key, e.kind, e.actor_kind, e.actor_label,
       e.from_state, e.to_state, e.fence, e.reason, e.details, e.content_hash, e.prev_hash, e.hash
FROM ledger_attemptevent e LEFT JOIN ledger_attempt a ON a.id = e.attempt_id
WHERE e.tenant_id = {tenant_id}
ORDER BY e.seq
"""


class ExportUnavailable(Exception):
    """This build has no streaming export to measure (or not the one expected)."""


def stream_export(tenant_slug: str, out: BinaryIO) -> str:
    """Write ``tenant_slug``'s audit export as CSV to ``out``; returns which
    entry point ran. Raises :class:`ExportUnavailable` when there is none."""
    from django.core.management import call_command, get_commands

    from ledgerdash.ledger.models import Tenant

    tenant = Tenant.objects.get(slug=tenant_slug)
    stream_csv = _find("reviews.exports", "stream_csv")
    if stream_csv is not None:
        try:
            for chunk in stream_csv(tenant=tenant):
                out.write(chunk if isinstance(chunk, bytes) else str(chunk).encode())
        except TypeError as exc:
            raise ExportUnavailable(f"reviews.exports.stream_csv exists but not as expected here: {exc}") from exc
        return "reviews.exports.stream_csv"
    if "export_audit" in get_commands():
        text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
        try:
            call_command("export_audit", "--tenant", tenant_slug, "--format", "csv", stdout=text)
        except Exception as exc:
            raise ExportUnavailable(f"manage.py export_audit exists but not as expected here: {exc}") from exc
        return "manage.py export_audit"
    raise ExportUnavailable(
        "export not available in this build (no reviews.exports.stream_csv, no manage.py export_audit)"
    )


def _find(module: str, name: str) -> Any:
    try:
        imported = __import__(module, fromlist=[name])
    except ImportError:
        return None
    return getattr(imported, name, None)

"""The one place the export benchmark calls the project's streaming export.

It writes one tenant's full audit CSV to a binary stream through
``reviews.exports.stream``; the peer, PostgreSQL's COPY, runs ``COPY_QUERY``
(the same events in chain order with their attempts' columns).
"""

from __future__ import annotations

from typing import BinaryIO

#: What the peer, PostgreSQL's COPY, exports: the same rows as the export
#: (one tenant's events in chain order), as CSV.
COPY_QUERY = """
SELECT e.seq, e.id, e.kind, e.created_at, e.actor_kind, e.actor_user_id, e.actor_label, e.from_state, e.to_state,
       e.fence, e.reason, e.details, e.content_hash, e.prev_hash, e.hash,
       a.id, a.task_id, a.tool_name, a.idempotency_key, a.args_hash, a.args, a.provider_key, a.provider_request_id,
       a.policy_version, a.credential_scope, a.state, u.username, a.parent_id, a.created_at
FROM ledger_attemptevent e
LEFT JOIN ledger_attempt a ON a.id = e.attempt_id
LEFT JOIN auth_user u ON u.id = a.owner_id
WHERE e.tenant_id = {tenant_id}
ORDER BY e.seq
"""


class ExportUnavailable(Exception):
    """This build has no streaming export to measure (or not the one expected)."""


def stream_export(tenant_slug: str, out: BinaryIO) -> str:
    """Write ``tenant_slug``'s full audit export as CSV to ``out`` through
    the real streaming export (the code behind the dashboard's download and
    ``manage.py export_audit``); returns which entry point ran."""
    from ledgerdash.ledger.events import Actor
    from ledgerdash.ledger.models import Tenant

    try:
        from reviews import exports
    except ImportError as exc:
        raise ExportUnavailable(f"export not available in this build: {exc}") from exc
    tenant = Tenant.objects.get(slug=tenant_slug)
    request = exports.ExportRequest(tenants=[tenant], format="csv", actor=Actor.system("bench"))
    for text in exports.stream(request):
        out.write(text.encode())
    return "reviews.exports.stream"

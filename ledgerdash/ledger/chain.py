"""The per-tenant hash chain over events.

Each tenant's events form one chain ordered by ``seq`` (1, 2, 3, …):

    content_hash = sha256(RFC 8785 canonical JSON of event_content(event))
    hash         = sha256(bytes.fromhex(prev_hash) + bytes.fromhex(content_hash))

with ``prev_hash`` of the first event being :data:`GENESIS`. Editing an event
changes its content hash; removing or reordering one breaks the links after
it; removing the newest ones leaves the tenant's :class:`ChainHead` pointing
past the end. Per tenant rather than global: tenants never queue behind each
other's writes, and an auditor verifies one tenant's export on its own.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from ledgerdash.ledger.canonical import canonical_bytes, sha256_hex

GENESIS = "0" * 64


def timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def event_content(
    *,
    tenant_id: int,
    attempt_id: int | None,
    kind: str,
    actor_kind: str,
    actor_user_id: int | None,
    actor_label: str,
    from_state: str,
    to_state: str,
    fence: int | None,
    reason: str,
    details: dict[str, Any],
    created_at: datetime,
) -> dict[str, Any]:
    """The fields an event's hash covers (everything but its position and links)."""
    return {
        "tenant_id": tenant_id,
        "attempt_id": attempt_id,
        "kind": kind,
        "actor_kind": actor_kind,
        "actor_user_id": actor_user_id,
        "actor_label": actor_label,
        "from_state": from_state,
        "to_state": to_state,
        "fence": fence,
        "reason": reason,
        "details": details,
        "created_at": timestamp(created_at),
    }


def content_hash(content: dict[str, Any]) -> str:
    return sha256_hex(canonical_bytes(content))


def link(prev_hash: str, content_hash_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + bytes.fromhex(content_hash_hex)).hexdigest()

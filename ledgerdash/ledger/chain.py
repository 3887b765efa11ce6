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


#: The fields of an event its content hash covers: everything but its
#: position (``seq``) and its links, which the chain itself covers.
HASHED_FIELDS = (
    "tenant_id",
    "attempt_id",
    "kind",
    "actor_kind",
    "actor_user_id",
    "actor_label",
    "from_state",
    "to_state",
    "fence",
    "reason",
    "details",
    "created_at",
)


def event_content(event: Any) -> dict[str, Any]:
    """The hashed fields of ``event`` (a model instance or anything with those attributes)."""
    content = {name: getattr(event, name) for name in HASHED_FIELDS}
    content["created_at"] = timestamp(content["created_at"])
    return content


def content_hash(content: dict[str, Any]) -> str:
    return sha256_hex(canonical_bytes(content))


def link(prev_hash: str, content_hash_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + bytes.fromhex(content_hash_hex)).hexdigest()

"""The per-tenant hash chains over events.

A tenant's events form one chain ordered by ``seq`` (1, 2, 3, …):

    content_hash = sha256(RFC 8785 canonical JSON of event_content(event))
    hash         = sha256(bytes.fromhex(prev_hash) + bytes.fromhex(content_hash))

with ``prev_hash`` of the first event being :data:`GENESIS`. Editing an event
changes its content hash; removing or reordering one breaks the links after
it; removing the newest ones leaves the tenant's :class:`ChainHead` pointing
past the end. Per tenant rather than global: tenants never queue behind each
other's writes, and an auditor verifies one tenant's export on its own.

**Stripes.** Appending locks the chain's head until the commit is on disk,
so one chain takes one event per disk flush, however many agents wait. A
tenant with ``chain_stripes`` = N > 1 keeps N chains ("stripes") side by
side, each exactly as above: an attempt's events all go to stripe
``attempt id mod N`` (events about the tenant as a whole to stripe 0), so
one attempt's history is one chain's order, and agents working on different
attempts lock different heads. The seqs interleave: stripe ``s`` numbers its
events ``s + 1``, ``s + 1 + N``, ``s + 1 + 2N``, …, so a seq is unique in the
tenant and names its stripe (:func:`stripe_of_seq`), and a tenant with one
stripe is numbered 1, 2, 3, … as it always was. What stripes give up: the
seq no longer orders events across stripes by time (a busy stripe numbers
ahead of a quiet one), and a head (or a known head) speaks for its stripe
only. Each stripe is verified on its own; readers that follow the whole
tenant in commit order keep a position per stripe.
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


def stripe_of(attempt_id: int | None, stripes: int) -> int:
    """The stripe an event about ``attempt_id`` (None: about the tenant) goes to."""
    return attempt_id % stripes if attempt_id is not None else 0


def stripe_of_seq(seq: int, stripes: int) -> int:
    """The stripe the event at ``seq`` belongs to."""
    return (seq - 1) % stripes


def next_seq(head_seq: int, stripe: int, stripes: int) -> int:
    """The seq after ``head_seq`` in ``stripe`` (``head_seq`` 0: its first)."""
    return head_seq + stripes if head_seq else stripe + 1


def past(seq: int, positions: list[int]) -> bool:
    """Whether the event at ``seq`` comes after ``positions``: a seq for each
    of the tenant's chains, in chain order (none: after everything)."""
    return not positions or seq > positions[stripe_of_seq(seq, len(positions))]


def count_up_to(seq: int, stripes: int) -> int:
    """How many events the chain that ``seq`` is in has up to it (0 for no seq)."""
    return (seq - 1) // stripes + 1 if seq > 0 else 0

"""Webhook signatures: how the ledger signs a body, and how a receiver checks one.

Every webhook request carries::

    X-Ledgerdash-Delivery:  the delivery id (also in the body): drop a repeat
    X-Ledgerdash-Timestamp: Unix seconds when this send was signed
    X-Ledgerdash-Signature: v1=<hex HMAC-SHA256 of "<timestamp>." + body, keyed by the channel's secret>

A receiver recomputes the HMAC over the raw body bytes, compares it in
constant time, and refuses a timestamp further than the tolerance (five
minutes by default) from its own clock, so a captured request cannot be
replayed later. :func:`verify` is that recipe; docs/notifications.md shows it in
standard-library Python for receivers that do not import ledgerdash.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

DELIVERY_HEADER = "X-Ledgerdash-Delivery"
TIMESTAMP_HEADER = "X-Ledgerdash-Timestamp"
SIGNATURE_HEADER = "X-Ledgerdash-Signature"
SCHEME = "v1"

BAD_SIGNATURE = "the signature does not match the body"
BAD_TIMESTAMP = "the timestamp is not a whole number of seconds"
STALE_TIMESTAMP = "the timestamp is {age:.0f}s from now, outside the {tolerance}s window: a replay or a wrong clock"
NO_SIGNATURE = "no v1 signature in the header"


class SignatureError(ValueError):
    pass


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"{SCHEME}={digest}"


def verify(secret: str, *, timestamp: str, body: bytes, signature: str, now: float, tolerance: int = 300) -> None:
    """Raise :class:`SignatureError` unless ``signature`` signs ``body`` at
    ``timestamp`` with ``secret`` and ``timestamp`` is within ``tolerance``
    seconds of ``now``."""
    try:
        stamp = int(timestamp)
    except (TypeError, ValueError):
        raise SignatureError(BAD_TIMESTAMP) from None
    if abs(now - stamp) > tolerance:
        raise SignatureError(STALE_TIMESTAMP.format(age=now - stamp, tolerance=tolerance))
    offered = [part.strip() for part in signature.split(",") if part.strip().startswith(f"{SCHEME}=")]
    if not offered:
        raise SignatureError(NO_SIGNATURE)
    expected = sign(secret, stamp, body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in offered):
        raise SignatureError(BAD_SIGNATURE)

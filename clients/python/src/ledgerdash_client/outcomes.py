"""What a tool says about its own call, when the provider was clear: raise
these from a tool wrapped for the ledger (in process or over HTTP)."""

from __future__ import annotations


class NothingHappened(Exception):
    """Raise from a tool when the provider guarantees it did not act (it
    rejected the request before acting). The attempt becomes FAILED_RETRYABLE
    and may be retried with the same key."""


class PermanentFailure(Exception):
    """Raise from a tool when the provider definitively refused; the attempt
    becomes FAILED and is not retried."""

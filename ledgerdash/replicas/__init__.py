"""Replicas of the providers the presets reach: small local servers that
answer each provider's documented requests in its documented shapes, with
its semantics (whether it deduplicates and for how long, how it refuses a
reused key, how far its search lags) and switchable faults (429s, 5xx, a
dropped connection after acting, a request held past its caller). The
presets' tests and ``manage.py crashdrill --provider NAME`` run them; the
providers' own SDKs are pointed at them in the tests.

Standalone: nothing of Django or the ledger is imported (see :mod:`.core`).
"""

from __future__ import annotations

import importlib

from ledgerdash.replicas.core import Replica

#: provider name -> the module and class of its replica
REPLICAS = {
    "stripe": ("ledgerdash.replicas.stripe", "Stripe"),
    "slack": ("ledgerdash.replicas.slack", "Slack"),
    "github": ("ledgerdash.replicas.github", "GitHub"),
    "postmark": ("ledgerdash.replicas.postmark", "Postmark"),
    "twilio": ("ledgerdash.replicas.twilio", "Twilio"),
    "jira": ("ledgerdash.replicas.jira", "Jira"),
}


def replica(name: str) -> Replica:
    """A new replica of provider ``name``."""
    if name not in REPLICAS:
        raise ValueError(f"no replica of {name!r}; there are: {', '.join(REPLICAS)}")
    module, cls = REPLICAS[name]
    return getattr(importlib.import_module(module), cls)()

"""The providers' replicas as the tests use them: one server per provider,
on a thread of the test process, and each preset's adapter pointed at it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerdash.ledger.drill.processes import ReplicaControl
from ledgerdash.ledger.providers.presets import PRESETS, PresetAdapter
from ledgerdash.replicas import replica
from ledgerdash.replicas.core import ReplicaServer

ACCOUNT_SID = "AC" + "0" * 31 + "1"
#: The secrets the presets name by default, as the replicas take them.
SECRETS = {
    "STRIPE_SECRET_KEY": "sk_test_replica",
    "SLACK_BOT_TOKEN": "xoxb-replica",
    "GITHUB_TOKEN": "ghp_replica",
    "POSTMARK_SERVER_TOKEN": "server-token-replica",
    "TWILIO_AUTH_TOKEN": "twilio-token-replica",
    "JIRA_API_TOKEN": "jira-token-replica",
}
#: What each provider's tools need besides the preset and the replica's address.
SETTINGS: dict[str, dict[str, str]] = {
    "github": {"repository": "acme/shop"},
    "twilio": {"account_sid": ACCOUNT_SID},
    "jira": {"email": "agent@example.com"},
}


def config_for(preset: str, url: str, **extra: str) -> dict[str, Any]:
    """A tool configuration of ``preset`` pointed at the replica at ``url``."""
    provider = preset.split(".")[0]
    return {"preset": preset, "base_url": url, **SETTINGS.get(provider, {}), **extra}


def adapter_for(preset: str, url: str, *, lag_stated: bool = True, **extra: str) -> PresetAdapter:
    """``preset``'s adapter pointed at the replica at ``url``, as a tool that states its lookup's lag
    (``lag_stated``: its ``lookup_lag_seconds`` set) would have it."""
    adapter = PRESETS[preset](f"test.{preset}", config_for(preset, url, **extra))
    adapter.max_request_seconds = 3.0
    adapter.lookup_timeout = 2.0
    adapter.lag_stated = lag_stated
    return adapter


@pytest.fixture(autouse=True)
def provider_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


@contextlib.contextmanager
def replica_server(provider: str) -> Iterator[str]:
    """A replica of ``provider`` served by a thread of this process on a free
    port: the adapters reach it over real HTTP, and what it runs is measured
    with the rest (``crashdrill --provider`` runs it as a process of its own:
    ``replica_service``)."""
    server = ReplicaServer(("127.0.0.1", 0), replica(provider))
    thread = threading.Thread(target=server.serve_forever, name=f"{provider} replica", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Replicas:
    """Replicas started on first use, one per provider, for the whole module."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.urls: dict[str, str] = {}

    def url(self, provider: str) -> str:
        if provider not in self.urls:
            self.urls[provider] = self.stack.enter_context(replica_server(provider))
        return self.urls[provider]

    def control(self, provider: str) -> ReplicaControl:
        return ReplicaControl(self.url(provider))


@pytest.fixture(scope="module")
def replicas() -> Iterator[Replicas]:
    started = Replicas()
    with started.stack:
        yield started


@pytest.fixture
def kind_again(replicas: Replicas) -> Iterator[None]:
    """After the test, every replica it used is its kind self again: modes off, faults cleared."""
    yield
    for provider in list(replicas.urls):
        control = replicas.control(provider)
        control.kind()
        control.clear()

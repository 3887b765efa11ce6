"""The sandbox provider service (see :mod:`.server`). Standalone: it imports
nothing of Django or the ledger, as a real provider would not."""


def http_adapter_config(base_url: str, **overrides: object) -> dict[str, object]:
    """The generic HTTP adapter's configuration for a tool served by this
    sandbox at ``base_url``: proof that a provider with a lookup API needs
    configuration, not code."""
    base = base_url.rstrip("/")
    config: dict[str, object] = {
        "dispatch_url": base + "/tools/{tool}/effects",
        "idempotency_header": "Idempotency-Key",
        "request_id_path": "id",
        "lookup_url": base + "/tools/{tool}/effects?key={key}",
        "lookup_request_id_path": "id",
        "lookup_payload_hash_path": "payload_hash",
        "lookup_not_found_statuses": [404],
        "lookup_timeout": 2.0,
    }
    config.update(overrides)
    return config

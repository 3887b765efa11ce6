"""Helpers for the ingest API tests: tokens, and a test client that speaks the API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.test import Client

from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import TokenScope
from ledgerdash.ledger.tokens import token_create

BASE = "/api/v1"
READ = TokenScope.READ.value
WRITE = TokenScope.WRITE.value
BOTH = (READ, WRITE)


def issue_token(tenant: Any, *scopes: str, expires_at: datetime | None = None, name: str = "test agent") -> str:
    _, raw = token_create(
        tenant=tenant, name=name, scopes=scopes or BOTH, actor=Actor.system("tests"), expires_at=expires_at
    )
    return raw


def intent(key: str = "invoice:7:send", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task_id": "task-1",
        "tool_name": "send_email",
        "idempotency_key": key,
        "args": {"to": "ap@example.com", "invoice": 7},
    }
    body.update(overrides)
    return body


class Api:
    """A Django test client with the bearer token set; paths are relative to /api/v1."""

    def __init__(self, token: str | None, client: Client | None = None) -> None:
        self.client = client or Client()
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> Any:
        """``method`` with ``body`` as JSON (or ``raw`` bytes as they are)."""
        data: bytes | str = raw if raw is not None else (b"" if body is None else json.dumps(body))
        return getattr(self.client, method)(
            BASE + path, data=data, content_type=content_type, headers={**self.headers, **(headers or {})}, **extra
        )

    def post(self, path: str, body: Any = None, **options: Any) -> Any:
        return self.request("post", path, body, **options)

    def get(self, path: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
        return self.client.get(BASE + path, params or {}, headers={**self.headers, **(headers or {})})

    def record(self, key: str = "invoice:7:send", **overrides: Any) -> dict[str, Any]:
        response = self.post("/attempts", intent(key, **overrides))
        assert response.status_code in (200, 201), response.content
        return response.json()

    def dispatch(self, attempt_id: int, **body: Any) -> Any:
        return self.post(f"/attempts/{attempt_id}/dispatch", body or None)

    def outcome(self, attempt_id: int, outcome: str, fence: int, **fields: Any) -> Any:
        return self.post(f"/attempts/{attempt_id}/outcome", {"outcome": outcome, "fence": fence, **fields})

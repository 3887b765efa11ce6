"""The ingest API's middleware chain is built without touching the settings.

It used to be built by swapping ``settings.MIDDLEWARE`` under a lock; the
settings object caches what a thread reads, so a handler built at the same
moment elsewhere could leave the dashboard's list in that cache and the API's
chain would load itself again inside the lock: the test client deadlocked.
Many threads build handlers and read the settings at once here; every one
finishes, and each chain is the API's own.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpResponse

from ledgerdash.ledger.models import Tenant
from ledgerdash.middleware import ApiRequests
from tests.api_support import Api, intent, issue_token


def test_api_chains_are_built_concurrently_from_their_own_list() -> None:
    pages = list(settings.MIDDLEWARE)
    built: list[ApiRequests] = []
    failed: list[BaseException] = []

    def build() -> None:
        try:
            for _ in range(30):
                assert list(settings.MIDDLEWARE) == pages
                built.append(ApiRequests(lambda request: HttpResponse("page")))
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=build, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "building the API's chain deadlocked"
    assert failed == []
    assert len(built) == 8 * 30
    assert list(settings.MIDDLEWARE) == pages
    chain: Any = built[-1].api._middleware_chain
    assert chain is not None
    names = {type(m.__self__).__name__ for m in built[-1].api._exception_middleware if hasattr(m, "__self__")}
    assert "DatabaseUnavailableMiddleware" in names


@pytest.mark.parametrize(
    ("method", "path", "auth"),
    [
        ("post", "/attempts", True),  # 201, an attempt
        ("post", "/attempts", False),  # 401 missing_token
        ("get", "/attempts/999999", True),  # 404 attempt_not_found
        ("get", "/nowhere", True),  # 404 from the guard, for a path the API does not serve
    ],
)
def test_every_answer_states_its_length(method: str, path: str, auth: bool, tenant_a: Tenant) -> None:
    """Without a Content-Length, gunicorn sends the answer chunked: a third write and a chunked read per request."""
    api = Api(issue_token(tenant_a) if auth else None)
    answer = api.post(path, intent("k-length")) if method == "post" else api.get(path)
    assert answer.status_code in (201, 401, 404), answer.content
    assert answer["Content-Length"] == str(len(answer.content))

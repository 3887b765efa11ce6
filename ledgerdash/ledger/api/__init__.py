"""The ingest API: the recording API over HTTP, for agents in any language.

``/api/v1/``, JSON, one bearer token per agent (:mod:`.auth`). Endpoints
(:mod:`.attempts`) parse, authorize, call one function of
:mod:`ledgerdash.ledger.recording` and return the attempt, which the
response schemas render; they never write attempt rows themselves. Every
error answer is ``{"code": …, "message": …}`` with the ledger's stable codes
(:mod:`.errors`), and a refused request writes nothing (the one exception is
the ledger's own rule: an idempotency key reused with other arguments
records a linked attempt for review and answers 409 naming it).

Checks run in this order, so an answer says the first thing wrong:
body size (before anything is read, :mod:`.guard`), token, scope, content
type, JSON (:mod:`.parsing`), schema, then the ledger's own validation and
state machine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver
from django.utils.csp import CSP, build_policy
from ninja import NinjaAPI
from ninja.openapi.schema import OpenAPISchema

from ledgerdash.ledger.api import approvals, attempts, openapi
from ledgerdash.ledger.api.errors import API_CODES, STATUS_BY_CODE, install_handlers
from ledgerdash.ledger.api.guard import guarded_urls
from ledgerdash.ledger.api.parsing import StrictJsonParser
from ledgerdash.ledger.api.rendering import JsonRenderer

__all__ = ["API_CODES", "STATUS_BY_CODE", "api", "urls"]


def under_the_sites_csp(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The API's own chain sets no Content-Security-Policy (its answers are JSON); its docs page is
    HTML, so it gets the site's policy (``SECURE_CSP``), as every dashboard page does."""

    @functools.wraps(view)
    def docs(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        policy = cast("Mapping[str, Collection[str]]", settings.SECURE_CSP)  # settings.py: lists of sources
        response.headers[str(CSP.HEADER_ENFORCE)] = build_policy(policy)
        return response

    return docs


class LedgerApi(NinjaAPI):
    def get_openapi_schema(self, **kwargs: Any) -> OpenAPISchema:
        document = super().get_openapi_schema(**kwargs)
        openapi.complete(document)
        return document


api = LedgerApi(
    title="ledgerdash ingest API",
    version="1",
    description=(
        "Record an agent's side effects in the ledger before they happen: record the intent, claim it for "
        "dispatch (the claim returns a fence), call the provider, report the outcome with the fence. "
        "Every error is `{code, message}` (with `attempt_id` and `state` when it is about an attempt); each error "
        "status lists the codes it may carry."
    ),
    urls_namespace="ledger-api-v1",
    # Swagger UI from ninja's own static files (no CDN; its settings are a JSON block, not a script), under the CSP.
    docs_url="/docs",
    docs_decorator=under_the_sites_csp,
    parser=StrictJsonParser(),
    renderer=JsonRenderer(),
)
api.add_router("", attempts.router)
api.add_router("", approvals.router)
install_handlers(api)


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, each behind the body check, with JSON answers
    for unknown paths and methods. Include under ``api/v1/``."""
    return guarded_urls(api)

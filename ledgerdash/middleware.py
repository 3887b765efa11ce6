"""Project-wide HTTP middleware."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, MiddlewareNotUsed
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.cache import add_never_cache_headers
from django.utils.http import http_date
from django.utils.module_loading import import_string

#: What ``add_never_cache_headers`` writes in a response that says nothing of caching.
NEVER_CACHE = "max-age=0, no-cache, no-store, must-revalidate, private"
#: Where the ingest API is served (ledgerdash/urls.py); everything under it answers JSON.
API_ROOT = "/api/v1/"


class NoStoreMiddleware:
    """Nothing the application answers is kept by a browser or a proxy cache.

    Every page shows tenant data to a logged-in person, every export and
    report is audit data, and every API answer is a tenant's ledger: a copy
    left in a shared machine's disk cache, or in a proxy, outlives the
    session that was allowed to see it. Static files are answered by
    whitenoise before this runs and stay cacheable. A response that already
    says how to cache it keeps ``no-store`` added to what it says
    (Django's ``add_never_cache_headers``, which parses and merges); one
    that says nothing, nearly every answer, gets the two headers that
    function would write, as they are (a tenth of the time: 30 us of an API
    request's Python went to the merge).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        headers = response.headers
        if "Cache-Control" in headers or "Expires" in headers:
            add_never_cache_headers(response)
        else:
            headers["Expires"] = http_date(time.time())
            headers["Cache-Control"] = NEVER_CACHE
        return response


class ContentLengthMiddleware:
    """Every answer of the ingest API states its length.

    An answer without ``Content-Length`` is sent chunked by gunicorn: its
    headers, the body as a chunk, then the last chunk, three writes instead
    of two, and the client reads it chunk by chunk. On loopback that cost an
    agent's request about as much as its statement. The dashboard's answers
    get theirs from Django's ``CommonMiddleware``, whose other work (slash
    redirects, refused user agents) has no place in the API's chain; this
    is its one line for the API. First in ``API_MIDDLEWARE``, so it measures
    the body as sent."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if not response.streaming and "Content-Length" not in response.headers:
            response.headers["Content-Length"] = str(len(response.content))  # type: ignore[attr-defined]
        return response


class ApiHandler(BaseHandler):
    """Django's request handler over the ingest API's own middleware list
    (``settings.API_MIDDLEWARE``), loaded as :meth:`BaseHandler.load_middleware`
    loads ``settings.MIDDLEWARE`` on the synchronous path (the API's
    middleware are all synchronous).

    Django's loader reads ``settings.MIDDLEWARE`` only, so the list used to
    be swapped into the settings for the call, under a lock: but the settings
    object caches what a thread reads, so a handler built at the same moment
    in another thread (the test client builds one per request) could put the
    dashboard's list back into that cache, and the API's chain would then
    load ``ApiRequests`` again, inside the lock: a deadlock. This loader
    touches no setting."""

    def load_middleware(self, is_async: bool = False) -> None:
        if is_async:
            raise ImproperlyConfigured("the ingest API's middleware chain is synchronous")
        self._view_middleware: list[Callable[..., Any]] = []
        self._template_response_middleware: list[Callable[..., Any]] = []
        self._exception_middleware: list[Callable[..., Any]] = []
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]
        for path in reversed(settings.API_MIDDLEWARE):
            try:
                instance = import_string(path)(handler)
            except MiddlewareNotUsed:
                continue
            if instance is None:
                raise ImproperlyConfigured(f"Middleware factory {path} returned None.")
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self._template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler


class ApiRequests:
    """Requests to the ingest API go through the API's own middleware
    (``settings.API_MIDDLEWARE``), not the dashboard's.

    The dashboard's chain (sessions, CSRF, sign-in, messages, the login
    throttle, htmx, frame and content-security headers) did nothing for an
    agent's request but cost a fifth of its time in Python (about 0.2 ms of
    some 0.4 ms a request spends in Django before its view, measured on a
    request that needs no database). First in ``MIDDLEWARE``; the API's
    chain (:class:`ApiHandler`) ends in the same URL resolution and views,
    so every request, the test client's included, takes the same path to the
    API.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.api = ApiHandler()
        self.api.load_middleware()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(API_ROOT):
            return self.api.get_response(request)
        return self.get_response(request)

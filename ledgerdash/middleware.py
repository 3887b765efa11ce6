"""Project-wide HTTP middleware."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.cache import add_never_cache_headers

#: Where the ingest API is served (ledgerdash/urls.py); everything under it answers JSON.
API_ROOT = "/api/v1/"
_loading = threading.Lock()


class NoStoreMiddleware:
    """Nothing the application answers is kept by a browser or a proxy cache.

    Every page shows tenant data to a logged-in person, every export and
    report is audit data, and every API answer is a tenant's ledger: a copy
    left in a shared machine's disk cache, or in a proxy, outlives the
    session that was allowed to see it. Static files are answered by
    whitenoise before this runs and stay cacheable. A response that already
    says how to cache it keeps ``no-store`` added to what it says.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        add_never_cache_headers(response)  # Cache-Control: max-age=0, no-cache, no-store, must-revalidate, private
        return response


class ApiRequests:
    """Requests to the ingest API go through the API's own middleware
    (``settings.API_MIDDLEWARE``), not the dashboard's.

    The dashboard's chain (sessions, CSRF, sign-in, messages, the login
    throttle, htmx, frame and content-security headers) did nothing for an
    agent's request but cost a fifth of its time in Python (about 0.2 ms of
    some 0.4 ms a request spends in Django before its view, measured on a
    request that needs no database). First in ``MIDDLEWARE``; the API's
    chain is built from its own list as Django builds the main one, and
    ends in the same URL resolution and views, so every request, the test
    client's included, takes the same path to the API.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.api = BaseHandler()
        with _loading:  # the list is read from the settings, as Django's own handler reads its own
            pages = settings.MIDDLEWARE
            settings.MIDDLEWARE = settings.API_MIDDLEWARE
            try:
                self.api.load_middleware()
            finally:
                settings.MIDDLEWARE = pages

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(API_ROOT):
            return self.api.get_response(request)
        return self.get_response(request)

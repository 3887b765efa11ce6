"""Project-wide HTTP middleware."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.cache import add_never_cache_headers


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

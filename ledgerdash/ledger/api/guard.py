"""What is checked before ninja sees a request: the body's size, and JSON
answers for paths and methods the API does not serve."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, re_path
from ninja import NinjaAPI

from ledgerdash.ledger.api.errors import body_too_large, error_response, no_endpoint
from ledgerdash.ledger.api.rendering import JSON_TYPE


def refuse_body(request: HttpRequest) -> HttpResponse | None:
    """Refuse a body over LEDGER_API_MAX_BODY_BYTES: by its Content-Length
    before reading a byte, and by what was actually read. Checked before
    Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE), which would answer 400."""
    limit = settings.LEDGER_API_MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH", "")
    if declared:
        if not declared.strip().isdigit():
            return error_response(400, "invalid_content_length", "Content-Length is not a number")
        if int(declared) > limit:
            return body_too_large()
    elif "HTTP_TRANSFER_ENCODING" in request.META:
        return error_response(411, "length_required", "send a Content-Length; chunked bodies are not read")
    try:
        body = request.body
    except RequestDataTooBig:
        return body_too_large()
    if len(body) > limit:
        return body_too_large()
    return None


def guard(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = refuse_body(request)
        if refused is not None:
            return refused
        try:
            response = view(request, *args, **kwargs)
        except Http404:
            return no_endpoint(request)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith(JSON_TYPE):
            allow = response.get("Allow", "")
            return error_response(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed here; use {allow}",
                headers={"Allow": allow},
            )
        return response

    guarded.csrf_exempt = True  # type: ignore[attr-defined]
    return guarded


def guarded_urls(api: NinjaAPI) -> tuple[list[URLPattern | URLResolver], str, str]:
    """The API's URL patterns, each behind the body check, with JSON answers
    for unknown paths and methods."""
    patterns, app_name, namespace = api.urls
    guarded: list[URLPattern | URLResolver] = []
    for pattern in patterns:
        assert isinstance(pattern, URLPattern)
        guarded.append(URLPattern(pattern.pattern, guard(pattern.callback), pattern.default_args, pattern.name))
    guarded.append(re_path(r"", guard(no_endpoint), name="no-endpoint"))
    return guarded, app_name, namespace

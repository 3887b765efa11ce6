"""The server's own error pages, which must render when everything else is failing.

Django renders ``500.html`` without a request, so no context processor
runs; this handler also keeps the page away from anything that can fail
on its own: no database, no session, no URL reversing (the URLconf itself
may be what broke). The stylesheet's URL comes from the static files
storage, which raises when its manifest lacks the file: then the page goes
without it, and if even the template cannot be rendered, a fixed page is
served instead.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.template import loader
from django.templatetags.static import static
from django.views.decorators.csrf import requires_csrf_token

logger = logging.getLogger(__name__)

#: Served when not even the template renders: the app's words, no markup to fail.
FALLBACK = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Something went wrong · ledgerdash</title></head>'
    "<body><h1>Something went wrong</h1><p>The dashboard could not answer this request; the error is in the "
    "server's log. Try again in a moment.</p></body></html>"
)


def stylesheet() -> str:
    try:
        return static("ledgerdash/app.css")
    except Exception:  # a missing manifest entry, a broken storage: go without
        logger.warning("the 500 page is served without its stylesheet", exc_info=True)
        return ""


@requires_csrf_token
def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    try:
        body = loader.get_template(template_name).render({"stylesheet": stylesheet()})
    except Exception:
        logger.exception("the 500 page could not be rendered; serving the fixed one")
        body = FALLBACK
    return HttpResponseServerError(body)

"""What every dashboard view does the same way: find what the user may see
(another tenant's attempt is a 404, a missing role a 403), speak for the user
in the ledger, render a region under htmx, and redirect after a post.

Rules are not decided here: these only fetch, scope and render; whether a
move may happen is the ledger's answer (:mod:`ledgerdash.ledger.rules`).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

from ledgerdash.ledger import tenancy
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, Tenant


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def is_partial(request: HtmxHttpRequest) -> bool:
    # A history restore wants the whole page, not a region.
    return bool(request.htmx) and not request.htmx.history_restore_request


def render_region(request: HtmxHttpRequest, template: str, region: str, context: dict[str, Any]) -> HttpResponse:
    name = f"{template}#{region}" if is_partial(request) else template
    response = render(request, name, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def refresh_paused(request: HttpRequest) -> bool:
    """Whether the user paused the list's own refresh (``?refresh=off``,
    kept by its filters): the page then changes only when they act."""
    return request.GET.get("refresh") == "off"


def tenants_or_403(request: HttpRequest) -> list[Tenant]:
    tenants = list(tenancy.tenants_for(request.user).order_by("slug"))
    if not tenants:
        raise PermissionDenied("you are not a member of any tenant; ask an admin to add you")
    return tenants


def attempt_for_user(request: HttpRequest, pk: int) -> Attempt:
    """The attempt if it belongs to one of the user's tenants, else 404
    (whether it exists elsewhere is not the user's business)."""
    return get_object_or_404(tenancy.attempts_for(request.user), pk=pk)


def actor_of(request: HttpRequest) -> Actor:
    assert request.user.is_authenticated  # every view here is behind login_required
    return Actor.user(request.user)


def safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        return target
    return ""


def see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


def form_errors(form: Form) -> str:
    parts = []
    for name, errors in form.errors.items():
        label = form.fields[name].label if name in form.fields else None
        text = " ".join(str(error) for error in errors)
        parts.append(f"{label or name}: {text}" if name != "__all__" else text)
    return "; ".join(parts)

"""Audit: exports of the queues' selections, and reports people read and print.

Same rules as the rest of the dashboard: another tenant's rows are a 404, a
role too small a 403. Exporting needs the operator role in every exported
tenant (operators export audit reports; a viewer reads them on screen).
Reports are readable by anyone who may read the attempt (or the drill's
tenant).
"""

from __future__ import annotations

import dataclasses

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone
from django.views.decorators.http import require_safe

from reviews import exports, queries
from reviews.forms import ListForm
from reviews.models import Role
from reviews.permissions import can
from reviews.views import _actor, _form_errors, _tenants_or_403

CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "ndjson": "application/x-ndjson; charset=utf-8"}


def _export_request(request: HttpRequest, fmt: str) -> exports.ExportRequest | HttpResponse:
    """The export the query string asks for, authorized, or the response refusing it."""
    tenants = _tenants_or_403(request)
    queue = request.GET.get("queue", "")
    if queue and queue not in queries.QUEUES:
        raise Http404("no such queue")
    slug = request.GET.get("tenant", "")
    if slug and slug not in {t.slug for t in tenants}:
        # Whether another tenant exists is not the user's business.
        raise Http404("no such tenant")
    form = ListForm(request.GET, tenants=tenants, queue_state=queries.QUEUES[queue] if queue else "")
    if not form.is_valid():
        # A list shows what it can of a bad query string; an export must not
        # quietly select something other than what was asked for.
        return HttpResponseBadRequest(f"not exported: {_form_errors(form)}", content_type="text/plain")
    query = dataclasses.replace(form.list_query(), after=None, before=None)
    selected = [t for t in tenants if t.pk in query.tenant_ids]
    short = [t.slug for t in selected if not can(request.user, t.pk, Role.OPERATOR)]
    if short:
        raise PermissionDenied(f"exporting needs the operator role in {', '.join(short)}; choose a tenant")
    filters = form.active_filters()
    return exports.ExportRequest(
        tenants=selected,
        format=fmt,
        actor=_actor(request),
        query=None if set(filters) <= {"tenant"} else query,
        owner_user=request.user,
        links=request.GET.get("links") == "1",
        filters=filters,
    )


@login_required
@require_safe
def export(request: HttpRequest, fmt: str) -> HttpResponseBase:
    """The list's selection (its query string) as a CSV or NDJSON download, streamed."""
    if fmt not in exports.FORMATS:
        raise Http404("no such export format")
    export_request = _export_request(request, fmt)
    if isinstance(export_request, HttpResponse):
        return export_request
    if request.method == "HEAD":
        return HttpResponse(content_type=CONTENT_TYPES[fmt])
    names = "-".join(t.slug for t in export_request.tenants)
    filename = f"ledgerdash-audit-{names}-{timezone.now():%Y%m%dT%H%M%SZ}.{fmt}"
    response = StreamingHttpResponse(exports.stream(export_request), content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response

"""Stored crash-drill reports, for the people who gate deployments on them.

Read-only: any member of the drill's tenant may read its report. Another
tenant's run is a 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_safe

from ledgerdash.ledger import tenancy
from ledgerdash.ledger.models import DrillRun
from reviews import queries

PAGE_SIZE = 25


@login_required
@require_safe
def drill_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(queries.drill_runs_for(request.user), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "reviews/drill_list.html", {"page": page, "runs": page.object_list})


def run_for_user(request: HttpRequest, pk: int) -> tuple[DrillRun, list[dict[str, Any]], set[int]]:
    """The drill run if it belongs to one of the user's tenants (else 404),
    its cases, and which of their attempts the user may open."""
    run: DrillRun = get_object_or_404(DrillRun.objects.filter(tenant__in=tenancy.tenants_for(request.user)), pk=pk)
    cases: list[dict[str, Any]] = run.report.get("cases", [])
    attempt_ids = {a["id"] for case in cases for a in case.get("attempts", [])}
    visible = set(tenancy.attempts_for(request.user).filter(pk__in=attempt_ids).values_list("pk", flat=True))
    return run, cases, visible


@login_required
@require_safe
def drill_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run, cases, visible = run_for_user(request, pk)
    failed = [case for case in cases if not case.get("ok")]
    return render(
        request,
        "reviews/drill_detail.html",
        {"run": run, "cases": cases, "failed": failed, "visible_attempts": visible},
    )

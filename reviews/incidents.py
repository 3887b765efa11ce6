"""Incidents: effects the ledger learned about after it had settled the
attempt otherwise (a duplicate, when a retry went out too). They wait on
people: an owner, and someone who resolves them saying what was done.

Any member of the tenant may read one; claiming and resolving need the
operator role. Another tenant's incident is a 404.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from ledgerdash.ledger import moves, rules
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import AttemptEvent, Incident
from reviews import queries
from reviews.forms import ClaimForm, ResolveIncidentForm
from reviews.shortcuts import actor_of, form_errors, see_other

PAGE_SIZE = 50


def _incident_for_user(request: HttpRequest, pk: int) -> Incident:
    incident: Incident = get_object_or_404(queries.incidents_for(request.user), pk=pk)
    return incident


@login_required
@require_safe
def incident_list(request: HttpRequest) -> HttpResponse:
    incidents = queries.incidents_for(request.user)
    if request.GET.get("status") in (Incident.Status.OPEN, Incident.Status.RESOLVED):
        incidents = incidents.filter(status=request.GET["status"])
    if request.GET.get("kind") in Incident.Kind.values:
        incidents = incidents.filter(kind=request.GET["kind"])
    page = Paginator(incidents, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "reviews/incident_list.html", {"page": page, "incidents": page.object_list})


@login_required
@require_safe
def incident_detail(request: HttpRequest, pk: int) -> HttpResponse:
    incident = _incident_for_user(request, pk)
    reports = (EventKind.LATE_REPORT, EventKind.REQUEST_ID_TAKEN)
    kinds = [*reports, EventKind.INCIDENT]
    events = (
        AttemptEvent.objects.filter(attempt_id=incident.attempt_id, kind__in=kinds)
        .select_related("actor_user")
        .order_by("seq")
    )
    return render(
        request,
        "reviews/incident_detail.html",
        {
            "incident": incident,
            "events": [e for e in events if e.kind in reports or e.details.get("incident_id") == incident.pk],
            "moves": rules.incident_moves_for(request.user, incident),
            "resolve_form": ResolveIncidentForm(initial={"fence": incident.fence}),
        },
    )


def _operator_or_403(request: HttpRequest, incident: Incident) -> None:
    """A person whose role refuses them gets a 403; the move asks the rest."""
    if not (allowed := rules.incident_moves_for(request.user, incident)).operate:
        raise PermissionDenied(allowed.resolve.why_not)


@login_required
@require_POST
def incident_claim(request: HttpRequest, pk: int) -> HttpResponse:
    incident = _incident_for_user(request, pk)
    _operator_or_403(request, incident)
    form = ClaimForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
    else:
        try:
            moves.incident_assign(
                incident=incident,
                owner=request.user,  # type: ignore[arg-type]
                actor=actor_of(request),
                expected_owner_id=form.cleaned_data["owner_seen"],
                reason=f"incident #{incident.pk} claimed",
            )
            messages.success(request, f"You own incident #{incident.pk} now.")
        except LedgerError as exc:
            messages.error(request, str(exc))
    return see_other(reverse("reviews:incident", args=[incident.pk]))


@login_required
@require_POST
def incident_resolve(request: HttpRequest, pk: int) -> HttpResponse:
    incident = _incident_for_user(request, pk)
    _operator_or_403(request, incident)
    form = ResolveIncidentForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
    else:
        try:
            moves.incident_resolve(
                incident=incident,
                actor=actor_of(request),
                resolution=form.cleaned_data["resolution"],
                fence=form.cleaned_data["fence"],
            )
            messages.success(request, f"Incident #{incident.pk} is resolved.")
        except LedgerError as exc:
            messages.error(request, str(exc))
    return see_other(reverse("reviews:incident", args=[incident.pk]))

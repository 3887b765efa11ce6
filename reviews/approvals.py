"""The approvals queue: what waits for an approver's yes or no.

Each row shows what an approver triages from the list: the original's
standing (its last lookup, and whether a retry could duplicate it) and
what approving would meet right now. Both answers come from the ledger
(:func:`ledgerdash.ledger.rules.approval_verdict`); this view fetches,
asks and renders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.views.decorators.http import require_safe

from ledgerdash.ledger import rules, tenancy
from ledgerdash.ledger.models import Attempt, Role, State
from ledgerdash.ledger.tenancy import Person
from reviews import queries
from reviews.forms import ListForm
from reviews.shortcuts import HtmxHttpRequest, refresh_paused, render_region, tenants_or_403


@dataclass(frozen=True)
class ApprovalRow:
    attempt: Attempt
    original: Attempt | None
    verdict: rules.ApprovalVerdict


def approval_rows(user: Person, rows: list[Attempt]) -> list[ApprovalRow]:
    """Each item with its original (read in one query) and the ledger's verdict for ``user`` now."""
    originals = Attempt.objects.in_bulk([a.parent_id for a in rows if a.parent_id is not None])
    result = []
    for attempt in rows:
        original = originals.get(attempt.parent_id) if attempt.parent_id is not None else None
        result.append(ApprovalRow(attempt, original, rules.approval_verdict(attempt, original, user)))
    return result


@login_required
@require_safe
def approvals(request: HtmxHttpRequest) -> HttpResponse:
    """Items awaiting approval, oldest first, filtered by tenant, tool and age."""
    tenants = tenants_or_403(request)
    form = ListForm(request.GET, tenants=tenants, queue_state=State.MANUAL_REVIEW)
    form.is_valid()  # invalid values are reported and left out
    query = dataclasses.replace(form.list_query(), awaiting_approval=True, owner="anyone", search="")
    tenant_ids = [t.pk for t in tenants]
    for_me = request.GET.get("for") == "me"
    if for_me:
        # What this user may decide: their approver tenants, not what they asked for.
        approver_of = set(tenancy.tenant_ids_for(request.user, Role.APPROVER))
        query = dataclasses.replace(
            query,
            tenant_ids=tuple(t for t in query.tenant_ids if t in approver_of),
            not_requested_by=request.user.pk,
        )
    page = queries.list_page(request.user, query, allowed=tenant_ids)
    context = {
        "form": form,
        "query": query,
        "page": page,
        "rows": approval_rows(request.user, page.rows),
        "approver_tenants": set(tenancy.tenant_ids_for(request.user, Role.APPROVER)),
        "queue": "approvals",
        "title": "Awaiting your approval" if for_me else "Awaiting approval",
        "for_me": for_me,
        "tools": queries.known_tools(tenant_ids),
        "not_sent": queries.not_sent_retries(tenant_ids),
        "counts": queries.queue_counts(request.user, tenant_ids=tenant_ids),
        "paused": refresh_paused(request),
    }
    return render_region(request, "reviews/approvals.html", "results", context)

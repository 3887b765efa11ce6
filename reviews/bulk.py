"""Decisions on several attempts at once: re-check, mark failed (with
evidence), reject. Like bulk assign: the preview (GET) shows exactly which
attempts the decision will touch and which it skips (and why, in the
ledger's words: :func:`ledgerdash.ledger.rules.moves_for`); the
confirmation (POST) names those attempts with the version and owner the
preview showed, and if anything changed since, nothing happens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from ledgerdash.ledger import moves, rules, tenancy
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.models import Attempt, Role
from reviews.forms import AttemptIdsField, ascii_number
from reviews.shortcuts import HtmxHttpRequest, actor_of, is_partial, render_region, safe_next, see_other

#: Each decision: its title, the verb for the button, what it asks for, and
#: the attribute of :class:`ledgerdash.ledger.rules.PeoplesMoves` that allows it.
DECISIONS: dict[str, dict[str, str]] = {
    "recheck": {
        "title": "Re-check attempts",
        "verb": "Re-check",
        "done": "The reconciler will look up {n} attempt(s) again now.",
        "reason": "Why look again",
        "allowed": "recheck",
    },
    "fail": {
        "title": "Mark attempts failed",
        "verb": "Mark failed",
        "done": "{n} attempt(s) marked failed, with your evidence.",
        "reason": "Evidence that they did not happen (and must not)",
        "allowed": "mark_failed",
    },
    "reject": {
        "title": "Reject what awaits approval",
        "verb": "Reject",
        "done": "{n} attempt(s) rejected: they will not be sent.",
        "reason": "Why reject (the agent is told)",
        "allowed": "decide_retry",
    },
}


class VersionsField(forms.Field):
    """``attempt:fence:owner`` triples (owner empty for nobody): what a preview showed."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> dict[int, tuple[int, int | None]]:
        seen: dict[int, tuple[int, int | None]] = {}
        if value and not isinstance(value, list | tuple):
            value = [value]
        for item in value or []:
            parts = str(item).split(":")
            if len(parts) != 3:
                raise forms.ValidationError("not an attempt:version:owner triple", code="invalid")
            attempt = ascii_number(parts[0], "an attempt number")
            fence = ascii_number(parts[1], "a version of the attempt")
            owner = ascii_number(parts[2], "a user id") if parts[2] else None
            seen[attempt] = (fence, owner)
        return seen


class BulkDecisionForm(forms.Form):
    MAX = 200

    ids = AttemptIdsField(label="Attempts")
    reason = forms.CharField(label="Reason", required=False, max_length=1000, strip=True)
    expect = VersionsField(required=False)
    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)

    def clean_ids(self) -> list[int]:
        ids: list[int] = self.cleaned_data["ids"]
        if len(ids) > self.MAX:
            raise forms.ValidationError(f"decide at most {self.MAX} attempts at once")
        return ids


@dataclass(frozen=True)
class PlanRow:
    attempt: Attempt
    #: Why this attempt will not be touched; empty when it will be.
    skip: str = ""


def _plan(request: HttpRequest, ids: list[int], allowed: str) -> list[PlanRow]:
    attempts = tenancy.attempts_for(request.user).select_related("tenant", "owner").in_bulk(ids)
    if len(attempts) != len(ids):
        raise Http404("no such attempt")
    plan = []
    for pk in ids:
        attempt = attempts[pk]
        may = getattr(rules.moves_for(request.user, attempt), allowed)
        plan.append(PlanRow(attempt, "" if may else may.why_not))
    return plan


@login_required
@require_http_methods(["GET", "POST"])
def bulk_decide(request: HtmxHttpRequest, decision: str) -> HttpResponse:
    if decision not in DECISIONS:
        raise Http404("no such decision")
    spec = DECISIONS[decision]
    if not tenancy.tenant_ids_for(request.user, Role.OPERATOR):
        raise PermissionDenied("deciding work needs the operator role")
    form = BulkDecisionForm(request.POST if request.method == "POST" else request.GET)
    context: dict[str, Any] = {
        "form": form,
        "plan": [],
        "done": False,
        "decision": decision,
        "spec": spec,
        "next": safe_next(request),
    }
    if not form.is_valid():
        return render_region(request, "reviews/bulk_decide.html", "preview", context)
    data = form.cleaned_data
    plan = _plan(request, data["ids"], spec["allowed"])
    context["plan"] = plan
    context["touching"] = [row for row in plan if not row.skip]
    if request.method != "POST":
        return render_region(request, "reviews/bulk_decide.html", "preview", context)
    touch = [row.attempt.pk for row in plan if not row.skip]
    previewed = sorted(data["expect"])
    try:
        if touch != previewed:
            # A row the preview would touch may no longer be decided (or one it
            # skipped now could be): the preview no longer says what happens.
            now_skipped = sorted(set(previewed) - set(touch))
            raise LedgerError(
                "the preview no longer holds"
                + (f" ({', '.join(f'#{pk}' for pk in now_skipped)} can no longer be decided)" if now_skipped else "")
                + "; nothing was done, preview again"
            )
        moves.attempts_decide(
            decision=decision,
            attempt_ids=touch,
            expected=data["expect"],
            actor=actor_of(request),
            reason=data["reason"],
        )
    except LedgerError as exc:
        messages.error(request, str(exc))
        context["plan"] = _plan(request, data["ids"], spec["allowed"])
        context["touching"] = [row for row in context["plan"] if not row.skip]
        return render_region(request, "reviews/bulk_decide.html", "preview", context)
    messages.success(request, spec["done"].format(n=len(touch)))
    if not is_partial(request):
        return see_other(context["next"] or reverse("reviews:search"))
    context["done"] = True
    response = render_region(request, "reviews/bulk_decide.html", "preview", context)
    response["HX-Trigger"] = "ledgerdash:refresh"
    return response

"""The operator dashboard: queues, one attempt, and people's decisions.

Views parse (a Form), authorize (membership and role per tenant), call one
ledger function, and render. Another tenant's attempt is a 404, a role too
small for the action a 403. Under htmx a view renders only the region that
changed (``page.html#region``); without JavaScript every action is a plain
form post that redirects back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from ledgerdash.ledger import moves, rules, tenancy
from ledgerdash.ledger.errors import ApprovalRefused, LedgerError
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, Role, State, roles_at_least
from reviews import charts, diffs, history, queries, timeline
from reviews.forms import (
    AbandonForm,
    ApproveForm,
    AssignForm,
    BulkAssignForm,
    ClaimForm,
    CommentForm,
    ListForm,
    MarkFailedForm,
    RecheckForm,
    RejectForm,
    RetryRequestForm,
    UnassignForm,
    VerifyForm,
)
from reviews.shortcuts import (
    HtmxHttpRequest,
    actor_of,
    attempt_for_user,
    form_errors,
    is_partial,
    refresh_paused,
    render_region,
    safe_next,
    see_other,
    tenants_or_403,
)

# --- pages ---------------------------------------------------------------------------


@login_required
@require_safe
def home(request: HtmxHttpRequest) -> HttpResponse:
    tenants = tenants_or_403(request)
    tenant_ids = [t.pk for t in tenants]
    if is_partial(request) and request.GET.get("region") == "drills":
        return render_region(request, "reviews/home.html", "drills", _latest_drills(request, tenant_ids))
    counts = queries.queue_counts(request.user, tenant_ids=tenant_ids)
    roles = tenancy.roles_by_tenant(request.user)
    approving = roles_at_least(Role.APPROVER)
    approves = [pk for pk, role in roles.items() if role in approving]
    context: dict[str, Any] = {
        "counts": counts,
        "first": queries.first_things(request.user, tenants, approves),
        "paused": refresh_paused(request),
    }
    if not is_partial(request):
        context.update(_latest_drills(request, tenant_ids))
        context["chains"] = queries.chain_status(request.user, tenants=tenants)
        context["administers"] = Role.ADMIN in roles.values()
    return render_region(request, "reviews/home.html", "counts", context)


@login_required
@require_safe
def trends(request: HtmxHttpRequest) -> HttpResponse:
    """The overview's last 24 hours, fetched after the overview (it reads up to
    ``charts.RECENT_EVENTS`` events): the section alone for htmx, a page of its own without it."""
    tenants = tenants_or_403(request)
    context = {"trends": charts.trends([t.pk for t in tenants]), "recent_events": f"{charts.RECENT_EVENTS:,}"}
    template = "reviews/_charts.html#trends" if is_partial(request) else "reviews/trends.html"
    return render(request, template, context)


def _latest_drills(request: HtmxHttpRequest, tenant_ids: list[int]) -> dict[str, Any]:
    runs = list(queries.drill_runs_for(request.user, tenant_ids=tenant_ids)[:3])
    return {"latest_drills": runs, "drills_running": any(run.ok is None for run in runs)}


def _list_title(state: str) -> str:
    titles: dict[str, str] = {State.UNKNOWN: "UNKNOWN queue", State.MANUAL_REVIEW: "MANUAL_REVIEW queue"}
    return titles.get(state, "All attempts")


#: List parameters an export does not carry: it is every page, in chain order.
#: ``refresh`` (paused or not) and ``ids`` (ticked rows) are the page's, not the list's.
EXPORT_SKIPS = frozenset({"after", "before", "sort", "queue", "links", "refresh", "ids"})


@login_required
@require_safe
def attempt_list(request: HtmxHttpRequest, queue: str = "") -> HttpResponse:
    """A queue (one state) or the search over all attempts. All of its state
    is in the query string; the results region polls itself."""
    tenants = tenants_or_403(request)
    if queue and queue not in queries.QUEUES:
        raise Http404("no such queue")
    state = queries.QUEUES[queue] if queue else ""
    form = ListForm(request.GET, tenants=tenants, queue_state=state)
    form.is_valid()  # invalid values are reported and left out
    query = form.list_query()
    tenant_ids = [t.pk for t in tenants]
    page = queries.list_page(request.user, query, allowed=tenant_ids)
    operator_tenants = set(tenancy.tenant_ids_for(request.user, Role.OPERATOR))
    owners = tenancy.member_names_who_can(operator_tenants)
    context = {
        "form": form,
        "query": query,
        "page": page,
        "list_url": request.get_full_path(),
        "queue": queue,
        "state": state,
        "title": _list_title(state),
        "operator_tenants": operator_tenants,
        # The export form carries the list's filters (not its page or sort).
        "export_fields": [
            *((name, value) for name, values in request.GET.lists() if name not in EXPORT_SKIPS for value in values),
            *([("queue", queue)] if queue else []),
        ],
        "bulk_owners": owners,
        "tools": queries.known_tools(tenant_ids),
        "counts": queries.queue_counts(request.user, tenant_ids=tenant_ids),
        "paused": refresh_paused(request),
    }
    return render_region(request, "reviews/attempt_list.html", "results", context)


def _detail_context(request: HttpRequest, attempt: Attempt) -> dict[str, Any]:
    chain = queries.chain_of(attempt)
    parent = next((a for a in chain if a.pk == attempt.parent_id), None)
    children = [a for a in chain if a.parent_id == attempt.pk]
    actions = rules.moves_for(request.user, attempt, children=children)
    approval: dict[str, Any] | None = None
    if rules.awaiting_approval(attempt) and (parent is not None or attempt.parent_id is None):
        # What the approval's re-check would find now. It runs again, under
        # locks, when the approver decides: this is a preview, not the check.
        check = rules.approval_check(attempt, parent, request.user)
        standing = check.standing
        approval = {
            "original": parent,
            "first_call": parent is None,
            "blocked": standing.blocked if standing else None,
            "risk": standing.risk if standing else None,
            "safe_because": standing.proof if standing else None,
            "changes": check.authority,
            "self_requested": check.own,
        }
    fence = {"fence": attempt.fence}
    history_page = timeline.timeline(attempt, request.GET.get("events") or 1)
    owners = tenancy.member_names_who_can([attempt.tenant_id])
    return {
        "attempt": attempt,
        "args_json": diffs.as_json(attempt.args),
        "chain": chain,
        "parent": parent,
        "parent_diff": diffs.diff(parent, attempt) if parent is not None else None,
        "child_diffs": [diffs.diff(attempt, child) for child in children],
        # Repeated checks folded, in pages; the audit report keeps every event.
        "timeline": history_page,
        "strip": charts.strip(attempt),
        "created": history.origin(attempt, history_page.creating),
        "actions": actions,
        "approval": approval,
        "owner_seen": attempt.owner_id or "",
        # Several forms share field names on one page: give each its own ids.
        "assign_form": AssignForm(
            owners=owners,
            initial={"owner": attempt.owner_id, "owner_seen": attempt.owner_id or ""},
            auto_id="assign-%s",
        ),
        "comment_form": CommentForm(auto_id="comment-%s"),
        "recheck_form": RecheckForm(auto_id="recheck-%s"),
        "verify_form": VerifyForm(initial=fence, auto_id="verify-%s"),
        "fail_form": MarkFailedForm(initial=fence, auto_id="fail-%s"),
        "retry_form": RetryRequestForm(auto_id="retry-%s"),
        "approve_form": ApproveForm(initial=fence, auto_id="approve-%s"),
        "reject_form": RejectForm(initial=fence, auto_id="reject-%s"),
        "abandon_form": AbandonForm(initial=fence, auto_id="abandon-%s"),
        "incidents": list(attempt.incidents.order_by("-opened_at")),
    }


@login_required
@require_safe
def attempt_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    attempt = attempt_for_user(request, pk)
    if is_partial(request) and request.htmx.target == "timeline":
        # The timeline's pager swaps only the timeline: read nothing else.
        context = {"attempt": attempt, "timeline": timeline.timeline(attempt, request.GET.get("events") or 1)}
        return render_region(request, "reviews/attempt_detail.html", "timeline", context)
    return render_region(request, "reviews/attempt_detail.html", "detail", _detail_context(request, attempt))


# --- decisions on one attempt -----------------------------------------------------------


def _after_action(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Without htmx: back where the person came from (or the attempt). With
    htmx: the region that changed, fresh from the database: the queue row
    the action came from, or the attempt's detail."""
    if not is_partial(request):
        return see_other(safe_next(request) or reverse("reviews:attempt", args=[pk]))
    attempt = attempt_for_user(request, pk)
    if (request.htmx.target or "").startswith("row-"):
        context = {
            "attempt": attempt,
            "operator_tenants": set(tenancy.tenant_ids_for(request.user, Role.OPERATOR)),
            "list_url": request.htmx.current_url_abs_path or reverse("reviews:search"),
        }
        return render_region(request, "reviews/attempt_list.html", "row_update", context)
    return render_region(request, "reviews/attempt_detail.html", "detail", _detail_context(request, attempt))


def _act(
    request: HtmxHttpRequest,
    pk: int,
    form: Form,
    move: str,
    do: Callable[[Attempt, dict[str, Any], Actor], str],
) -> HttpResponse:
    """Validate, run one ledger function, say what happened. ``move`` names
    the person's move (:data:`ledgerdash.ledger.rules.MOVES`): a person
    whose role refuses it gets a 403 before the form is read; every other
    refusal is the move's own, asked under its row lock."""
    attempt = attempt_for_user(request, pk)
    allowed = getattr(rules.moves_for(request.user, attempt), move)
    if not allowed and allowed.because == rules.Because.ROLE:
        raise PermissionDenied(allowed.why_not)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return _after_action(request, attempt.pk)
    try:
        messages.success(request, do(attempt, form.cleaned_data, actor_of(request)))
    except ApprovalRefused as refusal:
        messages.error(request, "Approval refused: " + "; ".join(refusal.changes) + ".")
    except LedgerError as exc:
        messages.error(request, str(exc))
    return _after_action(request, attempt.pk)


@login_required
@require_POST
def attempt_claim(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.attempt_assign(
            attempt=attempt,
            owner=request.user,  # type: ignore[arg-type]
            actor=actor,
            reason="claimed",
            expected_owner_id=data["owner_seen"],
        )
        return f"You own #{attempt.pk} now."

    return _act(request, pk, ClaimForm(request.POST), "claim", do)


@login_required
@require_POST
def attempt_assign(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    attempt = attempt_for_user(request, pk)
    form = AssignForm(request.POST, owners=tenancy.member_names_who_can([attempt.tenant_id]))

    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        owner = get_user_model().objects.get(pk=data["owner"])
        moves.attempt_assign(
            attempt=attempt,
            owner=owner,
            actor=actor,
            reason=data["reason"] or f"assigned to {owner.get_username()}",
            expected_owner_id=data["owner_seen"],
        )
        return f"#{attempt.pk} is assigned to {owner.get_username()}."

    return _act(request, pk, form, "assign", do)


@login_required
@require_POST
def attempt_unassign(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.attempt_assign(
            attempt=attempt,
            owner=None,
            actor=actor,
            reason=data["reason"] or "unassigned",
            expected_owner_id=data["owner_seen"],
        )
        return f"#{attempt.pk} has no owner now."

    return _act(request, pk, UnassignForm(request.POST), "unassign", do)


@login_required
@require_POST
def attempt_comment(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.attempt_comment(attempt=attempt, actor=actor, text=data["text"])
        return "Comment recorded."

    return _act(request, pk, CommentForm(request.POST), "comment", do)


@login_required
@require_POST
def attempt_recheck(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.attempt_recheck(attempt=attempt, actor=actor, reason=data["reason"])
        return f"The reconciler will look #{attempt.pk} up again now."

    return _act(request, pk, RecheckForm(request.POST), "recheck", do)


@login_required
@require_POST
def attempt_verify(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.attempt_verify(
            attempt=attempt,
            actor=actor,
            evidence=data["evidence"],
            provider_request_id=data["provider_request_id"],
            fence=data["fence"],
        )
        return f"#{attempt.pk} is confirmed, with your evidence."

    return _act(request, pk, VerifyForm(request.POST), "verify", do)


@login_required
@require_POST
def attempt_mark_failed(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.attempt_mark_failed(attempt=attempt, actor=actor, reason=data["reason"], fence=data["fence"])
        return f"#{attempt.pk} is marked failed."

    return _act(request, pk, MarkFailedForm(request.POST), "mark_failed", do)


@login_required
@require_POST
def attempt_abandon(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.intent_abandon(attempt=attempt, actor=actor, reason=data["reason"], fence=data["fence"])
        return f"#{attempt.pk} was given up before it was sent."

    return _act(request, pk, AbandonForm(request.POST), "abandon", do)


@login_required
@require_POST
def retry_request(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        retry = moves.retry_request(attempt=attempt, actor=actor, reason=data["reason"])
        return f"Linked retry #{retry.pk} recorded; another person must approve it."

    return _act(request, pk, RetryRequestForm(request.POST), "request_retry", do)


@login_required
@require_POST
def retry_approve(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.retry_approve(
            attempt=attempt,
            actor=actor,
            comment=data["comment"],
            safe_because=data["safe_because"],
            fence=data["fence"],
        )
        if attempt.parent_id is None:
            return f"#{attempt.pk} approved: its agent's next call sends it."
        return f"Retry #{attempt.pk} approved: it may be dispatched now."

    return _act(request, pk, ApproveForm(request.POST), "decide_retry", do)


@login_required
@require_POST
def retry_reject(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    def do(attempt: Attempt, data: dict[str, Any], actor: Actor) -> str:
        moves.retry_reject(attempt=attempt, actor=actor, comment=data["comment"], fence=data["fence"])
        return f"{'Retry ' if attempt.parent_id else ''}#{attempt.pk} rejected: it will not be sent."

    return _act(request, pk, RejectForm(request.POST), "decide_retry", do)


# --- bulk assign ----------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRow:
    attempt: Attempt
    #: Why this attempt will not be touched; empty when it will be assigned.
    skip: str = ""


ALREADY_THEIRS = "already theirs"


def _bulk_plan(request: HttpRequest, ids: list[int], owner: Any) -> list[PlanRow]:
    """Which attempts an assignment to ``owner`` touches, and why it skips
    the others: the ledger's answers (the assigner's move, and whether
    ``owner`` may own the attempt), which the move asks again."""
    attempts = tenancy.attempts_for(request.user).in_bulk(ids)
    if len(attempts) != len(ids):
        raise Http404("no such attempt")
    plan = []
    # Both answers depend on the tenant alone (the role of each person in it): asked once per tenant.
    by_tenant: dict[int, tuple[rules.Allowed, rules.Allowed]] = {}
    for pk in ids:
        attempt = attempts[pk]
        if attempt.tenant_id not in by_tenant:
            by_tenant[attempt.tenant_id] = (
                rules.moves_for(request.user, attempt).assign,
                rules.may_own(owner, attempt),
            )
        assign, may_own = by_tenant[attempt.tenant_id]
        if not assign:
            raise PermissionDenied(f"assigning #{pk}: {assign.why_not}")
        if attempt.owner_id == owner.pk:
            plan.append(PlanRow(attempt, ALREADY_THEIRS))
        else:
            plan.append(PlanRow(attempt, "" if may_own else may_own.why_not))
    return plan


@login_required
@require_http_methods(["GET", "POST"])
def bulk_assign(request: HtmxHttpRequest) -> HttpResponse:
    """GET previews exactly which attempts an assignment will touch (and
    which it will skip, and why); POST applies that preview, all or nothing,
    refusing if any owner changed since."""
    operator_tenants = set(tenancy.tenant_ids_for(request.user, Role.OPERATOR))
    if not operator_tenants:
        raise PermissionDenied("assigning work needs the operator role")
    owners = tenancy.member_names_who_can(operator_tenants)
    form = BulkAssignForm(request.POST if request.method == "POST" else request.GET, owners=owners)
    context: dict[str, Any] = {"form": form, "plan": [], "done": False, "next": safe_next(request)}
    if not form.is_valid():
        return render_region(request, "reviews/bulk_assign.html", "preview", context)
    data = form.cleaned_data
    owner = get_user_model().objects.get(pk=data["owner"])
    context["owner"] = owner
    plan = _bulk_plan(request, data["ids"], owner)
    context["plan"] = plan
    if request.method == "POST":
        touch = [row.attempt.pk for row in plan if not row.skip]
        # Every row the target could own goes to the ledger with the owner the
        # preview showed, those it skipped as "already theirs" too: a row the
        # target claimed meanwhile changes the batch, so nothing is assigned.
        could_own = [row.attempt.pk for row in plan if row.skip in ("", ALREADY_THEIRS)]
        try:
            moves.attempts_assign(
                attempt_ids=could_own,
                owner=owner,
                actor=actor_of(request),
                expected_owner_ids=data["expect"],
                reason=data["reason"],
            )
        except LedgerError as exc:
            messages.error(request, str(exc))
            context["plan"] = _bulk_plan(request, data["ids"], owner)
        else:
            messages.success(request, f"Assigned {len(touch)} attempt(s) to {owner.get_username()}.")
            if not is_partial(request):
                return see_other(context["next"] or reverse("reviews:search"))
            context["done"] = True
            response = render_region(request, "reviews/bulk_assign.html", "preview", context)
            response["HX-Trigger"] = "ledgerdash:refresh"
            return response
    return render_region(request, "reviews/bulk_assign.html", "preview", context)

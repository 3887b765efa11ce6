"""Audit: exports of the queues' selections, and reports people read and print.

Same rules as the rest of the dashboard: another tenant's rows are a 404, a
role too small a 403. Exporting needs the operator role in every exported
tenant (operators export audit reports; a viewer reads them on screen).
Reports are readable by anyone who may read the attempt (or the drill's
tenant).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe

from ledgerdash.ledger import store, tenancy
from ledgerdash.ledger.events import EventKind
from ledgerdash.ledger.models import Attempt, AttemptEvent, DrillRun, Role
from reviews import diffs, drills, exports, history, pdf_bounds, queries
from reviews.forms import ListForm
from reviews.shortcuts import actor_of, attempt_for_user, form_errors, tenants_or_403

CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "ndjson": "application/x-ndjson; charset=utf-8"}


def _export_request(request: HttpRequest, fmt: str) -> exports.ExportRequest | HttpResponse:
    """The export the form asks for (the list's filters), authorized, or the response refusing it."""
    tenants = tenants_or_403(request)
    asked = request.POST
    queue = asked.get("queue", "")
    if queue and queue not in queries.QUEUES:
        raise Http404("no such queue")
    slug = asked.get("tenant", "")
    if slug and slug not in {t.slug for t in tenants}:
        # Whether another tenant exists is not the user's business.
        raise Http404("no such tenant")
    form = ListForm(asked, tenants=tenants, queue_state=queries.QUEUES[queue] if queue else "")
    if not form.is_valid():
        # A list shows what it can of a bad query string; an export must not
        # quietly select something other than what was asked for.
        return HttpResponseBadRequest(f"not exported: {form_errors(form)}", content_type="text/plain")
    query = dataclasses.replace(form.list_query(), after=None, before=None)
    selected = [t for t in tenants if t.pk in query.tenant_ids]
    operating = set(tenancy.tenant_ids_for(request.user, Role.OPERATOR))
    short = [t.slug for t in selected if t.pk not in operating]
    if short:
        raise PermissionDenied(f"exporting needs the operator role in {', '.join(short)}; choose a tenant")
    filters = form.active_filters()
    return exports.ExportRequest(
        tenants=selected,
        format=fmt,
        actor=actor_of(request),
        query=None if set(filters) <= {"tenant"} else query,
        owner_user=request.user,
        links=asked.get("links") == "1",
        filters=filters,
    )


@login_required
@require_POST
def export(request: HttpRequest, fmt: str) -> HttpResponseBase:
    """The list's selection (the filters its export form carries) as a CSV or
    NDJSON download, streamed. A POST with the CSRF token: the export is an
    audit event, and a link on another site must not make an operator write one."""
    if fmt not in exports.FORMATS:
        raise Http404("no such export format")
    export_request = _export_request(request, fmt)
    if isinstance(export_request, HttpResponse):
        return export_request
    names = "-".join(t.slug for t in export_request.tenants)
    filename = f"ledgerdash-audit-{names}-{timezone.now():%Y%m%dT%H%M%SZ}.{fmt}"
    response = StreamingHttpResponse(exports.stream(export_request), content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response


# --- reports ------------------------------------------------------------------------------

#: The crash drill keys its attempts ``drill:<run>-<nonce>:<case>`` (runs
#: before the nonce was added: ``drill:<run>:<case>``); a case with several
#: side effects keys them ``<case key>/<n>``.
_DRILL_KEY = re.compile(r"^drill:(\d+)(?:-[0-9a-f]+)?:(.+)$")


def _drill_case(attempt: Attempt) -> tuple[DrillRun, dict[str, Any]] | None:
    """The crash-drill case that produced ``attempt``, with its assertions and evidence."""
    match = _DRILL_KEY.match(attempt.idempotency_key)
    if match is None:
        return None
    run = DrillRun.objects.filter(pk=int(match.group(1)), tenant_id=attempt.tenant_id).first()
    if run is None:
        return None
    key = attempt.idempotency_key
    case = next((c for c in run.report.get("cases", []) if key in c.get("keys", [c.get("key")])), None)
    return (run, case) if case is not None else None


def _is_decision(event: AttemptEvent) -> bool:
    """What people decided (and what was refused), as opposed to what machines did."""
    return event.actor_kind == "user" or event.kind == EventKind.APPROVAL_REFUSED


def _report_context(request: HttpRequest, attempt: Attempt, *, whole: bool, pdf: bool = False) -> dict[str, Any]:
    """What a report shows (``whole``: every attempt at the side effect); in a PDF, a bounded part of it
    (see reviews.pdf_bounds)."""
    chain = queries.chain_of(attempt)
    subjects = chain if whole else [attempt]
    timeline = list(queries.events_of_chain(subjects))
    drill = _drill_case(attempt)
    (status,) = queries.chain_status(request.user, tenants=[attempt.tenant])
    decisions = [e for e in timeline if _is_decision(e)]
    by_pk = {a.pk: a for a in chain}

    def subject(a: Attempt) -> dict[str, Any]:
        parent_diff = diffs.diff(by_pk[a.parent_id], a) if a.parent_id in by_pk else None
        if pdf:
            args_json, args_cut = pdf_bounds.args_json(a.args)
        else:
            args_json, args_cut = diffs.as_json(a.args), 0
        return {
            "attempt": a,
            "args_json": args_json,
            "args_cut": args_cut,
            "origin": history.origin(a, history.creating_event(a, timeline)),
            "parent_diff": pdf_bounds.bounded_diff(parent_diff) if pdf and parent_diff else parent_diff,
        }

    def event_seq(event: AttemptEvent) -> str:
        return f"seq {event.seq}"

    def attempt_no(a: Attempt) -> str:
        return f"#{a.pk}"

    shown_subjects: list[Any] = list(subjects)
    shown_chain: list[Any] = list(chain)
    shown_timeline: list[Any] = list(timeline)
    shown_decisions: list[Any] = list(decisions)
    if pdf:
        # The attempt the report is about, and its parent, are always shown.
        def mine(a: Attempt) -> bool:
            return a.pk in (attempt.pk, attempt.parent_id)

        shown_subjects = pdf_bounds.pick(subjects, pdf_bounds.SUBJECTS, label=attempt_no, keep=mine)
        shown_chain = pdf_bounds.pick(chain, pdf_bounds.ROWS, label=attempt_no, keep=mine)
        shown_timeline = pdf_bounds.pick(timeline, pdf_bounds.ROWS, label=event_seq)
        shown_decisions = pdf_bounds.pick(decisions, pdf_bounds.ROWS, label=event_seq)
    return {
        "attempt": attempt,
        "side_effect": whole,
        "subjects": [item if isinstance(item, pdf_bounds.Gap) else subject(item) for item in shown_subjects],
        "chain": shown_chain,
        "chain_total": len(chain),
        "chain_states": chain,
        "timeline": shown_timeline,
        "events_total": len(timeline),
        "decisions": shown_decisions,
        "decisions_total": len(decisions),
        # Every user an owner change names, in one query for the report.
        "names": history.user_names(timeline),
        "drill_run": drill[0] if drill else None,
        "drill_case": drill[1] if drill else None,
        "chain_status": status,
        "generated_at": timezone.now(),
        **pdf_bounds.context(
            pdf=pdf, subjects=sum(1 for item in shown_subjects if not isinstance(item, pdf_bounds.Gap))
        ),
    }


@functools.cache
def _print_setup() -> tuple[Any, Any]:
    """The URL fetcher that fetches nothing and the parsed print stylesheet,
    made once per process: each costs a noticeable part of a PDF's time (a
    fetcher builds an SSL context and loads the system's certificates)."""
    import weasyprint
    from weasyprint.urls import URLFetcher, URLFetchingError

    class NoFetching(URLFetcher):
        def fetch(self, url: str, headers: Any = None) -> Any:
            raise URLFetchingError(f"a report fetches nothing ({url})")

    fetcher = NoFetching()
    css = Path(str(finders.find("ledgerdash/report.css"))).read_text(encoding="utf-8")
    return fetcher, weasyprint.CSS(string=css, url_fetcher=fetcher)


def preload_pdf_renderer() -> None:
    """Load WeasyPrint (Pango, fontconfig: seconds on a busy machine), parse
    the print stylesheet and lay out one line when a worker starts
    (``ledgerdash/wsgi.py``), so that the first PDF a worker serves does not
    pay for it. Where Pango is missing the PDF views say so (503); starting
    up does not fail."""
    try:
        import weasyprint
    except (ImportError, OSError):
        return
    fetcher, stylesheet = _print_setup()
    weasyprint.HTML(string="<p>ledgerdash</p>", url_fetcher=fetcher).write_pdf(stylesheets=[stylesheet])


def _pdf(request: HttpRequest, template: str, context: dict[str, Any], filename: str) -> HttpResponse:
    """The report as a PDF, by WeasyPrint: the same HTML, the print stylesheet,
    and nothing fetched from anywhere (the content is attacker-controlled text)."""
    try:
        import weasyprint
    except (ImportError, OSError) as exc:  # OSError: Pango missing from the system
        return HttpResponse(
            f"PDF rendering is unavailable here ({exc}); print the HTML report instead.",
            status=503,
            content_type="text/plain",
        )
    fetcher, stylesheet = _print_setup()
    html = render_to_string(template, {**context, "pdf": True}, request=request)
    pdf = weasyprint.HTML(string=html, url_fetcher=fetcher).write_pdf(stylesheets=[stylesheet])
    response = HttpResponse(pdf, content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _record_reading(request: HttpRequest, response: HttpResponse, tenant_id: int, **subject: Any) -> HttpResponse:
    """Who read which audit report, as an event in the tenant's chain: reading
    audit data is itself on the record. Only a report actually delivered
    counts (not a HEAD, not a refused or failed PDF)."""
    if request.method == "GET" and response.status_code == 200:
        pdf = response["Content-Type"] == "application/pdf"
        store.event_record(
            tenant=tenant_id,
            kind=EventKind.REPORT,
            actor=actor_of(request),
            reason=f"{subject['report']} report {'downloaded as PDF' if pdf else 'viewed'}",
            details={**subject, "format": "pdf" if pdf else "html"},
        )
    return response


def _report(request: HttpRequest, pk: int, *, whole: bool, pdf: bool) -> HttpResponse:
    attempt = attempt_for_user(request, pk)
    context = _report_context(request, attempt, whole=whole, pdf=pdf)
    template = "reviews/audit_report.html"
    kind = "side effect" if whole else "attempt"
    if pdf:
        response = _pdf(request, template, context, f"ledgerdash-{kind.replace(' ', '-')}-{attempt.pk}.pdf")
    else:
        response = render(request, template, context)
    return _record_reading(request, response, attempt.tenant_id, report=kind, attempt=attempt.pk)


@login_required
@require_safe
def attempt_report(request: HttpRequest, pk: int) -> HttpResponse:
    """One attempt for the record: facts, arguments, decisions, timeline."""
    return _report(request, pk, whole=False, pdf=False)


@login_required
@require_safe
def attempt_report_pdf(request: HttpRequest, pk: int) -> HttpResponse:
    return _report(request, pk, whole=False, pdf=True)


@login_required
@require_safe
def side_effect_report(request: HttpRequest, pk: int) -> HttpResponse:
    """Every attempt at the side effect ``pk`` belongs to (its linked chain),
    with one timeline across them."""
    return _report(request, pk, whole=True, pdf=False)


@login_required
@require_safe
def side_effect_report_pdf(request: HttpRequest, pk: int) -> HttpResponse:
    return _report(request, pk, whole=True, pdf=True)


def _drill(request: HttpRequest, pk: int, *, pdf: bool) -> HttpResponse:
    run, cases, visible = drills.run_for_user(request, pk)
    context = {
        "run": run,
        "cases": cases,
        "visible": visible,
        "chain_status": queries.chain_status(request.user, tenants=[run.tenant])[0],
        "generated_at": timezone.now(),
        **pdf_bounds.context(pdf=pdf),
    }
    if pdf:
        response = _pdf(request, "reviews/drill_report.html", context, f"ledgerdash-drill-{run.pk}.pdf")
    else:
        response = render(request, "reviews/drill_report.html", context)
    return _record_reading(request, response, run.tenant_id, report="drill", drill_run=run.pk)


@login_required
@require_safe
def drill_report(request: HttpRequest, pk: int) -> HttpResponse:
    """A crash-drill run for the record: every case, its assertions and their evidence."""
    return _drill(request, pk, pdf=False)


@login_required
@require_safe
def drill_report_pdf(request: HttpRequest, pk: int) -> HttpResponse:
    return _drill(request, pk, pdf=True)

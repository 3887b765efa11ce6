"""One row of an attempt list (the queues and the search), written in Python.

A list page shows 50 rows of 13 cells; drawn by the template language,
each row cost some 70 variable lookups, three URL reversals, a CSRF tag and
the partial's own context, which made the rows most of the page's time
(and the page's time is rendering, not SQL: the keyset read takes a few
milliseconds at a million attempts). Here a row is a handful of
:func:`reviews.display.format_markup` calls, and what is the same for every row of the page
(the CSRF field, the user, the tenants they operate, the URL patterns) is
worked out once per page and kept on the template's render context.

Every untrusted value still goes through :func:`reviews.display.untrusted`
(escaped, isolated, hidden characters marked) and every other value through
the same escaping as ``format_html``'s, as the template's autoescape did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.middleware.csrf import get_token
from django.template import Context
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from ledgerdash.ledger import rules
from ledgerdash.ledger.models import Attempt
from reviews import display
from reviews.display import format_markup

#: A placeholder id: reverse() once, then put each row's id in its place.
_PK = 2_147_483_647
_MUTED_NONE = mark_safe('<span class="muted">none</span>')
_MUTED_NOBODY = mark_safe('<span class="muted">nobody</span>')
_YOURS = mark_safe('<span class="mine">yours</span>')
_CHECKED = mark_safe(" checked")


@dataclass(frozen=True)
class RowSetting:
    """What every row of one page shares."""

    user_pk: int | None
    operator_tenants: frozenset[int]
    #: The rows the user ticked, as the list's own refresh sends them: they come back ticked.
    ticked: frozenset[int]
    csrf_token: str
    next_url: str
    attempt_url: str
    claim_url: str

    def url(self, pattern: str, pk: int) -> str:
        return pattern.replace(str(_PK), str(pk))


def setting_for(context: Context) -> RowSetting:
    """The page's :class:`RowSetting`, worked out on its first row and kept for the rest."""
    key = "reviews.rows.setting"
    cached = context.render_context.get(key)
    if cached is None:
        request = context["request"]
        list_url = context.get("list_url") or request.get_full_path()
        cached = RowSetting(
            user_pk=request.user.pk,
            operator_tenants=frozenset(context.get("operator_tenants") or ()),
            ticked=frozenset(int(v) for v in request.GET.getlist("ids") if v.isdecimal() and len(v) < 19),
            csrf_token=get_token(request),
            next_url=list_url,
            attempt_url=reverse("reviews:attempt", args=[_PK]),
            claim_url=reverse("reviews:claim", args=[_PK]),
        )
        # The render context is per render and per template: a row's partial
        # rendered later in the page sees the setting too, another page never.
        context.render_context[key] = cached
    return cached


def _dates(value: Any) -> tuple[str, str]:
    """``value`` as the template's ``date:'c'`` and ``date:'Y-m-d H:i:s e'`` wrote it (``dateformat`` was a
    third of a row's time)."""
    local = timezone.localtime(value)
    return local.isoformat(), f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or ''}".rstrip()


def row(attempt: Attempt, setting: RowSetting) -> SafeString:
    pk = attempt.pk
    operates = attempt.tenant_id in setting.operator_tenants
    select = (
        format_markup(
            '<input type="checkbox" name="ids" value="{}" form="bulk" aria-label="Select #{}"{}>',
            pk,
            pk,
            _CHECKED if pk in setting.ticked else "",
        )
        if operates
        else ""
    )
    retry = format_markup(' <span class="retry-of">retries #{}</span>', attempt.parent_id) if attempt.parent_id else ""
    request_id = (
        format_markup("<code>{}</code>", display.untrusted(attempt.provider_request_id, 64))
        if attempt.provider_request_id
        else _MUTED_NONE
    )
    owner = display.untrusted(attempt.owner.get_username(), 40) if attempt.owner else _MUTED_NOBODY
    if rules.claimable(operates, attempt.owner_id, setting.user_pk):
        claim = setting.url(setting.claim_url, pk)
        action = format_markup(
            '<form method="post" action="{}" hx-post="{}" hx-target="#row-{}" hx-swap="outerHTML">'
            '<input type="hidden" name="csrfmiddlewaretoken" value="{}">'
            '<input type="hidden" name="owner_seen" value="{}">'
            '<input type="hidden" name="next" value="{}">'
            '<button type="submit" class="claim" aria-label="Claim #{}">Claim</button></form>',
            claim, claim, pk, setting.csrf_token, attempt.owner_id or "", setting.next_url, pk,
        )  # fmt: skip
    elif attempt.owner_id is not None and attempt.owner_id == setting.user_pk:
        action = _YOURS
    else:
        action = SafeString()
    iso, full = _dates(attempt.created_at)
    return format_markup(
        '<tr id="row-{pk}" data-attempt="{pk}" tabindex="-1">'
        "<td>{select}</td>"
        '<td class="nowrap"><a class="open" href="{url}">#{pk}</a>{retry}</td>'
        '<td class="wrap">{tenant}</td>'
        '<td class="wrap tool">{tool}</td>'
        '<td class="wrap task">{task}</td>'
        '<td class="wrap key"><code>{key}</code></td>'
        '<td class="nowrap"><code class="hash" title="{hash}">{short}…</code> '
        '<button type="button" class="copy" data-copy="{hash}" aria-label="Copy the args hash of #{pk}">'
        "copy</button></td>"
        '<td class="wrap">{request_id}</td>'
        '<td class="wrap owner">{owner}</td>'
        '<td><span class="state state-{state_class}">{state}</span></td>'
        '<td class="nowrap"><time datetime="{iso}" title="{full}">{age}</time></td>'
        '<td class="note wrap">{note}</td>'
        "<td>{action}</td>"
        "</tr>",
        pk=pk,
        select=select,
        url=setting.url(setting.attempt_url, pk),
        retry=retry,
        tenant=display.untrusted(attempt.tenant.slug),
        tool=display.untrusted(attempt.tool_name, 60),
        task=display.untrusted(attempt.task_id, 64),
        key=display.untrusted(attempt.idempotency_key, 64),
        hash=attempt.args_hash,
        short=attempt.args_hash[:12],
        request_id=request_id,
        owner=owner,
        state_class=attempt.state.lower(),
        state=attempt.state,
        iso=iso,
        full=full,
        age=display.age(attempt.created_at),
        note=display.untrusted(attempt.last_note, 140),
        action=action,
    )

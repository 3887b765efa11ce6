"""Input of the dashboard: list state from the query string, and people's decisions."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django import forms
from django.forms.utils import flatatt
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ledgerdash.ledger.models import OWNED_STATES, State, Tenant
from reviews import queries
from reviews.queries import Cursor, ListQuery

OWNER_CHOICES = [("anyone", "anyone"), ("me", "me"), ("unassigned", "unassigned")]
AGE_CHOICES = [
    ("", "any age"),
    ("lt1h", "newer than 1 hour"),
    ("gt1h", "older than 1 hour"),
    ("gt1d", "older than 1 day"),
    ("gt7d", "older than 7 days"),
]
_AGES = {
    "lt1h": (None, timedelta(hours=1)),
    "gt1h": (timedelta(hours=1), None),
    "gt1d": (timedelta(days=1), None),
    "gt7d": (timedelta(days=7), None),
}
SORT_CHOICES = [("oldest", "oldest first"), ("newest", "newest first")]
#: The state filter's value for all work that must have an owner.
ATTENTION = "attention"

#: Numbers in forms are ASCII digits. ``str.isdigit()`` also accepts "²" (which
#: ``int()`` refuses: a 500) and ``\d`` accepts other scripts' digits (which
#: ``int()`` takes): neither is a number anyone types into a form or a URL.
_ASCII_NUMBER = re.compile(r"[0-9]{1,18}")
#: Ids and fences are PostgreSQL bigints.
_BIGINT_MAX = 2**63 - 1
_CURSOR = re.compile(r"[0-9]{1,19}-([0-9]{1,19})")


def ascii_number(text: str, what: str) -> int:
    """``text`` (already stripped) as a non-negative integer, or a ValidationError naming it."""
    if not _ASCII_NUMBER.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise forms.ValidationError(
            "not %(what)s (digits 0-9 only): %(value)s", code="invalid", params={"what": what, "value": shown}
        )
    return int(text)


class PlainSelect(forms.Select):
    """A ``<select>`` written in Python. Django renders every ``<option>``
    through a template include of its own; with 50 tenants the list pages'
    filter form cost more than their 50 rows. Same markup, no groups."""

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> SafeString:
        chosen = {str(v) for v in self.format_value(value)}
        options = format_html_join(
            "",
            '<option value="{}"{}>{}</option>',
            ((key, mark_safe(" selected") if str(key) in chosen else "", label) for key, label in self.choices),
        )
        attributes = flatatt(self.build_attrs(self.attrs, attrs))
        return format_html('<select name="{}"{}>{}</select>', name, attributes, options)


class NumberField(forms.IntegerField):
    """A non-negative whole number in ASCII digits, up to a bigint. Django's
    IntegerField takes other scripts' digits and "7.0"; a fence is neither."""

    def __init__(self, *, what: str = "a whole number", **kwargs: Any) -> None:
        self.what = what
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", _BIGINT_MAX)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        return ascii_number(str(value).strip(), self.what)


class CursorField(forms.CharField):
    def to_python(self, value: Any) -> Cursor | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        match = _CURSOR.fullmatch(text)
        cursor = Cursor.parse(text) if match is not None and int(match.group(1)) <= _BIGINT_MAX else None
        if cursor is None:
            raise forms.ValidationError("not a position in this list", code="invalid")
        return cursor


class ListForm(forms.Form):
    """Everything a list shows lives in its query string; this validates it.

    A value that does not validate is reported and left out (the list then
    shows as if it were not given) rather than failing the whole page.
    """

    q = forms.CharField(label="Search", required=False, max_length=255, strip=True)
    tenant = forms.ChoiceField(label="Tenant", required=False, widget=PlainSelect)
    tool = forms.CharField(label="Tool", required=False, max_length=255, strip=True)
    owner = forms.ChoiceField(label="Owner", required=False, choices=OWNER_CHOICES, widget=PlainSelect)
    age = forms.ChoiceField(label="Age", required=False, choices=AGE_CHOICES, widget=PlainSelect)
    state = forms.ChoiceField(
        label="State",
        required=False,
        choices=[("", "any state"), (ATTENTION, "UNKNOWN or MANUAL_REVIEW"), *State.choices],
        widget=PlainSelect,
    )
    sla = forms.BooleanField(label="Past its tenant's SLA", required=False)
    sort = forms.ChoiceField(label="Sort", required=False, choices=SORT_CHOICES, widget=PlainSelect)
    after = CursorField(required=False, widget=forms.HiddenInput)
    before = CursorField(required=False, widget=forms.HiddenInput)

    def __init__(self, data: Any, *, tenants: list[Tenant], queue_state: str = "", **kwargs: Any) -> None:
        super().__init__(data, label_suffix="", **kwargs)
        self.tenants = tenants
        self.queue_state = queue_state
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ChoiceField)
        tenant_field.choices = [("", "all my tenants"), *((t.slug, t.name) for t in tenants)]
        if queue_state:
            # A queue is one state; only search chooses.
            del self.fields["state"]
        sort_field = self.fields["sort"]
        assert isinstance(sort_field, forms.ChoiceField)
        sort_field.initial = self.default_sort

    @property
    def default_sort(self) -> str:
        # Queues are worked oldest first; a search shows the latest first.
        return "oldest" if self.queue_state else "newest"

    def list_query(self) -> ListQuery:
        """The valid part of the query string as a ListQuery (call after is_valid())."""
        data = getattr(self, "cleaned_data", {})
        tenant_slug = data.get("tenant") or ""
        tenant_ids = tuple(t.pk for t in self.tenants if not tenant_slug or t.slug == tenant_slug)
        older, newer = _AGES.get(data.get("age") or "", (None, None))
        state = self.queue_state or data.get("state") or ""
        return ListQuery(
            tenant_ids=tenant_ids,
            state="" if state == ATTENTION else state,
            states=tuple(sorted(OWNED_STATES)) if state == ATTENTION else (),
            past_sla=bool(data.get("sla")),
            tool=data.get("tool") or "",
            owner=data.get("owner") or "anyone",
            older_than=older,
            newer_than=newer,
            search=data.get("q") or "",
            oldest_first=(data.get("sort") or self.default_sort) == "oldest",
            after=data.get("after"),
            before=data.get("before"),
            page_size=queries.PAGE_SIZE,
        )

    def active_filters(self) -> dict[str, str]:
        """The filters in force (call after is_valid()), as given: what an
        export records about what it selected. Paging and sorting are not filters."""
        data = getattr(self, "cleaned_data", {})
        active = {name: str(data[name]) for name in ("tenant", "q", "tool", "age", "state", "sla") if data.get(name)}
        if data.get("owner") not in (None, "", "anyone"):
            active["owner"] = str(data["owner"])
        if self.queue_state:
            active["state"] = self.queue_state
        return active


class OwnerSeenField(forms.CharField):
    """The owner (user id, or empty for nobody) the page showed when the person acted."""

    def to_python(self, value: Any) -> int | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        return ascii_number(text, "a user id")


class ClaimForm(forms.Form):
    owner_seen = OwnerSeenField(required=False, widget=forms.HiddenInput)


class AssignForm(forms.Form):
    owner = forms.TypedChoiceField(label="Assign to", coerce=int)
    reason = forms.CharField(label="Why", required=False, max_length=1000, strip=True)
    owner_seen = OwnerSeenField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, owners: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        owner_field = self.fields["owner"]
        assert isinstance(owner_field, forms.TypedChoiceField)
        owner_field.choices = owners


class UnassignForm(forms.Form):
    reason = forms.CharField(label="Why", required=False, max_length=1000, strip=True)
    owner_seen = OwnerSeenField(required=False, widget=forms.HiddenInput)


class CommentForm(forms.Form):
    text = forms.CharField(label="Comment", max_length=4000, strip=True, widget=forms.Textarea(attrs={"rows": 2}))


class RecheckForm(forms.Form):
    reason = forms.CharField(label="Why", required=False, max_length=1000, strip=True)


class FenceForm(forms.Form):
    """A decision names the version of the attempt the person saw: if it moved
    on since (another decision, the reconciler), the decision is refused."""

    fence = NumberField(what="a version of the attempt", widget=forms.HiddenInput)


class VerifyForm(FenceForm):
    evidence = forms.CharField(
        label="Evidence",
        max_length=1000,
        strip=True,
        help_text="What you checked at the provider: a dashboard link, a receipt, a ticket.",
    )
    provider_request_id = forms.CharField(label="Provider request ID", required=False, max_length=255, strip=True)


class MarkFailedForm(FenceForm):
    reason = forms.CharField(label="Why it did not (and must not) happen", max_length=1000, strip=True)


class RetryRequestForm(forms.Form):
    reason = forms.CharField(label="Why retry", max_length=1000, strip=True)


class ApproveForm(FenceForm):
    comment = forms.CharField(label="Comment", max_length=1000, strip=True)
    safe_because = forms.CharField(
        label="Why it is safe although the original may have happened",
        required=False,
        max_length=1000,
        strip=True,
    )


class RejectForm(FenceForm):
    comment = forms.CharField(label="Comment", max_length=1000, strip=True)


_EXPECT = re.compile(r"([0-9]{1,18}):([0-9]{0,18})")


class AttemptIdsField(forms.Field):
    """Attempt numbers, as repeated query parameters (``ids=3&ids=7``)."""

    widget = forms.MultipleHiddenInput
    default_error_messages = {"required": "select some attempts first"}

    def to_python(self, value: Any) -> list[int]:
        if not value:
            return []
        if not isinstance(value, list | tuple):
            value = [value]
        ids = set()
        for item in value:
            ids.add(ascii_number(str(item).strip(), "an attempt number"))
        return sorted(ids)


class ExpectedOwnersField(forms.Field):
    """``attempt:owner`` pairs (owner empty for nobody): what a preview showed."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> dict[int, int | None]:
        expected: dict[int, int | None] = {}
        if value and not isinstance(value, list | tuple):
            value = [value]
        for item in value or []:
            match = _EXPECT.fullmatch(str(item))
            if match is None:
                raise forms.ValidationError("not an attempt:owner pair of numbers", code="invalid")
            expected[int(match.group(1))] = int(match.group(2)) if match.group(2) else None
        return expected


class BulkAssignForm(forms.Form):
    """The preview (GET) names ``ids`` and ``owner``; the confirmation (POST)
    also carries ``expect``: each attempt's owner as the preview showed it."""

    MAX = 200

    ids = AttemptIdsField(label="Attempts")
    owner = forms.TypedChoiceField(label="Assign to", coerce=int)
    reason = forms.CharField(label="Why", required=False, max_length=1000, strip=True)
    expect = ExpectedOwnersField(required=False)
    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)

    def __init__(self, *args: Any, owners: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        owner_field = self.fields["owner"]
        assert isinstance(owner_field, forms.TypedChoiceField)
        owner_field.choices = owners

    def clean_ids(self) -> list[int]:
        ids: list[int] = self.cleaned_data["ids"]
        if len(ids) > self.MAX:
            raise forms.ValidationError(f"assign at most {self.MAX} attempts at once")
        return ids


class AbandonForm(FenceForm):
    reason = forms.CharField(
        label="Why give it up",
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="It was never sent, so nothing happened; the agent is told it failed as abandoned.",
    )


class ResolveIncidentForm(FenceForm):
    resolution = forms.CharField(
        label="What was done",
        max_length=4000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="e.g. refunded the second charge; confirmed with the provider that only one landed",
    )

"""Every form field refuses bad input with a message, never a 500 (reviews/forms.py).

"²" passes ``str.isdigit()`` and fails ``int()``; "٣" (an Arabic-Indic
three) passes both; neither is a number anyone types into these forms.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from ledgerdash.ledger.models import Attempt, State, Tenant
from reviews.forms import (
    ApproveForm,
    AssignForm,
    BulkAssignForm,
    ClaimForm,
    CommentForm,
    ListForm,
    MarkFailedForm,
    RejectForm,
    UnassignForm,
    VerifyForm,
)
from tests.conftest import as_user, ledger_snapshot
from tests.factories import attempt_in

NOT_NUMBERS = ["²", "٣", "1²", "¹²", "7.0", "-1", "+3", "1e3", "0x10", " ", "1 2", "١٢", "9" * 19, "\u200b7"]
OWNERS = [(5, "alice"), (7, "bob")]


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_the_owner_a_page_showed_must_be_a_user_id(value: str) -> None:
    for form in (ClaimForm({"owner_seen": value}), UnassignForm({"owner_seen": value})):
        if value.strip() == "":
            assert form.is_valid()  # empty: the page showed nobody
            continue
        assert not form.is_valid()
        assert "not a user id (digits 0-9 only)" in str(form.errors["owner_seen"])


def test_a_user_id_in_ascii_digits_is_taken() -> None:
    form = ClaimForm({"owner_seen": "42"})
    assert form.is_valid()
    assert form.cleaned_data["owner_seen"] == 42


@pytest.mark.parametrize("value", [*NOT_NUMBERS, ""])
@pytest.mark.parametrize("form_class", [VerifyForm, MarkFailedForm, ApproveForm, RejectForm])
def test_a_decision_names_a_version_in_ascii_digits(form_class: type, value: str) -> None:
    data = {"fence": value, "evidence": "receipt 7", "reason": "r", "comment": "c"}
    form = form_class(data)
    assert not form.is_valid()
    assert form.errors["fence"]


def test_a_decision_with_a_good_version_is_taken() -> None:
    form = VerifyForm({"fence": "3", "evidence": "receipt 7"})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["fence"] == 3


@pytest.mark.parametrize("value", [*NOT_NUMBERS, "5²", "99"])
def test_an_owner_must_be_one_of_the_choices(value: str) -> None:
    form = AssignForm({"owner": value}, owners=OWNERS)
    assert not form.is_valid()
    assert "Select a valid choice" in str(form.errors["owner"])


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_bulk_assign_refuses_attempt_numbers_that_are_not_numbers(value: str) -> None:
    form = BulkAssignForm({"ids": ["3", value], "owner": "5"}, owners=OWNERS)
    assert not form.is_valid()
    assert "not an attempt number (digits 0-9 only)" in str(form.errors["ids"])


@pytest.mark.parametrize("value", ["3:²", "²:5", "٣:5", "3:5:7", "3", "x:y"])
def test_bulk_assign_refuses_previewed_owners_that_are_not_numbers(value: str) -> None:
    form = BulkAssignForm({"ids": ["3"], "owner": "5", "expect": [value]}, owners=OWNERS)
    assert not form.is_valid()
    assert "not an attempt:owner pair of numbers" in str(form.errors["expect"])


def test_bulk_assign_takes_good_input() -> None:
    form = BulkAssignForm({"ids": ["3", "3", "11"], "owner": "7", "expect": ["3:5", "11:"]}, owners=OWNERS)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["ids"] == [3, 11]
    assert form.cleaned_data["owner"] == 7
    assert form.cleaned_data["expect"] == {3: 5, 11: None}


@pytest.mark.parametrize("cursor", ["²-1", "1-²", "٣-1", "1-٣", "1-9223372036854775808", "-", "1-"])
def test_a_list_position_that_is_not_one_is_reported(cursor: str) -> None:
    form = ListForm({"after": cursor, "before": cursor}, tenants=[])
    assert not form.is_valid()
    assert form.errors["after"] == ["not a position in this list"]
    assert form.list_query().after is None  # reported, then left out


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("q", "x" * 256, "at most 255 characters"),
        ("q", "a\x00b", "Null characters are not allowed"),
        ("tool", "t" * 256, "at most 255 characters"),
        ("owner", "everyone", "Select a valid choice"),
        ("age", "gt99y", "Select a valid choice"),
        ("state", "DONE", "Select a valid choice"),
        ("sort", "sideways", "Select a valid choice"),
        ("tenant", "globex", "Select a valid choice"),
    ],
)
def test_list_filters_refuse_bad_values_with_a_message(field: str, value: str, message: str) -> None:
    form = ListForm({field: value}, tenants=[])
    assert not form.is_valid()
    assert message in str(form.errors[field])


@pytest.mark.parametrize(
    ("form", "field"),
    [
        (CommentForm({"text": "   "}), "text"),
        (CommentForm({"text": "x" * 4001}), "text"),
        (CommentForm({"text": "a\x00b"}), "text"),
        (VerifyForm({"fence": "1", "evidence": ""}), "evidence"),
        (VerifyForm({"fence": "1", "evidence": "e", "provider_request_id": "r" * 256}), "provider_request_id"),
        (MarkFailedForm({"fence": "1", "reason": "y" * 1001}), "reason"),
        (ApproveForm({"fence": "1", "comment": ""}), "comment"),
        (BulkAssignForm({"ids": [], "owner": "5"}, owners=OWNERS), "ids"),
        (BulkAssignForm({"ids": [str(n) for n in range(201)], "owner": "5"}, owners=OWNERS), "ids"),
    ],
)
def test_text_fields_refuse_empty_oversized_and_nul_input(form: Any, field: str) -> None:
    assert not form.is_valid()
    assert form.errors[field]


# --- through the views: a message, not a 500 --------------------------------------------


@pytest.fixture
def stuck_one(tenant_a: Tenant) -> Attempt:
    return attempt_in(State.UNKNOWN, tenant_a, key="claim-me")


@pytest.mark.parametrize("htmx", [False, True])
def test_claiming_with_a_unicode_digit_says_so_and_changes_nothing(
    stuck_one: Attempt, operator_a: Any, htmx: bool
) -> None:
    client = as_user(operator_a)
    before = ledger_snapshot()
    headers = {"HX-Request": "true", "HX-Target": "detail"} if htmx else {}
    response = client.post(
        reverse("reviews:claim", args=[stuck_one.pk]), {"owner_seen": "²"}, headers=headers, follow=True
    )
    assert response.status_code == 200
    assert "not a user id (digits 0-9 only): ²" in response.content.decode()
    assert ledger_snapshot() == before


@pytest.mark.parametrize("method", ["get", "post"])
def test_bulk_assign_with_a_unicode_digit_says_so_and_changes_nothing(
    stuck_one: Attempt, operator_a: Any, method: str
) -> None:
    client = as_user(operator_a)
    before = ledger_snapshot()
    data = {"ids": ["²"], "owner": str(operator_a.pk), "expect": [f"{stuck_one.pk}:"]}
    response = getattr(client, method)(reverse("reviews:bulk_assign"), data)
    assert response.status_code == 200
    assert "not an attempt number (digits 0-9 only): ²" in response.content.decode()
    response = getattr(client, method)(
        reverse("reviews:bulk_assign"), {**data, "ids": [str(stuck_one.pk)], "owner": "²"}
    )
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert ledger_snapshot() == before


def test_a_decision_with_a_unicode_digit_version_says_so(tenant_a: Tenant, operator_a: Any) -> None:
    attempt = attempt_in(State.MANUAL_REVIEW, tenant_a, key="verify-me")
    before = ledger_snapshot()
    response = as_user(operator_a).post(
        reverse("reviews:verify", args=[attempt.pk]), {"fence": "٣", "evidence": "receipt"}, follow=True
    )
    assert response.status_code == 200
    assert "not a version of the attempt (digits 0-9 only)" in response.content.decode()
    assert ledger_snapshot() == before

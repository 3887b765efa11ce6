"""What changed between an attempt and its linked retry, as a reviewer reads it."""

from __future__ import annotations

from typing import Any

from ledgerdash.ledger.models import Attempt
from reviews.diffs import Change, diff


def attempt(pk: int, **fields: Any) -> Attempt:
    values: dict[str, Any] = {
        "tenant_id": 1,
        "task_id": "task-1",
        "tool_name": "drill.send_email",
        "idempotency_key": "drill:7:E",
        "provider_key": "drill:7:E",
        "args": {"to": "ap@example.com"},
        "args_hash": "a" * 64,
        "policy_version": 1,
        "credential_scope": "",
    }
    values.update(fields)
    return Attempt(pk=pk, **values)


def scope_rows(parent: Attempt, child: Attempt) -> list[Change]:
    return [change for change in diff(parent, child).changes if change.what.startswith("credential scope")]


def test_a_narrowed_scope_shows_both_sides_as_they_are() -> None:
    parent = attempt(1, credential_scope="drill:notify drill:send")
    child = attempt(2, credential_scope="drill:send", policy_version=2)
    (row,) = scope_rows(parent, child)
    assert (row.before, row.after) == ("drill:notify drill:send", "drill:send")
    assert row.what == "credential scope (narrowed: drill:notify dropped)"


def test_a_replaced_scope_is_one_row_naming_both_scopes() -> None:
    parent = attempt(1, credential_scope="drill:notify")
    child = attempt(2, credential_scope="drill:send")
    (row,) = scope_rows(parent, child)
    assert (row.before, row.after) == ("drill:notify", "drill:send")
    assert row.what == "credential scope (drill:notify dropped, drill:send added)"


def test_a_scope_dropped_to_nothing_says_none_only_where_there_is_none() -> None:
    parent = attempt(1, credential_scope="email:send")
    child = attempt(2, credential_scope="")
    (row,) = scope_rows(parent, child)
    assert (row.before, row.after) == ("email:send", "")


def test_the_same_scope_in_another_order_is_no_change() -> None:
    parent = attempt(1, credential_scope="a:x b:y")
    child = attempt(2, credential_scope="b:y  a:x")
    assert scope_rows(parent, child) == []
    assert diff(parent, child).same


def test_arguments_are_compared_key_by_key() -> None:
    parent = attempt(1, args={"to": "ap@example.com", "invoice": 7})
    child = attempt(2, args={"to": "ap@example.com", "cc": "cfo@example.com"}, args_hash="b" * 64)
    whats = {change.what: (change.before, change.after) for change in diff(parent, child).changes}
    assert whats["argument cc"] == ("", '"cfo@example.com"')
    assert whats["argument invoice"] == ("7", "")
    assert "argument to" not in whats
    assert whats["args hash"] == ("a" * 64, "b" * 64)

"""GitHub as its own pages describe it, against the replica with what people
and GitHub do to an issue after it was made (transferred, deleted, its
marker edited out) and GitHub's rate limits as they come (a bare 403, a
reset time instead of Retry-After): the lookup never answers "not found"
for an issue GitHub made, and a rate limit is never taken for a refusal."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from ledgerdash.ledger.providers.base import LookupStatus, RateLimited, Sought
from ledgerdash.ledger.providers.presets import PRESETS, github
from tests.replicas import Replicas, adapter_for, kind_again, provider_secrets, replicas
from tests.test_presets import sought

__all__ = ["kind_again", "provider_secrets", "replicas"]
pytestmark = pytest.mark.usefixtures("kind_again")


def a_repository(replicas: Replicas) -> Any:
    """An adapter for a repository of its own (issue numbers from 1), so each test counts its own issues."""
    return adapter_for("github.issue", replicas.url("github"), repository=f"acme/r{uuid.uuid4().hex[:8]}")


def call(key: str) -> dict[str, Any]:
    return PRESETS["github.issue"].example_args(key)


def three_issues(adapter: Any) -> tuple[str, dict[str, Any], str]:
    """Issues #1, #2 (the call's) and #3; the call's key, arguments and number."""
    adapter.dispatch(key="before", args=call("before"))
    key = f"issue:{uuid.uuid4().hex[:8]}"
    sent = adapter.dispatch(key=key, args=call(key))
    adapter.dispatch(key="after", args=call("after"))
    return key, call(key), sent.request_id


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("transfer_every", "-moved/issues/2)"),
        ("transfer_away_every", "GitHub answers 404"),
        ("delete_every", "GitHub answers 410 for it now (deleted)"),
        ("marker_removed_every", "its marker was edited out"),
    ],
)
def test_the_number_github_answered_with_finds_the_issue_whatever_became_of_it(
    mode: str, said: str, replicas: Replicas
) -> None:
    replicas.control("github").modes(**{mode: 2})
    adapter = a_repository(replicas)
    key, args, number = three_issues(adapter)

    answer = adapter.find(sought(key, args, request_id=number))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == number == "2"
    assert said in answer.detail


def test_an_issue_transferred_is_followed_to_where_it_went(replicas: Replicas) -> None:
    replicas.control("github").modes(transfer_every=2)
    adapter = a_repository(replicas)
    key, args, _number = three_issues(adapter)

    answer = adapter.find(sought(key, args))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == "2"
    assert answer.payload_hash == sought(key, args).args_hash


@pytest.mark.parametrize("mode", ["delete_every", "transfer_away_every"])
def test_an_issue_out_of_reach_is_a_blind_spot_not_a_not_found(mode: str, replicas: Replicas) -> None:
    replicas.control("github").modes(**{mode: 2})
    adapter = a_repository(replicas)
    key, args, _number = three_issues(adapter)

    answer = adapter.find(sought(key, args))

    assert answer.status == LookupStatus.NOT_EVIDENCE, answer.detail
    assert answer.extra["blind_spot"] == "transferred_or_deleted"
    assert "#2" in answer.detail


def test_an_issue_whose_marker_was_edited_out_is_for_a_person(replicas: Replicas) -> None:
    replicas.control("github").modes(marker_removed_every=1)
    adapter = a_repository(replicas)
    key, args, _number = three_issues(adapter)

    answer = adapter.find(sought(key, args))

    assert answer.status == LookupStatus.AMBIGUOUS, answer.detail
    assert "edited" in answer.detail


@pytest.mark.parametrize(("mode", "wait"), [("secondary_limit", 60.0), ("reset_header", 7.0)])
def test_a_rate_limit_without_retry_after_is_a_rate_limit_with_githubs_wait(
    mode: str, wait: float, replicas: Replicas
) -> None:
    control = replicas.control("github")
    control.modes(**{mode: True})
    control.faults("*", reject=True, retry_after=7)
    adapter = a_repository(replicas)

    with pytest.raises(RateLimited) as limited:
        adapter.dispatch(key="limited", args=call("limited"))

    assert limited.value.retry_after == pytest.approx(wait, abs=2.0)
    control.faults("*", reject=False, lookup_429=True)
    answer = adapter.find(sought("limited", call("limited")))
    assert answer.status == LookupStatus.UNAVAILABLE
    assert answer.retry_after == pytest.approx(wait, abs=2.0)


def test_old_issues_updated_since_the_call_do_not_hide_it(replicas: Replicas, monkeypatch: Any) -> None:
    """``since`` filters on update time: a hundred old issues commented on since the call fill the first
    page; the lookup stops at the first issue made before the call instead of reading on."""
    monkeypatch.setattr(github, "PAGES", 1)
    control = replicas.control("github")
    adapter = a_repository(replicas)
    comments = adapter_for("github.issue_comment", replicas.url("github"), repository=adapter.settings["repository"])
    for n in range(100):
        adapter.dispatch(key=f"old-{n}", args=call(f"old-{n}"))
    control.advance(3600)
    try:
        sent_after = datetime.fromtimestamp(control._call("POST", "/clock", {"advance": 0})["now"], UTC)
        for n in range(1, 101):
            comments.dispatch(key=f"note-{n}", args={"issue_number": n, "body": "still open"})
        key = f"issue:{uuid.uuid4().hex[:8]}"
        sent = adapter.dispatch(key=key, args=call(key))
        answer = adapter.find(
            Sought(key=key, args_hash=sought(key, call(key)).args_hash, args=call(key), sent_after=sent_after)
        )
    finally:
        control.advance(-3600)
    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id


# --- what is another call's is left out ---------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "without"),
    [("marker_removed_every", LookupStatus.AMBIGUOUS), ("delete_every", LookupStatus.NOT_EVIDENCE)],
)
def test_an_altered_issue_the_ledger_recorded_on_another_call_hides_nothing(
    mode: str, without: LookupStatus, replicas: Replicas
) -> None:
    """#2, edited or deleted since, is the outcome of another side effect the ledger recorded: it cannot be
    this call's, so it neither clouds nor blinds the lookup."""
    replicas.control("github").modes(**{mode: 2})
    adapter = a_repository(replicas)
    adapter.dispatch(key="first", args=call("first"))
    adapter.dispatch(key="another", args=call("another"))
    adapter.dispatch(key="third", args=call("third"))
    key = f"issue:{uuid.uuid4().hex[:8]}"  # never sent

    assert adapter.find(sought(key, call(key))).status == without
    answer = adapter.find(sought(key, call(key), elsewhere={"2"}))

    assert answer.status == LookupStatus.NOT_FOUND, answer.detail


def a_discussion(replicas: Replicas) -> tuple[Any, int]:
    """A comment adapter on a repository of its own, and the issue its comments go to."""
    repository = f"acme/r{uuid.uuid4().hex[:8]}"
    issue = adapter_for("github.issue", replicas.url("github"), repository=repository)
    number = int(issue.dispatch(key="the issue", args=call("the issue")).request_id)
    return adapter_for("github.issue_comment", replicas.url("github"), repository=repository), number


def comment(key: str, number: int) -> dict[str, Any]:
    return {"issue_number": number, "body": f"Retried the export ({key})."}


@pytest.mark.parametrize(
    ("mode", "said"),
    [("comment_edited_every", "marker was edited out"), ("comment_deleted_every", "GitHub answers 404")],
)
def test_the_id_github_answered_a_comment_with_finds_it_whatever_became_of_it(
    mode: str, said: str, replicas: Replicas
) -> None:
    replicas.control("github").modes(**{mode: 1})
    adapter, number = a_discussion(replicas)
    key = f"comment:{uuid.uuid4().hex[:8]}"
    sent = adapter.dispatch(key=key, args=comment(key, number))

    answer = adapter.find(sought(key, comment(key, number), request_id=sent.request_id))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == sent.request_id
    assert said in answer.detail


def test_a_comment_whose_marker_was_edited_out_is_for_a_person_unless_it_is_anothers(replicas: Replicas) -> None:
    replicas.control("github").modes(comment_edited_every=1)
    adapter, number = a_discussion(replicas)
    key = f"comment:{uuid.uuid4().hex[:8]}"
    sent = adapter.dispatch(key=key, args=comment(key, number))

    answer = adapter.find(sought(key, comment(key, number)))

    assert answer.status == LookupStatus.AMBIGUOUS, answer.detail
    assert "edited" in answer.detail
    other = f"comment:{uuid.uuid4().hex[:8]}"
    assert adapter.find(sought(other, comment(other, number), elsewhere={sent.request_id})).status == (
        LookupStatus.NOT_FOUND
    )

"""Jira as Atlassian describes it, against the replica with what people do to
an issue after it was made (its label or its property removed), a search
whose lag has no stated bound, and a project whose create screen lacks
Labels: the lookup never answers "not found" where it could not have seen
the issue, and a refused label says what to change."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import LookupStatus
from ledgerdash.ledger.providers.presets import PRESETS
from tests.replicas import Replicas, adapter_for, kind_again, provider_secrets, replicas
from tests.test_presets import sought

__all__ = ["kind_again", "provider_secrets", "replicas"]
pytestmark = pytest.mark.usefixtures("kind_again")


def made(replicas: Replicas, mode: str = "", **adapter: Any) -> tuple[Any, str, dict[str, Any], str]:
    """An issue made with ``mode`` befalling it (every issue); the adapter, key, arguments and Jira's id."""
    if mode:
        replicas.control("jira").modes(**{mode: 1})
    jira = adapter_for("jira.issue", replicas.url("jira"), **adapter)
    key = f"jira:{uuid.uuid4().hex[:8]}"
    args = PRESETS["jira.issue"].example_args(key)
    return jira, key, args, jira.dispatch(key=key, args=args).request_id


@pytest.mark.parametrize(
    ("mode", "said"),
    [("label_removed_every", "carries this call's reference"), ("property_removed_every", "property was deleted")],
)
def test_the_id_jira_answered_with_finds_the_issue_whatever_became_of_it(
    mode: str, said: str, replicas: Replicas
) -> None:
    jira, key, args, issue_id = made(replicas, mode)

    answer = jira.find(sought(key, args, request_id=issue_id))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == issue_id
    assert said in answer.detail


def test_an_issue_whose_property_was_deleted_is_found_by_its_label_for_a_person_to_confirm(
    replicas: Replicas,
) -> None:
    jira, key, args, issue_id = made(replicas, "property_removed_every")

    answer = jira.find(sought(key, args))

    assert answer.status == LookupStatus.FOUND, answer.detail
    assert answer.request_id == issue_id
    assert answer.payload_hash == ""  # nothing to compare: the reconciler hands it to a person
    assert "property was deleted" in answer.detail


def test_a_search_that_cannot_see_the_issue_is_not_evidence_unless_the_tool_states_its_lag(
    replicas: Replicas,
) -> None:
    jira, key, args, _issue_id = made(replicas, "label_removed_every", lag_stated=False)

    answer = jira.find(sought(key, args))

    assert answer.status == LookupStatus.NOT_EVIDENCE, answer.detail
    assert answer.extra["blind_spot"] == "search_lag_unbounded"


def test_a_project_without_labels_on_its_create_screen_is_refused_with_what_to_change(replicas: Replicas) -> None:
    replicas.control("jira").modes(no_labels_on_create_screen=True)
    jira = adapter_for("jira.issue", replicas.url("jira"))
    key = f"jira:{uuid.uuid4().hex[:8]}"

    with pytest.raises(PermanentFailure, match="add Labels to the project's create screen"):
        jira.dispatch(key=key, args=PRESETS["jira.issue"].example_args(key))
    assert replicas.control("jira").count(key) == 0


def test_the_projects_named_are_read_for_labels_on_their_create_screens_before_any_call(replicas: Replicas) -> None:
    told = adapter_for("jira.issue", replicas.url("jira"), projects="OPS, SUP")
    assert told.setup_warnings() == []
    assert adapter_for("jira.issue", replicas.url("jira")).setup_warnings() == []  # none named: nothing read

    replicas.control("jira").modes(no_labels_on_create_screen=True)
    before = len(replicas.control("jira").effects())
    warnings = told.setup_warnings()

    assert len(warnings) == 2
    assert warnings[0].startswith("project OPS has no Labels on its create screen for Task, Bug: Jira refuses")
    assert "add Labels to the screen" in warnings[0]
    assert len(replicas.control("jira").effects()) == before  # reading the screens made nothing


def test_a_project_whose_screens_cannot_be_read_is_said_so(replicas: Replicas) -> None:
    warnings = adapter_for("jira.issue", replicas.url("jira"), projects="GONE").setup_warnings()

    assert len(warnings) == 1
    assert warnings[0].startswith("could not read project GONE's create screens: Jira answered HTTP 404")


@pytest.mark.django_db
def test_ledger_config_plan_warns_of_a_create_screen_without_labels(replicas: Replicas, tmp_path: Any) -> None:
    from tests.test_ledger_config import run, write

    replicas.control("jira").modes(no_labels_on_create_screen=True)
    path = write(
        tmp_path,
        f"""
[tools."jira.escalate"]
adapter = "preset"

[tools."jira.escalate".config]
preset = "jira.issue"
base_url = "{replicas.url("jira")}"
email = "agent@example.com"
projects = "OPS"
""",
    )

    out = run("plan", path)

    assert (
        'warning: tools."jira.escalate".config: project OPS has no Labels on its create screen for Task, Bug'
    ) in out
    replicas.control("jira").kind()
    assert "warning" not in run("plan", path)

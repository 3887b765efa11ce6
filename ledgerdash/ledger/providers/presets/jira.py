"""Jira Cloud: create an issue (https://developer.atlassian.com/cloud/jira/platform/rest/v3/).

Jira has no idempotency: the same request sent twice makes two issues.
Each issue is created with an issue property ``ledgerdash`` (the call's
reference and the hash of its arguments), set in the same request, and a
label that is the reference itself (``ld-…``): JQL can search a label
without an app, where searching a property needs one that indexes it. The
lookup reads the issue by its id when a dispatcher recorded it (read-after-
write consistent), else searches ``labels = "ld-…"`` through
``/rest/api/3/search/jql`` and reads the property from the results.

Atlassian documents the search as eventually consistent, "from a few
seconds to minutes", with no bound: a search that finds nothing is not
evidence (a blind spot, ``search_lag_unbounded``) unless the tool states
the lag its site keeps to (``lookup_lag_seconds``), and then only once that
lag has passed. An issue found by its label whose property someone deleted
is the call's (the label is the call's reference) with nothing to compare:
a person confirms it. One whose label someone removed is found by its id
when a dispatcher recorded it; without it, the search cannot see it, which
a tool that states its lag takes as outside the promise.

A 400 names the fields that were wrong, a 401 or 403 the credentials, a
404 the project: nothing was created. A 5xx says nothing of whether it was.
A project whose create screen lacks Labels refuses every call (the label
cannot be set): name the projects the agent creates issues in
(``projects``) and ``ledger_config plan`` reads each one's create screens
(the create-meta endpoints) and warns before any call is refused.
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable
from typing import Any, ClassVar

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import BlindSpot, Dispatched, Lookup, Sought
from ledgerdash.ledger.providers.presets.common import (
    MARK,
    LookupUnavailable,
    Option,
    PresetAdapter,
    args_hash,
    choose,
    found,
    not_found,
    received,
    ref,
)

#: The most pages of create metadata read for one project or issue type.
SETUP_PAGES = 20


class JiraIssue(PresetAdapter):
    name = "jira.issue"
    provider = "Jira"
    title = "Jira: create an issue"
    documented_lag_seconds = 60.0
    default_base_url = "https://your-site.atlassian.net"
    options: ClassVar[dict[str, Option]] = {
        "email": Option("the account's email (basic auth with an API token)", required=True),
        "api_token": Option("the account's API token, as ${NAME}", default="${JIRA_API_TOKEN}"),
        "projects": Option(
            "the keys of the projects the agent creates issues in, comma-separated: ledger_config plan checks "
            "that each one's create screens have Labels",
            default="",
        ),
    }
    refused_statuses = frozenset({400, 401, 403, 404})
    blind_spots = (
        BlindSpot(
            "search_lag_unbounded",
            "Jira's search is eventually consistent with no stated bound, and the tool states none it keeps to",
            "Atlassian, Jira Cloud REST API v3: Search for issues using JQL enhanced search, "
            "https://developer.atlassian.com/cloud/jira/platform/rest/v3/api-group-issue-search/",
        ),
    )

    @classmethod
    def parse_config(cls, config: Any) -> dict[str, str]:
        if isinstance(config, dict) and not config.get("base_url"):
            raise ValueError(f"preset {cls.name} needs base_url: your Jira site (https://your-site.atlassian.net)")
        return super().parse_config(config)

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {
            "fields": {
                "project": {"key": "OPS"},
                "issuetype": {"name": "Task"},
                "summary": f"Agent escalation {key}",
            }
        }

    def auth_headers(self) -> dict[str, str]:
        pair = f"{self.settings['email']}:{self.secret('api_token')}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        fields = args.get("fields")
        if not isinstance(fields, dict):
            raise PermanentFailure("a Jira issue's arguments are {fields: {...}} as Jira's create request has them")
        if "properties" in args:
            raise PermanentFailure("properties are the ledger's on a Jira issue: leave them out of the arguments")
        labels = fields.get("labels", [])
        if not isinstance(labels, list):
            raise PermanentFailure("fields.labels must be a list")
        body = {
            **args,
            "fields": {**fields, "labels": [*labels, ref(key)]},
            "properties": [{"key": MARK, "value": {"ref": ref(key), "args_sha256": args_hash(args)}}],
        }
        answer = self.call("POST", "/rest/api/3/issue", json_body=body, sending=True)
        document = answer.document if isinstance(answer.document, dict) else {}
        if answer.status == 201 and document.get("id"):
            received(on_request_id, str(document["id"]))
            return Dispatched(request_id=str(document["id"]), response=document)
        errors = document.get("errors")
        if answer.status == 400 and isinstance(errors, dict) and "labels" in errors:
            raise PermanentFailure(
                f"Jira refused the issue's labels ({errors['labels']}): the ledger labels each issue it makes so "
                "its lookup can find it; add Labels to the project's create screen"
            )
        self.refuse_or_doubt(answer, "the issue")
        raise AssertionError("unreachable")  # pragma: no cover

    def search(self, sought: Sought) -> Lookup:
        reference = ref(sought.key)
        if sought.request_id.isdigit():
            answer = self.call(
                "GET", f"/rest/api/3/issue/{sought.request_id}", params={"fields": "summary,labels", "properties": MARK}
            )
            if answer.ok and _reference(answer.document) == reference:
                return self._found(answer.document)
            if answer.status == 404 or (answer.ok and not _reference(answer.document)):
                # The id Jira answered the call with is its receipt: the issue is the call's, whatever became of it.
                fate = "its property was deleted since" if answer.ok else "Jira answers 404 for it now (deleted?)"
                return self.receipt(sought.request_id, answer.document, f"issue {sought.request_id}", fate)
        params = {
            "jql": f'labels = "{reference}"',
            "fields": "summary,labels",
            "properties": MARK,
            "maxResults": "50",
        }
        answer = self.call("GET", "/rest/api/3/search/jql", params=params)
        issues = answer.document.get("issues") if isinstance(answer.document, dict) else None
        if not isinstance(issues, list):
            raise LookupUnavailable(f"Jira's search answered without issues (HTTP {answer.status})")
        # The label is the call's reference: an issue that carries it is the call's even where its property
        # was deleted since (then with no hash to compare, for a person).
        chosen = choose(
            [i for i in issues if _reference(i) == reference or reference in _labels(i)],
            sought,
            lambda i: str(i.get("id", "")),
            "issues",
        )
        if chosen.match is None:
            said = f"Jira's search has no issue labelled {reference}"
            if not self.lag_stated:
                raise self.blind("search_lag_unbounded", said)
            return not_found(f"{said} (its index can lag: the tool states {self.lookup_lag_seconds:g} s)", chosen)
        return self._found(chosen.match)

    def setup_warnings(self) -> list[str]:
        warnings = []
        for project in [p.strip() for p in self.settings["projects"].split(",") if p.strip()]:
            try:
                lacking = self._types_without_labels(project)
            except LookupUnavailable as exc:
                warnings.append(f"could not read project {project}'s create screens: {exc.detail}")
                continue
            if lacking:
                warnings.append(
                    f"project {project} has no Labels on its create screen for {', '.join(lacking)}: Jira refuses "
                    "every call that creates one (the ledger labels each issue it makes so its lookup can find it); "
                    "add Labels to the screen"
                )
        return warnings

    def _types_without_labels(self, project: str) -> list[str]:
        """The names of ``project``'s issue types whose create screen lacks Labels."""
        base = f"/rest/api/3/issue/createmeta/{urllib.parse.quote(project, safe='')}/issuetypes"
        lacking = []
        for issue_type in self._pages(base, "issueTypes"):
            fields = self._pages(f"{base}/{urllib.parse.quote(str(issue_type.get('id', '')), safe='')}", "fields")
            if not any("labels" in (field.get("fieldId"), field.get("key")) for field in fields):
                lacking.append(str(issue_type.get("name") or issue_type.get("id")))
        return lacking

    def _pages(self, path: str, name: str) -> list[dict[str, Any]]:
        """Every item of a paged create-meta answer (``startAt``, ``maxResults``, ``total``)."""
        items: list[dict[str, Any]] = []
        for _ in range(SETUP_PAGES):
            answer = self.call("GET", path, params={"startAt": str(len(items)), "maxResults": "50"})
            document = answer.document if isinstance(answer.document, dict) else {}
            page = document.get(name, document.get("values"))
            if not answer.ok or not isinstance(page, list):
                raise LookupUnavailable(f"Jira answered HTTP {answer.status}: {answer.text[:200]}")
            items += [item for item in page if isinstance(item, dict)]
            total = document.get("total")
            if not page or document.get("isLast") or (isinstance(total, int) and len(items) >= total):
                return items
        raise LookupUnavailable(f"more than {SETUP_PAGES} pages of {name}")

    def _found(self, issue: dict[str, Any]) -> Lookup:
        value = (issue.get("properties") or {}).get(MARK) or {}
        how = "carries this call's reference" if value else "carries this call's label; its property was deleted"
        return found(
            str(issue.get("id", "")), str(value.get("args_sha256", "")), issue, f"issue {issue.get('key')} {how}"
        )


def _labels(issue: Any) -> list[str]:
    fields = issue.get("fields") if isinstance(issue, dict) else None
    labels = fields.get("labels") if isinstance(fields, dict) else None
    return [str(label) for label in labels] if isinstance(labels, list) else []


def _reference(issue: Any) -> str:
    properties = issue.get("properties") if isinstance(issue, dict) else None
    value = properties.get(MARK) if isinstance(properties, dict) else None
    return str(value.get("ref", "")) if isinstance(value, dict) else ""

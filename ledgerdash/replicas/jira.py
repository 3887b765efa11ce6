"""A replica of Jira Cloud's REST API for issues (versions 2 and 3).

As Atlassian documents it: HTTP basic auth with an email and an API token;
``POST /rest/api/3/issue`` with ``fields`` and ``properties`` answers 201
with ``id``, ``key`` and ``self``, or 400 with ``errorMessages`` and
``errors`` by field; ``GET /rest/api/3/issue/<id or key>`` with ``fields``
and ``properties`` reads it at once; ``/rest/api/3/search/jql`` takes JQL
(here: ``labels = "…"``, ``project = KEY`` and ``key = K-1``, joined by
``AND``), ``fields``, ``properties``, ``maxResults`` and ``nextPageToken``,
and shows an issue only once it is indexed (the search lag);
``/rest/api/3/issue/createmeta/<project>/issuetypes`` lists a project's
issue types and ``…/issuetypes/<id>`` the fields on its create screen, a
page at a time. No idempotency. Every project key exists except ``GONE``.

Its modes (``PUT /modes``) are what people do to an issue after it was
made, and a project set up without Labels, from Atlassian's own pages
(:attr:`Jira.MODES`); its search lag (``search_lag_seconds``) may be set
longer than any wait a preset could choose, as Atlassian states no bound.
"""

from __future__ import annotations

import re
from typing import Any

from ledgerdash.replicas.core import ACT, READ, SEARCH, Effect, Handler, Mode, Replica, Request, Response, iso

EDIT = (
    "Atlassian, Jira Cloud REST API v3: Edit issue, "
    "https://developer.atlassian.com/cloud/jira/platform/rest/v3/api-group-issues/#api-rest-api-3-issue-issueidorkey-put"
)
PROPERTIES = (
    "Atlassian, Jira Cloud REST API v3: Issue properties, "
    "https://developer.atlassian.com/cloud/jira/platform/rest/v3/api-group-issue-properties/"
)

API = r"/rest/api/(?:2|3)"
CLAUSE = re.compile(r'(labels|project|key)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([A-Za-z0-9_.-]+))', re.IGNORECASE)


#: The issue types every project offers.
ISSUE_TYPES = {"10001": "Task", "10002": "Bug"}


def problem(status: int, messages: list[str] | None = None, **errors: str) -> Response:
    return Response(status, {"errorMessages": messages or [], "errors": errors})


class Jira(Replica):
    name = "jira"
    MODES = {
        "label_removed_every": Mode(0, "anyone who edits an issue can remove a label (every Nth issue made)", EDIT),
        "property_removed_every": Mode(
            0, "an issue property can be deleted by anyone who may edit the issue (every Nth issue made)", PROPERTIES
        ),
        "no_labels_on_create_screen": Mode(
            False,
            "a field not on the project's create screen cannot be set: a create naming labels is refused (400)",
            "Atlassian, Jira Cloud REST API v3: Get create field metadata for a project and issue type id, "
            "https://developer.atlassian.com/cloud/jira/platform/rest/v3/api-group-issues/"
            "#api-rest-api-3-issue-createmeta-projectidorkey-issuetypes-issuetypeid-get",
        ),
    }
    FATES = ("label_removed_every", "property_removed_every")

    def _as_now(self, issue: dict[str, Any]) -> dict[str, Any]:
        """The issue as Jira shows it now: a label or a property removed, if that was its fate."""
        fate = self.fate(int(issue["id"]) - 10000)
        if fate == "label_removed":
            labels = [label for label in issue["fields"]["labels"] if not label.startswith("ld-")]
            return {**issue, "fields": {**issue["fields"], "labels": labels}}
        if fate == "property_removed":
            return {**issue, "properties": {}}
        return issue

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        return [
            ("POST", API + r"/issue", ACT, self.create),
            ("GET", API + r"/issue/([^/]+)", READ, self.get),
            ("GET", API + r"/search/jql", SEARCH, self.search),
            ("POST", API + r"/search/jql", SEARCH, self.search),
            ("GET", API + r"/issue/createmeta/([^/]+)/issuetypes", READ, self.issue_types),
            ("GET", API + r"/issue/createmeta/([^/]+)/issuetypes/([^/]+)", READ, self.create_fields),
            ("GET", API + r"/field", READ, lambda _request: Response(200, [])),
            ("GET", API + r"/serverInfo", READ, self.server_info),
        ]

    def authorized(self, request: Request) -> Response | None:
        user, token = request.basic()
        if user and token:
            return None
        return problem(401, ["You are not authenticated. Authentication required to perform this operation."])

    def rate_limit_body(self) -> Any:
        return {"errorMessages": ["Rate limit exceeded."], "errors": {}}

    def server_error_body(self) -> Any:
        return {"errorMessages": ["Internal server error"], "errors": {}}

    def server_info(self, request: Request) -> Response:
        base = f"http://{request.headers.get('Host', 'localhost')}"
        return Response(
            200, {"baseUrl": base, "version": "1001.0.0", "versionNumbers": [1001, 0, 0], "deploymentType": "Cloud"}
        )

    def issue_types(self, request: Request) -> Response:
        """The issue types a project's issues may be created with (Task and Bug in every project)."""
        if request.groups[0] == "GONE":
            return problem(404, ["No project could be found with key 'GONE'."])
        types = [{"id": id_, "name": name, "subtask": False} for id_, name in ISSUE_TYPES.items()]
        return Response(200, {"issueTypes": types, "maxResults": 50, "startAt": 0, "total": len(types)})

    def create_fields(self, request: Request) -> Response:
        """The fields on a project's create screen for an issue type, a page at a time (``startAt``,
        ``maxResults``); Labels is among them unless the project was set up without it."""
        project, issue_type = request.groups
        if project == "GONE" or issue_type not in ISSUE_TYPES:
            return problem(404, ["The project or issue type was not found."])
        names = ["summary", "issuetype", "project", "description", "reporter"]
        if not self.mode("no_labels_on_create_screen"):
            names.append("labels")
        fields = [{"fieldId": n, "key": n, "name": n.title(), "required": n in ("summary", "issuetype")} for n in names]
        start, size = int(request.arg("startAt", "0") or 0), int(request.arg("maxResults", "50") or 50)
        page = fields[start : start + size]
        return Response(200, {"fields": page, "maxResults": size, "startAt": start, "total": len(fields)})

    def create(self, request: Request) -> Response:
        body = request.json()
        fields = body.get("fields") if isinstance(body, dict) else None
        if not isinstance(fields, dict):
            return problem(400, ["the request needs fields"])
        project = (fields.get("project") or {}).get("key") if isinstance(fields.get("project"), dict) else None
        if not isinstance(project, str) or not project or project == "GONE":
            return problem(400, project="valid project is required")
        if not isinstance(fields.get("summary"), str) or not fields["summary"].strip():
            return problem(400, summary="You must specify a summary of the issue.")
        if not isinstance(fields.get("issuetype"), dict):
            return problem(400, issuetype="Specify an issue type")
        labels = fields.get("labels", [])
        if "labels" in fields and self.mode("no_labels_on_create_screen"):
            return problem(400, labels="Field 'labels' cannot be set. It is not on the appropriate screen, or unknown.")
        if not isinstance(labels, list) or any(not isinstance(x, str) or " " in x for x in labels):
            return problem(400, labels="Labels cannot contain spaces")
        properties = {}
        for item in body.get("properties") or []:
            if not isinstance(item, dict) or not isinstance(item.get("key"), str):
                return problem(400, ["properties are objects with a key and a value"])
            properties[item["key"]] = item.get("value")
        issue_id = str(10000 + self.next_id())
        number = 1 + sum(1 for e in self.of_kind("issue") if e.document["fields"]["project"]["key"] == project)
        key = f"{project}-{number}"
        host = request.headers.get("Host", "localhost")
        issue = {
            "id": issue_id,
            "key": key,
            "self": f"http://{host}/rest/api/3/issue/{issue_id}",
            "fields": {**fields, "labels": labels, "created": iso(self.now()), "status": {"name": "To Do"}},
            "properties": properties,
        }
        self.record(Effect("issue", issue_id, self.now(), issue))
        return Response(201, {"id": issue_id, "key": key, "self": issue["self"]})

    @staticmethod
    def _shown(issue: dict[str, Any], request: Request) -> dict[str, Any]:
        wanted_fields = [f for f in request.arg("fields", "*all").split(",") if f]
        wanted_props = [p for p in request.arg("properties").split(",") if p]
        fields = issue["fields"]
        if "*all" not in wanted_fields and "*navigable" not in wanted_fields:
            fields = {k: v for k, v in fields.items() if k in wanted_fields}
        shown = {k: issue[k] for k in ("id", "key", "self")}
        shown["fields"] = fields
        if wanted_props:
            everything = "*all" in wanted_props
            shown["properties"] = {k: v for k, v in issue["properties"].items() if everything or k in wanted_props}
        return shown

    def get(self, request: Request) -> Response:
        wanted = request.groups[0]
        issue = next((e.document for e in self.of_kind("issue") if wanted in (e.id, e.document["key"])), None)
        if issue is None:
            return problem(404, ["Issue does not exist or you do not have permission to see it."])
        return Response(200, self._shown(self._as_now(issue), request))

    def search(self, request: Request) -> Response:
        if request.method == "POST":
            posted = request.json() or {}
            request.query.update({k: [",".join(v) if isinstance(v, list) else str(v)] for k, v in posted.items()})
        jql = re.split(r"\s+ORDER\s+BY\s+", request.arg("jql"), flags=re.IGNORECASE)[0].strip()
        clauses = [c.strip() for c in re.split(r"\s+AND\s+", jql, flags=re.IGNORECASE)] if jql else []
        wanted = []
        for clause in clauses:
            found = CLAUSE.fullmatch(clause)
            if found is None:
                return problem(400, [f"Error in the JQL Query: this replica does not understand {clause!r}."])
            wanted.append((found.group(1).lower(), found.group(2) if found.group(2) is not None else found.group(3)))

        def matches(issue: dict[str, Any]) -> bool:
            for name, value in wanted:
                if name == "labels" and value not in issue["fields"]["labels"]:
                    return False
                if name == "project" and issue["fields"]["project"]["key"] != value:
                    return False
                if name == "key" and issue["key"] != value:
                    return False
            return True

        shown = [self._as_now(e.document) for e in reversed(self.of_kind("issue", searching=True))]
        issues = [issue for issue in shown if matches(issue)]
        size = min(int(request.arg("maxResults", "50") or 50), 5000)
        start = int(request.arg("nextPageToken", "0") or 0)
        page = issues[start : start + size]
        body: dict[str, Any] = {
            "issues": [self._shown(i, request) for i in page],
            "isLast": start + size >= len(issues),
        }
        if not body["isLast"]:
            body["nextPageToken"] = str(start + size)
        return Response(200, body)

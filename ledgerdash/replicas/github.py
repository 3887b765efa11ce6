"""A replica of GitHub's REST API for issues and issue comments.

As GitHub documents it: a token as ``Authorization: Bearer`` (or
``token``), JSON bodies, 201 with the created resource; 401 for bad
credentials, 404 for a repository it does not know, 410 where issues are
off, 422 with ``errors`` for a bad field; rate limits as 403 or 429 with
``x-ratelimit-remaining: 0`` and ``Retry-After``; listings newest first by
creation (``sort=created``), ``since`` on updated time, ``per_page`` and
``page``. No idempotency. Every ``owner/name`` repository exists, except
``*/gone`` (404) and ``*/no-issues`` (410).

Its modes (``PUT /modes``) are what people and GitHub do to an issue after
it was made, and how GitHub limits a caller, from GitHub's own pages
(:attr:`GitHub.MODES`): every Nth issue made is transferred (to
``<owner>/<name>-moved``, answered 301 by its old number; or where the token
cannot read, 404), deleted (410), or has its body edited so the hidden
marker is gone; every Nth comment is deleted or edited the same way.
"""

from __future__ import annotations

import calendar
import hashlib
import re
import time
from typing import Any

from ledgerdash.replicas.core import ACT, READ, Effect, Handler, Mode, Replica, Request, Response, iso

REPO = r"/repos/([^/]+/[^/]+)"
GET_ISSUE = (
    "GitHub, REST API endpoints for issues: Get an issue, https://docs.github.com/en/rest/issues/issues#get-an-issue"
)
LIMITS = (
    "GitHub, Rate limits for the REST API, "
    "https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api"
)
#: The preset's hidden marker, as an edit that removes it leaves the body.
MARKER = re.compile(r"\s*<!-- ledgerdash:ref=[^>]*-->")


def problem(status: int, message: str, **extra: Any) -> Response:
    return Response(status, {"message": message, "documentation_url": "https://docs.github.com/rest", **extra})


class GitHub(Replica):
    name = "github"
    MODES = {
        "transfer_every": Mode(
            0,
            "an issue transferred to another repository leaves this one's listing; by its old number GitHub "
            "answers 301 Moved Permanently to where it went",
            GET_ISSUE,
        ),
        "transfer_away_every": Mode(
            0, "an issue transferred where the token cannot read: by its old number, 404 Not Found", GET_ISSUE
        ),
        "delete_every": Mode(
            0, "an issue deleted from a repository the token can read: by its number, 410 Gone", GET_ISSUE
        ),
        "marker_removed_every": Mode(
            0,
            "anyone who can edit an issue can change its body, the hidden marker with it",
            "GitHub, Editing an issue, "
            "https://docs.github.com/en/issues/tracking-your-work-with-issues/using-issues/editing-an-issue",
        ),
        "comment_edited_every": Mode(
            0,
            "anyone who can edit a comment can change its body, the hidden marker with it",
            "GitHub, REST API endpoints for issue comments: Update an issue comment, "
            "https://docs.github.com/en/rest/issues/comments#update-an-issue-comment",
        ),
        "comment_deleted_every": Mode(
            0,
            "a comment can be deleted: by its id, 404 Not Found, and gone from its issue's listing",
            "GitHub, REST API endpoints for issue comments: Delete an issue comment, "
            "https://docs.github.com/en/rest/issues/comments#delete-an-issue-comment",
        ),
        "secondary_limit": Mode(
            False,
            "a secondary rate limit answers 403 or 429, possibly with neither retry-after nor "
            "x-ratelimit-remaining: 0 (then wait at least one minute)",
            LIMITS,
        ),
        "reset_header": Mode(
            False,
            "the primary rate limit answers with x-ratelimit-remaining: 0 and x-ratelimit-reset (when it resets, "
            "in UTC epoch seconds), no retry-after",
            LIMITS,
        ),
    }
    FATES = ("delete_every", "transfer_away_every", "transfer_every", "marker_removed_every")
    #: What may befall every Nth comment made (counted by its id).
    COMMENT_FATES = ("comment_deleted_every", "comment_edited_every")

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        return [
            ("GET", REPO, READ, self.get_repo),
            ("POST", REPO + r"/issues", ACT, self.create_issue),
            ("GET", REPO + r"/issues", READ, self.list_issues),
            ("GET", REPO + r"/issues/comments/(\d+)", READ, self.get_comment),
            ("GET", REPO + r"/issues/(\d+)", READ, self.get_issue),
            ("POST", REPO + r"/issues/(\d+)/comments", ACT, self.create_comment),
            ("GET", REPO + r"/issues/(\d+)/comments", READ, self.list_comments),
        ]

    def authorized(self, request: Request) -> Response | None:
        if request.bearer():
            return None
        return problem(401, "Requires authentication")

    def rate_limit_body(self) -> Any:
        if self.mode("secondary_limit"):
            return {
                "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
                "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
            }
        return {"message": "API rate limit exceeded", "documentation_url": "https://docs.github.com/rest"}

    def rate_limit_status(self) -> int:
        return 403 if self.mode("secondary_limit") or self.mode("reset_header") else 429

    def rate_limit_headers(self) -> dict[str, str]:
        if self.mode("secondary_limit"):
            return {}
        if self.mode("reset_header"):
            reset = int(self.now() + float(self.fault("retry_after")))
            return {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
        return super().rate_limit_headers()

    def server_error_body(self) -> Any:
        return {"message": "Server Error"}

    @staticmethod
    def api(request: Request) -> str:
        """The API's own address, as GitHub Enterprise names its host in the URLs it returns."""
        return f"http://{request.headers.get('Host', 'localhost')}"

    def _repo(self, repo: str) -> Response | None:
        if repo.endswith("/gone"):
            return problem(404, "Not Found")
        if repo.endswith("/no-issues"):
            return problem(410, "Issues are disabled for this repo")
        return None

    def get_repo(self, request: Request) -> Response:
        repo = request.groups[0]
        if repo.endswith("/gone"):
            return problem(404, "Not Found")
        owner, name = repo.split("/")
        return Response(
            200,
            {
                "id": int(hashlib.sha256(repo.encode()).hexdigest()[:8], 16),
                "name": name,
                "full_name": repo,
                "owner": {"login": owner},
                "private": False,
                "has_issues": not repo.endswith("/no-issues"),
                "url": f"{self.api(request)}/repos/{repo}",
                "html_url": f"https://github.com/{repo}",
            },
        )

    def _issues(self, repo: str) -> list[dict[str, Any]]:
        """The issues made in ``repo``, as GitHub holds them (those moved away included)."""
        return [e.document for e in self.of_kind("issue") if e.document["repository"] == repo]

    def _as_now(self, issue: dict[str, Any]) -> dict[str, Any]:
        """The issue as GitHub shows it now: its body edited, if that was its fate."""
        if self.fate(issue["number"]) == "marker_removed":  # edited a minute after it was made
            edited = iso(calendar.timegm(time.strptime(issue["created_at"], "%Y-%m-%dT%H:%M:%SZ")) + 60)
            return {**issue, "body": MARKER.sub("", issue.get("body") or ""), "updated_at": edited}
        return issue

    def _moved(self, issue: dict[str, Any]) -> dict[str, Any]:
        """Where a transferred issue lives now: ``<owner>/<name>-moved``, under the same number."""
        there = f"{issue['repository']}-moved"
        return {**issue, "repository": there, "html_url": f"https://github.com/{there}/issues/{issue['number']}"}

    def _transferred(self, moved_repo: str) -> list[dict[str, Any]]:
        """The issues transferred to ``moved_repo``, as they are there."""
        source = moved_repo.removesuffix("-moved")
        return [self._moved(i) for i in self._issues(source) if self.fate(i["number"]) == "transfer"]

    def create_issue(self, request: Request) -> Response:
        repo = request.groups[0]
        if (refused := self._repo(repo)) is not None:
            return refused
        body = request.json() or {}
        if not isinstance(body, dict) or not isinstance(body.get("title"), str) or not body["title"]:
            return problem(
                422, "Validation Failed", errors=[{"resource": "Issue", "field": "title", "code": "missing"}]
            )
        number = len(self._issues(repo)) + 1
        now = iso(self.now())
        issue = {
            "id": self.next_id(),
            "node_id": f"I_replica{number}",
            "number": number,
            "title": body["title"],
            "body": body.get("body"),
            "state": "open",
            "labels": [{"name": name} for name in body.get("labels") or []],
            "html_url": f"https://github.com/{repo}/issues/{number}",
            "url": f"{self.api(request)}/repos/{repo}/issues/{number}",
            "created_at": now,
            "updated_at": now,
            "user": {"login": "replica-bot", "id": 1},
            "comments": 0,
            "repository": repo,
        }
        self.record(Effect("issue", str(issue["id"]), self.now(), issue))
        return Response(201, self._shown(issue))

    @staticmethod
    def _shown(item: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if k not in ("repository", "issue_number")}

    def _page(self, request: Request, items: list[dict[str, Any]]) -> Response:
        since = request.arg("since")
        if since:
            items = [i for i in items if i["updated_at"] >= since]
        reverse = request.arg("direction", "desc") == "desc"
        items = sorted(items, key=lambda i: (i["created_at"], i["id"]), reverse=reverse)
        per_page = min(int(request.arg("per_page", "30") or 30), 100)
        page = max(int(request.arg("page", "1") or 1), 1)
        return Response(200, [self._shown(i) for i in items[(page - 1) * per_page : page * per_page]])

    def list_issues(self, request: Request) -> Response:
        if (refused := self._repo(request.groups[0])) is not None:
            return refused
        repo = request.groups[0]
        if repo.endswith("-moved"):
            issues = self._transferred(repo)
        else:
            issues = [self._as_now(i) for i in self._issues(repo) if self.fate(i["number"]) in ("", "marker_removed")]
        state = request.arg("state", "open")
        if state != "all":
            issues = [i for i in issues if i["state"] == state]
        return self._page(request, issues)

    def get_issue(self, request: Request) -> Response:
        repo, number = request.groups
        if repo.endswith("-moved"):
            found = next((i for i in self._transferred(repo) if i["number"] == int(number)), None)
            return Response(200, self._shown(found)) if found else problem(404, "Not Found")
        issue = next((i for i in self._issues(repo) if i["number"] == int(number)), None)
        if issue is None:
            return problem(404, "Not Found")
        fate = self.fate(issue["number"])
        if fate == "delete":
            return problem(410, "This issue was deleted")
        if fate == "transfer_away":
            return problem(404, "Not Found")
        if fate == "transfer":
            moved = self._moved(issue)
            location = f"{self.api(request)}/repos/{moved['repository']}/issues/{moved['number']}"
            return Response(
                301,
                {"message": "Moved Permanently", "url": location, "documentation_url": GET_ISSUE.rsplit(" ", 1)[-1]},
                {"Location": location},
            )
        return Response(200, self._shown(self._as_now(issue)))

    def _comments(self, repo: str) -> list[dict[str, Any]]:
        """``repo``'s comments as GitHub shows them now: those deleted left out, those edited without
        the marker (a minute after they were made)."""
        shown = []
        for comment in (e.document for e in self.of_kind("comment") if e.document["repository"] == repo):
            fate = self.fate(comment["id"], self.COMMENT_FATES)
            if fate == "comment_deleted":
                continue
            if fate == "comment_edited":
                edited = iso(calendar.timegm(time.strptime(comment["created_at"], "%Y-%m-%dT%H:%M:%SZ")) + 60)
                comment = {**comment, "body": MARKER.sub("", comment["body"]), "updated_at": edited}
            shown.append(comment)
        return shown

    def create_comment(self, request: Request) -> Response:
        repo, number = request.groups
        if (refused := self._repo(repo)) is not None:
            return refused
        issue = next((i for i in self._issues(repo) if i["number"] == int(number)), None)
        if issue is None:
            return problem(404, "Not Found")
        body = request.json() or {}
        if not isinstance(body, dict) or not isinstance(body.get("body"), str) or not body["body"]:
            return problem(
                422, "Validation Failed", errors=[{"resource": "IssueComment", "field": "body", "code": "missing"}]
            )
        now = iso(self.now())
        comment_id = self.next_id()
        comment = {
            "id": comment_id,
            "node_id": f"IC_replica{comment_id}",
            "body": body["body"],
            "html_url": f"https://github.com/{repo}/issues/{number}#issuecomment-{comment_id}",
            "issue_url": f"{self.api(request)}/repos/{repo}/issues/{number}",
            "url": f"{self.api(request)}/repos/{repo}/issues/comments/{comment_id}",
            "created_at": now,
            "updated_at": now,
            "user": {"login": "replica-bot", "id": 1},
            "repository": repo,
            "issue_number": int(number),
        }
        self.record(Effect("comment", str(comment_id), self.now(), comment))
        with self.lock:
            issue["updated_at"] = now  # a comment updates its issue, as `since` sees it
        return Response(201, self._shown(comment))

    def list_comments(self, request: Request) -> Response:
        repo, number = request.groups
        comments = [c for c in self._comments(repo) if c["issue_number"] == int(number)]
        # Comments list oldest first, as GitHub's do.
        request.query.setdefault("direction", ["asc"])
        return self._page(request, comments)

    def get_comment(self, request: Request) -> Response:
        repo, comment_id = request.groups
        comment = next((c for c in self._comments(repo) if c["id"] == int(comment_id)), None)
        return Response(200, self._shown(comment)) if comment else problem(404, "Not Found")

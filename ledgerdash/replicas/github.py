"""A replica of GitHub's REST API for issues and issue comments.

As GitHub documents it: a token as ``Authorization: Bearer`` (or
``token``), JSON bodies, 201 with the created resource; 401 for bad
credentials, 404 for a repository it does not know, 410 where issues are
off, 422 with ``errors`` for a bad field; rate limits as 403 or 429 with
``x-ratelimit-remaining: 0`` and ``Retry-After``; listings newest first by
creation (``sort=created``), ``since`` on updated time, ``per_page`` and
``page``. No idempotency. Every ``owner/name`` repository exists, except
``*/gone`` (404) and ``*/no-issues`` (410).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ledgerdash.replicas.core import ACT, READ, Effect, Handler, Replica, Request, Response, iso

REPO = r"/repos/([^/]+/[^/]+)"


def problem(status: int, message: str, **extra: Any) -> Response:
    return Response(status, {"message": message, "documentation_url": "https://docs.github.com/rest", **extra})


class GitHub(Replica):
    name = "github"

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
        return {"message": "API rate limit exceeded", "documentation_url": "https://docs.github.com/rest"}

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
        return [e.document for e in self.of_kind("issue") if e.document["repository"] == repo]

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
        issues = self._issues(request.groups[0])
        state = request.arg("state", "open")
        if state != "all":
            issues = [i for i in issues if i["state"] == state]
        return self._page(request, issues)

    def get_issue(self, request: Request) -> Response:
        repo, number = request.groups
        issue = next((i for i in self._issues(repo) if i["number"] == int(number)), None)
        return Response(200, self._shown(issue)) if issue else problem(404, "Not Found")

    def _comments(self, repo: str) -> list[dict[str, Any]]:
        return [e.document for e in self.of_kind("comment") if e.document["repository"] == repo]

    def create_comment(self, request: Request) -> Response:
        repo, number = request.groups
        if (refused := self._repo(repo)) is not None:
            return refused
        if not any(i["number"] == int(number) for i in self._issues(repo)):
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

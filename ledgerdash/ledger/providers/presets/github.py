"""GitHub: open an issue, comment on one (https://docs.github.com/en/rest/issues).

GitHub has no idempotency: the same request sent twice opens two issues.
Each issue or comment the preset writes ends with a hidden marker, an HTML
comment that Markdown does not render::

    <!-- ledgerdash:ref=ld-… args_sha256=… -->

and the lookup finds it by reading the repository's issues (or the issue's
comments) created since the first dispatch claim, less five minutes for
the clocks; by its number or id when a dispatcher recorded one. Those
listings read the repository itself, not a search index; GitHub documents
no lag for them, so the preset keeps a margin of ten seconds. GitHub's
search (``/search/issues``) would find the marker too, but its index lags
behind by seconds to minutes, so the preset does not use it.

A refusal is definitive when GitHub says what was wrong (401, 404, 410
when issues are off, 422 for a field); a 403 or 429 with
``x-ratelimit-remaining: 0`` or ``Retry-After`` is a rate limit (nothing
done; come back later); a 5xx says nothing of whether the issue was made.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import Dispatched, Lookup, Sought
from ledgerdash.ledger.providers.presets.common import (
    MARK,
    Answer,
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

MARKER = re.compile(rf"<!-- {MARK}:ref=(ld-[0-9a-f]{{40}}) args_sha256=([0-9a-f]{{64}}) -->")
PAGES = 20


def marker(key: str, args: dict[str, Any]) -> str:
    return f"<!-- {MARK}:ref={ref(key)} args_sha256={args_hash(args)} -->"


def read_marker(body: Any) -> tuple[str, str]:
    """The reference and arguments hash a body's marker carries ("" for none)."""
    found_at = MARKER.search(body) if isinstance(body, str) else None
    return (found_at.group(1), found_at.group(2)) if found_at else ("", "")


class _GitHub(PresetAdapter):
    provider = "GitHub"
    #: GitHub documents no lag for its listings (they read the repository itself): a margin.
    documented_lag_seconds = 10.0
    default_base_url = "https://api.github.com"
    options: ClassVar[dict[str, Option]] = {
        "repository": Option("the repository, owner/name", required=True),
        "token": Option("a token that may write issues, as ${NAME}", default="${GITHUB_TOKEN}"),
    }
    refused_statuses = frozenset({400, 401, 403, 404, 410, 422})
    noun: ClassVar[str]

    @classmethod
    def parse_config(cls, config: Any) -> dict[str, str]:
        settings = super().parse_config(config)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", settings["repository"]):
            raise ValueError(f"preset {cls.name}: repository must be owner/name, not {settings['repository']!r}")
        return settings

    def auth_headers(self) -> dict[str, str]:
        return {
            "Authorization": "Bearer " + self.secret("token"),
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }

    def rate_limited(self, answer: Answer) -> bool:
        limited = answer.headers.get("x-ratelimit-remaining") == "0" or "retry-after" in answer.headers
        return answer.status == 429 or (answer.status == 403 and limited)

    @property
    def repo_path(self) -> str:
        return f"/repos/{self.settings['repository']}"

    def _post(
        self,
        path: str,
        key: str,
        args: dict[str, Any],
        payload: dict[str, Any],
        on_request_id: Callable[[str], None] | None,
    ) -> Dispatched:
        body = payload.get("body", "")
        if not isinstance(body, str):
            raise PermanentFailure(f"a GitHub {self.noun}'s body must be text")
        if MARKER.search(body):
            raise PermanentFailure(f"the {self.noun}'s body already holds a ledger marker: the ledger writes it")
        payload = {**payload, "body": (body + "\n\n" if body else "") + marker(key, args)}
        answer = self.call("POST", path, json_body=payload, sending=True)
        document = answer.document if isinstance(answer.document, dict) else {}
        if answer.status == 201 and document.get("id"):
            request_id = str(document.get("number") or document["id"])
            received(on_request_id, request_id)
            return Dispatched(request_id=request_id, response=document)
        self.refuse_or_doubt(answer, f"the {self.noun}")
        raise AssertionError("unreachable")  # pragma: no cover

    def _listing(self, path: str, sought: Sought, params: dict[str, str]) -> list[dict[str, Any]]:
        """Every item of a listing made since the call whose marker is the call's."""
        reference, start = ref(sought.key), self.window_start(sought)
        matches: list[dict[str, Any]] = []
        params = {**params, "since": start.strftime("%Y-%m-%dT%H:%M:%SZ"), "per_page": "100"}
        for page in range(1, PAGES + 1):
            answer = self.call("GET", path, params={**params, "page": str(page)})
            if not isinstance(answer.document, list):
                raise LookupUnavailable(f"GitHub's listing answered without a list (HTTP {answer.status})")
            for item in answer.document:
                # A page can repeat an item of the last when new ones are made meanwhile: one match per id.
                if read_marker(item.get("body"))[0] == reference and item.get("id") not in {
                    m.get("id") for m in matches
                }:
                    matches.append(item)
            if len(answer.document) < 100:
                return matches
        raise LookupUnavailable(f"more than {PAGES * 100} {self.noun}s since the call: not all were read")

    def _by_id(self, path: str, sought: Sought) -> Lookup | None:
        """The item a dispatcher recorded the id of, read at ``path``, when it carries the call's marker."""
        if not sought.request_id.isdigit():
            return None
        answer = self.call("GET", path)
        if answer.ok and read_marker((answer.document or {}).get("body"))[0] == ref(sought.key):
            return self._found(answer.document, sought.request_id)
        return None

    def _found(self, item: dict[str, Any], request_id: str) -> Lookup:
        return found(
            request_id,
            read_marker(item.get("body"))[1],
            item,
            f"{self.noun} {request_id} carries this call's marker ({item.get('html_url', '')})",
        )


class Issue(_GitHub):
    name = "github.issue"
    title = "GitHub: open an issue"
    noun = "issue"

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"title": "Nightly export failed", "body": f"Seen by the agent ({key}).", "labels": ["agent"]}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        if not isinstance(args.get("title"), str) or not args["title"]:
            raise PermanentFailure("an issue's arguments need a title")
        return self._post(f"{self.repo_path}/issues", key, args, dict(args), on_request_id)

    def search(self, sought: Sought) -> Lookup:
        if (by_id := self._by_id(f"{self.repo_path}/issues/{sought.request_id}", sought)) is not None:
            return by_id
        matches = self._listing(
            f"{self.repo_path}/issues", sought, {"state": "all", "sort": "created", "direction": "desc"}
        )
        chosen = choose(matches, sought, lambda m: str(m.get("number", "")), "issues")
        if chosen.match is None:
            repository = self.settings["repository"]
            return not_found(f"no issue of {repository} made since the call carries its marker", chosen)
        return self._found(chosen.match, str(chosen.match.get("number", "")))


class IssueComment(_GitHub):
    name = "github.issue_comment"
    title = "GitHub: comment on an issue"
    noun = "comment"

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"issue_number": 1, "body": f"The agent retried the export ({key})."}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        number = args.get("issue_number")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise PermanentFailure("a comment's arguments need issue_number, the issue's number")
        payload = {name: value for name, value in args.items() if name != "issue_number"}
        return self._post(f"{self.repo_path}/issues/{number}/comments", key, args, payload, on_request_id)

    def search(self, sought: Sought) -> Lookup:
        number = sought.args.get("issue_number")
        if not isinstance(number, int):
            raise LookupUnavailable("a comment is found on its issue; the call's arguments name none")
        if (by_id := self._by_id(f"{self.repo_path}/issues/comments/{sought.request_id}", sought)) is not None:
            return by_id
        comments = self._listing(f"{self.repo_path}/issues/{number}/comments", sought, {})
        chosen = choose(comments, sought, lambda m: str(m.get("id", "")), "comments")
        if chosen.match is None:
            return not_found(f"no comment on issue {number} made since the call carries its marker", chosen)
        return self._found(chosen.match, str(chosen.match.get("id", "")))

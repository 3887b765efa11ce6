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

What people and GitHub may do to an issue after it was made, and how the
lookup allows for it:

- Its number, once a dispatcher recorded it, is GitHub's receipt: read by
  that number, an issue whose marker someone edited out, one transferred
  (301, followed to where it went) or one deleted or moved where the token
  cannot read (410, 404) is the call's, found with nothing to compare.
- Without a number, the listing reads the issues made since the call
  (``since`` filters on update time, so it stops at the first issue made
  before the call rather than reading every old issue touched since). An
  issue made in the window whose body was edited and carries no marker may
  be the call's: ambiguous, for a person. A number missing between two
  issues of the window is looked up: transferred, it is followed; deleted
  or moved out of reach, it is a blind spot (``transferred_or_deleted``),
  not evidence. An issue the newest of all or alone in its window and then
  deleted or moved out of reach leaves no gap: outside the promise. An
  issue whose number the ledger recorded on another side effect is that
  call's: it neither clouds nor blinds this lookup.
- A comment is read by the id a dispatcher recorded the same way (edited
  or deleted since, it is the call's); without one, a comment of the window
  edited since that carries no marker is ambiguous. A comment deleted
  before its id was recorded leaves no trace: outside the promise.

A refusal is definitive when GitHub says what was wrong (401, 404, 410
when issues are off, 422 for a field). A 429, or a 403 with
``x-ratelimit-remaining: 0``, ``Retry-After`` or a message naming a rate
limit (GitHub's secondary limits may send neither header), is a rate limit:
nothing done; come back after ``Retry-After``, else when
``x-ratelimit-reset`` says, else a minute. A 5xx says nothing of whether
the issue was made.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from ledgerdash.ledger import clock
from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import BlindSpot, Dispatched, Lookup, LookupStatus, Sought
from ledgerdash.ledger.providers.presets.common import (
    MARK,
    Answer,
    LookupUnavailable,
    Option,
    PresetAdapter,
    args_hash,
    changed_may_be,
    choose,
    found,
    not_found,
    received,
    ref,
)

MARKER = re.compile(rf"<!-- {MARK}:ref=(ld-[0-9a-f]{{40}}) args_sha256=([0-9a-f]{{64}}) -->")
PAGES = 20
#: The most numbers missing from a window the lookup asks after, one by one.
PROBES = 20
GET_ISSUE = (
    "GitHub, REST API endpoints for issues: Get an issue, https://docs.github.com/en/rest/issues/issues#get-an-issue"
)
LIST_ISSUES = (
    "GitHub, REST API endpoints for issues: List repository issues, "
    "https://docs.github.com/en/rest/issues/issues#list-repository-issues"
)


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
    blind_spots: ClassVar[tuple[BlindSpot, ...]] = (
        BlindSpot(
            "page_cap",
            "more were made or updated since the call than the lookup reads: it did not read back to when the call "
            "was made",
            LIST_ISSUES,
        ),
    )

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
        message = answer.document.get("message", "") if isinstance(answer.document, dict) else ""
        limited = limited or "rate limit" in str(message).lower()  # a secondary limit may send no header
        return answer.status == 429 or (answer.status == 403 and limited)

    def retry_after(self, answer: Answer) -> float | None:
        said = super().retry_after(answer)
        if said is not None:
            return said
        reset = answer.headers.get("x-ratelimit-reset", "")
        if reset.isdigit():
            return min(max(int(reset) - clock.now().timestamp(), 0.0), 86400.0)
        return 60.0  # GitHub: otherwise wait at least one minute

    def lookup_absent_statuses(self) -> frozenset[int]:
        return frozenset({301, 404, 410})  # moved, gone, deleted: read by the lookup

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
        """Every item of a listing made since the call (each once), whatever its marker."""
        start = self.window_start(sought)
        items: dict[Any, dict[str, Any]] = {}
        params = {**params, "since": start.strftime("%Y-%m-%dT%H:%M:%SZ"), "per_page": "100"}
        newest_first = params.get("direction") == "desc"
        for page in range(1, PAGES + 1):
            answer = self.call("GET", path, params={**params, "page": str(page)})
            if not isinstance(answer.document, list):
                raise LookupUnavailable(f"GitHub's listing answered without a list (HTTP {answer.status})")
            for item in answer.document:
                made = _made(item)
                if made is None or made >= start:
                    # A page can repeat an item of the last when new ones are made meanwhile: one per id.
                    items.setdefault(item.get("id"), item)
            oldest = _made(answer.document[-1]) if answer.document else None
            if len(answer.document) < 100 or (newest_first and oldest is not None and oldest < start):
                return list(items.values())
        raise self.blind("page_cap", f"no {self.noun} among the {PAGES * 100} read carries this call's marker")

    def _mine(self, items: list[dict[str, Any]], sought: Sought) -> list[dict[str, Any]]:
        return [item for item in items if _carries(item, sought)]

    def _edited(self, items: list[dict[str, Any]], sought: Sought, id_of: Callable[[Any], str], nothing: str) -> None:
        """Raise :class:`Ambiguous` when an item of the window carries no marker and was edited since it
        was made: the marker may have been edited out of the call's (:func:`changed_may_be`)."""
        edited = [
            item
            for item in items
            if not read_marker(item.get("body"))[0] and item.get("updated_at") != item.get("created_at")
        ]
        how = "were edited and carry no marker: it may have been edited out of the call's"
        changed_may_be(edited, sought, id_of, nothing, how, shown_as=self.shown_id)

    def shown_id(self, request_id: str) -> str:
        return request_id

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

    blind_spots = (
        *_GitHub.blind_spots,
        BlindSpot(
            "transferred_or_deleted",
            "an issue made since the call was deleted or transferred where the token cannot read (GitHub answers "
            "410 or 404 for its number), and it may have been the call's",
            GET_ISSUE,
        ),
    )

    def search(self, sought: Sought) -> Lookup:
        if sought.request_id.isdigit():
            receipt = self._by_number(int(sought.request_id), sought, recorded=True)
            if receipt is not None:
                return receipt
        items = self._listing(
            f"{self.repo_path}/issues", sought, {"state": "all", "sort": "created", "direction": "desc"}
        )
        chosen = choose(self._mine(items, sought), sought, lambda m: str(m.get("number", "")), "issues")
        if chosen.match is not None:
            return self._found(chosen.match, str(chosen.match.get("number", "")))
        numbers = {item["number"] for item in items if isinstance(item.get("number"), int)}
        # A number the ledger recorded on another side effect is that call's issue, wherever it went.
        gaps = [
            n
            for n in range(min(numbers, default=0) + 1, max(numbers, default=0))
            if n not in numbers and not sought.elsewhere(str(n))
        ]
        out_of_reach = []
        for number in gaps[:PROBES]:
            lookup = self._by_number(number, sought, recorded=False)
            if lookup is not None and lookup.status == LookupStatus.FOUND:
                return lookup
            if lookup is not None:
                out_of_reach.append(number)
        repository = self.settings["repository"]
        if out_of_reach or len(gaps) > PROBES:
            shown = ", ".join(f"#{n}" for n in out_of_reach[:5]) or f"{len(gaps)} numbers"
            raise self.blind(
                "transferred_or_deleted", f"no issue of {repository} made since the call carries its marker ({shown})"
            )
        nothing = f"no issue of {repository} made since the call carries its marker"
        self._edited(items, sought, lambda item: str(item.get("number", "")), nothing)
        return not_found(nothing, chosen)

    def shown_id(self, request_id: str) -> str:
        return f"#{request_id}"

    def _by_number(self, number: int, sought: Sought, *, recorded: bool) -> Lookup | None:
        """Issue ``number`` read by its number, following a transfer. ``recorded``: the number the
        dispatcher recorded, GitHub's receipt for the call, so what became of the issue does not matter.
        Otherwise a number missing from the listing: found when it carries the call's marker, a
        NOT_EVIDENCE answer when it is out of reach (deleted, moved where the token cannot read), None when
        it is another's."""
        answer = self.call("GET", f"{self.repo_path}/issues/{number}")
        moved_to = ""
        if answer.status == 301 and answer.headers.get("location"):
            moved_to = urllib.parse.urlsplit(answer.headers["location"]).path
            answer = self.call("GET", moved_to)
        document = answer.document if answer.ok and isinstance(answer.document, dict) else None
        where = f" (transferred to {document.get('html_url', moved_to)})" if moved_to and document else ""
        if document is not None and _carries(document, sought):
            lookup = self._found(document, str(number))
            return replace(lookup, detail=lookup.detail + where)
        if recorded and (document is None or not read_marker(document.get("body"))[0]):
            gone = "deleted" if answer.status == 410 else "moved where the token cannot read, or deleted"
            fate = (
                f"its marker was edited out{where}"
                if document is not None
                else f"GitHub answers {answer.status} for it now ({gone})"
            )
            return self.receipt(str(number), document, f"issue #{number}", fate)
        if document is None and answer.status in (404, 410):
            return Lookup(LookupStatus.NOT_EVIDENCE, detail=f"#{number}: HTTP {answer.status}")
        return None


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
        if sought.request_id.isdigit():
            receipt = self._by_id(sought)
            if receipt is not None:
                return receipt
        comments = self._listing(f"{self.repo_path}/issues/{number}/comments", sought, {})
        chosen = choose(self._mine(comments, sought), sought, lambda m: str(m.get("id", "")), "comments")
        if chosen.match is None:
            nothing = f"no comment on issue {number} made since the call carries its marker"
            self._edited(comments, sought, lambda item: str(item.get("id", "")), nothing)
            return not_found(nothing, chosen)
        return self._found(chosen.match, str(chosen.match.get("id", "")))

    def _by_id(self, sought: Sought) -> Lookup | None:
        """The comment read by the id GitHub answered the call with: GitHub's receipt, so one edited or
        deleted since is still the call's. None when it carries another call's marker."""
        comment_id = sought.request_id
        answer = self.call("GET", f"{self.repo_path}/issues/comments/{comment_id}")
        document = answer.document if answer.ok and isinstance(answer.document, dict) else None
        if document is not None and _carries(document, sought):
            return self._found(document, comment_id)
        if document is None and answer.status in (404, 410):
            fate = (
                f"GitHub answers {answer.status} for it now (deleted, or its issue moved where the token cannot read)"
            )
            return self.receipt(comment_id, None, f"comment {comment_id}", fate)
        if document is not None and not read_marker(document.get("body"))[0]:
            return self.receipt(comment_id, document, f"comment {comment_id}", "its marker was edited out")
        return None


def _carries(item: Any, sought: Sought) -> bool:
    """Whether ``item``'s body carries the marker of the call ``sought`` describes."""
    return isinstance(item, dict) and read_marker(item.get("body"))[0] == ref(sought.key)


def _made(item: Any) -> datetime | None:
    """When GitHub made ``item`` (its ``created_at``), None when unreadable."""
    try:
        return datetime.strptime(str(item.get("created_at", "")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (AttributeError, ValueError):
        return None

"""Slack: post a message (https://api.slack.com/methods/chat.postMessage).

Slack has no idempotency: the same request sent twice posts twice. So the
ledger never sends a Slack call again by itself; it finds out whether the
first one posted. Each message carries message metadata (``event_type``
``ledgerdash_call``, its payload the call's reference and the hash of its
arguments), which Slack keeps with the message and returns from
``conversations.history`` (and ``conversations.replies`` for a reply in a
thread) when asked with ``include_all_metadata``. The lookup reads the
channel from the first dispatch claim (less five minutes for the clocks)
to the time the request could no longer land (plus the lag and five
minutes) and looks for the reference; by the message's timestamp when a
dispatcher recorded it. Slack documents no lag for reading a channel's
history: the preset keeps a margin of ten seconds.

What Slack and people may do, and how the lookup allows for it:

- Slack limits how often an app outside its Marketplace reads history (one
  request a minute, at most 15 messages a page). A lookup that meets the
  limit part-way through a window that is closed (no request can land in
  it any more) keeps its place in this process: the next check goes on
  from the page it reached instead of starting again, so a window of any
  size is read in the end (each check is one of the tool's ``max_checks``).
- ``chat.postMessage`` takes a channel's name or a user's id, history only
  an id: the lookup reads the conversation Slack answered the send with
  (recorded with the message's timestamp). A call that names its channel
  otherwise, with nothing recorded, is a blind spot (``channel_by_name``).
- The timestamp Slack answered with is its receipt: read by it, a message
  whose metadata was changed or deleted since, or the message deleted, is
  the call's, found with nothing to compare. Without it, a message of the
  window with the call's text whose metadata was changed or removed may be
  the call's: ambiguous, for a person. A deleted message leaves no trace in
  history: without a receipt that is outside the promise.

Slack answers most errors with HTTP 200 and ``"ok": false``; the errors
that mean nothing was posted (a missing channel, a revoked token, a message
too long…) are definitive refusals, others (``internal_error``,
``fatal_error``…) leave the outcome unknown. A 429 carries ``Retry-After``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ledgerdash.ledger import clock
from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import BlindSpot, Dispatched, Lookup, ProviderAmbiguous, Sought
from ledgerdash.ledger.providers.presets.common import (
    MARK,
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

EVENT_TYPE = f"{MARK}_call"
#: Errors after which nothing was posted (Slack's documented errors of chat.postMessage).
REFUSALS = frozenset(
    {
        "account_inactive",
        "as_user_not_supported",
        "channel_not_found",
        "duplicate_channel_not_found",
        "ekm_access_denied",
        "invalid_arguments",
        "invalid_auth",
        "invalid_blocks",
        "invalid_blocks_format",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "is_archived",
        "message_limit_exceeded",
        "metadata_too_large",
        "missing_scope",
        "msg_too_long",
        "no_permission",
        "no_text",
        "not_allowed_token_type",
        "not_authed",
        "not_in_channel",
        "restricted_action",
        "team_access_not_granted",
        "token_expired",
        "token_revoked",
        "too_many_attachments",
    }
)
PAGES = 20
HISTORY = "Slack, conversations.history, https://docs.slack.dev/reference/methods/conversations.history"


@dataclass
class Progress:
    """How far a lookup read a closed window before Slack's rate limit stopped it."""

    cursor: str
    pages: int
    read: int
    matches: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)


#: Each lookup's progress through a window it could not read at once, kept in this process between checks.
PROGRESS: OrderedDict[tuple[str, ...], Progress] = OrderedDict()
PROGRESS_KEPT = 1000
_progress_lock = threading.Lock()


class PostMessage(PresetAdapter):
    name = "slack.post_message"
    provider = "Slack"
    title = "Slack: post a message to a channel"
    documented_lag_seconds = 10.0
    default_base_url = "https://slack.com"
    options: ClassVar[dict[str, Option]] = {
        "token": Option("the bot token (xoxb-…), as ${NAME}", default="${SLACK_BOT_TOKEN}"),
    }

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"channel": "C0DRILL", "text": f"Deploy finished ({key})"}

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer " + self.secret("token")}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        if not isinstance(args.get("channel"), str) or not args["channel"]:
            raise PermanentFailure("a Slack message's arguments need channel (its id, C…)")
        if "metadata" in args:
            raise PermanentFailure("metadata is the ledger's on a Slack message: leave it out of the arguments")
        body = {
            **args,
            "metadata": {"event_type": EVENT_TYPE, "event_payload": {"ref": ref(key), "args_sha256": args_hash(args)}},
        }
        answer = self.call("POST", "/api/chat.postMessage", json_body=body, sending=True)
        document = answer.document if isinstance(answer.document, dict) else {}
        if answer.ok and document.get("ok") is True and document.get("ts"):
            request_id = f"{document.get('channel', args['channel'])}:{document['ts']}"
            received(on_request_id, request_id)
            return Dispatched(request_id=request_id, response=document)
        if answer.ok and document.get("ok") is False:
            error = str(document.get("error", ""))
            if error in REFUSALS:
                raise PermanentFailure(f"Slack refused the message: {error}")
            raise ProviderAmbiguous(f"Slack answered {error or 'an error'}, which does not say whether it posted")
        self.refuse_or_doubt(answer, "the message")
        raise AssertionError("unreachable")  # pragma: no cover

    blind_spots = (
        BlindSpot(
            "channel_by_name",
            "the call names its channel by name or a user's id, which conversations.history does not take, and "
            "Slack's answer naming the conversation's id was never recorded",
            HISTORY,
        ),
        BlindSpot(
            "page_cap",
            "more messages were posted in the call's window than the lookup reads: it did not read all of it",
            HISTORY,
        ),
    )

    def search(self, sought: Sought) -> Lookup:
        channel = sought.args.get("channel")
        if not isinstance(channel, str) or not channel:
            raise LookupUnavailable("a Slack message is found in its channel; the call's arguments name none")
        thread = sought.args.get("thread_ts")
        method, params = "/api/conversations.history", {"include_all_metadata": "true", "limit": "200"}
        if isinstance(thread, str) and thread:
            method, params["ts"] = "/api/conversations.replies", thread
        if ":" in sought.request_id:
            return self._by_receipt(sought, method, params)
        if not channel.startswith(("C", "G", "D")):
            raise self.blind("channel_by_name", f"no message of {channel} can be read by that name")
        params["channel"] = channel
        params["oldest"] = f"{self.window_start(sought).timestamp():.6f}"
        end = self.window_end(sought)
        if end is not None:
            params["latest"] = f"{end.timestamp():.6f}"
        # A window no request can land in any more reads the same on every check: its place may be kept.
        place = (self.base_url, self.tool_name, sought.key, method, channel, params["oldest"], params.get("latest", ""))
        closed = end is not None and clock.now() >= end
        with _progress_lock:
            progress = PROGRESS.pop(place, None) if closed else None
        progress = progress or Progress(cursor="", pages=0, read=0)
        reference, text = ref(sought.key), sought.args.get("text")
        while progress.pages < PAGES:
            if progress.cursor:
                params["cursor"] = progress.cursor
            try:
                document = self._read(method, params)
            except LookupUnavailable as exc:
                if closed and exc.retry_after is not None and progress.pages:
                    with _progress_lock:
                        PROGRESS[place] = progress
                        while len(PROGRESS) > PROGRESS_KEPT:
                            PROGRESS.popitem(last=False)
                    raise LookupUnavailable(
                        f"{exc.detail}; {progress.read} messages of {channel} read so far: the next check goes on "
                        "from there",
                        exc.retry_after,
                    ) from None
                raise
            messages = [m for m in document.get("messages") or [] if isinstance(m, dict)]
            progress.pages, progress.read = progress.pages + 1, progress.read + len(messages)
            progress.matches += [m for m in messages if _reference(m) == reference]
            progress.changed += [
                m for m in messages if text and m.get("text") == text and not _reference(m) and m.get("edited")
            ]
            cursor = (document.get("response_metadata") or {}).get("next_cursor")
            if not document.get("has_more") or not cursor:
                break
            progress.cursor = str(cursor)
        else:
            raise self.blind(
                "page_cap", f"{progress.read} messages of {channel} read in {PAGES} pages, none this call's"
            )
        chosen = choose(progress.matches, sought, lambda m: f"{channel}:{m.get('ts', '')}", "messages")
        if chosen.match is not None:
            return self._found(channel, chosen.match)
        nothing = f"no message in {channel} since the call carries its reference"
        changed_may_be(
            progress.changed,
            sought,
            lambda m: f"{channel}:{m.get('ts', '')}",
            nothing,
            "carry the call's text, and their metadata was changed or removed since",
        )
        return not_found(nothing, chosen)

    def _by_receipt(self, sought: Sought, method: str, params: dict[str, str]) -> Lookup:
        """The message read by the conversation and timestamp Slack answered the call with (its receipt):
        the call's, whatever became of it since."""
        channel, ts = sought.request_id.split(":", 1)
        document = self._read(method, {**params, "channel": channel, "oldest": ts, "latest": ts, "inclusive": "true"})
        message = next((m for m in document.get("messages") or [] if m.get("ts") == ts), None)
        if message is not None and _reference(message) == ref(sought.key):
            return self._found(channel, message)
        fate = "its metadata was changed or removed since" if message is not None else "it was deleted since"
        shown = {"ok": True, "channel": channel, "ts": ts, "message": message}
        return self.receipt(sought.request_id, shown, f"message {ts} in {channel}", fate)

    def _read(self, method: str, params: dict[str, str]) -> dict[str, Any]:
        """One page of ``method`` (history or replies); Slack's ``"ok": false`` decides nothing."""
        answer = self.call("GET", method, params=params)
        document = answer.document if isinstance(answer.document, dict) else {}
        if document.get("ok") is not True:
            raise LookupUnavailable(f"Slack answered {document.get('error', f'HTTP {answer.status}')}")
        return document

    @staticmethod
    def _found(channel: str, message: dict[str, Any]) -> Lookup:
        payload = (message.get("metadata") or {}).get("event_payload") or {}
        return found(
            f"{channel}:{message.get('ts', '')}",
            str(payload.get("args_sha256", "")),
            {"ok": True, "channel": channel, "ts": message.get("ts"), "message": message},
            f"message {message.get('ts')} in {channel} carries this call's reference",
        )


def _reference(message: Any) -> str:
    metadata = message.get("metadata") if isinstance(message, dict) else None
    if not isinstance(metadata, dict) or metadata.get("event_type") != EVENT_TYPE:
        return ""
    payload = metadata.get("event_payload")
    return str(payload.get("ref", "")) if isinstance(payload, dict) else ""

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
history: the preset keeps a margin of ten seconds. Slack limits how often
an app that is not in its Marketplace may read history (since 2025, one
request a minute of at most 15 messages for new such apps): in a busy
channel such a lookup is answered 429 and waits its ``Retry-After``, and
after the tool's ``max_checks`` a person decides.

Slack answers most errors with HTTP 200 and ``"ok": false``; the errors
that mean nothing was posted (a missing channel, a revoked token, a message
too long…) are definitive refusals, others (``internal_error``,
``fatal_error``…) leave the outcome unknown. A 429 carries ``Retry-After``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import Dispatched, Lookup, ProviderAmbiguous, Sought
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

    def search(self, sought: Sought) -> Lookup:
        channel = sought.args.get("channel")
        if not isinstance(channel, str) or not channel:
            raise LookupUnavailable("a Slack message is found in its channel; the call's arguments name none")
        thread = sought.args.get("thread_ts")
        params: dict[str, str] = {"channel": channel, "include_all_metadata": "true", "limit": "200"}
        if ":" in sought.request_id:
            ts = sought.request_id.split(":", 1)[1]
            params.update(oldest=ts, latest=ts, inclusive="true")
        else:
            params["oldest"] = f"{self.window_start(sought).timestamp():.6f}"
            end = self.window_end(sought)
            if end is not None:
                params["latest"] = f"{end.timestamp():.6f}"
        method = "/api/conversations.history"
        if isinstance(thread, str) and thread:
            method, params["ts"] = "/api/conversations.replies", thread
        reference, matches, read = ref(sought.key), [], 0
        for _ in range(PAGES):
            answer = self.call("GET", method, params=params)
            document = answer.document if isinstance(answer.document, dict) else {}
            if document.get("ok") is not True:
                raise LookupUnavailable(f"Slack answered {document.get('error', f'HTTP {answer.status}')}")
            messages = document.get("messages") or []
            read += len(messages)
            matches += [m for m in messages if _reference(m) == reference]
            cursor = (document.get("response_metadata") or {}).get("next_cursor")
            if not document.get("has_more") or not cursor:
                break
            params["cursor"] = cursor
        else:
            raise LookupUnavailable(
                f"{read} messages of {channel} read in {PAGES} pages and more remain in the call's window"
            )
        chosen = choose(matches, sought, lambda m: f"{channel}:{m.get('ts', '')}", "messages")
        match = chosen.match
        if match is None:
            return not_found(f"no message in {channel} since the call carries its reference", chosen)
        payload = (match.get("metadata") or {}).get("event_payload") or {}
        return found(
            f"{channel}:{match.get('ts', '')}",
            str(payload.get("args_sha256", "")),
            {"ok": True, "channel": channel, "ts": match.get("ts"), "message": match},
            f"message {match.get('ts')} in {channel} carries this call's reference",
        )


def _reference(message: Any) -> str:
    metadata = message.get("metadata") if isinstance(message, dict) else None
    if not isinstance(metadata, dict) or metadata.get("event_type") != EVENT_TYPE:
        return ""
    payload = metadata.get("event_payload")
    return str(payload.get("ref", "")) if isinstance(payload, dict) else ""

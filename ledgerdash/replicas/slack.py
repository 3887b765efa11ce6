"""A replica of Slack's Web API: ``chat.postMessage``, ``conversations.history``
and ``conversations.replies``.

As Slack documents them: a bot token as a bearer token, a JSON or form
body, every answer HTTP 200 with ``"ok"`` (errors as ``"ok": false`` and
``"error"``), except a 429 with ``Retry-After`` for rate limits; message
metadata (``event_type``, ``event_payload``) kept with the message and
returned only with ``include_all_metadata``; history newest first, within
``oldest``/``latest`` (``inclusive``), paged by ``cursor``. No idempotency.
Channels ``C…`` exist; ``C0ARCHIVED`` is archived. ``chat.postMessage``
takes a channel by name (``#deploys``) or a user's id (``U…``, a direct
message) and answers with the conversation's id; ``conversations.history``
takes only an id.

Its modes (``PUT /modes``) are Slack's limits for apps outside its
Marketplace and what people and apps do to a message after it was posted,
from Slack's own pages (:attr:`Slack.MODES`).
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.parse
from typing import Any

from ledgerdash.replicas.core import ACT, READ, Effect, Handler, Mode, Replica, Request, Response

METADATA = "Slack, Message metadata, https://docs.slack.dev/messaging/message-metadata"


def ok(body: dict[str, Any]) -> Response:
    return Response(200, {"ok": True, **body})


def fail(error: str) -> Response:
    return Response(200, {"ok": False, "error": error})


class Slack(Replica):
    name = "slack"
    MODES = {
        "non_marketplace": Mode(
            False,
            "an app distributed outside the Marketplace reads conversations.history and conversations.replies "
            "at one request a minute, at most 15 messages a page",
            "Slack, Rate limits, https://docs.slack.dev/apis/web-api/rate-limits",
        ),
        "metadata_deleted_every": Mode(
            0, "a message's metadata can be updated or deleted after it was posted (every Nth: deleted)", METADATA
        ),
        "metadata_edited_every": Mode(
            0, "a message's metadata can be updated after it was posted (every Nth: another payload)", METADATA
        ),
        "deleted_every": Mode(
            0,
            "a message can be deleted (chat.delete): it leaves the channel's history",
            "Slack, chat.delete, https://docs.slack.dev/reference/methods/chat.delete",
        ),
    }
    FATES = ("deleted_every", "metadata_deleted_every", "metadata_edited_every")

    def __init__(self) -> None:
        super().__init__()
        #: method -> when it was last read (the replica's clock), for the Marketplace limit
        self.last_read: dict[str, float] = {}

    def _as_now(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The message as the channel shows it now (None: deleted)."""
        fate = self.fate(int(message.get("n", 0)))
        if fate == "deleted":
            return None
        if fate == "metadata_deleted":
            return {k: v for k, v in message.items() if k != "metadata"} | {"edited": {"user": "U0OTHER"}}
        if fate == "metadata_edited" and "metadata" in message:
            edited = {"event_type": "order_update", "event_payload": {"status": "shipped"}}
            return {**message, "metadata": edited, "edited": {"user": "U0OTHER"}}
        return message

    def _limited(self, method: str) -> Response | None:
        """Outside the Marketplace: one read a minute per method, else 429 with the wait."""
        if not self.mode("non_marketplace"):
            return None
        with self.lock:
            last, now = self.last_read.get(method), self.now()
            if last is not None and now - last < 60.0:
                wait = math.ceil(60.0 - (now - last))
                return Response(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(wait)})
            self.last_read[method] = now
        return None

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        return [
            ("POST", r"/api/chat\.postMessage", ACT, self.post_message),
            ("GET", r"/api/conversations\.history", READ, self.history),
            ("POST", r"/api/conversations\.history", READ, self.history),
            ("GET", r"/api/conversations\.replies", READ, self.replies),
            ("POST", r"/api/conversations\.replies", READ, self.replies),
        ]

    def authorized(self, request: Request) -> Response | None:
        token = request.bearer()
        if not token:
            return fail("not_authed")
        if not token.startswith("xox"):
            return fail("invalid_auth")
        return None

    def rate_limit_body(self) -> Any:
        return {"ok": False, "error": "ratelimited"}

    def server_error_body(self) -> Any:
        return {"ok": False, "error": "internal_error"}

    @staticmethod
    def _fields(request: Request) -> dict[str, Any]:
        if request.headers.get("Content-Type", "").startswith("application/json"):
            body = request.json()
            return body if isinstance(body, dict) else {}
        fields: dict[str, Any] = {k: v[-1] for k, v in request.form().items()}
        fields.update({k: v[-1] for k, v in request.query.items()})
        return fields

    def post_message(self, request: Request) -> Response:
        fields = self._fields(request)
        channel = fields.get("channel")
        if isinstance(channel, str) and channel.startswith("#") and len(channel) > 1:
            channel = "C" + hashlib.sha256(channel[1:].encode()).hexdigest()[:10].upper()  # the channel's id
        elif isinstance(channel, str) and channel.startswith("U"):
            channel = "D" + channel[1:]  # the direct message with that user
        if not isinstance(channel, str) or not channel.startswith(("C", "G", "D")):
            return fail("channel_not_found")
        if channel == "C0ARCHIVED":
            return fail("is_archived")
        text, blocks = fields.get("text"), fields.get("blocks")
        if not text and not blocks:
            return fail("no_text")
        if isinstance(text, str) and len(text) > 40000:
            return fail("msg_too_long")
        metadata = fields.get("metadata")
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                return fail("invalid_metadata_format")
        if metadata is not None and (not isinstance(metadata, dict) or "event_type" not in metadata):
            return fail("invalid_metadata_schema")
        ts = f"{self.now():.6f}"
        ts = f"{ts[:-6]}{self.next_id() % 1000000:06d}"  # unique within the channel, as Slack's are
        message: dict[str, Any] = {"type": "message", "user": "U0REPLICA", "text": text or "", "ts": ts}
        number = sum(1 for _ in self.of_kind("message")) + 1
        if blocks:
            message["blocks"] = blocks
        if fields.get("thread_ts"):
            message["thread_ts"] = fields["thread_ts"]
        if metadata is not None:
            message["metadata"] = metadata
        self.record(Effect("message", f"{channel}:{ts}", self.now(), {"channel": channel, "n": number, **message}))
        return ok({"channel": channel, "ts": ts, "message": {k: v for k, v in message.items() if k != "metadata"}})

    def _listed(self, request: Request, posted: list[dict[str, Any]]) -> Response:
        if (limited := self._limited(request.path)) is not None:
            return limited
        messages = [now for m in posted if (now := self._as_now(m)) is not None]
        fields = self._fields(request)
        metadata = str(fields.get("include_all_metadata", "")).lower() in ("true", "1")
        inclusive = str(fields.get("inclusive", "")).lower() in ("true", "1")
        oldest, latest = float(fields.get("oldest") or 0), float(fields.get("latest") or 1e12)

        def within(ts: float) -> bool:
            return (oldest <= ts <= latest) if inclusive else (oldest < ts < latest)

        chosen = [m for m in messages if within(float(m["ts"]))]
        chosen.sort(key=lambda m: float(m["ts"]), reverse=True)
        start = int(urllib.parse.unquote(str(fields.get("cursor") or "0")) or 0)
        limit = min(int(fields.get("limit") or 100), 15 if self.mode("non_marketplace") else 999)
        page = chosen[start : start + limit]
        hidden = {"channel", "n"} | (set() if metadata else {"metadata"})
        listed = [{k: v for k, v in m.items() if k not in hidden} for m in page]
        more = start + limit < len(chosen)
        return ok(
            {
                "messages": listed,
                "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""},
            }
        )

    def _channel(self, request: Request) -> str | None:
        channel = self._fields(request).get("channel")
        return channel if isinstance(channel, str) and channel.startswith(("C", "G", "D")) else None

    def history(self, request: Request) -> Response:
        channel = self._channel(request)
        if channel is None:
            return fail("channel_not_found")
        messages = [
            e.document
            for e in self.of_kind("message")
            if e.document["channel"] == channel and not e.document.get("thread_ts")
        ]
        return self._listed(request, messages)

    def replies(self, request: Request) -> Response:
        channel = self._channel(request)
        thread = str(self._fields(request).get("ts", ""))
        if channel is None:
            return fail("channel_not_found")
        messages = [
            e.document
            for e in self.of_kind("message")
            if e.document["channel"] == channel and thread in (e.document["ts"], e.document.get("thread_ts"))
        ]
        if not messages:
            return fail("thread_not_found")
        return self._listed(request, messages)

"""A replica of Slack's Web API: ``chat.postMessage``, ``conversations.history``
and ``conversations.replies``.

As Slack documents them: a bot token as a bearer token, a JSON or form
body, every answer HTTP 200 with ``"ok"`` (errors as ``"ok": false`` and
``"error"``), except a 429 with ``Retry-After`` for rate limits; message
metadata (``event_type``, ``event_payload``) kept with the message and
returned only with ``include_all_metadata``; history newest first, within
``oldest``/``latest`` (``inclusive``), paged by ``cursor``. No idempotency.
Channels ``C…`` exist; ``C0ARCHIVED`` is archived.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from ledgerdash.replicas.core import ACT, READ, Effect, Handler, Replica, Request, Response


def ok(body: dict[str, Any]) -> Response:
    return Response(200, {"ok": True, **body})


def fail(error: str) -> Response:
    return Response(200, {"ok": False, "error": error})


class Slack(Replica):
    name = "slack"

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
        if blocks:
            message["blocks"] = blocks
        if fields.get("thread_ts"):
            message["thread_ts"] = fields["thread_ts"]
        if metadata is not None:
            message["metadata"] = metadata
        self.record(Effect("message", f"{channel}:{ts}", self.now(), {"channel": channel, **message}))
        return ok({"channel": channel, "ts": ts, "message": {k: v for k, v in message.items() if k != "metadata"}})

    def _listed(self, request: Request, messages: list[dict[str, Any]]) -> Response:
        fields = self._fields(request)
        metadata = str(fields.get("include_all_metadata", "")).lower() in ("true", "1")
        inclusive = str(fields.get("inclusive", "")).lower() in ("true", "1")
        oldest, latest = float(fields.get("oldest") or 0), float(fields.get("latest") or 1e12)

        def within(ts: float) -> bool:
            return (oldest <= ts <= latest) if inclusive else (oldest < ts < latest)

        chosen = [m for m in messages if within(float(m["ts"]))]
        chosen.sort(key=lambda m: float(m["ts"]), reverse=True)
        start = int(urllib.parse.unquote(str(fields.get("cursor") or "0")) or 0)
        limit = min(int(fields.get("limit") or 100), 999)
        page = chosen[start : start + limit]
        shown = [{k: v for k, v in m.items() if k != "channel" and (metadata or k != "metadata")} for m in page]
        more = start + limit < len(chosen)
        return ok(
            {
                "messages": shown,
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

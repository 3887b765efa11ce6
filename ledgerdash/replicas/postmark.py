"""A replica of Postmark's Email API and outbound message search.

As Postmark documents them: ``X-Postmark-Server-Token``; ``POST /email``
answers 200 with ``MessageID`` and ``ErrorCode`` 0, or 422 with an
``ErrorCode`` (300 for an invalid request, 406 for an inactive recipient)
and 401 (``ErrorCode`` 10) without a token; ``GET /messages/outbound``
takes ``count`` and ``offset`` (both required), ``recipient``, ``tag``,
``subject``, ``messagestream`` (default: the transactional ``outbound``
stream) and ``metadata_<name>`` filters, and shows a message only once its
activity is indexed (the search lag);
``GET /messages/outbound/<id>/details`` reads one message at once. No
idempotency. ``inactive@…`` recipients are inactive.

Its mode (``PUT /modes``): the account's retention, which keeps each
message as long as the setting in force when it was processed said.
"""

from __future__ import annotations

import uuid
from typing import Any

from ledgerdash.replicas.core import ACT, READ, SEARCH, Effect, Handler, Mode, Replica, Request, Response, iso

DAY = 86400.0


def refusal(status: int, code: int, message: str) -> Response:
    return Response(status, {"ErrorCode": code, "Message": message})


class Postmark(Replica):
    name = "postmark"
    MODES = {
        "retention_days": Mode(
            45,
            "messages and their metadata are kept 45 days by default; an account may choose 7 to 365, and a "
            "change applies only to messages processed afterwards",
            "Postmark, How does the Retention Add-on work?, "
            "https://postmarkapp.com/support/article/1289-how-does-the-retention-add-on-work",
        ),
    }

    def __init__(self) -> None:
        super().__init__()
        #: How many days each message is kept: the retention in force when it was processed.
        self.kept_days: dict[str, float] = {}

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        return [
            ("POST", r"/email", ACT, self.send_email),
            ("GET", r"/messages/outbound", SEARCH, self.search),
            ("GET", r"/messages/outbound/([^/]+)/details", READ, self.details),
        ]

    def authorized(self, request: Request) -> Response | None:
        if request.headers.get("X-Postmark-Server-Token"):
            return None
        return refusal(401, 10, "No Account or Server API tokens were supplied in the HTTP headers.")

    def rate_limit_body(self) -> Any:
        return {"ErrorCode": 429, "Message": "Rate limit exceeded"}

    def server_error_body(self) -> Any:
        return {"ErrorCode": 500, "Message": "Internal server error"}

    def send_email(self, request: Request) -> Response:
        body = request.json()
        if not isinstance(body, dict):
            return refusal(422, 300, "Invalid email request: the body must be a JSON object")
        to, sender = body.get("To"), body.get("From")
        if not isinstance(sender, str) or "@" not in sender:
            return refusal(422, 300, "Invalid 'From' address")
        if not isinstance(to, str) or "@" not in to:
            return refusal(422, 300, "Invalid 'To' address")
        if to.startswith("inactive@"):
            return refusal(422, 406, "You tried to send to recipient(s) that have been marked as inactive.")
        if not body.get("TextBody") and not body.get("HtmlBody"):
            return refusal(422, 300, "Provide either email TextBody or HtmlBody or both.")
        metadata = body.get("Metadata") or {}
        if not isinstance(metadata, dict) or any(len(k) > 20 or len(str(v)) > 80 for k, v in metadata.items()):
            return refusal(422, 300, "Invalid metadata: names at most 20 characters, values at most 80")
        message_id = str(uuid.UUID(int=self.next_id() + (1 << 64)))
        at = iso(self.now())
        message = {
            "MessageID": message_id,
            "MessageStream": body.get("MessageStream") or "outbound",
            "From": sender,
            "To": [{"Email": address.strip(), "Name": ""} for address in to.split(",")],
            "Recipients": [address.strip() for address in to.split(",")],
            "Subject": body.get("Subject", ""),
            "Tag": body.get("Tag", ""),
            "TextBody": body.get("TextBody", ""),
            "HtmlBody": body.get("HtmlBody", ""),
            "Metadata": {str(k): str(v) for k, v in metadata.items()},
            "ReceivedAt": at,
            "Status": "Sent",
            "Attachments": [],
        }
        # Kept as long as the retention in force now says, whatever the account chooses later.
        self.kept_days[message_id] = float(self.mode("retention_days"))
        self.record(Effect("email", message_id, self.now(), message))
        return Response(200, {"To": to, "SubmittedAt": at, "MessageID": message_id, "ErrorCode": 0, "Message": "OK"})

    def kept(self, *, searching: bool = False) -> list[dict[str, Any]]:
        """The messages Postmark still keeps, the most recent first."""
        now = self.now()
        return [
            e.document
            for e in reversed(self.of_kind("email", searching=searching))
            if now - e.created < self.kept_days[e.id] * DAY
        ]

    @staticmethod
    def _summary(message: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in message.items() if k not in ("TextBody", "HtmlBody")}

    def search(self, request: Request) -> Response:
        try:
            count, offset = int(request.arg("count")), int(request.arg("offset"))
        except ValueError:
            return refusal(422, 1100, "count and offset are required")
        if not 1 <= count <= 500 or offset < 0:
            return refusal(422, 1100, "count must be 1 to 500, offset 0 or more")
        messages = self.kept(searching=True)
        wanted = {
            name[len("metadata_") :]: values[-1]
            for name, values in request.query.items()
            if name.startswith("metadata_")
        }
        messages = [m for m in messages if all(m["Metadata"].get(k) == v for k, v in wanted.items())]
        if request.arg("recipient"):
            messages = [m for m in messages if request.arg("recipient") in m["Recipients"]]
        if request.arg("tag"):
            messages = [m for m in messages if m["Tag"] == request.arg("tag")]
        # Without a stream, the search reads the transactional one, as Postmark's does.
        messages = [m for m in messages if m["MessageStream"] == (request.arg("messagestream") or "outbound")]
        if request.arg("subject"):
            messages = [m for m in messages if request.arg("subject") in m["Subject"]]
        page = [self._summary(m) for m in messages[offset : offset + count]]
        return Response(200, {"TotalCount": len(messages), "Messages": page})

    def details(self, request: Request) -> Response:
        message = next((m for m in self.kept() if m["MessageID"] == request.groups[0]), None)
        if message is None:
            return refusal(422, 701, "This message was not found.")
        return Response(200, {**message, "Body": message["HtmlBody"] or message["TextBody"], "MessageEvents": []})

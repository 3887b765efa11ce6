"""A replica of Twilio's Programmable Messaging API (the Message resource).

As Twilio documents it: HTTP basic auth with the account SID and auth
token (the SID must be the path's), form bodies with ``To``, ``From`` or
``MessagingServiceSid`` and ``Body``; 201 with the message (``sid`` ``SM…``,
``date_created`` in RFC 2822); 400 with ``code`` (21211 for an invalid
``To``, 21602 for a missing body), 401 (20003), 429 (20429); listings
filtered by ``To`` and ``From``, newest first, ``PageSize`` with
``next_page_uri``. No idempotency. A number ending in ``0000`` is invalid.
"""

from __future__ import annotations

import email.utils
import urllib.parse
from typing import Any

from ledgerdash.replicas.core import ACT, READ, Effect, Handler, Replica, Request, Response

ACCOUNT = r"/2010-04-01/Accounts/(AC[0-9a-zA-Z]+)"


def problem(status: int, code: int, message: str) -> Response:
    return Response(
        status,
        {"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}", "status": status},
    )


class Twilio(Replica):
    name = "twilio"

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        return [
            ("POST", ACCOUNT + r"/Messages\.json", ACT, self.create),
            ("GET", ACCOUNT + r"/Messages\.json", READ, self.listing),
            ("GET", ACCOUNT + r"/Messages/((?:SM|MM)[0-9a-f]+)\.json", READ, self.fetch),
        ]

    def authorized(self, request: Request) -> Response | None:
        user, password = request.basic()
        if user and password and request.groups and user == request.groups[0]:
            return None
        return problem(401, 20003, "Authenticate")

    def rate_limit_body(self) -> Any:
        return {"code": 20429, "message": "Too Many Requests", "status": 429}

    def server_error_body(self) -> Any:
        return {"code": 20500, "message": "Internal Server Error", "status": 500}

    def create(self, request: Request) -> Response:
        fields = {k: v[-1] for k, v in request.form().items()}
        to = fields.get("To", "")
        if not to.startswith("+") or not to[1:].isdigit() or to.endswith("0000"):
            return problem(400, 21211, f"The 'To' number {to} is not a valid phone number.")
        if not fields.get("From") and not fields.get("MessagingServiceSid"):
            return problem(400, 21603, "A 'From' or 'MessagingServiceSid' parameter is required to send a message")
        if not fields.get("Body"):
            return problem(400, 21602, "Message body is required.")
        n = self.next_id()
        sid = f"SM{n:032x}"
        account = request.groups[0]
        message = {
            "sid": sid,
            "account_sid": account,
            "to": to,
            "from": fields.get("From"),
            "messaging_service_sid": fields.get("MessagingServiceSid"),
            "body": fields["Body"],
            "status": "queued",
            "direction": "outbound-api",
            "num_segments": "1",
            "date_created": email.utils.formatdate(self.now(), usegmt=True),
            "date_updated": email.utils.formatdate(self.now(), usegmt=True),
            "date_sent": None,
            "error_code": None,
            "error_message": None,
            "price": None,
            "uri": f"/2010-04-01/Accounts/{account}/Messages/{sid}.json",
        }
        self.record(Effect("message", sid, self.now(), message))
        return Response(201, message)

    def listing(self, request: Request) -> Response:
        account = request.groups[0]
        messages = [e.document for e in reversed(self.of_kind("message")) if e.document["account_sid"] == account]
        for field, name in (("to", "To"), ("from", "From")):
            if request.arg(name):
                messages = [m for m in messages if m[field] == request.arg(name)]
        size = min(int(request.arg("PageSize", "50") or 50), 1000)
        page = int(request.arg("Page", "0") or 0)
        chosen = messages[page * size : (page + 1) * size]
        base = f"/2010-04-01/Accounts/{account}/Messages.json"
        query = {k: v[-1] for k, v in request.query.items() if k not in ("Page", "PageToken")}
        more = (page + 1) * size < len(messages)
        return Response(
            200,
            {
                "messages": chosen,
                "page": page,
                "page_size": size,
                "start": page * size,
                "end": page * size + len(chosen) - 1,
                "uri": base + "?" + urllib.parse.urlencode({**query, "Page": page}),
                "first_page_uri": base + "?" + urllib.parse.urlencode({**query, "Page": 0}),
                "next_page_uri": base + "?" + urllib.parse.urlencode({**query, "Page": page + 1}) if more else None,
                "previous_page_uri": None,
            },
        )

    def fetch(self, request: Request) -> Response:
        account, sid = request.groups
        message = next(
            (e.document for e in self.of_kind("message") if e.id == sid and e.document["account_sid"] == account), None
        )
        if message is None:
            return problem(404, 20404, f"The requested resource {request.path} was not found")
        return Response(200, message)

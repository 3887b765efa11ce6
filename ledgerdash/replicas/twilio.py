"""A replica of Twilio's Programmable Messaging API (the Message resource).

As Twilio documents it: HTTP basic auth with the account SID and auth
token (the SID must be the path's), form bodies with ``To``, ``From`` or
``MessagingServiceSid`` and ``Body``; 201 with the message (``sid`` ``SM…``,
``date_created`` in RFC 2822); 400 with ``code`` (21211 for an invalid
``To``, 21602 for a missing body), 401 (20003), 429 (20429); listings
filtered by ``To`` and ``From``, sorted by ``DateSent`` with the most recent
first (a message still queued has none, and comes first), ``PageSize`` with
``next_page_uri``. No idempotency. A number ending in ``0000`` is invalid.

A ``To`` that is not E.164 may work, Twilio says: the replica takes a
North American number written the local way (``(555) 867-5310``,
``1-555-867-5310``) and stores it as E.164 (``+15558675310``), as Twilio
does; a listing's ``To`` matches what was stored, not what was sent.

Its modes (``PUT /modes``) are what an account may be set up to do, each
from Twilio's own pages (:attr:`Twilio.MODES`).
"""

from __future__ import annotations

import email.utils
import re
import urllib.parse
from typing import Any

from ledgerdash.replicas.core import ACT, READ, Effect, Handler, Mode, Replica, Request, Response

REDACTION = (
    "Twilio, Message Redaction for Programmable Messaging, "
    "https://www.twilio.com/docs/messaging/guides/privacy-message-redaction"
)
#: What Smart Encoding replaces, as Twilio's announcement names it (smart quotes, long dashes, Unicode
#: whitespace, to their GSM-7/ASCII equivalents); a real Messaging Service's table is longer.
SMART = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"',
    "\u301e": '"', "\u2013": "-", "\u2014": "-", "\u2026": "...", "\u00a0": " ", "\u2002": " ", "\u2003": " ",
    "\u2009": " ",
}  # fmt: skip
DAY = 86400.0


def local_number(to: str) -> str:
    """``to`` as Twilio stores it: E.164, converting a North American number written the local way; "" when
    it is not a number Twilio takes."""
    if re.fullmatch(r"\+[1-9]\d{6,14}", to):
        return to
    digits = re.sub(r"[\s().\-]", "", to)
    if re.fullmatch(r"1?[2-9]\d{9}", digits):
        return "+1" + digits[-10:]
    return ""


ACCOUNT = r"/2010-04-01/Accounts/(AC[0-9a-zA-Z]+)"


def problem(status: int, code: int, message: str) -> Response:
    return Response(
        status,
        {"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}", "status": status},
    )


class Twilio(Replica):
    name = "twilio"
    MODES = {
        "redact_body": Mode(
            False,
            "message body redaction: once sent, a message's body is no longer available through the API",
            REDACTION,
        ),
        "redact_number": Mode(
            False,
            "phone number redaction: the last four digits of the recipient's number are replaced with XXXX",
            REDACTION,
        ),
        "smart_encoding": Mode(
            False,
            "Smart Encoding on the Messaging Service (on by default for new ones): smart quotes, long dashes and "
            "Unicode spaces in a body sent through it are replaced by their GSM-7 equivalents",
            "Twilio, Copilot Just Got Even Smarter: Announcing Smart Encoding, "
            "https://www.twilio.com/blog/copilot-just-got-even-smarter-announcing-smart-encoding-html",
        ),
        "retention_days": Mode(
            400,
            "message records are shown by the API for 400 days after the message is created by default; an "
            "account may shorten that to anywhere from 7 days",
            "Twilio, New Data Controls with Twilio Messaging, https://www.twilio.com/blog/new-data-controls-twilio-messaging",
        ),
        "queue_seconds": Mode(
            0.0,
            "a message waits in Twilio's queue before it is sent (up to four hours, depending on volume): its "
            "date_sent, by which listings are sorted, comes that much after it was created",
            REDACTION,
        ),
    }

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
        to = local_number(fields.get("To", ""))
        if not to or to.endswith("0000"):
            return problem(400, 21211, f"The 'To' number {fields.get('To', '')} is not a valid phone number.")
        if not fields.get("From") and not fields.get("MessagingServiceSid"):
            return problem(400, 21603, "A 'From' or 'MessagingServiceSid' parameter is required to send a message")
        if not fields.get("Body"):
            return problem(400, 21602, "Message body is required.")
        n = self.next_id()
        sid = f"SM{n:032x}"
        account = request.groups[0]
        body = fields["Body"]
        if fields.get("MessagingServiceSid") and self.mode("smart_encoding"):
            body = "".join(SMART.get(c, c) for c in body)
        message = {
            "sid": sid,
            "account_sid": account,
            "to": to,
            "from": fields.get("From"),
            "messaging_service_sid": fields.get("MessagingServiceSid"),
            "body": body,
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
        # What the account keeps of it (redaction) is applied when it is read: the effect keeps what was sent.
        self.record(Effect("message", sid, self.now(), message, extra=fields["Body"] + "\0" + to))
        return Response(201, message)

    def shown(self, effect: Effect) -> dict[str, Any] | None:
        """The message as the API shows it now: sent once out of the queue, redacted as the account says,
        gone past its retention (None)."""
        now = self.now()
        if now - effect.created > float(self.mode("retention_days")) * DAY:
            return None
        message = dict(effect.document)
        sent_at = effect.created + float(self.mode("queue_seconds"))
        if sent_at <= now:
            message["status"] = "sent"
            message["date_sent"] = email.utils.formatdate(sent_at, usegmt=True)
            if self.mode("redact_body"):
                message["body"] = ""
            if self.mode("redact_number"):
                message["to"] = message["to"][:-4] + "XXXX"
        return message

    def messages(self, account: str) -> list[tuple[float, dict[str, Any]]]:
        """The account's messages the API shows, with when each was sent (still queued: infinity)."""
        out = []
        for effect in self.of_kind("message"):
            message = self.shown(effect)
            if message is not None and message["account_sid"] == account:
                sent = effect.created + float(self.mode("queue_seconds"))
                out.append((sent if message["date_sent"] else float("inf"), message))
        return out

    def listing(self, request: Request) -> Response:
        account = request.groups[0]
        # Sorted by DateSent, the most recent first; those still queued (no date_sent yet) before them all.
        shown = reversed(self.messages(account))  # sent at the same moment: the newest first
        messages = [m for _, m in sorted(shown, key=lambda pair: pair[0], reverse=True)]
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
        message = next((m for _, m in self.messages(account) if m["sid"] == sid), None)
        if message is None:
            return problem(404, 20404, f"The requested resource {request.path} was not found")
        return Response(200, message)

"""Twilio: send an SMS (https://www.twilio.com/docs/messaging/api/message-resource).

Twilio has no idempotency and nothing on a message that the sender chooses
and can read back: no metadata, no hidden field. So the lookup matches by
content: messages to the call's recipient (``To``, and ``From`` when the
call names it), created since five minutes (the clocks' skew) before the
first dispatch claim, whose body is the call's, byte for byte; by the
message's ``sid`` when a dispatcher recorded it. The listing reads
Twilio's message log; Twilio documents no lag for it, so the preset waits
a minute before it takes "not found" for an answer.

What that can prove: no such message since the call was made means it was
not sent (Twilio keeps the log for 400 days). A message whose sid the ledger
recorded on another side effect (another key: the same text sent to the
same number by another call) is that call's, never this one's: it is left
out before the lookup chooses. One such message left means a message like
it was sent, and the ledger takes it for the call's: if something the ledger
did not record sent the same text to the same number in that window, the
ledger would take that one for it and the call's own message would be
missing, which is a loss, never a duplicate. Two or more are for a person.
Turn Twilio's Smart Encoding off for these messages: it rewrites some
characters, and a rewritten body no longer matches.

A call's arguments are ``to``, ``body`` and ``from`` or
``messaging_service_sid``; nothing else, so that the hash of what Twilio
shows can be compared with the ledger's.
"""

from __future__ import annotations

import base64
import email.utils
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import Dispatched, Lookup, Sought
from ledgerdash.ledger.providers.presets.common import (
    LookupUnavailable,
    Option,
    PresetAdapter,
    args_hash,
    by_content,
    choose,
    found,
    not_found,
    received,
)

#: The call's arguments and Twilio's names for them.
FIELDS = {"to": "To", "from": "From", "messaging_service_sid": "MessagingServiceSid", "body": "Body"}
PAGES = 20


class Message(PresetAdapter):
    name = "twilio.message"
    provider = "Twilio"
    title = "Twilio: send an SMS"
    documented_lag_seconds = 60.0
    kept_days = 400
    default_base_url = "https://api.twilio.com"
    options: ClassVar[dict[str, Option]] = {
        "account_sid": Option("the account's SID (AC…)", required=True),
        "auth_token": Option("the account's auth token, as ${NAME}", default="${TWILIO_AUTH_TOKEN}"),
    }
    refused_statuses = frozenset({400, 401, 403, 404, 405})

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"to": "+15558675310", "from": "+15017122661", "body": f"Your code is ready ({key})"}

    @property
    def messages_path(self) -> str:
        return f"/2010-04-01/Accounts/{self.settings['account_sid']}/Messages"

    def auth_headers(self) -> dict[str, str]:
        pair = f"{self.settings['account_sid']}:{self.secret('auth_token')}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        extra = sorted(set(args) - set(FIELDS))
        if extra or not isinstance(args.get("to"), str) or not isinstance(args.get("body"), str):
            raise PermanentFailure(
                "an SMS's arguments are to, body and from or messaging_service_sid, nothing else"
                + (f" (not {', '.join(extra)})" if extra else "")
                + ": a lookup can compare only what Twilio shows"
            )
        if ("from" in args) == ("messaging_service_sid" in args):
            raise PermanentFailure("an SMS's arguments name exactly one of from and messaging_service_sid")
        form = [(FIELDS[name], str(value)) for name, value in args.items()]
        answer = self.call("POST", self.messages_path + ".json", form=form, sending=True)
        document = answer.document if isinstance(answer.document, dict) else {}
        if answer.status == 201 and document.get("sid"):
            received(on_request_id, str(document["sid"]))
            return Dispatched(request_id=str(document["sid"]), response=document)
        if answer.status == 400:
            raise PermanentFailure(
                f"Twilio refused the message: error {document.get('code')}: {document.get('message', '')}"
            )
        self.refuse_or_doubt(answer, "the message")
        raise AssertionError("unreachable")  # pragma: no cover

    def _hash_of(self, message: dict[str, Any], sought: Sought) -> str:
        """The hash of the arguments that would have made ``message``, read from what Twilio shows."""
        shown = {name: message.get(name) for name in sought.args if name in FIELDS}
        return args_hash(shown) if all(isinstance(v, str) for v in shown.values()) else ""

    def _matches(self, message: dict[str, Any], sought: Sought, since: datetime | None) -> bool:
        if any(message.get(name) != sought.args.get(name) for name in sought.args if name in FIELDS):
            return False
        if since is None:
            return True
        created = _created(message)
        return created is None or created >= since  # unreadable: kept, so a person sees it

    def search(self, sought: Sought) -> Lookup:
        if not isinstance(sought.args.get("to"), str) or not isinstance(sought.args.get("body"), str):
            raise LookupUnavailable("an SMS is found by its recipient and body; the call's arguments name none")
        if sought.request_id.startswith(("SM", "MM")):
            answer = self.call("GET", f"{self.messages_path}/{sought.request_id}.json")
            if answer.ok and self._matches(answer.document, sought, None):
                return self._found(answer.document, sought, "by its sid")
        since = self.window_start(sought)
        params = [("To", sought.args["to"]), ("PageSize", "100")]
        if isinstance(sought.args.get("from"), str):
            params.append(("From", sought.args["from"]))
        path, matches = self.messages_path + ".json", []
        for _ in range(PAGES):
            answer = self.call("GET", path, params=params)
            document = answer.document if isinstance(answer.document, dict) else {}
            messages = document.get("messages")
            if not isinstance(messages, list):
                raise LookupUnavailable(f"Twilio's message list answered without messages (HTTP {answer.status})")
            matches += [m for m in messages if self._matches(m, sought, since)]
            next_uri = document.get("next_page_uri")
            oldest = _created(messages[-1]) if messages else None
            if not next_uri or not messages or (oldest is not None and oldest < since):
                break  # newest first: a page reaching before the window ends the search
            path, _, query = str(next_uri).partition("?")
            params = urllib.parse.parse_qsl(query)
        else:
            raise LookupUnavailable(f"more than {PAGES * 100} messages to {sought.args['to']}: not all were read")
        chosen = choose(
            matches,
            sought,
            lambda m: str(m.get("sid", "")),
            f"messages to {sought.args['to']} with this body since the call",
        )
        if chosen.match is None:
            return not_found(f"no message to {sought.args['to']} with this body since the call was made", chosen)
        match = self._found(chosen.match, sought, f"by recipient, body and time, not by a key{chosen.note}")
        return by_content(match)

    def _found(self, message: dict[str, Any], sought: Sought, how: str) -> Lookup:
        return found(
            str(message.get("sid", "")),
            self._hash_of(message, sought),
            message,
            f"message {message.get('sid')} matches this call {how} (status {message.get('status', '?')})",
        )


def _created(message: dict[str, Any]) -> datetime | None:
    """When Twilio made ``message`` (its RFC 2822 ``date_created``), None when unreadable."""
    try:
        created = email.utils.parsedate_to_datetime(str(message.get("date_created", "")))
    except (TypeError, ValueError):
        return None
    return created if created.tzinfo is not None else created.replace(tzinfo=UTC)

"""Twilio: send an SMS (https://www.twilio.com/docs/messaging/api/message-resource).

Twilio has no idempotency and nothing on a message that the sender chooses
and can read back: no metadata, no hidden field. So the lookup matches by
content: messages to the call's recipient (``To``, and ``From`` when the
call names it), created since five minutes (the clocks' skew) before the
first dispatch claim, whose body is the call's; by the message's ``sid``
when a dispatcher recorded it. Twilio documents no lag for its message
log, so the preset waits a minute before it takes "not found" for an
answer.

What Twilio changes of a message, and how the lookup allows for it:

- Numbers are compared as E.164, the form Twilio stores them in (a call
  may write ``(555) 867-5310``; Twilio converts it, and lists it only by
  ``+15558675310``).
- The listing is sorted by when a message was sent (``date_sent``), not
  when it was made; one that waited long in Twilio's queue comes after
  messages made later. The search reads back until a page's oldest
  message was *sent* before the call, never stops on its creation time.
- Message Redaction (an account setting) empties a sent message's body
  and masks the recipient's last four digits (``XXXX``). A message whose
  body or number was redacted, or whose body differs only in what Smart
  Encoding replaces (smart quotes, long dashes, Unicode spaces), may be the
  call's and may be another's: ambiguous, for a person, never "not found".
  An account that redacts numbers must say so (``number_redaction = "on"``):
  a listing by recipient cannot see a masked number, so the lookup reads
  the sender's messages instead. Found by the ``sid`` the ledger recorded, a
  redacted message is the call's: the sid is Twilio's own receipt.
- Twilio shows a message for 400 days by default; an account may choose 7
  to 400 (``retention_days``). It is a window over what the API shows, and
  Twilio does not say that a shorter one spares messages already kept: a
  lookup later after the call than the shortest window in force since it
  was sent proves nothing.

What that can prove: no such message since the call was made, read back
to before it, means it was not sent. A message whose sid the ledger
recorded on another side effect (another key: the same text sent to the
same number by another call) is that call's, never this one's: it is left
out before the lookup chooses. One such message left means a message like
it was sent, and the ledger takes it for the call's: if something the ledger
did not record sent the same text to the same number in that window, the
ledger would take that one for it and the call's own message would be
missing, which is a loss, never a duplicate. Two or more are for a person.
More messages in the window than the lookup reads (2,000) is a blind spot:
not evidence, for a person.

A call's arguments are ``to``, ``body`` and ``from`` or
``messaging_service_sid``; nothing else, so that what Twilio shows can be
compared with the call.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import enum
import functools
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import phonenumbers
from anyascii import anyascii

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import BlindSpot, Dispatched, Lookup, Sought
from ledgerdash.ledger.providers.presets.common import (
    LookupUnavailable,
    Option,
    PresetAdapter,
    args_hash,
    by_content,
    changed_may_be,
    choose,
    found,
    not_found,
    received,
)

#: The call's arguments and Twilio's names for them.
FIELDS = {"to": "To", "from": "From", "messaging_service_sid": "MessagingServiceSid", "body": "Body"}
PAGES = 20
PAGE_SIZE = 100
LIST = "Twilio, Message resource: read multiple Message resources, https://www.twilio.com/docs/messaging/api/message-resource"


class Seen(enum.Enum):
    """How a message Twilio shows compares with the call."""

    OTHER = "another message"
    SAME = "the call's content"
    #: Compatible, but Twilio changed what it shows (redaction, Smart Encoding): it may be the call's.
    CHANGED = "changed by Twilio"


class Message(PresetAdapter):
    name = "twilio.message"
    provider = "Twilio"
    title = "Twilio: send an SMS"
    documented_lag_seconds = 60.0
    kept_days = 400
    retention_range = (7, 400)
    default_base_url = "https://api.twilio.com"
    options: ClassVar[dict[str, Option]] = {
        "account_sid": Option("the account's SID (AC…)", required=True),
        "auth_token": Option("the account's auth token, as ${NAME}", default="${TWILIO_AUTH_TOKEN}"),
        "number_redaction": Option(
            'whether the account redacts recipients\' numbers ("on" or "off"): a listing by recipient cannot '
            "see a masked one",
            default="off",
        ),
    }
    refused_statuses = frozenset({400, 401, 403, 404, 405})
    blind_spots = (
        BlindSpot(
            "page_cap",
            "more messages were sent in the window than the lookup reads: it did not read back to when the call "
            "was made",
            LIST,
        ),
    )

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"to": "+15558675310", "from": "+15017122661", "body": f"Your code is ready ({key})"}

    @classmethod
    def parse_config(cls, config: Any) -> dict[str, str]:
        settings = super().parse_config(config)
        if settings["number_redaction"] not in ("on", "off"):
            raise ValueError(f'preset {cls.name}: number_redaction is "on" or "off"')
        return settings

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

    def seen(self, message: dict[str, Any], sought: Sought) -> Seen:
        """How ``message`` compares with the call: numbers as E.164, a body Twilio emptied or Smart-Encoded,
        a number it masked."""
        args, changed = sought.args, False
        to = e164(args["to"], args.get("from"))
        shown_to = str(message.get("to") or "")
        if shown_to.endswith("XXXX") and len(shown_to) == len(to) and shown_to[:-4] == to[:-4]:
            changed = True
        elif e164(shown_to) != to:
            return Seen.OTHER
        if "from" in args and e164(str(message.get("from") or "")) != e164(str(args["from"])):
            return Seen.OTHER
        if "messaging_service_sid" in args and message.get("messaging_service_sid") != args["messaging_service_sid"]:
            return Seen.OTHER
        body, shown_body = str(args["body"]), message.get("body")
        if not isinstance(shown_body, str):
            return Seen.OTHER
        if shown_body != body:
            if shown_body and fold(shown_body) != fold(body):
                return Seen.OTHER
            changed = True  # emptied by redaction, or rewritten by Smart Encoding
        return Seen.CHANGED if changed else Seen.SAME

    def search(self, sought: Sought) -> Lookup:
        if not isinstance(sought.args.get("to"), str) or not isinstance(sought.args.get("body"), str):
            raise LookupUnavailable("an SMS is found by its recipient and body; the call's arguments name none")
        if sought.request_id.startswith(("SM", "MM")):
            answer = self.call("GET", f"{self.messages_path}/{sought.request_id}.json")
            if answer.ok and isinstance(answer.document, dict):
                seen = self.seen(answer.document, sought)
                if seen != Seen.OTHER:
                    note = "; Twilio changed what it shows of it" if seen == Seen.CHANGED else ""
                    return self._found(answer.document, sought, f"by the sid the ledger recorded{note}", seen)
        since = self.window_start(sought)
        to = e164(sought.args["to"], sought.args.get("from"))
        redacted = self.settings["number_redaction"] == "on"
        params = [("PageSize", str(PAGE_SIZE))]
        if not redacted:
            params.append(("To", to))
        if isinstance(sought.args.get("from"), str):
            params.append(("From", sought.args["from"]))
        path = self.messages_path + ".json"
        same: list[dict[str, Any]] = []
        changed: list[dict[str, Any]] = []
        for _ in range(PAGES):
            answer = self.call("GET", path, params=params)
            document = answer.document if isinstance(answer.document, dict) else {}
            messages = document.get("messages")
            if not isinstance(messages, list):
                raise LookupUnavailable(f"Twilio's message list answered without messages (HTTP {answer.status})")
            for message in messages:
                if not isinstance(message, dict) or not _since(message, since):
                    continue
                seen = self.seen(message, sought)
                if seen == Seen.SAME:
                    same.append(message)
                elif seen == Seen.CHANGED:
                    changed.append(message)
            next_uri = document.get("next_page_uri")
            # Sorted by when each was sent, the most recent first: a page whose oldest was sent before the
            # call ends the search (one made earlier but sent later is still ahead; one unsent has no date).
            oldest = _date(messages[-1], "date_sent") if messages and isinstance(messages[-1], dict) else None
            if not next_uri or not messages or (oldest is not None and oldest < since):
                break
            path, _, query = str(next_uri).partition("?")
            params = urllib.parse.parse_qsl(query)
        else:
            raise self.blind("page_cap", f"no message to {to} with this body among the {PAGES * PAGE_SIZE} read")
        what = f"messages to {to} with this body since the call"
        chosen = choose(same, sought, lambda m: str(m.get("sid", "")), what)
        if chosen.match is not None:
            match = self._found(chosen.match, sought, f"by recipient, body and time, not by a key{chosen.note}")
            return by_content(match)
        nothing = f"no message to {to} with this body since the call was made"
        changed_may_be(
            changed,
            sought,
            lambda m: str(m.get("sid", "")),
            nothing,
            "(Twilio changed what it shows of them: a body emptied or rewritten, a number masked, by redaction or "
            "Smart Encoding)",
        )
        return not_found(nothing, chosen)

    def _found(self, message: dict[str, Any], sought: Sought, how: str, seen: Seen = Seen.SAME) -> Lookup:
        # What Twilio shows is the call's in every field compared (as E.164, byte for byte): the call's own
        # hash; changed by Twilio, there is none to compare, and only the recorded sid can settle it.
        shown = {name: sought.args[name] for name in sought.args if name in FIELDS}
        return found(
            str(message.get("sid", "")),
            args_hash(shown) if seen == Seen.SAME else "",
            message,
            f"message {message.get('sid')} matches this call {how} (status {message.get('status', '?')})",
        )


@functools.lru_cache(maxsize=4096)
def e164(number: str, sender: str | None = None) -> str:
    """``number`` as Twilio stores it (E.164), read in the sender's country (the United States unless the
    sender's number says another); unchanged when it is not a phone number (a short code, a sender id)."""
    region = "US"
    if sender:
        with contextlib.suppress(phonenumbers.NumberParseException):
            region = phonenumbers.region_code_for_number(phonenumbers.parse(sender, None)) or "US"
    try:
        parsed = phonenumbers.parse(number, region)
    except phonenumbers.NumberParseException:
        return number
    if not phonenumbers.is_possible_number(parsed):
        return number
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


def fold(body: str) -> str:
    """A body as Smart Encoding could have left it: transliterated to ASCII, spaces collapsed."""
    return " ".join(anyascii(body).split())


def _date(message: dict[str, Any], name: str) -> datetime | None:
    """One of Twilio's RFC 2822 dates of ``message`` (``date_created``, ``date_sent``), None when absent."""
    try:
        when = email.utils.parsedate_to_datetime(str(message.get(name) or ""))
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _since(message: dict[str, Any], since: datetime) -> bool:
    """Whether Twilio made ``message`` since ``since`` (unreadable: kept, so a person sees it)."""
    created = _date(message, "date_created")
    return created is None or created >= since

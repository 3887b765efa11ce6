"""Postmark: send an email (https://postmarkapp.com/developer/api/email-api).

Postmark has no idempotency: the same request sent twice sends two emails.
Each email carries Postmark metadata (``ledgerdash_ref``, the call's
reference; ``ledgerdash_args``, the hash of its arguments), which Postmark
keeps with the message; the lookup asks the outbound message search for
``metadata_ledgerdash_ref``, or reads the message's details by its
``MessageID`` when a dispatcher recorded it (Postmark answered the call
with that id, so it took the email: one it no longer shows is still the
call's). The search is built from
Postmark's activity, which shows a message moments after it was accepted:
Postmark documents no figure, so the preset waits a minute before it takes
"not found" for an answer. The search reads one message stream (the
transactional ``outbound`` one unless told): the preset asks for the
stream the email went to. Postmark keeps a server's messages 45 days by
default (an account sets 7 to 365: the ``retention_days`` setting), and a
change "will apply only to messages processed going forward": an email is
kept as long as the setting in force when it was sent said, and a "not
found" later than that proves nothing.

A 422 names what was wrong with the email (``ErrorCode`` 300, 406 for an
inactive recipient…) and a 401 a bad token: nothing was sent. A 500 says
nothing of whether it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

from ledgerdash.ledger.errors import PermanentFailure
from ledgerdash.ledger.providers.base import Dispatched, Lookup, Sought
from ledgerdash.ledger.providers.presets.common import (
    WHEN_SENT,
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

REF = "ledgerdash_ref"
ARGS_HASH = "ledgerdash_args"
UUID = re.compile(r"[0-9a-fA-F-]{36}")
#: Postmark's ErrorCode for a message it does not have (any more).
NOT_KEPT = 701


class Email(PresetAdapter):
    name = "postmark.email"
    provider = "Postmark"
    title = "Postmark: send an email"
    documented_lag_seconds = 60.0
    default_base_url = "https://api.postmarkapp.com"
    options: ClassVar[dict[str, Option]] = {
        "server_token": Option("the server's API token, as ${NAME}", default="${POSTMARK_SERVER_TOKEN}"),
        "message_stream": Option("the message stream emails go to", default="outbound"),
    }
    kept_days = 45
    retention_range = (7, 365)
    retention_applies = WHEN_SENT
    refused_statuses = frozenset({400, 401, 403, 404, 413, 422})

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {
            "From": "agent@example.com",
            "To": "customer@example.com",
            "Subject": "Your receipt",
            "TextBody": f"Thank you for your order ({key}).",
        }

    def auth_headers(self) -> dict[str, str]:
        return {"X-Postmark-Server-Token": self.secret("server_token")}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        metadata = args.get("Metadata") or {}
        if not isinstance(metadata, dict) or {REF, ARGS_HASH} & set(metadata):
            raise PermanentFailure(f"Metadata must be an object without {REF} or {ARGS_HASH} (the ledger writes them)")
        body = {
            "MessageStream": self.settings["message_stream"],
            **args,
            "Metadata": {**metadata, REF: ref(key), ARGS_HASH: args_hash(args)},
        }
        answer = self.call("POST", "/email", json_body=body, sending=True)
        document = answer.document if isinstance(answer.document, dict) else {}
        if answer.ok and document.get("ErrorCode") == 0 and document.get("MessageID"):
            received(on_request_id, str(document["MessageID"]))
            return Dispatched(request_id=str(document["MessageID"]), response=document)
        if answer.status == 422 or (answer.ok and document.get("ErrorCode")):
            raise PermanentFailure(
                f"Postmark refused the email: ErrorCode {document.get('ErrorCode')}: {document.get('Message', '')}"
            )
        self.refuse_or_doubt(answer, "the email")
        raise AssertionError("unreachable")  # pragma: no cover

    def search(self, sought: Sought) -> Lookup:
        if UUID.fullmatch(sought.request_id):
            answer = self.call("GET", f"/messages/outbound/{sought.request_id}/details")
            if answer.ok and _reference(answer.document) == ref(sought.key):
                return self._found(answer.document)
            if answer.status == 404 or _error_code(answer.document) == NOT_KEPT:
                # Postmark answered the call with this id, so it took the email; it no longer keeps it.
                return self.receipt(
                    sought.request_id,
                    answer.document,
                    f"email {sought.request_id}",
                    "Postmark no longer shows it (past its retention, or deleted)",
                )
            if not answer.ok:
                raise LookupUnavailable(f"Postmark answered HTTP {answer.status}: {answer.text[:200]}")
        stream = sought.args.get("MessageStream") or self.settings["message_stream"]
        params = {"count": "50", "offset": "0", "messagestream": str(stream), f"metadata_{REF}": ref(sought.key)}
        answer = self.call("GET", "/messages/outbound", params=params)
        messages = answer.document.get("Messages") if isinstance(answer.document, dict) else None
        if not isinstance(messages, list):
            raise LookupUnavailable(
                f"Postmark's message search answered without Messages (HTTP {answer.status}): {answer.text[:200]}"
            )
        total = answer.document.get("TotalCount")
        if not isinstance(total, int) or total > len(messages):
            raise LookupUnavailable(
                f"Postmark's message search found {total} messages for one reference and answered {len(messages)}: "
                "its filter was not applied, and what it did not show may hold the call"
            )
        chosen = choose(
            [m for m in messages if _reference(m) == ref(sought.key)],
            sought,
            lambda m: str(m.get("MessageID", "")),
            "emails",
        )
        if chosen.match is None:
            return not_found(
                f"Postmark's outbound search has no email with {REF} {ref(sought.key)} (it shows a message "
                "moments after it was accepted)",
                chosen,
            )
        return self._found(chosen.match)

    def lookup_absent_statuses(self) -> frozenset[int]:
        return frozenset({404, 422})  # a message's details answer 422 with ErrorCode 701 when it is not kept

    def _found(self, message: dict[str, Any]) -> Lookup:
        metadata = message.get("Metadata") or {}
        return found(
            str(message.get("MessageID", "")),
            str(metadata.get(ARGS_HASH, "")),
            message,
            f"email {message.get('MessageID')} carries this call's reference (status {message.get('Status', '?')})",
        )


def _error_code(document: Any) -> Any:
    return document.get("ErrorCode") if isinstance(document, dict) else None


def _reference(message: Any) -> str:
    metadata = message.get("Metadata") if isinstance(message, dict) else None
    return str(metadata.get(REF, "")) if isinstance(metadata, dict) else ""

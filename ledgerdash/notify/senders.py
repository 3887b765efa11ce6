"""Sending one delivery to its channel: a signed webhook, a Slack-compatible
message, or an email through Django's email backend. Each returns a
:class:`Sent` or raises :class:`SendFailed`; the worker records either."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings
from django.core.mail import EmailMessage

from ledgerdash.notify import signing
from ledgerdash.notify.models import ChannelKind, Delivery

USER_AGENT = "ledgerdash-notify/1"


@dataclass(frozen=True)
class Sent:
    status_code: int | None = None


class SendFailed(Exception):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def _post(url: str, body: bytes, headers: dict[str, str]) -> Sent:
    request = urllib.request.Request(  # noqa: S310 - the URL's scheme is checked when the channel is saved
        url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": USER_AGENT, **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.NOTIFY_SEND_TIMEOUT_SECONDS) as response:  # noqa: S310
            return Sent(response.status)
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode("utf-8", "replace").strip()
        raise SendFailed(f"HTTP {exc.code} {exc.reason}: {detail}"[:1000], exc.code) from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise SendFailed(f"{type(exc).__name__}: {reason}"[:1000]) from None


def body_of(delivery: Delivery) -> bytes:
    return json.dumps(delivery.payload, sort_keys=True, separators=(",", ":")).encode()


def send_webhook(delivery: Delivery) -> Sent:
    body = body_of(delivery)
    # The wall clock, not the ledger's: the receiver checks it against its own.
    timestamp = int(time.time())
    return _post(
        delivery.channel.target,
        body,
        {
            signing.DELIVERY_HEADER: str(delivery.id),
            signing.TIMESTAMP_HEADER: str(timestamp),
            signing.SIGNATURE_HEADER: signing.sign(delivery.channel.secret, timestamp, body),
        },
    )


def slack_escape(text: str) -> str:
    """Slack's own escaping: an agent's reason must not become a link or an @channel."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(delivery: Delivery) -> str:
    p = delivery.payload
    title, tenant, text = (slack_escape(p[k]) for k in ("title", "tenant", "text"))
    return f"*{title}* ({tenant})\n{text}\n<{p['url']}|Open in ledgerdash>\ndelivery {delivery.id}"


def send_slack(delivery: Delivery) -> Sent:
    body = json.dumps({"text": slack_text(delivery), "delivery_id": str(delivery.id)}).encode()
    return _post(delivery.channel.target, body, {signing.DELIVERY_HEADER: str(delivery.id)})


def send_email(delivery: Delivery) -> Sent:
    p = delivery.payload
    if not delivery.recipients:
        raise SendFailed("no recipient address")
    if "default" not in settings.MAILERS:
        raise SendFailed("email is not configured on this server: set EMAIL_HOST (see docs/settings.md)")
    message = EmailMessage(
        subject=f"[ledgerdash {p['tenant']}] {p['title']}",
        body=f"{p['text']}\n\n{p['url']}\n\ndelivery {delivery.id}\n",
        to=delivery.recipients,
        headers={
            # The same id on a second send lets mail systems and people drop it.
            "Message-ID": f"<{delivery.id}@ledgerdash>",
            signing.DELIVERY_HEADER: str(delivery.id),
        },
    )
    try:
        message.send()
    except (OSError, ValueError) as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}"[:1000]) from None
    return Sent()


SENDERS = {
    ChannelKind.WEBHOOK: send_webhook,
    ChannelKind.AGENT: send_webhook,  # an agent's callback is a signed webhook
    ChannelKind.SLACK: send_slack,
    ChannelKind.EMAIL: send_email,
}


def send(delivery: Delivery) -> Sent:
    return SENDERS[ChannelKind(delivery.channel.kind)](delivery)

"""Stripe: payment intents and refunds (https://docs.stripe.com/api).

Stripe deduplicates: a request with an ``Idempotency-Key`` it has seen
replays the first answer (``Idempotent-Replayed: true``) for at least 24
hours; the same key with other parameters is refused with an
``idempotency_error`` (HTTP 400), and while the first request with a key
is still running, another with it gets HTTP 409. Request bodies are forms
(``metadata[ledgerdash_ref]=…``); answers are JSON.

Each call carries ``metadata[ledgerdash_ref]`` (:func:`~.common.ref` of its
key) and ``metadata[ledgerdash_args_sha256]`` (the ledger's hash of its
arguments); Stripe takes 50 metadata keys, so a call may bring 48. Every
request names the API version it speaks (``Stripe-Version``): an account's
default may be older than search needs (2020-08-27).

A payment intent is found by its id when a dispatcher recorded one, else by
listing the intents created while the call could have landed (from its
first dispatch claim to when it could no longer land, each widened by the
clocks' margin): Stripe's list endpoints are read-after-write consistent,
so a call that happened is found at once. Only when that window holds more
intents than the preset reads (2,000) does it ask the search API
(``metadata['ledgerdash_ref']:'…'``), which Stripe says is not for
read-after-write: data is searchable "in less than a minute" and can be
"up to an hour" behind during outages, hence the tool's lag of an hour for
a "not found". An account without search (Stripe offers none to merchants
in India) is then a blind spot: not evidence, for a person.
Refunds have no search: they are found by listing the payment intent's
refunds (consistent; no lag).

A 409 means another request with the key is still running, whatever type
Stripe gives it (``idempotency_error``, or ``invalid_request_error`` as it
has been seen): nothing was done by this one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from ledgerdash.ledger.errors import NothingHappened, PermanentFailure
from ledgerdash.ledger.providers.base import BlindSpot, Dispatched, Lookup, Sought
from ledgerdash.ledger.providers.presets.common import (
    MARK,
    Answer,
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

REF = f"{MARK}_ref"
ARGS_HASH = f"{MARK}_args_sha256"
#: Stripe's longest idempotency key; a longer ledger key is sent as its reference.
MAX_KEY = 255
#: The API version every request speaks (Stripe's search page names it as the one to override with).
STRIPE_VERSION = "2025-03-31.basil"
#: Stripe's most metadata keys on an object; the ledger writes two of them.
MAX_METADATA = 50
#: The listing reads this many pages of 100 before it asks the search API.
PAGES = 20
SEARCH_PAGE = "Stripe, Search, https://docs.stripe.com/search"


def form(args: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``args`` as Stripe's form encoding: ``a[b]=…`` for objects, ``a[0]=…`` for lists."""
    pairs: list[tuple[str, str]] = []
    for name, value in args.items():
        field = f"{prefix}[{name}]" if prefix else str(name)
        if isinstance(value, dict):
            pairs.extend(form(value, field))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    pairs.extend(form(item, f"{field}[{i}]"))
                else:
                    pairs.append((f"{field}[{i}]", _scalar(item)))
        elif value is not None:
            pairs.append((field, _scalar(value)))
    return pairs


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _Stripe(PresetAdapter):
    provider = "Stripe"
    deduplicates = True
    retention_seconds = 24 * 3600
    default_base_url = "https://api.stripe.com"
    options: ClassVar[dict[str, Option]] = {
        "secret_key": Option("the secret API key, as ${NAME}", default="${STRIPE_SECRET_KEY}"),
        "stripe_account": Option("a connected account to act for (Stripe-Account header); empty: your own"),
    }
    #: The API path of the object the preset creates.
    path: ClassVar[str]
    noun: ClassVar[str]

    def auth_headers(self) -> dict[str, str]:
        headers = {"Authorization": "Bearer " + self.secret("secret_key"), "Stripe-Version": STRIPE_VERSION}
        if self.settings["stripe_account"]:
            headers["Stripe-Account"] = self.settings["stripe_account"]
        return headers

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        metadata = args.get("metadata") or {}
        if not isinstance(metadata, dict) or {REF, ARGS_HASH} & set(metadata):
            raise PermanentFailure(f"metadata must be an object without {REF} or {ARGS_HASH} (the ledger writes them)")
        if len(metadata) > MAX_METADATA - 2:
            raise PermanentFailure(
                f"metadata has {len(metadata)} keys: Stripe takes {MAX_METADATA} and the ledger writes 2, so a call "
                f"may bring {MAX_METADATA - 2}"
            )
        body = {**args, "metadata": {**metadata, REF: ref(key), ARGS_HASH: args_hash(args)}}
        answer = self._post(self.path, form(body), key)
        if answer.ok and isinstance(answer.document, dict) and answer.document.get("id"):
            received(on_request_id, str(answer.document["id"]))
            return Dispatched(request_id=str(answer.document["id"]), response=answer.document)
        error = (answer.document or {}).get("error", {}) if isinstance(answer.document, dict) else {}
        if answer.status == 409:  # typed idempotency_error, or invalid_request_error as it has come back
            raise NothingHappened(
                "Stripe is still running an earlier request with this key (HTTP 409): nothing was done by this one"
            )
        if error.get("type") == "idempotency_error":
            raise PermanentFailure(
                "Stripe refused: this key was already used with other parameters (idempotency_error); an effect "
                f"under it exists that is not this call's: {error.get('message', '')}"
            )
        if answer.status == 402:
            raise PermanentFailure(
                f"Stripe declined the {self.noun} (HTTP 402, {error.get('code', 'card_error')}): no money moved"
                + (f"; the declined payment intent is {error['payment_intent']['id']}" if _intent_id(error) else "")
            )
        self.refuse_or_doubt(answer, f"the {self.noun}")
        raise AssertionError("unreachable")  # pragma: no cover

    def _post(self, path: str, body: list[tuple[str, str]], key: str) -> Answer:
        """The one request that may act, with the key Stripe deduplicates on."""
        sent_key = key if len(key) <= MAX_KEY else ref(key)
        return self.call("POST", path, form=body, headers={"Idempotency-Key": sent_key}, sending=True)

    def _list(self, params: dict[str, str], sought: Sought, what: str) -> tuple[list[Any], bool]:
        """The call's among the objects of this list (read-after-write consistent), at most ``PAGES``
        pages of 100, and whether the list was read to its end."""
        matches: list[Any] = []
        for _ in range(PAGES):
            answer = self.call("GET", self.path, params=params)
            data = answer.document.get("data") if isinstance(answer.document, dict) else None
            if not isinstance(data, list):
                raise LookupUnavailable(f"Stripe's {what} list answered without a data list (HTTP {answer.status})")
            matches += [d for d in data if self._ours(d, sought)]
            if not answer.document.get("has_more") or not data:
                return matches, True
            params = {**params, "starting_after": str(data[-1].get("id", ""))}
        return matches, False

    def _chosen(self, matches: list[Any], sought: Sought, nothing: str) -> Lookup:
        """The one of ``matches`` that is the call's (none: not found, saying ``nothing``)."""
        chosen = choose(matches, sought, lambda d: str(d.get("id", "")), f"{self.noun}s")
        if chosen.match is None:
            return not_found(nothing, chosen)
        mine = self._ours(chosen.match, sought)
        assert mine is not None
        return mine

    def _ours(self, document: Any, sought: Sought) -> Lookup | None:
        metadata = document.get("metadata") or {} if isinstance(document, dict) else {}
        if metadata.get(REF) != ref(sought.key):
            return None
        return found(
            str(document.get("id", "")),
            str(metadata.get(ARGS_HASH, "")),
            document,
            f"{self.noun} {document.get('id')} carries this call's reference (status {document.get('status', '?')})",
        )


class PaymentIntent(_Stripe):
    name = "stripe.payment_intent"
    title = "Stripe: create a payment intent"
    documented_lag_seconds = 3600.0
    path = "/v1/payment_intents"
    noun = "payment intent"

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"amount": 1999, "currency": "usd", "description": f"order {key}", "metadata": {"order": key[-40:]}}

    blind_spots = (
        BlindSpot(
            "search_unavailable",
            "more payment intents were made while the call could land than the listing reads, and the account "
            "has no search to find it by its reference",
            SEARCH_PAGE,
        ),
    )

    def lookup_absent_statuses(self) -> frozenset[int]:
        return frozenset({400, 404})  # a search the account cannot use answers 400: read below

    def search(self, sought: Sought) -> Lookup:
        if sought.request_id.startswith("pi_"):
            answer = self.call("GET", f"{self.path}/{sought.request_id}")
            if answer.ok:
                mine = self._ours(answer.document, sought)
                if mine is not None:
                    return mine
        listed = self._listed(sought)
        if listed is not None:
            return listed
        return self._searched(sought)

    def _listed(self, sought: Sought) -> Lookup | None:
        """The call found among the intents created while it could land (consistent: no lag); None when
        there were more than the listing reads."""
        start = self.window_start(sought)
        params = {"created[gte]": str(int(start.timestamp())), "limit": "100"}
        end = self.window_end(sought)
        if end is not None:
            params["created[lte]"] = str(int(end.timestamp()) + 1)
        matches, complete = self._list(params, sought, "payment intent")
        if not complete and not matches:
            return None
        listed = self._chosen(
            matches,
            sought,
            f"no payment intent created since {start:%Y-%m-%d %H:%M:%S} UTC carries {REF} {ref(sought.key)} "
            "(Stripe's list is read-after-write consistent)",
        )
        return replace(listed, consistent=True)

    def _searched(self, sought: Sought) -> Lookup:
        reference = ref(sought.key)
        answer = self.call("GET", f"{self.path}/search", params={"query": f"metadata['{REF}']:'{reference}'"})
        error = answer.document.get("error") if isinstance(answer.document, dict) else None
        if answer.status == 400 and isinstance(error, dict) and "not available" in str(error.get("message", "")):
            raise self.blind("search_unavailable", f"Stripe answered: {error.get('message')}")
        if answer.status == 400:
            raise LookupUnavailable(f"Stripe's search refused the query (HTTP 400): {answer.text[:200]}")
        data = answer.document.get("data") if isinstance(answer.document, dict) else None
        if not isinstance(data, list):
            raise LookupUnavailable(f"Stripe's search answered without a data list (HTTP {answer.status})")
        return self._chosen(
            [d for d in data if self._ours(d, sought)],
            sought,
            f"Stripe's search has no payment intent with {REF} {reference} (the search index can lag behind by up "
            "to an hour)",
        )


class Refund(_Stripe):
    name = "stripe.refund"
    title = "Stripe: refund a payment intent"
    path = "/v1/refunds"
    noun = "refund"

    @classmethod
    def example_args(cls, key: str) -> dict[str, Any]:
        return {"payment_intent": "pi_drill", "amount": 500, "reason": "requested_by_customer"}

    def send(self, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None) -> Dispatched:
        if not isinstance(args.get("payment_intent"), str):
            raise PermanentFailure("a refund's arguments need payment_intent (the intent it refunds), by its id")
        return super().send(key, args, on_request_id)

    def search(self, sought: Sought) -> Lookup:
        intent = sought.args.get("payment_intent")
        if not isinstance(intent, str):
            raise LookupUnavailable("a refund is found through its payment intent; the call's arguments name none")
        matches, complete = self._list({"payment_intent": intent, "limit": "100"}, sought, "refund")
        if not complete:  # 2,000 refunds of one payment intent: past that, a person looks
            raise LookupUnavailable(f"payment intent {intent} has more than 2,000 refunds: not all were read")
        return self._chosen(matches, sought, f"no refund of {intent} carries this call's reference")


def _intent_id(error: dict[str, Any]) -> bool:
    intent = error.get("payment_intent")
    return isinstance(intent, dict) and isinstance(intent.get("id"), str)

"""A replica of Stripe's payment intents and refunds.

As Stripe documents it: form-encoded bodies with bracketed keys, a secret
key as a bearer token, ``Idempotency-Key`` honoured for 24 hours (the
first answer replayed with ``Idempotent-Replayed: true``; other parameters
under the same key refused with an ``idempotency_error``, HTTP 400; a
request while the first with its key runs, HTTP 409), the search API
(``metadata['k']:'v'`` clauses joined by ``AND``) behind its index lag,
lists newest first with ``starting_after``, errors as
``{"error": {"type", "code", "message"}}``; payment intents listed by
``created[gte]``/``created[lte]``, newest first; metadata of more than 50
keys refused. The test card ``pm_card_chargeDeclined`` is declined (HTTP
402), as in Stripe's test mode. A request without ``Stripe-Version`` is
served at the account's version, and search needs 2020-08-27 or later.

Its modes (``PUT /modes``) are what an account may meet, each from Stripe's
own pages or its engineers' word (:attr:`Stripe.MODES`).
"""

from __future__ import annotations

import re
from typing import Any

from ledgerdash.replicas.core import ACT, READ, SEARCH, Effect, Handler, Mode, Replica, Request, Response

RETENTION = 24 * 3600.0
SEARCH_PAGE = "Stripe, Search, https://docs.stripe.com/search"
#: The oldest API version search answers at (Stripe's search page).
SEARCH_SINCE = "2020-08-27"
CLAUSE = re.compile(r"metadata\['([^'\\]+)'\]:'((?:[^'\\]|\\.)*)'")


def nested(pairs: dict[str, list[str]]) -> dict[str, Any]:
    """Stripe's form encoding back into objects: ``metadata[a]=1`` -> {"metadata": {"a": "1"}}."""
    out: dict[str, Any] = {}
    for name, values in pairs.items():
        parts = re.findall(r"[^\[\]]+", name)
        target = out
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = values[-1]
    return out


def listed(request: Request, items: list[dict[str, Any]], url: str) -> Response:
    """One page of a list endpoint, newest first: ``limit`` (at most 100) after ``starting_after``."""
    after = request.arg("starting_after")
    if after:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    limit = min(int(request.arg("limit", "10") or 10), 100)
    return Response(200, {"object": "list", "data": items[:limit], "has_more": len(items) > limit, "url": url})


def error(status: int, kind: str, message: str, code: str = "") -> Response:
    body: dict[str, Any] = {"type": kind, "message": message}
    if code:
        body["code"] = code
    return Response(status, {"error": body})


class Stripe(Replica):
    name = "stripe"
    MODES = {
        "search_unavailable": Mode(
            False, "search is not available to the account (Stripe: not to merchants in India)", SEARCH_PAGE
        ),
        "account_api_version": Mode(
            "2025-03-31.basil",
            "a request without Stripe-Version is served at the account's default API version; search needs "
            f"{SEARCH_SINCE} or later",
            SEARCH_PAGE,
        ),
        "conflict_as_invalid_request": Mode(
            False,
            "a request whose key another request is still running under is answered 409 typed "
            "invalid_request_error, not idempotency_error (a Stripe engineer: match on the 409)",
            "woocommerce-gateway-stripe, Retry (pull request 503), "
            "https://github.com/woocommerce/woocommerce-gateway-stripe/pull/503",
        ),
        "no_retry_after": Mode(
            False,
            "a 429 comes without Retry-After (Stripe documents its rate limits and the 429, no header)",
            "Stripe, Rate limits, https://docs.stripe.com/rate-limits",
        ),
    }

    def __init__(self) -> None:
        super().__init__()
        #: key -> (parameters, the answer, when first seen); answer None while the first request runs
        self.keys: dict[str, tuple[list[tuple[str, str]], Response | None, float]] = {}

    def forget(self) -> None:
        self.keys.clear()

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        return [
            ("POST", r"/v1/payment_intents", ACT, self.idempotent(self.create_intent)),
            ("GET", r"/v1/payment_intents", READ, self.list_intents),
            ("GET", r"/v1/payment_intents/search", SEARCH, self.search_intents),
            ("GET", r"/v1/payment_intents/([^/]+)", READ, self.get("payment_intent")),
            ("POST", r"/v1/refunds", ACT, self.idempotent(self.create_refund)),
            ("GET", r"/v1/refunds", READ, self.list_refunds),
            ("GET", r"/v1/refunds/([^/]+)", READ, self.get("refund")),
        ]

    def authorized(self, request: Request) -> Response | None:
        if request.bearer().startswith("sk_"):
            return None
        return error(401, "invalid_request_error", "Invalid API Key provided")

    def rate_limit_body(self) -> Any:
        return {"error": {"type": "invalid_request_error", "code": "rate_limit", "message": "Too many requests"}}

    def rate_limit_headers(self) -> dict[str, str]:
        return {} if self.mode("no_retry_after") else super().rate_limit_headers()

    def server_error_body(self) -> Any:
        return {"error": {"type": "api_error", "message": "An unknown error occurred"}}

    def idempotent(self, create: Handler) -> Handler:
        def handle(request: Request) -> Response:
            key = request.headers.get("Idempotency-Key", "")
            params = sorted((k, v[-1]) for k, v in request.form().items())
            if key:
                with self.lock:
                    seen = self.keys.get(key)
                    if seen is not None and seen[2] < self.now() - RETENTION:
                        seen = None  # forgotten: the same key acts again
                    if seen is not None:
                        if seen[0] != params:
                            return error(
                                400,
                                "idempotency_error",
                                "Keys for idempotent requests can only be used with the same parameters they were "
                                f"first used with. Try using a key other than '{key}' if you meant to execute a "
                                "different request.",
                            )
                        if seen[1] is None:
                            return error(
                                409,
                                "invalid_request_error"
                                if self.mode("conflict_as_invalid_request")
                                else "idempotency_error",
                                "There is currently another in-progress request using this Stripe-Idempotency-Key.",
                            )
                        first = seen[1]
                        return Response(first.status, first.body, {**first.headers, "Idempotent-Replayed": "true"})
                    self.keys[key] = (params, None, self.now())
            try:
                response = create(request)
            except Exception:
                with self.lock:
                    self.keys.pop(key, None)  # nothing was kept: the key may be used again
                raise
            if key:
                with self.lock:
                    first_seen = self.keys.get(key, (params, None, self.now()))[2]
                    self.keys[key] = (params, response, first_seen)
            return response

        return handle

    def create_intent(self, request: Request) -> Response:
        fields = nested(request.form())
        if len(fields.get("metadata") or {}) > 50:
            return error(
                400, "invalid_request_error", "You can only specify up to 50 keys in metadata.", "parameter_invalid"
            )
        amount = str(fields.get("amount", ""))
        if not amount.isdigit() or int(amount) < 1:
            return error(400, "invalid_request_error", "Missing required param: amount.", "parameter_missing")
        if not fields.get("currency"):
            return error(400, "invalid_request_error", "Missing required param: currency.", "parameter_missing")
        n = self.next_id()
        intent_id = f"pi_{n:024d}"
        confirm = fields.get("confirm") == "true"
        document = {
            "id": intent_id,
            "object": "payment_intent",
            "amount": int(amount),
            "currency": str(fields["currency"]).lower(),
            "customer": fields.get("customer"),
            "description": fields.get("description"),
            "metadata": fields.get("metadata") or {},
            "payment_method": fields.get("payment_method"),
            "status": "succeeded" if confirm else "requires_payment_method",
            "client_secret": f"pi_{n:024d}_secret_replica",
            "created": int(self.now()),
            "livemode": False,
        }
        if confirm and fields.get("payment_method") == "pm_card_chargeDeclined":
            document["status"] = "requires_payment_method"
            self.record(Effect("payment_intent", intent_id, self.now(), document))
            declined = error(402, "card_error", "Your card was declined.", "card_declined")
            declined.body["error"]["payment_intent"] = document
            return declined
        self.record(Effect("payment_intent", intent_id, self.now(), document))
        return Response(200, document)

    def create_refund(self, request: Request) -> Response:
        fields = nested(request.form())
        intent = self._one("payment_intent", str(fields.get("payment_intent", "")))
        if intent is None:
            return error(
                400,
                "invalid_request_error",
                f"No such payment_intent: '{fields.get('payment_intent', '')}'",
                "resource_missing",
            )
        amount = str(fields.get("amount", intent["amount"]))
        if not amount.isdigit() or not 1 <= int(amount) <= intent["amount"]:
            return error(400, "invalid_request_error", "Refund amount is invalid.", "amount_too_large")
        n = self.next_id()
        document = {
            "id": f"re_{n:024d}",
            "object": "refund",
            "amount": int(amount),
            "currency": intent["currency"],
            "payment_intent": intent["id"],
            "reason": fields.get("reason"),
            "metadata": fields.get("metadata") or {},
            "status": "succeeded",
            "created": int(self.now()),
        }
        self.record(Effect("refund", document["id"], self.now(), document))
        return Response(200, document)

    def _one(self, kind: str, id_: str) -> dict[str, Any] | None:
        return next((e.document for e in self.of_kind(kind) if e.id == id_), None)

    def get(self, kind: str) -> Handler:
        def handle(request: Request) -> Response:
            document = self._one(kind, request.groups[0])
            if document is None:
                return error(404, "invalid_request_error", f"No such {kind}: '{request.groups[0]}'", "resource_missing")
            return Response(200, document)

        return handle

    def list_intents(self, request: Request) -> Response:
        intents = [e.document for e in reversed(self.of_kind("payment_intent"))]
        for bound, keep in (("gte", lambda c, v: c >= v), ("lte", lambda c, v: c <= v)):
            value = request.arg(f"created[{bound}]")
            if value:
                if not value.isdigit():
                    return error(400, "invalid_request_error", f"Invalid integer: {value}", "parameter_invalid")
                intents = [i for i in intents if keep(i["created"], int(value))]
        return listed(request, intents, "/v1/payment_intents")

    def search_intents(self, request: Request) -> Response:
        if self.mode("search_unavailable"):
            return error(
                400, "invalid_request_error", "Search is not available for your account.", "search_unavailable"
            )
        version = request.headers.get("Stripe-Version") or str(self.mode("account_api_version"))
        if version[:10] < SEARCH_SINCE:
            return error(
                400,
                "invalid_request_error",
                f"Search is only available for API versions {SEARCH_SINCE} and later (this request: {version}).",
                "api_version_unsupported",
            )
        query = request.arg("query").strip()
        clauses = [c.strip() for c in re.split(r"\s+AND\s+", query)] if query else []
        wanted = []
        for clause in clauses:
            found = CLAUSE.fullmatch(clause)
            if found is None:
                return error(400, "invalid_request_error", f"Unsupported search query: {clause!r}", "parameter_invalid")
            wanted.append((found.group(1), re.sub(r"\\(.)", r"\1", found.group(2))))
        if not wanted:
            return error(400, "invalid_request_error", "Missing required param: query.", "parameter_missing")
        data = [
            e.document
            for e in reversed(self.of_kind("payment_intent", searching=True))
            if all(e.document["metadata"].get(k) == v for k, v in wanted)
        ]
        limit = int(request.arg("limit", "10") or 10)
        return Response(
            200,
            {
                "object": "search_result",
                "data": data[:limit],
                "has_more": len(data) > limit,
                "next_page": None,
                "url": "/v1/payment_intents/search",
            },
        )

    def list_refunds(self, request: Request) -> Response:
        refunds = [e.document for e in reversed(self.of_kind("refund"))]
        if request.arg("payment_intent"):
            refunds = [r for r in refunds if r["payment_intent"] == request.arg("payment_intent")]
        return listed(request, refunds, "/v1/refunds")

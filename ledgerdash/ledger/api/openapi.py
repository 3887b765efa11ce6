"""What the generated OpenAPI document cannot say from the endpoints' types
alone, added to it: the statuses every operation may answer whatever its
handler (405 for another method, 411 for a chunked body), for each error
status the codes it may carry (from :mod:`ledgerdash_client.errorcodes`), and the
headers the API sends."""

from __future__ import annotations

from typing import Any

from ledgerdash_client import errorcodes

ERROR_REF = "#/components/schemas/ErrorOut"

HEADERS: dict[str, dict[str, Any]] = {
    "Retry-After": {
        "description": "Seconds to wait before asking again: until a retryable failure's back-off ends "
        "(retry_pending), the dispatcher's lease ends (attempt_in_flight), an approver may have decided "
        "(awaiting_approval), or the database is back (ledger_unavailable).",
        "schema": {"type": "integer", "minimum": 1},
    },
    "WWW-Authenticate": {
        "description": 'Bearer realm="ledgerdash", with error="invalid_token" unless no token was sent.',
        "schema": {"type": "string"},
    },
    "Idempotent-Replayed": {
        "description": "true: the key was already recorded with these arguments; the attempt returned is that "
        "one, whatever its state.",
        "schema": {"type": "string", "enum": ["true"]},
    },
    "Ledgerdash-Late-Report": {
        "description": "true: the outcome arrived after the attempt had moved on; it is recorded as a late "
        "report, and an incident opens when it contradicts what was decided.",
        "schema": {"type": "string", "enum": ["true"]},
    },
}

#: Statuses whose answers may carry Retry-After.
RETRY_AFTER_STATUSES = {409, 503}
#: Per operation and success status, the headers it may send.
SUCCESS_HEADERS: dict[tuple[str, int], list[str]] = {
    ("record_intent", 200): ["Idempotent-Replayed"],
    ("report_outcome", 200): ["Idempotent-Replayed", "Ledgerdash-Late-Report"],
}


def _error(status: int, description: str | None = None) -> dict[str, Any]:
    schema = {
        "allOf": [
            {"$ref": ERROR_REF},
            {"type": "object", "properties": {"code": {"enum": errorcodes.answered(status)}}},
        ]
    }
    answer: dict[str, Any] = {"content": {"application/json": {"schema": schema}}}
    if description:
        answer["description"] = description
    return answer


#: The methods an OpenAPI path item may describe.
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def other_methods(methods: list[str]) -> str:
    """What a path says of the methods it does not serve (each answers 405 with ``Allow``)."""
    served = ", ".join(method.upper() for method in methods)
    return f"Every other method than {served} answers 405 `method_not_allowed` (an `ErrorOut`) with `Allow: {served}`."


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """Add what the endpoints' types cannot say. A method a path does not serve is not made an
    operation of its own (generated clients would grow calls that can only fail): each path item
    says in its description what any other method answers."""
    for operations in document.get("paths", {}).values():
        methods = [method for method in METHODS if method in operations]
        operations["description"] = other_methods(methods)
        for method in methods:
            operation = operations[method]
            responses = operation.setdefault("responses", {})
            responses.setdefault(405, _error(405, "Method Not Allowed (`Allow` names those that are)"))
            if method in ("post", "put", "patch"):
                responses.setdefault(411, _error(411, "Length Required"))
            for status, answer in responses.items():
                code = int(status)
                headers: list[str] = []
                if code >= 400:
                    answer.setdefault("content", {}).update(_error(code)["content"])
                if code == 401:
                    headers.append("WWW-Authenticate")
                if code in RETRY_AFTER_STATUSES:
                    headers.append("Retry-After")
                headers.extend(SUCCESS_HEADERS.get((operation.get("operationId", ""), code), []))
                if headers:
                    answer["headers"] = {name: HEADERS[name] for name in headers}
    return document

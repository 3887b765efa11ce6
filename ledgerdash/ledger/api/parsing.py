"""Request bodies: strict JSON (I-JSON, RFC 7493), labelled as such, or refused."""

from __future__ import annotations

import json
import math
from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser

from ledgerdash.ledger.api.errors import ApiError
from ledgerdash.ledger.api.rendering import JSON_TYPE


def _no_constants(name: str) -> Any:
    raise ApiError("malformed_json", f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ApiError("malformed_json", f"number {text[:40]} is too large to represent")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ApiError("malformed_json", f"key {key[:80]!r} appears twice in one object")
        obj[key] = value
    return obj


def parse_json(body: bytes) -> Any:
    """Parse a request body as I-JSON (RFC 7493): UTF-8, no duplicate keys, no
    NaN/Infinity, no lone surrogates. What the ledger hashes is what was meant."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError("invalid_utf8", f"the body is not UTF-8 (invalid byte at offset {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constants, parse_float=_finite, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ApiError("malformed_json", "the body is nested too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, or an integer with too many digits
        raise ApiError("malformed_json", f"the body is not JSON: {exc}"[:300]) from None
    # A lone surrogate can only come from an escape: the text was decoded as strict UTF-8, which has none.
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(
                "invalid_unicode", "the body has a lone surrogate escape (like \\ud800), which is not text"
            ) from None
    return value


class StrictJsonParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        if request.content_type != JSON_TYPE:
            raise ApiError(
                "unsupported_media_type",
                f"send the body as {JSON_TYPE}, not {request.content_type or 'an unlabelled body'}",
            )
        charset = (request.content_params or {}).get("charset", "utf-8").lower()
        if charset not in ("utf-8", "utf8"):
            raise ApiError("unsupported_media_type", f"send the body as UTF-8, not {charset}")
        return parse_json(request.body)

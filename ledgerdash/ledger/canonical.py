"""Canonical JSON and the arguments hash.

Arguments are hashed as RFC 8785 (JSON Canonicalization Scheme) bytes:
sorted keys, no insignificant whitespace, UTF-8, numbers in their shortest
round-trip form. JCS is a published standard, so an agent written in any
language (or a provider) can compute the same hash from the same arguments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import rfc8785
from django.conf import settings

from ledgerdash.ledger.errors import InvalidArgs

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value``; raises :class:`InvalidArgs` for anything not JSON."""
    try:
        return rfc8785.dumps(value)
    except rfc8785.FloatDomainError:
        raise InvalidArgs(InvalidArgs.NOT_FINITE) from None
    except rfc8785.IntegerDomainError:
        raise InvalidArgs(InvalidArgs.INT_RANGE) from None
    except rfc8785.CanonicalizationError as exc:
        raise InvalidArgs(f"{InvalidArgs.NOT_JSON}: {exc}") from None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_shape(value: Any, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise InvalidArgs(InvalidArgs.TOO_DEEP.format(max_depth=max_depth))
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgs(InvalidArgs.KEY_NOT_STRING.format(key=repr(key)[:80]))
            if "\x00" in key:
                raise InvalidArgs(InvalidArgs.NUL)
            _check_shape(item, depth + 1, max_depth)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_shape(item, depth + 1, max_depth)
    elif isinstance(value, str):
        # PostgreSQL cannot store U+0000 in text or jsonb; refuse it everywhere
        # so a ledger moved between databases keeps every row.
        if "\x00" in value:
            raise InvalidArgs(InvalidArgs.NUL)
    elif value is None or isinstance(value, (bool, int, float)):
        return
    else:
        raise InvalidArgs(InvalidArgs.UNSUPPORTED_TYPE.format(type=type(value).__name__))


def normalize_args(args: Any) -> tuple[dict[str, Any], str]:
    """Validate tool arguments and return ``(normalized, args_hash)``.

    ``normalized`` is the canonical JSON parsed back: what is stored, shown
    to operators and sent to the provider is exactly what was hashed.
    """
    if not isinstance(args, Mapping):
        raise InvalidArgs(InvalidArgs.NOT_OBJECT.format(type=type(args).__name__))
    _check_shape(args, 1, settings.LEDGER_MAX_ARGS_DEPTH)
    data = canonical_bytes(dict(args))
    if len(data) > settings.LEDGER_MAX_ARGS_BYTES:
        raise InvalidArgs(InvalidArgs.TOO_LARGE.format(size=len(data), limit=settings.LEDGER_MAX_ARGS_BYTES))
    return json.loads(data), sha256_hex(data)

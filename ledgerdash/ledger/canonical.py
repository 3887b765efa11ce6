"""Canonical JSON and the arguments hash.

Arguments are hashed as RFC 8785 (JSON Canonicalization Scheme) bytes:
sorted keys, no insignificant whitespace, UTF-8, numbers in their shortest
round-trip form. JCS is a published standard, so an agent written in any
language (or a provider) can compute the same hash from the same arguments.

Two encoders make the same bytes. Most values the ledger hashes (every
event's content, nearly all arguments: four hashes a tool call) hold no
fractions: for those the standard library's C encoder, with sorted keys,
no whitespace and UTF-8 left unescaped, writes exactly RFC 8785, in half
the time the ``rfc8785`` package's pure-Python walk takes (70 against 142
us a tool call, measured in the calls of ``python -m bench.profile``).
Everything else (a fraction, whose shortest form ECMAScript may write
differently from Python; integers beyond 2**53 - 1, which JCS refuses;
keys beyond the Basic Multilingual Plane, which JCS orders by UTF-16 code
units; subclasses of containers; any other type) goes to the ``rfc8785``
package. ``tests/test_canonical.py`` holds the two equal on generated
values.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Mapping
from typing import Any

import rfc8785
from django.conf import settings

from ledgerdash.ledger.errors import InvalidArgs

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


#: The largest integer JCS takes (the largest an IEEE double holds exactly).
_SAFE_INT = 2**53 - 1
#: Where UTF-16 order and code point order part ways: beyond the Basic Multilingual Plane.
_BEYOND_BMP = "\U00010000"

_stdlib_encode = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"), check_circular=False
).encode


#: What :func:`_plain` answers for a value the standard library cannot write as JCS.
_NOT_PLAIN: Any = object()


def _plain(value: Any) -> Any:
    """``value`` as the standard library's encoder writes it exactly as RFC 8785
    does (itself, or a copy with integral floats made integers), or ``_NOT_PLAIN``.

    JCS writes an integral float as an integer (``60.0`` as ``60``); up to
    2**53 that integer is the float's exact value, which ``int()`` gives. A
    subclass of ``str`` (a ``StrEnum``) is written as its text by both; one
    of ``int`` or ``float`` as what ``int()`` or ``float()`` make of it, as
    the ``rfc8785`` package writes it. A subclass of ``dict``, ``list`` or a
    key's ``str`` may read its items its own way (Django's ``QueryDict``
    does): those go to the package, which copies them as plain ones."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        return value if -_SAFE_INT <= value <= _SAFE_INT else _NOT_PLAIN
    if kind is float:
        return int(value) if value.is_integer() and -_SAFE_INT <= value <= _SAFE_INT else _NOT_PLAIN
    if kind is dict:
        copy = None
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or max(key) < _BEYOND_BMP):
                return _NOT_PLAIN
            plain = _plain(item)
            if plain is not item:
                if plain is _NOT_PLAIN:
                    return _NOT_PLAIN
                if copy is None:
                    copy = dict(value)
                copy[key] = plain
        return value if copy is None else copy
    if kind is list or kind is tuple:
        items = [_plain(item) for item in value]
        if any(plain is _NOT_PLAIN for plain in items):
            return _NOT_PLAIN
        return value if all(map(operator.is_, items, value)) else items
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return _plain(int(value))
    if isinstance(value, float):
        return _plain(float(value))
    return _NOT_PLAIN


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value``; raises :class:`InvalidArgs` for anything not JSON."""
    plain = _plain(value)
    if plain is not _NOT_PLAIN:
        try:
            return _stdlib_encode(plain).encode()
        except UnicodeEncodeError:
            pass  # a lone surrogate: refused below
    try:
        return rfc8785.dumps(value)
    except UnicodeEncodeError:  # a lone surrogate in a key (the package sorts keys by their UTF-16)
        raise InvalidArgs(f"{InvalidArgs.NOT_JSON}: {InvalidArgs.NOT_UNICODE}") from None
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

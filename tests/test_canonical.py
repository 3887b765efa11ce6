"""Canonical bytes are RFC 8785's, byte for byte, whichever encoder made them
(ledgerdash/ledger/canonical.py): an argument hash or an event's content
hash computed by anyone with a JCS library must match the ledger's."""

from __future__ import annotations

import enum
from typing import Any

import pytest
import rfc8785
from django.utils.datastructures import MultiValueDict
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ledgerdash.ledger import canonical
from ledgerdash.ledger.canonical import canonical_bytes
from ledgerdash.ledger.errors import InvalidArgs

SAFE = 2**53 - 1


class Kind(enum.StrEnum):
    SENT = "sent"


class Level(enum.IntEnum):
    HIGH = 3


#: Keys and strings that stress both encoders: escapes, controls, DEL, line
#: separators, characters on both sides of the surrogate block and beyond
#: the BMP (where UTF-16 order and code point order part ways).
CHARS = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(['"', "\\", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "\u2028", "\ud7ff", "\ue000"]),
    st.sampled_from(["\uffff", "\U00010000", "\U0001f600", "é", "a", "A", "_"]),
)
TEXT = st.text(CHARS, max_size=8)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-SAFE, max_value=SAFE),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
    st.sampled_from([Kind.SENT, Level.HIGH]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(TEXT | st.just(Kind.SENT), inner, max_size=5)
    ),
    max_leaves=30,
)


def rfc8785_or_error(value: Any) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):
        return InvalidArgs


def ours_or_error(value: Any) -> bytes | type[Exception]:
    try:
        return canonical_bytes(value)
    except InvalidArgs:  # a lone surrogate too: the ledger names it where rfc8785 lets Python's error through
        return InvalidArgs


@settings(max_examples=1500, deadline=None)
@given(JSON)
@example({"\U0001f600": 1, "\uffff": 2})  # code point order puts the emoji last, UTF-16 first
@example({"a": [1, 2.0, 1e21, -0.0, 5e-7]})
@example({"n": 2**53})
@example({"k": "\ud800"})
@example({"\ud800": 1})
@example([60.0, -0.0, 1e15, 2.0**53, -(2.0**53), 2.0**53 + 2, 2.0**60, 0.5])
def test_canonical_bytes_are_rfc8785s(value: Any) -> None:
    assert ours_or_error(value) == rfc8785_or_error(value)


class Counted(int):
    def __int__(self) -> int:
        return 5


class Halved(float):
    def __float__(self) -> float:
        return 0.5


@pytest.mark.parametrize(
    "value",
    [
        {"kind": Kind.SENT, "level": Level.HIGH},
        {Kind.SENT: 1, "a": 2},
        {"q": MultiValueDict({"a": ["1", "2"]})},
        {"n": [Counted(3), Halved(3.0)]},
        ("a", ["b", ("c",)]),
        {"t": (1, 2)},
        {"when": 1.5},
        {},
        [],
        "",
    ],
)
def test_subclasses_tuples_and_floats_encode_as_rfc8785_does(value: Any) -> None:
    """A dict subclass that reads its items its own way, numbers that convert
    to other numbers: the bytes are still the package's."""
    assert canonical_bytes(value) == rfc8785.dumps(value)


@pytest.mark.parametrize(
    "value", [{"x": object()}, {1: "a"}, {"x": float("nan")}, {"x": 2**60}, {"x": {1, 2}}, {"\ud800": 1}, ["\udfff"]]
)
def test_what_is_not_json_is_refused_as_before(value: Any) -> None:
    with pytest.raises(InvalidArgs):
        canonical_bytes(value)


def test_plain_values_take_the_standard_librarys_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast encoder is the one used for plain values (this test fails if
    every value went through the rfc8785 package)."""

    def refuse(value: Any) -> bytes:
        raise AssertionError("rfc8785 was asked to encode a plain value")

    monkeypatch.setattr(canonical.rfc8785, "dumps", refuse)
    assert canonical_bytes({"b": [1, None, True], "a": "é\n"}) == b'{"a":"\xc3\xa9\\n","b":[1,null,true]}'
    assert (
        canonical_bytes({"kind": Kind.SENT, "level": Level.HIGH, "t": ("x",)}) == b'{"kind":"sent","level":3,"t":["x"]}'
    )
    assert (
        canonical_bytes({"lease_seconds": 60.0, "n": [-0.0, 1e15]}) == b'{"lease_seconds":60,"n":[0,1000000000000000]}'
    )

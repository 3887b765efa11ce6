"""What an idempotency key may be: one rule for the ledger, its HTTP API and the Python client.

A key names one logical side effect, and two keys are the same key only if
their code points are equal. Keys that *look* equal to a person but are not
equal as strings would each record an attempt of their own, so a retry that
arrives with another spelling of the key would send the effect twice. The
rule refuses such keys rather than rewriting them: a key the ledger silently
changed would no longer be the key the agent sends to its provider, and an
agent told *why* its key was refused fixes the template that built it.

Refused:

- control characters (Cc), format characters (Cf: bidi controls such as
  U+202E, zero-width spaces and joiners, the byte-order mark, soft hyphens),
  line and paragraph separators (Zl, Zp), surrogates (Cs), and every other
  *default-ignorable* code point (variation selectors, Hangul fillers, …):
  they are invisible, or reorder what is shown, so two keys that read alike
  can differ;
- unassigned code points (Cn): their normalization is not fixed yet, so a
  key that is normal today might not be under a later Unicode version;
- any key that is not in NFKC form. NFKC is NFC (canonical composition:
  "é" as one code point, not "e" plus a combining accent) plus the
  compatibility mappings: fullwidth and halfwidth forms (U+FF49 for "i"),
  ligatures (U+FB01 for "fi"), super- and subscripts, non-breaking and other wide
  spaces. A compatibility character is a look-alike of its NFKC form, which
  is what an identifier should use; the IETF's PRECIS IdentifierClass
  (RFC 8264) disallows them for the same reason, and Python normalizes its
  own identifiers with NFKC (PEP 3131). Keys are built by programs from
  templates, so refusing them costs nothing a legitimate key needs.

This module needs only the standard library: :mod:`ledgerdash_client` runs
the same check in an agent's process before anything is sent.
"""

from __future__ import annotations

import unicodedata

MAX_KEY = 255

#: Categories refused anywhere in a key (see the module's docstring).
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"})

#: Default-ignorable code points outside those categories (Unicode's
#: DerivedCoreProperties.txt, Default_Ignorable_Code_Point): invisible when
#: shown, so a key containing one reads exactly like the key without it.
DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)

EMPTY = "idempotency key must not be empty"
TOO_LONG = "idempotency key is {length} characters; the limit is {limit}"
INVISIBLE = (
    "idempotency key contains {codepoint} {name} at position {position}: control, format, bidi, "
    "invisible and unassigned characters are refused, since keys that look equal must be equal"
)
NOT_NFC = (
    "idempotency key is not in Unicode NFC form (character {position} is {codepoint} {name}): "
    "send the composed form, {suggestion!r}"
)
NOT_NFKC = (
    "idempotency key contains the compatibility character {codepoint} {name} at position {position}, "
    "a look-alike of {replacement!r}: send the key in NFKC form, {suggestion!r}"
)
NOT_NFKC_WHOLE = "idempotency key is not in NFKC form: send {suggestion!r}"


def _ignorable(code: int) -> bool:
    return any(low <= code <= high for low, high in DEFAULT_IGNORABLE)


def _describe(char: str) -> tuple[str, str]:
    return f"U+{ord(char):04X}", unicodedata.name(char, "(unnamed)")


def key_problem(key: object) -> str | None:
    """Why ``key`` is not an acceptable idempotency key, or None if it is."""
    if not isinstance(key, str) or not key.strip():
        return EMPTY
    if len(key) > MAX_KEY:
        return TOO_LONG.format(length=len(key), limit=MAX_KEY)
    if key.isascii() and key.isprintable():
        # Letters, digits, punctuation, symbols and the space: no refused
        # category, nothing default-ignorable, and already NFC and NFKC. Most
        # keys are such, and the checks below cost some 15 us a key.
        return None
    return unicode_problem(key)


def unicode_problem(key: str) -> str | None:
    """:func:`key_problem`'s checks of each character and of the key's normal forms."""
    for position, char in enumerate(key):
        if unicodedata.category(char) in REFUSED_CATEGORIES or _ignorable(ord(char)):
            codepoint, name = _describe(char)
            return INVISIBLE.format(codepoint=codepoint, name=name, position=position)
    if not unicodedata.is_normalized("NFC", key):
        suggestion = unicodedata.normalize("NFC", key)
        position = next((i for i, (a, b) in enumerate(zip(key, suggestion, strict=False)) if a != b), 0)
        codepoint, name = _describe(key[position])
        return NOT_NFC.format(codepoint=codepoint, name=name, position=position, suggestion=suggestion)
    if not unicodedata.is_normalized("NFKC", key):
        for position, char in enumerate(key):
            replacement = unicodedata.normalize("NFKC", char)
            if replacement != char:
                codepoint, name = _describe(char)
                return NOT_NFKC.format(
                    codepoint=codepoint,
                    name=name,
                    position=position,
                    replacement=replacement,
                    suggestion=unicodedata.normalize("NFKC", key),
                )
        # Every character is its own NFKC form, yet the whole is not: only
        # composition across characters can do that, which NFC already did.
        return NOT_NFKC_WHOLE.format(suggestion=unicodedata.normalize("NFKC", key))
    return None

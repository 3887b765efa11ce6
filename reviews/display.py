"""Showing untrusted text to people: isolated, visible, and of bounded size.

Keys, task ids, tool names, arguments, reasons, comments, request ids,
evidence and usernames come from agents, providers and people. Shown as
they are, a right-to-left override (U+202E) in a key reverses the rest of
its line, zero-width characters make two different keys look the same, and
a long string without spaces widens a page to tens of thousands of pixels.
So every such string goes through :func:`untrusted`:

- escaped first, then marked up (the text itself is never marked safe);
- wrapped in ``<bdi>`` (direction isolated; the stylesheets also let it
  wrap anywhere);
- each invisible or control character (and each space that is not U+0020)
  replaced by a visible marker (``U+202E``) whose title names it, and the
  whole value titled with the list of them;
- optionally cut after ``limit`` characters, saying how much was left out.
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.utils import timezone
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.safestring import SafeString

#: Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties) outside the
#: categories :func:`is_hidden` marks anyway: fillers, joiners and selectors
#: that draw nothing.
_IGNORABLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2065, 0x2065),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xE0100, 0xE01EF),
)

#: Names Python's unicodedata does not give control characters.
_CONTROL_NAMES = {
    0x09: "CHARACTER TABULATION",
    0x0A: "LINE FEED",
    0x0B: "LINE TABULATION",
    0x0C: "FORM FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
    0x85: "NEXT LINE",
}

#: Printable ASCII (and the space) needs no look-up: only other characters
#: are candidates. In blocks (arguments, details) line feeds and tabs are layout.
_CANDIDATES_INLINE = re.compile(r"[^\x20-\x7e]")
_CANDIDATES_BLOCK = re.compile(r"[^\x20-\x7e\n\t]")

#: How many distinct hidden characters a title lists before "and N more".
_TITLE_LIST = 8


@lru_cache(maxsize=4096)
def is_hidden(char: str) -> bool:
    """Whether ``char`` draws nothing (or looks like something it is not):
    control and format characters (bidi controls, zero-width spaces and
    joiners, the BOM), line and paragraph separators, spaces other than
    U+0020, lone surrogates, and the other default-ignorable code points."""
    category = unicodedata.category(char)
    if category in ("Cc", "Cf", "Zl", "Zp", "Cs"):
        return True
    if category == "Zs":
        return char != " "
    point = ord(char)
    return any(low <= point <= high for low, high in _IGNORABLE_RANGES)


def code_point(char: str) -> str:
    return f"U+{ord(char):04X}"


def describe(char: str) -> str:
    """``U+202E RIGHT-TO-LEFT OVERRIDE``."""
    point = ord(char)
    if unicodedata.category(char) == "Cs":
        name = "SURROGATE"
    else:
        name = unicodedata.name(char, "") or _CONTROL_NAMES.get(point, "CONTROL CHARACTER")
    return f"{code_point(char)} {name}"


@dataclass
class _Scan:
    """``text`` split into plain runs and hidden characters."""

    parts: list[tuple[bool, str]] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # distinct, in order of appearance


def _scan(text: str, *, block: bool) -> _Scan:
    scan = _Scan()
    candidates = _CANDIDATES_BLOCK if block else _CANDIDATES_INLINE
    if candidates.search(text) is None:  # printable ASCII: the common case, nothing to look up
        if text:
            scan.parts.append((False, text))
        return scan
    seen: set[str] = set()
    start = 0
    for match in candidates.finditer(text):
        char = match.group()
        if not is_hidden(char):
            continue
        if match.start() > start:
            scan.parts.append((False, text[start : match.start()]))
        scan.parts.append((True, char))
        if char not in seen:
            seen.add(char)
            scan.hidden.append(char)
        start = match.end()
    if start < len(text):
        scan.parts.append((False, text[start:]))
    return scan


def _hidden_summary(hidden: list[str]) -> str:
    listed = "; ".join(describe(char) for char in hidden[:_TITLE_LIST])
    more = len(hidden) - _TITLE_LIST
    return f"hidden characters: {listed}" + (f"; and {more} more" if more > 0 else "")


def visible_text(value: Any) -> str:
    """Plain text with each hidden character written as ``[U+202E]``: for
    places that cannot hold markup (attributes, ``<title>``, ``<option>``).
    Still autoescaped by the template."""
    text = "" if value is None else str(value)
    scan = _scan(text, block=False)
    if not scan.hidden:
        return text
    return "".join(f"[{code_point(part)}]" if hidden else part for hidden, part in scan.parts)


def _escape(text: str) -> str:
    # The standard library's escape, which Django's escape() wraps; called
    # directly because a queue page shows hundreds of values and Django's
    # lazy-string wrapper made each call about twenty times slower.
    return html.escape(text, quote=True)


def _escaped(value: Any) -> str:
    """``value`` as ``conditional_escape`` gives it: markup as it is, anything else escaped."""
    if isinstance(value, Promise):
        value = str(value)
    if hasattr(value, "__html__"):
        return value.__html__()
    return _escape(str(value))


def format_markup(template: str, /, *args: Any, **kwargs: Any) -> SafeString:
    """``format_html``, value for value, without Django's lazy-string wrapper
    around each value's escaping (about half of a queue row's time; see
    ``_escape``). ``tests/test_queue_views.py`` holds the two equal on
    arbitrary values."""
    escaped = {name: _escaped(value) for name, value in kwargs.items()}
    return SafeString(template.format(*map(_escaped, args), **escaped))


def _markers(scan: _Scan) -> str:
    """The value's markup: plain runs escaped, each hidden character a marker."""
    return "".join(
        f'<span class="cp" title="{_escape(describe(part))}">{code_point(part)}</span>' if hidden else _escape(part)
        for hidden, part in scan.parts
    )


#: A run this long without whitespace may break anywhere; shorter words never
#: break mid-word (in a table, breaking anywhere lets a column shrink to one
#: letter: "send_e|mail").
_LONG_RUN = re.compile(r"\S{16}")
#: Values up to this long keep to one line in a table cell ("oncall-|a" helps
#: nobody); longer ones are marked "wraps". Short enough that a queue row of
#: such values in every column still fits a 1440 px window.
SHORT = 16


def untrusted(value: Any, limit: int | None = None, *, block: bool = False, whole_in_title: bool = True) -> SafeString:
    """``value`` as isolated, visible, escaped markup (see the module's doc).

    ``limit``: show at most that many characters and say how many more
    there are; the whole value (hidden characters written out) is the
    title unless ``whole_in_title`` is false. ``block``: line feeds and
    tabs are kept as layout (``<pre>``).

    Every character of ``value`` reaches the markup through ``_escape`` (or
    as a code point label); only this function's own tags are not escaped.
    ``tests/test_display.py`` checks that for arbitrary text.
    """
    text = "" if value is None else str(value)
    cut = 0
    if limit and len(text) > limit:
        cut = len(text) - limit
        shown = text[:limit]
    else:
        shown = text
    scan = _scan(shown, block=block)
    # The title lists the hidden characters of the whole value, cut or not.
    hidden = _scan(text, block=block).hidden if cut else scan.hidden
    titles = []
    if cut and whole_in_title:
        titles.append(visible_text(text))
    if hidden:
        titles.append(_hidden_summary(hidden))
    classes = "u"
    if len(shown) > SHORT or block:
        classes += " wraps"
    if _LONG_RUN.search(shown):
        classes += " long"
    if hidden:
        classes += " hidden-chars"
    title = f' title="{_escape(chr(10).join(titles))}"' if titles else ""
    markup = f'<bdi class="{classes}"{title}>{_markers(scan)}</bdi>'
    if cut:
        markup += f'<span class="cut">… ({cut:,} more character{"s" if cut != 1 else ""})</span>'
    return SafeString(markup)


def expandable(value: Any, limit: int, *, block: bool = False) -> SafeString:
    """``value`` cut after ``limit`` characters, with the whole of it one
    click away (``<details>``): for long reasons and notes on a page."""
    text = "" if value is None else str(value)
    if len(text) <= limit:
        return untrusted(text, block=block)
    return format_html(
        '<span class="expandable">{}<details class="whole"><summary>show all {} characters</summary>{}</details>'
        "</span>",
        untrusted(text, limit, block=block, whole_in_title=False),
        f"{len(text):,}",
        untrusted(text, block=block),
    )


def shortened(value: Any, limit: int) -> tuple[Any, int]:
    """``value`` (JSON data) with every string longer than ``limit`` cut to
    ``limit`` characters and an ellipsis; and how many strings were cut.
    Object keys are cut too (they are attacker-controlled strings as well)."""
    count = 0

    def cut(item: Any) -> Any:
        nonlocal count
        if isinstance(item, str):
            if len(item) > limit:
                count += 1
                return item[:limit] + "…"
            return item
        if isinstance(item, dict):
            result: dict[str, Any] = {}
            for key, inner in item.items():
                short = cut(key)
                while short in result:  # two long keys with the same start stay two
                    short += "…"
                result[short] = cut(inner)
            return result
        if isinstance(item, list):
            return [cut(inner) for inner in item]
        return item

    return cut(value), count


def compact_json(value: Any) -> str:
    """One-line JSON with sorted keys: dense enough for a printed report."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def age(value: datetime | None, now: datetime | None = None) -> str:
    """A compact age: 45s, 12m, 3h, 4d."""
    if value is None:
        return ""
    seconds = max(0, int(((now or timezone.now()) - value).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"

"""Untrusted text as pages show it: escaped, isolated, hidden characters
made visible, long values cut with the rest on demand (reviews/display.py)."""

from __future__ import annotations

import html
import re

import pytest
from django.template import Context, Template
from django.utils.safestring import SafeString
from hypothesis import given, settings
from hypothesis import strategies as st

from reviews.display import describe, expandable, is_hidden, shortened, untrusted, visible_text

RLO = "\u202e"
ZWSP = "\u200b"


def render(source: str, **context: object) -> str:
    return Template("{% load reviews_tags %}" + source).render(Context(context))


def test_it_escapes_before_it_marks() -> None:
    html = untrusted('<img src=x onerror="alert(1)">&amp;')
    assert isinstance(html, SafeString)
    assert html == '<bdi class="u wraps long">&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;</bdi>'


def test_a_bidi_override_becomes_a_named_marker_inside_an_isolate() -> None:
    html = untrusted(f"invoice{RLO}dnes:7")
    assert RLO not in html
    assert html.startswith('<bdi class="u hidden-chars" title="hidden characters: U+202E RIGHT-TO-LEFT OVERRIDE">')
    assert '<span class="cp" title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</span>' in html
    assert html.endswith("dnes:7</bdi>")


def test_two_keys_that_look_the_same_do_not_render_the_same() -> None:
    plain, sneaky = "invoice:8:send", f"invoice:{ZWSP}8:send"
    assert untrusted(plain) != untrusted(sneaky)
    assert "U+200B" in untrusted(sneaky)
    assert visible_text(sneaky) == "invoice:[U+200B]8:send"


@pytest.mark.parametrize(
    ("char", "name"),
    [
        ("\u200b", "U+200B ZERO WIDTH SPACE"),
        ("\u200d", "U+200D ZERO WIDTH JOINER"),
        ("\u2066", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("\u061c", "U+061C ARABIC LETTER MARK"),
        ("\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
        ("\u00ad", "U+00AD SOFT HYPHEN"),
        ("\u00a0", "U+00A0 NO-BREAK SPACE"),
        ("\u2028", "U+2028 LINE SEPARATOR"),
        ("\u3164", "U+3164 HANGUL FILLER"),
        ("\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
        ("\x1b", "U+001B ESCAPE"),
        ("\x07", "U+0007 CONTROL CHARACTER"),
        ("\x85", "U+0085 NEXT LINE"),
        ("\ud800", "U+D800 SURROGATE"),
    ],
)
def test_every_kind_of_invisible_character_is_marked_and_named(char: str, name: str) -> None:
    assert is_hidden(char)
    assert describe(char) == name
    html = untrusted(f"a{char}b")
    assert char not in html
    assert f">{name.split()[0]}</span>" in html


@pytest.mark.parametrize("text", ["plain ascii", "naïve café", "Ünïcödé", "מפתח-7", "مفتاح", "日本語キー", "emoji 🙂"])
def test_ordinary_text_of_any_script_is_left_alone(text: str) -> None:
    assert untrusted(text) == f'<bdi class="u">{text}</bdi>'


def test_line_breaks_are_layout_in_a_block_and_marked_on_a_line() -> None:
    assert untrusted("a\nb\tc", block=True) == '<bdi class="u wraps">a\nb\tc</bdi>'
    inline = untrusted("a\nb")
    assert "U+000A" in inline
    assert "\n" not in inline


def test_a_long_value_is_cut_with_the_rest_on_demand() -> None:
    task = "t" * 255
    html = untrusted(task, 64)
    shown = re.search(r'<bdi class="u wraps long" title="(t+)">(t+)</bdi>', html)
    assert shown is not None
    assert shown.group(1) == task  # the whole value, on hover
    assert shown.group(2) == "t" * 64
    assert html.endswith('<span class="cut">… (191 more characters)</span>')
    assert untrusted("t" * 64, 64) == f'<bdi class="u wraps long">{"t" * 64}</bdi>'


def test_a_cut_value_still_names_the_hidden_characters_past_the_cut() -> None:
    html = untrusted("a" * 10 + RLO, 5)
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in html  # in the title
    assert "aaaaaaaaaa[U+202E]" in html


def test_a_60000_character_string_renders_quickly_and_whole() -> None:
    html = untrusted("x" * 60_000, block=True)
    assert html.count("x") == 60_000


def test_shortened_cuts_long_strings_and_keys_in_json_data() -> None:
    data = {"body": "x" * 5000, "k" * 3000: [1, "short", "y" * 1001], "n": 7}
    cut, count = shortened(data, 1000)
    assert count == 3
    assert cut["body"] == "x" * 1000 + "…"
    assert cut["k" * 1000 + "…"] == [1, "short", "y" * 1000 + "…"]
    assert cut["n"] == 7


def test_the_filters_work_in_templates_and_never_trust_their_input() -> None:
    hostile = f"<script>x</script>{RLO}"
    page = render(
        "{{ v|untrusted }}|{{ v|untrusted:3 }}|{{ v|untrusted_block }}|<p title='{{ v|visible }}'>", v=hostile
    )
    assert "<script>" not in page
    assert RLO not in page
    assert "&lt;scr" in page
    assert "[U+202E]" in page


def test_a_limit_from_an_empty_variable_cuts_nothing() -> None:
    assert render("{{ v|untrusted:limit }}", v="abcdef", limit=None) == '<bdi class="u">abcdef</bdi>'
    assert "more character" in render("{{ v|untrusted:limit }}", v="abcdef", limit=2)


def test_shortened_keeps_two_long_keys_with_the_same_start_apart() -> None:
    cut, count = shortened({"a" * 50 + "1": 1, "a" * 50 + "2": 2}, 10)
    assert count == 2
    assert sorted(cut.values()) == [1, 2]


def test_only_a_long_run_without_spaces_may_break_anywhere() -> None:
    # In a table, a value that may break anywhere lets its column shrink to a
    # letter ("send_e|mail"); only runs of 16 or more characters need it.
    assert untrusted("send_email") == '<bdi class="u">send_email</bdi>'
    assert untrusted("a fifteen-letter word") == '<bdi class="u wraps">a fifteen-letter word</bdi>'
    assert untrusted("x" * 16).startswith('<bdi class="u long">')
    assert untrusted("a " + "x" * 16 + " b").startswith('<bdi class="u wraps long">')
    # Short values keep to one line in a table cell; longer ones may wrap.
    assert untrusted("oncall-a") == '<bdi class="u">oncall-a</bdi>'
    assert untrusted("sixteen char val") == '<bdi class="u">sixteen char val</bdi>'
    assert untrusted("seventeen chr val").startswith('<bdi class="u wraps">')


def test_an_expandable_value_shows_a_part_and_keeps_the_whole_one_click_away() -> None:
    assert expandable("short", 10) == '<bdi class="u">short</bdi>'
    html = expandable("E" * 3900, 300)
    assert html.startswith('<span class="expandable"><bdi class="u wraps long">' + "E" * 300 + "</bdi>")
    assert "… (3,600 more characters)" in html
    assert "<summary>show all 3,900 characters</summary>" in html
    assert html.count("E") == 4200  # the part, then the whole (not a third time in a title)


@given(st.text(max_size=80), st.one_of(st.none(), st.integers(min_value=1, max_value=40)), st.booleans())
@settings(max_examples=400, deadline=None)
def test_any_text_comes_out_escaped_and_whole(text: str, limit: int | None, block: bool) -> None:
    """Whatever the text, the only tags are the renderer's own, and the
    text read back (tags dropped, entities decoded, markers read as their
    code points) is what was shown of it."""
    markup = str(untrusted(text, limit, block=block))
    tags = re.findall(r"<[^>]*>", markup)
    assert all(re.fullmatch(r'</?(bdi|span)( class="[a-z -]+")?( title="[^"<>]*")?>', tag) for tag in tags), tags
    shown = text[:limit] if limit else text
    read_back = html.unescape(re.sub(r"<[^>]*>", "", re.sub(r'<span class="cut">.*?</span>$', "", markup)))
    expected = "".join(
        f"U+{ord(char):04X}" if is_hidden(char) and not (block and char in "\n\t") else char for char in shown
    )
    assert read_back == expected

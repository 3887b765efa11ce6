"""How much of a report a PDF shows, so that any valid attempt renders in bounded time.

WeasyPrint's time grows with the pages it lays out (0.2 to 0.5 s a page
on this project's shared 2-core machine, depending on its load) and with
the square of a run of text without break opportunities: a 32,000-character
string without spaces took 22 s alone, 60,000 would take minutes. What a
report holds is not bounded: arguments up to 64 KiB, reasons of 4,000
characters, any number of events, linked attempts and changed arguments.
So a PDF shows a bounded part of each, and says on its first page and at
each cut what it left out; the HTML report (which prints from the browser)
and the exports hold everything.

The bounds keep the worst case to about fifteen pages; ``tests/test_pdf_bounds.py``
renders one and counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reviews import diffs, display

#: Characters of a value in the facts (a key, a request id, one string argument).
VALUE_CHARS = 1000
#: Characters of one attempt's arguments as JSON, after cutting their strings;
#: an incident shares ARGS_TOTAL among the attempts it shows.
ARGS_CHARS = 6000
ARGS_TOTAL = 9000
#: Characters of a value inside a table row (a reason, an event's details, a changed argument).
ROW_CHARS = 160
#: Rows of each list: events, decisions, linked attempts.
ROWS = 20
#: Rows of a diff between a parent and its retry.
DIFF_ROWS = 10
#: Attempts of an incident whose facts and arguments are shown.
SUBJECTS = 3


@dataclass(frozen=True)
class Gap:
    """A run of items a PDF leaves out, between the ones it shows."""

    count: int
    #: The first and last left out, as people know them ("seq 41", "#17").
    first: str
    last: str
    gap: bool = True  # what templates test for


def pick[T](
    items: Sequence[T], limit: int, *, label: Callable[[T], str], keep: Callable[[T], bool] | None = None
) -> list[T | Gap]:
    """``items`` if there are at most ``limit``; else the first and last
    halves (and any item ``keep`` asks for) in order, each run left out
    replaced by a Gap."""
    if len(items) <= limit:
        return list(items)
    shown = set(range(limit // 2)) | set(range(len(items) - limit // 2, len(items)))
    if keep is not None:
        shown |= {i for i, item in enumerate(items) if keep(item)}
    picked: list[T | Gap] = []
    run: list[T] = []
    for i, item in enumerate(items):
        if i in shown:
            if run:
                picked.append(Gap(len(run), label(run[0]), label(run[-1])))
                run = []
            picked.append(item)
        else:
            run.append(item)
    if run:
        picked.append(Gap(len(run), label(run[0]), label(run[-1])))
    return picked


def args_json(args: Any) -> tuple[str, int]:
    """The arguments as JSON for a PDF, every string cut to VALUE_CHARS,
    and how many strings were cut."""
    shortened, cut = display.shortened(args, VALUE_CHARS)
    return diffs.as_json(shortened), cut


def bounded_diff(diff: diffs.Diff) -> diffs.Diff | dict[str, Any]:
    """A diff whose changes are at most DIFF_ROWS (with a Gap for the rest)."""
    if len(diff.changes) <= DIFF_ROWS:
        return diff
    return {
        "parent": diff.parent,
        "child": diff.child,
        "same": False,
        "changes": pick(diff.changes, DIFF_ROWS, label=lambda change: change.what[:60]),
    }


def args_chars(subjects: int) -> int:
    """Characters of arguments per attempt when a PDF shows ``subjects`` attempts."""
    return min(ARGS_CHARS, max(1500, ARGS_TOTAL // max(1, subjects)))


def context(*, pdf: bool, subjects: int = 1) -> dict[str, Any]:
    """What the report templates cut: in a PDF, these; on screen, nothing."""
    if not pdf:
        return {"cut": None, "row_cut": None, "args_cut_at": None}
    return {
        "cut": VALUE_CHARS,
        "row_cut": ROW_CHARS,
        "args_cut_at": args_chars(subjects),
        "pdf_value_chars": VALUE_CHARS,
        "pdf_row_chars": ROW_CHARS,
        "pdf_rows": ROWS,
        "pdf_subjects": SUBJECTS,
    }

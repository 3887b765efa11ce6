"""No module of the ledger or the dashboard grows past 600 lines without
saying why on its first line (``# Over 600 lines because: …``): a long
module is a decision, not an accident."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 600
REASON = "# Over 600 lines because: "


def _long_without_reason(roots: list[Path], base: Path = ROOT) -> list[str]:
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "migrations" in path.parts:
                continue
            lines = path.read_text().splitlines()
            if len(lines) > LIMIT and not (lines[0].startswith(REASON) and len(lines[0]) > len(REASON) + 10):
                found.append(f"{path.relative_to(base)}: {len(lines)} lines")
    return found


def test_every_long_module_says_why() -> None:
    assert _long_without_reason([ROOT / "ledgerdash", ROOT / "reviews"]) == []


def test_a_long_module_without_its_reason_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (package / "reasoned.py").write_text(REASON + "it is one table of many rows.\n" + "x = 1\n" * LIMIT)
    (package / "short.py").write_text("x = 1\n")
    assert _long_without_reason([package], tmp_path) == [f"pkg/long.py: {LIMIT + 1} lines"]

"""The simulation's seeds for the commit under test.

Besides the fixed seeds (those of the default run that reach every move,
and those that once found a hole),
``make test`` runs a block of seeds whose first seed comes from the commit
(``git rev-parse HEAD``), so each commit explores histories no commit before
it ran, and a failure replays by its seed alone::

    python -m tests.sim_seeds        # the first seed for this checkout, and where it comes from

Commits are spread over seeds 1,000,000 to 900,999,999, far from the fixed
ones. Outside a git checkout (an unpacked release), the block starts at the
fixed seed :data:`FALLBACK`, and says so.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where commits' blocks start, and how far they spread.
LOWEST = 1_000_000
SPREAD = 900_000_000
#: The first seed when there is no commit to derive one from.
FALLBACK = LOWEST
#: How many seeds of the block each pass runs (SQLite over two processes).
ON_SQLITE = 60
ON_POSTGRESQL = 10
#: Seeds of the default run (1 to 200) that together reach every legal move and inject every fault
#: kind the whole default run does: ``make test`` runs these rather than all 200 (``make simulate``
#: runs all of them). When the simulation changes, measure them again: ``python manage.py simulate
#: --jobs 2`` names them on its "seeds that together reach…" line.
COVERING = (8, 9, 23, 44, 47, 89, 104, 116, 158)


@dataclass(frozen=True)
class CommitSeeds:
    first: int
    #: where ``first`` comes from, to print beside it
    source: str

    def last(self, count: int) -> int:
        return self.first + count - 1

    def line(self) -> str:
        return (
            f"this commit's simulation seeds: {self.first} to {self.last(ON_SQLITE)} on SQLite, "
            f"{self.first} to {self.last(ON_POSTGRESQL)} on PostgreSQL ({self.source}); "
            "replay one: python manage.py simulate --seed N"
        )


def for_this_commit(root: Path = ROOT) -> CommitSeeds:
    """The first seed of the commit checked out at ``root``: 1,000,000 plus its hash's first 32 bits
    modulo 900,000,000, so neighbouring commits land far apart."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
    except OSError:  # no git here
        head = ""
    if not re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", head):
        return CommitSeeds(FALLBACK, f"not a git checkout: the fixed first seed {FALLBACK}")
    return CommitSeeds(LOWEST + int(head[:8], 16) % SPREAD, f"from commit {head[:12]}")


if __name__ == "__main__":
    print(for_this_commit().line())

"""What the crash drill runs: its cases, and the plans that pick them.

Each case runs for an idempotent and a non-idempotent tool; A, B and C also
for an idempotent tool that claims its dispatch with the intent (one commit
for both: ``Tool.claim_with_intent``), in process and over HTTP, whose
recovery after A's crash is a lookup, not the intent alone. The agent calls
the ledger in process, over the HTTP API with the Python client, or (A and
C) as an MCP client's ``tools/call`` through the MCP gateway, whose process
is the one killed and whose upstream is an MCP server in front of the
sandbox provider (``via``): the same crash points through other paths.

    A  kill after the intent commit, before dispatch
    B  kill after the request left, before its response was read
    C  kill after the provider responded, before the outcome commit
    D  the same task delivered to two workers at once
    E  the authority changes while the attempt is UNKNOWN
    F  the provider's lookup times out
    G  the call runs inside a caller's transaction that rolls back
    H  the request is still on its way when recovery looks: the agent's
       connection is cut, the provider acts later; a reworded re-run, a
       retry request and an approval are tried meanwhile
    I  an operator marks the original failed without the provider's word,
       then a retry's approval is tried
    J  the policy changes between the intent and the dispatch
    K  a reconciler is killed (SIGKILL) in the middle of a batch; another
       finishes the work
    L  a reconciler's database connection is cut in the middle of a pass;
       it recovers by itself
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass

from ledgerdash_client import crashpoints

IDEMPOTENT_TOOL = "drill.send_email"
NON_IDEMPOTENT_TOOL = "drill.charge_card"
#: idempotent, and its dispatch is claimed in the commit that records the intent
CLAIMED_TOOL = "drill.send_email_claimed"
PROCESS = "process"
HTTP = "http"
#: through the MCP gateway: the agent's process is the gateway, its tool an upstream MCP server
MCP = "mcp"
BASE_SCOPES = ["drill:send", "drill:notify"]
#: What E and J narrow a tool's scopes to, while an attempt of it is in flight.
NARROWED_SCOPES = ["drill:send"]
#: The drill tenant's policy between cases: every tool, the base scopes.
BASELINE_TOOLS = {tool: BASE_SCOPES for tool in (IDEMPOTENT_TOOL, NON_IDEMPOTENT_TOOL, CLAIMED_TOOL)}


@dataclass(frozen=True)
class Case:
    letter: str
    title: str
    crash_at: str | None
    #: the ways an agent can reach the ledger that this case is run over
    vias: tuple[str, ...] = (PROCESS,)
    #: how many side effects (keys) the case's task makes
    keys: int = 1
    #: whether it also runs for :data:`CLAIMED_TOOL` (not through the MCP gateway, which claims apart)
    claims: bool = False


CASES = {
    case.letter: case
    for case in (
        Case(
            "A",
            "kill after the intent commit, before dispatch",
            crashpoints.AFTER_INTENT,
            (PROCESS, HTTP, MCP),
            claims=True,
        ),
        Case(
            "B",
            "kill after the request left, before its response was read",
            crashpoints.AFTER_SEND,
            (PROCESS, HTTP),
            claims=True,
        ),
        Case(
            "C",
            "kill after the provider responded, before the outcome commit",
            crashpoints.AFTER_RESPONSE,
            (PROCESS, HTTP, MCP),
            claims=True,
        ),
        Case("D", "the same task delivered to two workers at once", None, (PROCESS, HTTP)),
        Case("E", "the authority changes while the attempt is UNKNOWN", crashpoints.BEFORE_SEND),
        Case("F", "the provider's lookup times out", crashpoints.AFTER_SEND),
        Case("G", "the call runs inside a caller's transaction that rolls back", None),
        Case(
            "H",
            "the request is still on its way when recovery looks; a reworded re-run, a retry request and an "
            "approval are tried before it lands",
            None,
        ),
        Case(
            "I",
            "an operator marks the original failed without the provider's word; an approval is tried",
            crashpoints.AFTER_SEND,
        ),
        Case("J", "the policy changes between the intent and the dispatch", crashpoints.AFTER_INTENT),
        Case("K", "a reconciler is killed in the middle of a batch; another finishes", crashpoints.AFTER_SEND, keys=3),
        Case("L", "a reconciler's database connection is cut mid-pass; it recovers", crashpoints.AFTER_SEND, keys=3),
    )
}


@dataclass(frozen=True)
class Planned:
    """One case to run: which, for which kind of tool, with which crash point, over which way in."""

    letter: str
    idempotent: bool
    crash_at: str | None
    via: str = PROCESS
    #: the tool claims its dispatch with the intent (:data:`CLAIMED_TOOL`; idempotent)
    claimed: bool = False

    def __post_init__(self) -> None:
        if self.claimed and (not self.idempotent or self.via == MCP or not CASES[self.letter].claims):
            raise ValueError(f"case {self.letter} over {self.via} does not run for a tool that claims with the intent")

    @property
    def tool(self) -> str:
        if self.claimed:
            return CLAIMED_TOOL
        return IDEMPOTENT_TOOL if self.idempotent else NON_IDEMPOTENT_TOOL

    @property
    def label(self) -> str:
        kind = "claimed" if self.claimed else "idempotent" if self.idempotent else "non-idempotent"
        return f"{self.letter}-{kind}" if self.via == PROCESS else f"{self.letter}-{self.via}-{kind}"


def ways_in() -> tuple[str, ...]:
    """The ways in this installation can drill: MCP needs the ``mcp`` extra
    (``pip install 'ledgerdash[mcp]'``)."""
    return (PROCESS, HTTP, MCP) if importlib.util.find_spec("mcp") is not None else (PROCESS, HTTP)


def _kinds(case: Case, via: str, deduplicates: bool | None = None) -> list[tuple[bool, bool]]:
    """The kinds of tool ``case`` runs for over ``via``: (idempotent, claimed).
    ``deduplicates``: against a provider, only the kinds it can be (None: the
    sandbox, which can be either)."""
    kinds = [(True, False), (False, False)] + ([(True, True)] if case.claims and via != MCP else [])
    return [kind for kind in kinds if deduplicates is None or kind[0] == deduplicates]


def fixed_plan(*, deduplicates: bool | None = None) -> list[Planned]:
    """Every case, for every kind of tool it runs for, over every way in it
    runs over (against a provider: the kinds it can be)."""
    return [
        Planned(case.letter, idempotent, case.crash_at, via, claimed=claimed)
        for via in ways_in()
        for case in CASES.values()
        if via in case.vias
        for idempotent, claimed in _kinds(case, via, deduplicates)
    ]


def random_plan(iterations: int, seed: int, *, deduplicates: bool | None = None) -> list[Planned]:
    """``iterations`` cases picked from ``seed``: the same seed, the same plan."""
    rng = random.Random(seed)  # noqa: S311 - reproducible choice of cases, not security
    plan = []
    for _ in range(iterations):
        case = CASES[rng.choice(sorted(CASES))]
        via = rng.choice([v for v in case.vias if v in ways_in()])
        idempotent, claimed = rng.choice(_kinds(case, via, deduplicates))
        crash_at = case.crash_at
        if case.letter in ("E", "F"):
            # Whether the request reached the provider before the crash.
            crash_at = rng.choice((crashpoints.BEFORE_SEND, crashpoints.AFTER_SEND))
        plan.append(Planned(case.letter, idempotent, crash_at, via, claimed=claimed))
    return plan

"""What a simulated run starts from: the world every run shares (built once
into the template database) and what each seed draws for itself.

One tenant, ``sim``, with operators and approvers, and one tool per kind
of provider the ledger must recover against:

=============  ==============================================================
``sim.email``  idempotent, keeps keys an hour, claims its dispatch with the intent
``sim.charge`` not idempotent (every request acts)
``sim.ticket`` idempotent, keeps keys for ever, its lookup often unavailable, declines some
``sim.deploy`` not idempotent, acts late in its window, its lookup slow, declines some
``sim.sms``    idempotent, keeps keys two minutes, refuses before acting or for good
``sim.task``   not idempotent, an upstream behind the MCP gateway: it works as
               long as its caller waits
=============  ==============================================================

and one tool per provider preset (``sim.stripe``, ``sim.slack``,
``sim.github``, ``sim.postmark``, ``sim.twilio``, ``sim.jira``), modelled
on what the preset states of its provider: whether it deduplicates and for
how long, that it refuses a caller that comes too often (a 429), how far
its lookup lags (each effect shows up to the preset's
documented lag after it happened, and the tool's lookup lag is that), and
what the lookup finds a call by (Twilio's by its content, where two alike
are ambiguous), and what the provider's unkind modes do to an effect after
it was made (``AFTERWARDS``): changed so the lookup cannot match it (then
it is ambiguous for every lookup of its window) or taken out of its reach
(not evidence), each the call's when read by the id the ledger recorded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection

from ledgerdash.ledger import clock
from ledgerdash.ledger.events import Actor as LedgerActor
from ledgerdash.ledger.models import Membership, OnCallShift, Role, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.providers.presets import PRESETS, PresetAdapter
from ledgerdash.ledger.simulation.provider import NETWORK, Traits
from ledgerdash.ledger.simulation.world import EPOCH, World

TENANT = "sim"
ADAPTER = "ledgerdash.ledger.simulation.provider.SimulatedAdapter"

PROVIDERS: dict[str, Traits] = {
    "sim.email": Traits(idempotent=True, retention=3600, processing=2.0),
    "sim.charge": Traits(idempotent=False, retention=None, processing=3.0),
    "sim.ticket": Traits(idempotent=True, retention=None, processing=2.0, lookup="flaky", declines=0.2),
    "sim.deploy": Traits(idempotent=False, retention=None, processing=8.0, acts_late=True, lookup="slow", declines=0.2),
    "sim.sms": Traits(idempotent=True, retention=120, processing=1.0, refuses=0.3, declines=0.2),
    "sim.task": Traits(idempotent=False, retention=None, processing=2.0, works_while_caller_waits=True),
}

#: The simulated tool of each provider preset, and the preset it is modelled on.
PRESET_TOOLS = {
    "sim.stripe": "stripe.payment_intent",
    "sim.slack": "slack.post_message",
    "sim.github": "github.issue",
    "sim.postmark": "postmark.email",
    "sim.twilio": "twilio.message",
    "sim.jira": "jira.issue",
}


#: What the replicas' modes do to a preset's effects after they were made (docs/providers.md), as
#: chances for each effect: changed so the lookup cannot match it, and taken out of its reach.
AFTERWARDS: dict[str, tuple[float, float]] = {
    # metadata edited or deleted; the message deleted
    "slack.post_message": (0.1, 0.1),
    # the marker edited out; transferred out of reach or deleted
    "github.issue": (0.1, 0.1),
    # the body redacted or rewritten by Smart Encoding, the number masked
    "twilio.message": (0.15, 0.0),
    # the issue property deleted (a label removed without a recorded id is outside the promise)
    "jira.issue": (0.1, 0.0),
}


def _modelled_on(preset: type[PresetAdapter]) -> Traits:
    changes, vanishes = AFTERWARDS.get(preset.name, (0.0, 0.0))
    return Traits(
        idempotent=preset.deduplicates,
        retention=preset.retention_seconds,
        processing=1.0,
        # Every one of them answers 429 to a caller that comes too often: nothing done, come back later.
        refuses=0.1,
        lookup_lag=preset.documented_lag_seconds,
        lookup_by="content" if preset.name == "twilio.message" else "key",
        changes=changes,
        vanishes=vanishes,
    )


PROVIDERS.update({name: _modelled_on(PRESETS[preset]) for name, preset in PRESET_TOOLS.items()})

SCOPES: dict[str, list[str]] = {
    "sim.email": ["email:send"],
    "sim.charge": ["payments:charge", "payments:refund"],
    "sim.ticket": ["tickets:write"],
    "sim.deploy": ["deploy:prod", "deploy:staging"],
    "sim.sms": ["sms:send"],
    "sim.task": [],
    **{name: [] for name in PRESET_TOOLS},
}

#: Operators and approvers of the tenant (the first owns stuck work by default).
OPERATORS = ("owner", "ops-1", "ops-2")
APPROVERS = ("approver-1", "approver-2")


#: On PostgreSQL, the events of a run go to partitions this small (a run writes a few hundred
#: events), from this id on: the archiver has partitions to take while attempts still move.
ARCHIVE_PARTITION_SIZE = 16
ARCHIVE_FROM_ID = 10_000_000


def build_world() -> None:
    """The rows every run starts from, written once into the template, at
    one fixed instant (so the template is the same in every process)."""
    with clock.driven_by(lambda: EPOCH - timedelta(days=1), random.Random(0)):  # noqa: S311 - no secret
        _build_world()
    if connection.vendor == "postgresql":
        _small_partitions()


def _small_partitions() -> None:
    """The world's own events keep the first partition; a run's go to small ones."""
    from ledgerdash.ledger import partitions

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT setval('{partitions.SEQUENCE}', %s, false)", [ARCHIVE_FROM_ID])
    partitions.make_ahead(ahead=2, size=ARCHIVE_PARTITION_SIZE)


def _build_world() -> None:
    users = get_user_model()
    people = {name: users.objects.create_user(username=name, password=None) for name in (*OPERATORS, *APPROVERS)}
    tenant = Tenant.objects.create(slug=TENANT, name="Simulation", default_owner=people["owner"], chain_stripes=2)
    for name in OPERATORS:
        Membership.objects.create(user=people[name], tenant=tenant, role=Role.OPERATOR)
    for name in APPROVERS:
        Membership.objects.create(user=people[name], tenant=tenant, role=Role.APPROVER)
    OnCallShift.objects.create(
        tenant=tenant, user=people["ops-1"], starts_at=EPOCH + timedelta(hours=1), ends_at=EPOCH + timedelta(hours=3)
    )
    for name, traits in PROVIDERS.items():
        Tool.objects.create(
            name=name,
            adapter=Tool.Adapter.PYTHON,
            config={"class": ADAPTER, "provider": name},
            idempotent=traits.idempotent,
            key_retention_seconds=int(traits.retention) if traits.retention else None,
            max_request_seconds=_least_request_time(traits),
            dispatch_lease_seconds=_least_request_time(traits) + 10,
            lookup_lag_seconds=traits.lookup_lag or None,
        )
    policy_publish(tenant=tenant, tools=SCOPES, actor=LedgerActor.system("simulation"), note="every tool")


def _least_request_time(traits: Traits) -> float:
    """The shortest maximum request time that is true of a provider: its
    processing and the network both ways (for one that works while its
    caller waits, the caller's wait bounds it: any time will do)."""
    return round(traits.processing + 2 * NETWORK + 0.01, 2)


@dataclass(frozen=True)
class ToolTiming:
    max_request: float
    lease: float
    max_checks: int
    max_dispatches: int
    backoff: float
    claim_with_intent: bool
    #: The timeout the agent's dispatcher is configured with (None: the tool's maximum request time).
    configured_timeout: float | None


@dataclass(frozen=True)
class Call:
    tool: str
    ref: str
    amount: int
    #: Made under another key than its twin's with the same arguments (``ALIKE_KEY``): two side
    #: effects the provider cannot tell apart by content.
    alike: bool = False


#: The key of a call made under another key than ``{tool}:{ref}`` with the same arguments.
ALIKE_KEY = "{tool}:{ref}:alike"


@dataclass(frozen=True)
class Task:
    task_id: str
    calls: tuple[Call, ...]


@dataclass
class Plan:
    """What one seed drew: tool timings, the agents' tasks, how many of each actor."""

    timings: dict[str, ToolTiming]
    agents: list[list[Task]]
    reconcilers: int
    #: Arguments the agents' keys collide on, so tasks re-run each other's calls.
    refs: list[str] = field(default_factory=list)


def draw_timing(world: World, name: str, traits: Traits) -> ToolTiming:
    rng = world.rng
    least = _least_request_time(traits)
    max_request = round(least * rng.choice([1.0, 1.0, 1.5, 3.0]), 2)
    return ToolTiming(
        max_request=max_request,
        lease=round(max_request + rng.choice([0.5, 2.0, 10.0, 30.0]), 2),
        max_checks=rng.choice([2, 4, 8]),
        max_dispatches=rng.choice([1, 2, 3]),
        backoff=rng.choice([1.0, 5.0, 20.0]),
        claim_with_intent=traits.idempotent and traits.lookup == "by_key" and rng.random() < 0.5,
        configured_timeout=rng.choice([None, None, 5.0, 60.0]),
    )


def draw_plan(world: World) -> Plan:
    rng = world.rng
    timings = {name: draw_timing(world, name, traits) for name, traits in PROVIDERS.items()}
    refs = [f"r{n}" for n in range(rng.randint(3, 8))]
    # A seed's agents call the kinds of provider (two seeds in three) or the
    # presets' providers (one in three): each seed's calls meet few enough
    # tools for their faults to meet each other.
    presets = rng.random() < 1 / 3
    tools = sorted(name for name in PROVIDERS if (name in PRESET_TOOLS) == presets)
    # Alike calls under other keys matter where a provider is searched by content: most go there.
    by_content = [name for name in tools if PROVIDERS[name].lookup_by == "content"]
    agents: list[list[Task]] = []
    for a in range(rng.randint(2, 4)):
        tasks = []
        for t in range(rng.randint(1, 4)):
            calls = []
            for _ in range(rng.randint(1, 3)):
                tool, alike = rng.choice(tools), rng.random() < 0.3
                if alike and by_content and rng.random() < 0.5:
                    tool = rng.choice(by_content)
                calls.append(Call(tool=tool, ref=rng.choice(refs), amount=rng.choice([100, 4200, 90000]), alike=alike))
            tasks.append(Task(task_id=f"agent{a}-task{t}", calls=tuple(calls)))
        agents.append(tasks)
    # Each alike call has a twin elsewhere, the same arguments under the usual key: two side effects a
    # provider searched by content cannot tell apart.
    for a, tasks in enumerate(agents):
        for call in [c for task in tasks for c in task.calls if c.alike]:
            other = rng.choice([n for n in range(len(agents)) if n != a])
            twin = Task(task_id=f"agent{other}-twin{len(agents[other])}", calls=(replace(call, alike=False),))
            agents[other].insert(rng.randint(0, len(agents[other])), twin)
    return Plan(timings=timings, agents=agents, reconcilers=rng.randint(1, 3), refs=refs)


def apply_timings(plan: Plan) -> None:
    """Give each tool the timing this seed drew (a configuration change, recorded as such)."""
    for name, timing in sorted(plan.timings.items()):
        Tool.objects.filter(name=name).update(
            max_request_seconds=timing.max_request,
            dispatch_lease_seconds=timing.lease,
            max_checks=timing.max_checks,
            max_dispatches=timing.max_dispatches,
            backoff_base_seconds=timing.backoff,
            claim_with_intent=timing.claim_with_intent,
        )


def arguments(call: Call) -> dict[str, Any]:
    return {"ref": call.ref, "amount_cents": call.amount, "tool": call.tool}

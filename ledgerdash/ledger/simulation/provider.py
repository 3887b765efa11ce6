"""Simulated providers, the network to them, and the adapter the ledger's
``Tool`` rows name to reach them.

A provider records every request it receives and every effect it performs,
with the virtual time of each: that record is the ground truth the
invariants are held against. Its behaviour follows the ledger's
assumptions (``docs/protocol.md``): a request reaches it a moment after it
left (``NETWORK`` at most), and it acts on it within its processing time
of receiving it, or never; an idempotent provider performs one effect per
key while it keeps the key. What varies is how: some refuse (before acting,
or for good), some act late in their window, some answer lookups slowly or
not at all, some keep working as long as their caller waits (an upstream
behind the MCP gateway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ledgerdash.ledger import clock
from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import NothingHappened, PermanentFailure
from ledgerdash.ledger.providers.base import Dispatched, Lookup, LookupStatus, ProviderAdapter, Sought
from ledgerdash.ledger.simulation.world import Actor, World

#: The longest one way over the network takes, in seconds.
NETWORK = 0.05


@dataclass(frozen=True)
class Traits:
    """How one simulated provider behaves."""

    idempotent: bool
    #: Seconds an idempotent provider keeps a key (None: for ever).
    retention: float | None
    #: The longest it takes to act after receiving a request.
    processing: float
    #: Acts late in its window (the last fifth), not anywhere in it.
    acts_late: bool = False
    #: Keeps working on a request as long as its caller waits on it.
    works_while_caller_waits: bool = False
    #: Chance a request is refused before anything is done (a 429: retryable).
    refuses: float = 0.0
    #: Chance a request is refused for good (a decline).
    declines: float = 0.0
    #: Lookups: "by_key" (answers at once), "slow" (takes up to 20 s), "flaky" (often unavailable).
    lookup: str = "by_key"
    #: The most its lookup lags behind what it did (a search index): each
    #: effect shows up to this long after it happened.
    lookup_lag: float = 0.0
    #: What the lookup finds a call by: "key" (a key or a correlation field the
    #: call carries) or "content" (its arguments, within a window: two alike are ambiguous).
    lookup_by: str = "key"
    #: Chance an effect is changed within a minute of being made so that its lookup can no longer
    #: match it (a marker, label or metadata edited out, a body redacted or rewritten): found by
    #: the provider's id the ledger recorded, it is the call's; otherwise it clouds every lookup
    #: of its window (ambiguous), as the presets answer.
    changes: float = 0.0
    #: Chance an effect is taken out of the lookup's reach within a minute (deleted, moved where
    #: the credential cannot read) leaving a trace the lookup sees: by the recorded id it is the
    #: call's; otherwise every lookup of its window cannot tell (not evidence).
    vanishes: float = 0.0


@dataclass
class Request:
    """One request as it left its sender, and what became of it."""

    n: int
    provider: str
    key: str
    args_hash: str
    #: The attempt that sent it and the dispatch fence it held.
    attempt_id: int | None
    fence: int | None
    sender: str
    sent_at: datetime
    #: Sent while its dispatcher's lease ran (the ledger's assumption); False: a late send.
    licensed: bool
    #: How long its sender waits for the answer.
    wait: float
    received_at: datetime | None = None
    #: acted, deduplicated, in_progress, refused, declined, lost on the way
    outcome: str = "in flight"
    acted_at: datetime | None = None
    effect: int | None = None
    request_id: str = ""
    #: What its sender learned: the answer, "lost", "reset", or "" (it stopped waiting first).
    told: str = ""
    #: Where its sending falls among everything actors did (``World.happened``).
    order: int = 0
    #: The newest event the ledger had committed when it left: what the ledger knew by then.
    ledger_seen: int = 0


@dataclass
class Effect:
    n: int
    provider: str
    key: str
    args_hash: str
    request_id: str
    at: datetime
    request: int
    attempt_id: int | None
    #: When a lookup first shows it (its index's lag after ``at``).
    visible_at: datetime | None = None
    #: What people or the provider did to it after it was made ("changed", "vanished"), and when.
    fate: str = ""
    fate_at: datetime | None = None

    def shown(self, now: datetime) -> bool:
        return self.visible_at is None or self.visible_at <= now

    def befallen(self, now: datetime) -> str:
        """Its fate, once it has befallen it ("" before, or for none)."""
        return self.fate if self.fate_at is not None and self.fate_at <= now else ""


@dataclass
class Reply:
    """The answer on its way back to one sender."""

    request: Request
    waiter: Actor
    kind: str = ""  # acted, deduplicated, refused, declined, in_progress, reset
    arrived: bool = False


class Faults:
    """The provider-side faults a run has switched on, and their odds."""

    def __init__(self, world: World, enabled: frozenset[str]) -> None:
        self.world = world
        self.enabled = set(enabled)
        self.counts: dict[str, int] = {}

    def hit(self, kind: str, chance: float) -> bool:
        if kind not in self.enabled or self.world.rng.random() >= chance:
            return False
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return True


class Provider:
    """One simulated provider: the requests it received and the effects it performed."""

    def __init__(self, name: str, traits: Traits, world: World, faults: Faults) -> None:
        self.name = name
        self.traits = traits
        self.world = world
        self.faults = faults
        self.requests: list[Request] = []
        self.effects: list[Effect] = []
        #: key -> (first seen, the request deciding it) while the provider keeps it
        self.keys: dict[str, tuple[datetime, Request]] = {}
        #: Until when its lookups are down (an outage), if they are.
        self.lookups_down_until: datetime | None = None

    # --- requests -----------------------------------------------------------------------

    def kept(self, key: str) -> Request | None:
        seen = self.keys.get(key)
        if seen is None:
            return None
        first, request = seen
        if self.traits.retention is not None and (self.world.now - first).total_seconds() > self.traits.retention:
            del self.keys[key]
            return None
        return request

    def send(self, request: Request, waiter: Actor) -> Reply:
        """``request`` leaves its sender now; the answer comes back in the returned reply."""
        self.requests.append(request)
        reply = Reply(request, waiter)
        rng = self.world.rng

        if self.faults.hit("lost_answer", 0.1):
            # Lost on the way (a connection cut before the provider read it): its sender hears nothing.
            request.outcome = "lost on the way"
            return reply

        def arrive() -> None:
            self._receive(request, reply)

        arrive.label = f"{self.name} receives request {request.n}"  # type: ignore[attr-defined]
        self.world.at(rng.uniform(0, NETWORK), arrive)
        return reply

    def _receive(self, request: Request, reply: Reply) -> None:
        world, rng, traits = self.world, self.world.rng, self.traits
        request.received_at = world.now
        if traits.idempotent:
            earlier = self.kept(request.key)
            if earlier is not None and earlier.outcome in ("acted", "deduplicated"):
                request.outcome, request.effect, request.request_id = "deduplicated", earlier.effect, earlier.request_id
                return self._answer(reply, "deduplicated", rng.uniform(0, NETWORK))
            if earlier is not None and earlier.outcome == "pending":
                request.outcome = "in_progress"
                return self._answer(reply, "in_progress", rng.uniform(0, NETWORK))
        if traits.refuses and self.faults.hit("refuse", traits.refuses):
            request.outcome = "refused"
            return self._answer(reply, "refused", rng.uniform(0, NETWORK))
        if traits.declines and self.faults.hit("refuse", traits.declines):
            request.outcome = "declined"
            if traits.idempotent:
                self.keys[request.key] = (world.now, request)
            return self._answer(reply, "declined", rng.uniform(0, NETWORK))
        window = traits.processing
        if traits.works_while_caller_waits:
            # until its caller stops waiting, however long that is
            window = max(0.0, (request.sent_at + timedelta(seconds=request.wait) - world.now).total_seconds())
        if traits.acts_late or self.faults.hit("late_act", 0.3):
            delay = rng.uniform(0.8 * window, window)
        else:
            delay = rng.uniform(0, window)
        request.outcome = "pending"
        if traits.idempotent:
            self.keys[request.key] = (world.now, request)

        def act() -> None:
            self._act(request, reply)

        act.label = f"{self.name} acts on request {request.n}"  # type: ignore[attr-defined]
        world.at(delay, act)

    def _act(self, request: Request, reply: Reply) -> None:
        if self.traits.works_while_caller_waits and self.world.waiting.get(reply.waiter.name) is not reply:
            request.outcome = "abandoned"  # its caller stopped waiting (gave up, or died): the work stops
            return
        effect = Effect(
            n=len(self.effects) + 1,
            provider=self.name,
            key=request.key,
            args_hash=request.args_hash,
            request_id=f"{self.name}-{len(self.effects) + 1}",
            at=self.world.now,
            request=request.n,
            attempt_id=request.attempt_id,
        )
        if self.traits.lookup_lag:
            effect.visible_at = self.world.now + timedelta(seconds=self.world.rng.uniform(0, self.traits.lookup_lag))
        if self.traits.changes or self.traits.vanishes:
            # As the provider's own pages allow: edited, redacted, deleted or moved, a minute later at most.
            draw, after = self.world.fates.random(), self.world.fates.uniform(0, 60)
            fate = "changed" if draw < self.traits.changes else ""
            fate = fate or ("vanished" if draw < self.traits.changes + self.traits.vanishes else "")
            if fate:
                effect.fate, effect.fate_at = fate, self.world.now + timedelta(seconds=after)
        self.effects.append(effect)
        request.outcome, request.acted_at = "acted", self.world.now
        request.effect, request.request_id = effect.n, effect.request_id
        self._answer(reply, "acted", self.world.rng.uniform(0, NETWORK))

    def _answer(self, reply: Reply, kind: str, after: float) -> None:
        if self.faults.hit("lost_answer", 0.15):
            kind = "reset" if self.world.rng.random() < 0.5 else ""
            if not kind:
                return  # the answer never arrives: its sender waits until it gives up

        def deliver() -> None:
            reply.kind, reply.arrived = kind, True
            if self.world.waiting.get(reply.waiter.name) is reply:
                self.world.wake(reply.waiter)

        deliver.label = f"the answer to request {reply.request.n} arrives ({kind})"  # type: ignore[attr-defined]
        self.world.at(after, deliver)

    # --- lookups ------------------------------------------------------------------------

    def found(self, key: str) -> Effect | None:
        """The effect the provider has for ``key`` now, as a lookup would find it."""
        request = self.kept(key) if self.traits.idempotent else None
        if self.traits.idempotent:
            if request is None or request.effect is None:
                return None
            effect = self.effects[request.effect - 1]
            return effect if effect.shown(self.world.now) else None
        matches = [e for e in self.effects if e.key == key and e.shown(self.world.now)]
        return matches[-1] if matches else None

    def alike(self, args_hash: str, since: datetime | None) -> list[Effect]:
        """Effects a lookup by content finds now: the same arguments, made since ``since``, as shown."""
        return [
            e
            for e in self.effects
            if e.args_hash == args_hash
            and e.shown(self.world.now)
            and not e.befallen(self.world.now)
            and (since is None or e.at >= since)
        ]

    def receipt(self, request_id: str) -> Effect | None:
        """The effect the provider answered a call with ``request_id`` for, read by that id: whatever
        befell it since, it is the call's."""
        if not request_id:
            return None
        return next((e for e in self.effects if e.request_id == request_id), None)

    def clouded(self, sought: Sought | None) -> str:
        """What befell an effect of the lookup's window that it can no longer match ("vanished" before
        "changed"; "" for none), as a preset's lookup sees it: the effects the ledger recorded on other
        side effects are theirs, and cloud nothing."""
        since = sought.sent_after if sought is not None else None
        fates = {
            e.befallen(self.world.now)
            for e in self.effects
            if (since is None or e.at >= since) and not (sought is not None and sought.elsewhere(e.request_id))
        }
        return "vanished" if "vanished" in fates else "changed" if "changed" in fates else ""


def call(
    world: World,
    provider: Provider,
    *,
    key: str,
    args: dict[str, Any],
    attempt_id: int | None,
    fence: int | None,
    licensed: bool,
    wait: float,
    on_request_id: Callable[[str], None] | None = None,
    beat: Callable[[], object] | None = None,
    beat_every: float = 0.0,
) -> Dispatched:
    """Send one request from the running actor and wait for the answer, up to
    ``wait`` seconds: the provider's receipt, or the exception a real client
    would meet (refused before acting, declined, reset, timed out). While it
    waits, ``beat`` (the attempt's heartbeat) is called every ``beat_every``
    seconds, as the recording wrapper beats while a tool runs."""
    actor = world.current
    assert actor is not None
    request = Request(
        n=sum(len(p.requests) for p in _providers(world)) + 1,
        provider=provider.name,
        key=key,
        args_hash=normalize_args(args)[1],
        attempt_id=attempt_id,
        fence=fence,
        sender=actor.name,
        sent_at=world.now,
        licensed=licensed,
        wait=wait,
        order=next(world.happened),
        ledger_seen=newest_event(),
    )
    reply = provider.send(request, actor)
    deadline = world.now + timedelta(seconds=wait)
    world.waiting[actor.name] = reply
    try:
        next_beat = world.now + timedelta(seconds=beat_every) if beat is not None and beat_every > 0 else None
        while not reply.arrived and world.now < deadline:
            until = deadline if next_beat is None else min(deadline, next_beat)
            world.sleep((until - world.now).total_seconds(), f"waiting on {provider.name} (request {request.n})")
            if beat is not None and next_beat is not None and not reply.arrived and next_beat <= world.now < deadline:
                beat()
                next_beat = world.now + timedelta(seconds=beat_every)
    finally:
        world.waiting.pop(actor.name, None)
    if not reply.arrived:
        request.told = "timeout"
        raise TimeoutError(f"no answer from {provider.name} within {wait:g} s")
    request.told = reply.kind
    if reply.kind == "reset":
        raise ConnectionResetError(f"{provider.name} reset the connection")
    if reply.kind in ("refused", "in_progress"):
        raise NothingHappened(f"{provider.name} refused the request before acting ({reply.kind})")
    if reply.kind == "declined":
        raise PermanentFailure(f"{provider.name} declined the request")
    if on_request_id is not None:
        on_request_id(request.request_id)
    return Dispatched(
        request_id=request.request_id, payload_hash=request.args_hash, response={"id": request.request_id}
    )


def newest_event() -> int:
    """The id of the newest event the ledger has committed (one actor runs at a time, so ids follow commits)."""
    from ledgerdash.ledger.models import AttemptEvent

    return AttemptEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def look_up(world: World, provider: Provider, key: str, sought: Sought | None = None) -> Lookup:
    """A lookup from the running actor: it reaches the provider a moment
    after it was asked (a slow provider takes longer), sees the provider as
    it is then (what its index shows), and its answer comes back a moment
    later. A provider looked up by content matches ``sought``'s arguments."""
    rng = world.rng
    slow = provider.traits.lookup == "slow" or provider.faults.hit("lookup_down", 0.1)
    world.sleep(rng.uniform(0, 10.0 if slow else NETWORK), f"looking {key} up at {provider.name}")
    outage = provider.lookups_down_until
    down = (
        outage is not None and world.now < outage and "lookup_down" in provider.faults.enabled
    )  # (over once faults stop)
    if not down and provider.faults.hit("lookup_down", 0.6 if provider.traits.lookup == "flaky" else 0.1):
        down = True
        if rng.random() < 0.2:
            # An outage of its lookup (a search API down for minutes), not one failed request.
            provider.lookups_down_until = world.now + timedelta(seconds=rng.uniform(60, 900))
    # A provider whose effects may change reads a recorded id first, as the presets of such providers do.
    reads_receipts = provider.traits.changes or provider.traits.vanishes
    receipt = provider.receipt(sought.request_id) if reads_receipts and sought is not None and not down else None
    if receipt is not None:
        world.sleep(rng.uniform(0, 10.0 if slow else NETWORK), f"waiting on {provider.name}'s lookup of {key}")
        # Read by the id the provider answered the call with: the call's, with nothing left to compare
        # once something befell it (the reconciler accepts the recorded id alone).
        befallen = receipt.befallen(world.now)
        return Lookup(
            LookupStatus.FOUND,
            request_id=receipt.request_id,
            payload_hash="" if befallen else receipt.args_hash,
            document={"id": receipt.request_id},
            detail=f"read by the recorded id ({befallen} since)" if befallen else "read by the recorded id",
        )
    if provider.traits.lookup_by == "content" and sought is not None and not down:
        # As a preset's search does (presets.common.choose): another side effect's effect is not this call's.
        matches = [e for e in provider.alike(sought.args_hash, sought.sent_after) if not sought.elsewhere(e.request_id)]
        effect = matches[0] if len(matches) == 1 else None
        if len(matches) > 1:
            world.sleep(rng.uniform(0, NETWORK), f"waiting on {provider.name}'s lookup of {key}")
            return Lookup(LookupStatus.AMBIGUOUS, detail=f"{len(matches)} effects with these arguments")
    else:
        effect = None if down else provider.found(key)
        if effect is not None and effect.befallen(world.now):
            effect = None  # its marker is gone, or it is out of reach: the lookup cannot match it
    world.sleep(rng.uniform(0, 10.0 if slow else NETWORK), f"waiting on {provider.name}'s lookup of {key}")
    if down:
        return Lookup(LookupStatus.UNAVAILABLE, detail=f"{provider.name} answered 503")
    if effect is None:
        clouded = provider.clouded(sought)
        if clouded == "vanished":
            return Lookup(
                LookupStatus.NOT_EVIDENCE,
                detail="an effect of the window is out of the lookup's reach",
                extra={"blind_spot": "out_of_reach"},
            )
        if clouded == "changed":
            return Lookup(LookupStatus.AMBIGUOUS, detail="an effect of the window was changed so nothing matches it")
        return Lookup(LookupStatus.NOT_FOUND)
    return Lookup(
        LookupStatus.FOUND,
        request_id=effect.request_id,
        payload_hash=effect.args_hash,
        document={"id": effect.request_id},
        # (as a preset searching by content marks its match: presets.common.by_content)
        extra={"matched_by": "content"} if provider.traits.lookup_by == "content" and sought is not None else {},
    )


@dataclass
class Network:
    """The providers of the running simulation, by name (the adapter finds them here)."""

    world: World
    providers: dict[str, Provider] = field(default_factory=dict)


#: The running simulation's network; the adapter of every simulated tool reaches it.
_running: list[Network] = []


def _providers(world: World) -> list[Provider]:
    return list(_running[-1].providers.values()) if _running else []


def running() -> Network:
    if not _running:
        raise RuntimeError("no simulation is running: simulated tools have no provider to reach")
    return _running[-1]


class SimulatedAdapter(ProviderAdapter):
    """The adapter of a simulated tool (``{"class": "…SimulatedAdapter",
    "provider": name}``): the reconciler looks effects up and sends again
    through it, over the simulated network."""

    def __init__(self, *, provider: str) -> None:
        self.provider_name = provider

    def _provider(self) -> tuple[World, Provider]:
        network = running()
        return network.world, network.providers[self.provider_name]

    def dispatch(
        self, *, key: str, args: dict[str, Any], on_request_id: Callable[[str], None] | None = None
    ) -> Dispatched:
        from ledgerdash.ledger.models import Attempt, State

        world, provider = self._provider()
        # The reconciler sends right after its claim committed; which attempt
        # it is, and whether its lease still runs, is read for the record.
        sending = (
            Attempt.objects.filter(provider_key=key, state=State.DISPATCHED)
            .order_by("-dispatch_fence")
            .values_list("pk", "dispatch_fence", "next_check_at")
            .first()
        )
        attempt_id, fence, lease_end = sending if sending is not None else (None, None, None)
        return call(
            world,
            provider,
            key=key,
            args=args,
            attempt_id=attempt_id,
            fence=fence,
            licensed=lease_end is not None and clock.now() <= lease_end,
            wait=self.max_request_seconds,
            on_request_id=on_request_id,
        )

    def lookup(self, *, key: str, args_hash: str) -> Lookup:
        world, provider = self._provider()
        return look_up(world, provider, key)

    def find(self, sought: Sought) -> Lookup:
        world, provider = self._provider()
        return look_up(world, provider, sought.key, sought)

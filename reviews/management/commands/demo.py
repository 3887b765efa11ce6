"""Load the demo: people, two tenants, and queues produced by real crashes.

The attempts a newcomer sees are not fixtures: the crash drill kills real
agent processes at each crash point against the sandbox provider and lets
recovery run, for tenant ``acme`` (every case whose agent runs in process,
A to J but G, with every kind of tool) and ``globex`` (random cases from a
fixed seed). More agents are killed while
the provider's lookup API is down, so the UNKNOWN queue has live work; an
operator asks for a retry so the approver has a decision waiting. Agents
make a few hundred real calls through the sandbox provider over the last
two days (the clock is injected), acme's policy holds large charges for an
approver (two wait), and a team of operators on an on-call rotation shares
the stuck work.

Runs once: a database that already has the demo tenants is left alone.
``--defer-drills`` loads everything but the crash drills (seconds), and
``--drills`` runs them afterwards: ``make run`` serves the dashboard between
the two, and the overview shows the drills' progress.
"""

from __future__ import annotations

import contextlib
import logging
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ledgerdash.ledger import audit, clock, config, moves, recording
from ledgerdash.ledger.authority import current_policy
from ledgerdash.ledger.drill.runner import (
    IDEMPOTENT_TOOL,
    NON_IDEMPOTENT_TOOL,
    Drill,
    Planned,
    fixed_plan,
    leave_unknown,
    random_plan,
)
from ledgerdash.ledger.errors import AwaitingApproval, LedgerError, NothingHappened, PermanentFailure
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, DrillRun, OnCallShift, State, Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ops.progress import Progress

PASSWORD = "ledgerdash-demo"  # noqa: S105 - published on purpose: demo users only, refused with DEBUG off
PEOPLE = [
    ("admin", "admin", "an admin of both tenants (and of /admin/)"),
    ("approver", "approver", "approves or rejects linked retries and held calls"),
    ("chen", "approver", "a second approver (four eyes: nobody approves what they asked for)"),
    ("operator", "operator", "claims, assigns, asks for re-checks and retries; on call now"),
    ("ana", "operator", "an operator of the on-call rotation"),
    ("ben", "operator", "an operator of the on-call rotation"),
    ("viewer", "viewer", "reads only"),
]
#: The on-call rotation: eight-hour shifts, in this order, around the demo's start.
ROTATION = ["operator", "ana", "ben"]
#: Calls of the charge tool above this wait for an approver (acme's policy).
APPROVAL_CONDITION = "amount_cents > `50000`"
#: Real agent calls through the sandbox provider, so the lists have pages.
AGENT_CALLS = 240
#: The demo's tenants and who is a member of which, as configuration as code.
DEMO_FILE = Path(__file__).resolve().parents[2] / "demo.toml"


DEMO_CASES = "ABCDEFHIJ"


class Command(BaseCommand):
    help = "Load demo people and tenants, with queues produced by real crash-drill runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--sandbox-url", default=None, help="a running sandbox to crash against (else one is started)"
        )
        parser.add_argument(
            "--force", action="store_true", help="load even with DEBUG off (the demo users have a published password)"
        )
        parser.add_argument(
            "--defer-drills",
            action="store_true",
            help="load all but the crash drills (a minute or more), which `demo --drills` then runs",
        )
        parser.add_argument(
            "--drills", action="store_true", help="run the demo's crash drills, once the rest of the demo is loaded"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] < 2:
            logging.getLogger("ledgerdash.reconciler").setLevel(logging.WARNING)
        if not settings.DEBUG and not options["force"]:
            raise CommandError("refusing to create demo users with a known password while DEBUG is off (use --force)")
        demo = config.parse_file(DEMO_FILE)
        slugs = [tenant.slug for tenant in demo.tenants]
        loaded = Tenant.objects.filter(slug__in=slugs).exists()
        if options["drills"]:
            if not loaded:
                raise CommandError("the demo is not loaded yet: run `manage.py demo --defer-drills` first")
            self._drills(slugs, options["sandbox_url"])
            return
        if loaded:
            self.stdout.write("demo data already loaded")
        else:
            self._load(demo, slugs, options["sandbox_url"])
            if options["defer_drills"]:
                for tenant, plan, _mode, _seed in self._drill_plans():
                    # Shown on the overview as running, no case done, until `demo --drills` runs it.
                    DrillRun.objects.create(tenant=Tenant.objects.get(slug=tenant), iterations=len(plan), mode="")
                self.stdout.write(self.style.SUCCESS("demo data loaded; its crash drills run next (demo --drills)"))
            else:
                self._drills(slugs, options["sandbox_url"])
                self.stdout.write(self.style.SUCCESS("demo data loaded from real crash-drill runs"))
        self.stdout.write(f"demo users (password {PASSWORD!r}):")
        for username, _role, what in PEOPLE:
            self.stdout.write(f"  {username:<9} {what}")

    def _load(self, demo: config.Desired, slugs: list[str], sandbox_url: str | None) -> None:
        """Everything but the crash drills: seconds, so a first start answers soon."""
        users = self._people()
        config.apply(demo, actor=Actor.user(users["admin"]))
        self._on_call(users, slugs)
        with Drill(tenant="acme", sandbox_url=sandbox_url) as drill:
            left = leave_unknown(drill, count=8, run_id=0)
            self.stdout.write(f"  acme: {len(left)} agents killed while the provider's lookup API is down")
            self._agents_at_work(users)
        self._the_team_shares_the_work(users, slugs)
        self._verify_chains()

    def _verify_chains(self) -> None:
        """What an operator's nightly verify_audit does: the overview then shows each chain verified."""
        results = audit.verify()
        whole = sum(1 for result in results if result.ok)
        self.stdout.write(f"  the tenants' hash chains verified: {whole} of {len(results)} whole")

    def _drills(self, slugs: list[str], sandbox_url: str | None) -> None:
        """The crash drills (real agent processes killed at each crash point; each case's progress
        shows on the overview), then the work they leave for people."""
        if DrillRun.objects.filter(tenant__slug__in=slugs).exclude(finished_at=None).exists():
            self.stdout.write("the demo's crash drills have already run: their reports are on the overview")
            return
        users = {user.username: user for user in get_user_model().objects.filter(username__in=[p[0] for p in PEOPLE])}
        self.stdout.write("crashing agents for the demo (the crash drill, against the sandbox provider)…")
        runs = []
        plans = self._drill_plans()
        with Progress(
            "the demo's crash drills", total=sum(len(plan) for _, plan, _, _ in plans), write=self.stdout.write
        ) as bar:
            for tenant, plan, mode, seed in plans:
                queued = DrillRun.objects.filter(tenant__slug=tenant, finished_at=None, cases_total=0).first()
                with Drill(tenant=tenant, sandbox_url=sandbox_url, progress=lambda _line: bar.advance()) as drill:
                    runs.append(drill.run(plan, mode=mode, seed=seed, queued=queued))
                bar.say(f"  {tenant}: drill #{runs[-1].pk}, {runs[-1].cases_total} cases")
        if sandbox_url:
            # Keep the lookup API "down" so the UNKNOWN queue stays live for the demo.
            with contextlib.suppress(OSError):
                drill.sandbox.faults(IDEMPOTENT_TOOL, lookup_5xx=True)
        self._operator_asks_for_a_retry(users)
        self._the_team_shares_the_work(users, slugs)
        self._verify_chains()
        cases = sum(run.cases_total for run in runs)
        held = cases - sum(run.cases_failed for run in runs)
        self.stdout.write(f"the demo's crash drills are done: {held} of {cases} cases held every assertion")

    def _agents_at_work(self, users: dict[str, Any]) -> None:
        """Real agents at work through the sandbox provider: a few hundred
        calls over the last two days (the clock is injected, the calls are
        real), and charges under a policy that holds the large ones for an
        approver (one is left waiting in the approvals queue)."""
        tenant = Tenant.objects.get(slug="acme")
        policy = current_policy(tenant.pk)
        if policy is not None:
            policy_publish(
                tenant=tenant,
                tools=policy.tools,
                approvals={NON_IDEMPOTENT_TOOL: APPROVAL_CONDITION},
                actor=Actor.user(users["admin"]),
                note="large charges need an approver",
            )
        send = recording.provider_tool(IDEMPOTENT_TOOL, key="digest:{team}:{day}")
        charge = recording.provider_tool(NON_IDEMPOTENT_TOOL, key="order:{order}:charge")
        chance = random.Random(7)  # noqa: S311 - spreads the demo's times, not a secret
        now = timezone.now()
        agents = ["digest-agent", "billing-agent", "support-agent"]
        done = 0
        for n in range(AGENT_CALLS):
            at = now - timedelta(minutes=chance.randint(5, 48 * 60))
            try:
                with clock.frozen_at(at), recording.task(tenant="acme", task_id=f"run-{n // 10}", agent=agents[n % 3]):
                    if n % 4 == 0:
                        charge(order=1000 + n, amount_cents=chance.randint(500, 45000), to="shop@example.com")
                    else:
                        send(team=f"team-{n % 40}", day=f"d{n}", to=f"team-{n % 40}@example.com")
                done += 1
            except (LedgerError, PermanentFailure, NothingHappened, OSError) as exc:
                self.stdout.write(f"  acme: agent call {n} ended: {exc}")
        self.stdout.write(f"  acme: {done} agent calls through the sandbox provider")
        for order, amount in ((7001, 125000), (7002, 98000)):
            with (
                contextlib.suppress(AwaitingApproval),
                recording.task(tenant="acme", task_id="checkout-big", agent="billing-agent"),
            ):
                charge(order=order, amount_cents=amount, to="shop@example.com")
        self.stdout.write("  acme: two large charges wait for an approver")

    @staticmethod
    def _drill_plans() -> list[tuple[str, list[Planned], str, int | None]]:
        """Each tenant's drill: its plan, mode and seed. acme: the cases whose agents run in process
        and leave work for people (`manage.py crashdrill` runs all of them); globex: random cases
        of seed 1."""
        acme = [p for p in fixed_plan() if p.via == "process" and p.letter in DEMO_CASES]
        seed = 1
        return [("acme", acme, "fixed", None), ("globex", random_plan(6, seed=seed), "random", seed)]

    def _on_call(self, users: dict[str, Any], slugs: list[str]) -> None:
        """An on-call rotation: eight-hour shifts around the demo's start."""
        now = timezone.now()
        start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=16)
        for tenant in Tenant.objects.filter(slug__in=slugs):
            for shift in range(6):
                OnCallShift.objects.create(
                    tenant=tenant,
                    user=users[ROTATION[(shift + 1) % len(ROTATION)]],
                    starts_at=start + timedelta(hours=8 * shift),
                    ends_at=start + timedelta(hours=8 * (shift + 1)),
                )

    def _the_team_shares_the_work(self, users: dict[str, Any], slugs: list[str]) -> None:
        """The stuck work spread over the operators as they would claim it
        (each an owner event)."""
        stuck = Attempt.objects.filter(tenant__slug__in=slugs, state__in=[State.UNKNOWN, State.MANUAL_REVIEW]).order_by(
            "id"
        )
        for n, attempt in enumerate(stuck):
            person = users[ROTATION[n % len(ROTATION)]]
            if n % 5 == 4 or attempt.owner_id == person.pk:
                continue  # some stay with whoever the ledger gave them to
            with contextlib.suppress(LedgerError):
                moves.attempt_assign(
                    attempt=attempt,
                    owner=person,
                    actor=Actor.user(person),
                    reason="claimed",
                    expected_owner_id=attempt.owner_id,
                )

    def _people(self) -> dict[str, Any]:
        user_model = get_user_model()
        users = {}
        for username, role, _ in PEOPLE:
            users[username] = user_model.objects.create_user(
                username=username, password=PASSWORD, is_staff=role == "admin", is_superuser=role == "admin"
            )
        return users

    def _operator_asks_for_a_retry(self, users: dict[str, Any]) -> None:
        """A charge nobody could prove either way: the operator asks for a retry."""
        candidate = (
            Attempt.objects.filter(
                tenant__slug="acme", state=State.MANUAL_REVIEW, tool_name=NON_IDEMPOTENT_TOOL, last_lookup="not_found"
            )
            .order_by("id")
            .first()
        )
        if candidate is None:
            return
        with contextlib.suppress(LedgerError):
            moves.retry_request(
                attempt=candidate,
                actor=Actor.user(users["operator"]),
                reason="the provider has no record of the charge and the customer confirms none arrived",
            )

"""Load the demo: people, two tenants, and queues produced by real crashes.

The attempts a newcomer sees are not fixtures: the crash drill kills real
agent processes at each crash point against the sandbox provider and lets
recovery run, for tenant ``acme`` (the six cases, both kinds of tool) and
``globex`` (random cases from a fixed seed). A few more agents are killed
while the provider's lookup API is down, so the UNKNOWN queue has live work,
and an operator asks for a retry so the approver has a decision waiting.

Runs once: a database that already has the demo tenants is left alone.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledgerdash.ledger import moves
from ledgerdash.ledger.drill.runner import NON_IDEMPOTENT_TOOL, Drill, fixed_plan, leave_unknown, random_plan
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Attempt, Membership, State, Tenant

PASSWORD = "ledgerdash-demo"  # noqa: S105 - published on purpose: demo users only, refused with DEBUG off
PEOPLE = [
    ("admin", "admin", "an admin of both tenants (and of /admin/)"),
    ("approver", "approver", "approves or rejects linked retries"),
    ("operator", "operator", "claims, assigns, asks for re-checks and retries"),
    ("viewer", "viewer", "reads only"),
]
TENANTS = [("acme", "Acme Corp"), ("globex", "Globex")]


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

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] < 2:
            logging.getLogger("ledgerdash.reconciler").setLevel(logging.WARNING)
        if not settings.DEBUG and not options["force"]:
            raise CommandError("refusing to create demo users with a known password while DEBUG is off (use --force)")
        if Tenant.objects.filter(slug__in=[slug for slug, _ in TENANTS]).exists():
            self.stdout.write("demo data already loaded")
        else:
            self._load(options["sandbox_url"])
            self.stdout.write(self.style.SUCCESS("demo data loaded from real crash-drill runs"))
        self.stdout.write(f"demo users (password {PASSWORD!r}):")
        for username, _role, what in PEOPLE:
            self.stdout.write(f"  {username:<9} {what}")

    def _load(self, sandbox_url: str | None) -> None:
        users = self._people()
        for slug, name in TENANTS:
            tenant = Tenant.objects.create(slug=slug, name=name, default_owner=users["operator"])
            for username, role, _ in PEOPLE:
                Membership.objects.create(user=users[username], tenant=tenant, role=role)
        self.stdout.write("crashing agents for the demo (the crash drill, against the sandbox provider)…")
        with Drill(tenant="acme", sandbox_url=sandbox_url) as drill:
            # The cases whose agents run in process and leave work for people;
            # `manage.py crashdrill` runs all of them.
            plan = [p for p in fixed_plan() if p.via == "process" and p.letter in DEMO_CASES]
            run = drill.run(plan, mode="fixed", seed=None)
            self.stdout.write(
                f"  acme: drill #{run.pk}, {run.cases_total - run.cases_failed}/{run.cases_total} cases held"
            )
            left = leave_unknown(drill, count=3, run_id=run.pk)
            self.stdout.write(f"  acme: {len(left)} agents killed while the provider's lookup API is down")
        with Drill(tenant="globex", sandbox_url=sandbox_url) as drill:
            run = drill.run(random_plan(6, seed=1), mode="random", seed=1)
            self.stdout.write(f"  globex: drill #{run.pk}, random seed 1, {run.cases_total} cases")
        if sandbox_url:
            # Keep the lookup API "down" so the UNKNOWN queue stays live for the demo.
            with contextlib.suppress(OSError):
                drill.sandbox.faults("drill.send_email", lookup_5xx=True)
        self._operator_asks_for_a_retry(users)

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

"""Load demo tenants, people, policies and attempts in every state.

Everything goes through the real recording API and transitions, so each
demo attempt carries the event history a real one would. Runs once: a
database that already has the demo tenants is left alone.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from ledgerdash.ledger import recording, transitions
from ledgerdash.ledger.errors import IdempotencyConflict
from ledgerdash.ledger.models import Tenant
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.transitions import Actor
from reviews.models import Membership, Role
from reviews.permissions import may_act_as

PASSWORD = "ledgerdash-demo"  # noqa: S105 - published on purpose: demo users only, refused with DEBUG off
TOOLS = {
    "send_email": ["email:send"],
    "charge_card": ["payments:charge", "payments:refund"],
    "open_ticket": ["tickets:write"],
    "deploy_service": ["deploy:staging", "deploy:production"],
}
PEOPLE = [
    ("admin", "admin", "an admin of both tenants (and of /admin/)"),
    ("approver", "approver", "approves or rejects linked retries"),
    ("operator", "operator", "claims, assigns, re-checks"),
    ("viewer", "viewer", "reads only"),
]


class Command(BaseCommand):
    help = "Load demo data (tenants, users, policies, attempts in every state) through the real ledger API."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--force",
            action="store_true",
            help="load even with DEBUG off (the demo users have a published password)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG and not options["force"]:
            raise CommandError("refusing to create demo users with a known password while DEBUG is off (use --force)")
        if Tenant.objects.filter(slug__in=["acme", "globex"]).exists():
            self.stdout.write("demo data already loaded")
        else:
            with transaction.atomic():
                self._load()
            self.stdout.write(self.style.SUCCESS("demo data loaded"))
        self.stdout.write(f"demo users (password {PASSWORD!r}):")
        for username, _role, what in PEOPLE:
            self.stdout.write(f"  {username:<9} {what}")

    def _load(self) -> None:
        User = get_user_model()
        users = {}
        for username, role, _ in PEOPLE:
            user = User.objects.create_user(
                username=username,
                password=PASSWORD,
                is_staff=role == "admin",
                is_superuser=role == "admin",
            )
            users[username] = user
        system = Actor.system("demo")
        tenants = {}
        for slug, name in (("acme", "Acme Corp"), ("globex", "Globex")):
            tenant = Tenant.objects.create(slug=slug, name=name, default_owner=users["operator"])
            policy_publish(tenant=tenant, tools=TOOLS, actor=system, note="initial policy")
            for username, role, _ in PEOPLE:
                Membership.objects.create(user=users[username], tenant=tenant, role=role)
            tenants[slug] = tenant
        self._attempts(tenants["acme"], users)
        self._attempts(tenants["globex"], users)

    def _attempts(self, tenant: Tenant, users: dict[str, Any]) -> None:
        agent = Actor.agent(f"demo-agent@{tenant.slug}")
        reconciler = Actor.reconciler("demo-reconciler")

        def intent(key: str, tool: str, args: dict[str, Any], task: str = "nightly-billing") -> Any:
            return recording.record_intent(
                tenant=tenant, task_id=task, tool_name=tool, idempotency_key=key, args=args, actor=agent
            ).attempt

        def dispatched(key: str, tool: str, args: dict[str, Any]) -> Any:
            return recording.mark_dispatched(intent(key, tool, args), actor=agent)

        def unknown(key: str, tool: str, args: dict[str, Any], reason: str) -> Any:
            return recording.mark_unknown(dispatched(key, tool, args), reason=reason, actor=agent)

        intent(f"{tenant.slug}:invoice:1001:send", "send_email", {"to": "ap@example.com", "invoice": 1001})
        dispatched(f"{tenant.slug}:ticket:42:open", "open_ticket", {"title": "Disk full on db-2", "priority": "high"})
        done = dispatched(f"{tenant.slug}:invoice:1000:send", "send_email", {"to": "ap@example.com", "invoice": 1000})
        recording.confirm(done, provider_request_id="msg_7Qx1000", actor=agent)
        retryable = dispatched(
            f"{tenant.slug}:ticket:41:open", "open_ticket", {"title": "Rotate keys", "priority": "low"}
        )
        recording.fail_retryable(retryable, reason="429 Too Many Requests: rejected before acting", actor=agent)
        failed = dispatched(f"{tenant.slug}:charge:88", "charge_card", {"customer": "cus_88", "amount_cents": 1200})
        recording.fail(failed, reason="402 card declined", actor=agent)
        unknown(
            f"{tenant.slug}:invoice:1002:send",
            "send_email",
            {"to": "billing@example.org", "invoice": 1002},
            "read timed out after 10s",
        )
        unknown(
            f"{tenant.slug}:deploy:web:v42",
            "deploy_service",
            {"service": "web", "version": "v42", "env": "production"},
            "connection reset by peer",
        )
        # A payment nobody can prove: escalated to people.
        charge = unknown(
            f"{tenant.slug}:charge:89", "charge_card", {"customer": "cus_89", "amount_cents": 4999}, "gateway timeout"
        )
        charge = transitions.attempt_escalate(
            attempt=charge,
            actor=reconciler,
            fence=charge.fence,
            reason="charge_card is not idempotent and the provider has no record lookup: needs a person",
            lookup={"status": "not_found", "detail": "no charge with this key"},
        )
        # An operator asked for a retry; it waits for an approver.
        transitions.retry_request(
            attempt_id=charge.pk, actor=Actor.user(users["operator"]), reason="customer confirms no charge on statement"
        )
        # An agent reused a key with other arguments: a linked attempt for review.
        intent(f"{tenant.slug}:invoice:1003:send", "send_email", {"to": "ap@example.com", "invoice": 1003})
        with contextlib.suppress(IdempotencyConflict):
            intent(
                f"{tenant.slug}:invoice:1003:send",
                "send_email",
                {"to": "ap@example.com", "invoice": 1003, "cc": "cfo@example.com"},
            )
        # One settled by people: approved retry, original reconciled.
        old = unknown(f"{tenant.slug}:email:welcome:7", "send_email", {"to": "new@example.com"}, "timeout")
        old = transitions.attempt_escalate(
            attempt=old,
            actor=reconciler,
            fence=old.fence,
            reason="checks exhausted",
            lookup={"status": "not_found"},
        )
        retry = transitions.retry_request(attempt_id=old.pk, actor=Actor.user(users["operator"]), reason="resend")
        transitions.retry_approve(
            attempt_id=retry.pk,
            actor=Actor.user(users["approver"]),
            comment="provider lookup says not found",
            may_act=may_act_as(users["approver"], Role.APPROVER),
        )

"""Applying a plan: its writes, in one transaction (all of them or none).

Every write goes the way the dashboard makes it, so each is an event in
the affected tenant's chain: the configuration rows record their own
(:mod:`ledgerdash.ledger.configuration`), a policy's next version is
published (:func:`~ledgerdash.ledger.policies.policy_publish`), channels
and rules go through :mod:`ledgerdash.notify.services`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from ledgerdash.ledger.config.parse import ChannelSpec, Desired, PolicySpec, RuleSpec
from ledgerdash.ledger.config.plan import (
    CHANNEL,
    CREDENTIAL,
    MEMBERSHIP,
    POLICY,
    RULE,
    SHIFT,
    TENANT,
    TOOL,
    USER,
    Plan,
    Write,
    make_plan,
)
from ledgerdash.ledger.configuration import acting_as
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.models import Membership, OnCallShift, Tenant, Tool, ToolCredential
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.notify import services
from ledgerdash.notify.models import Channel, Rule

ACTOR = Actor.system("manage.py ledger_config")


def apply(desired: Desired, *, actor: Actor = ACTOR) -> tuple[Plan, list[str]]:
    """Make the plan's changes in one transaction (all or none); the plan,
    and the lines to show once (a new webhook's signing secret)."""
    shown: list[str] = []
    with transaction.atomic(), acting_as(actor):
        plan = make_plan(desired)
        for step in plan.changes:
            assert step.write is not None
            line = WRITERS[step.write.thing](step.write, actor)
            if line:
                shown.append(line)
        left = make_plan(desired).changes
        if left:  # the database must now be as the file says: else undo it all
            raise RuntimeError("apply left changes unmade: " + "; ".join(step.describe() for step in left))
    return plan, shown


def _user(username: str | None) -> Any:
    if not username:
        return None
    return get_user_model()._default_manager.get_by_natural_key(username)


def _tenant(slug: str) -> Tenant:
    return Tenant.objects.get(slug=slug)


def _save(write: Write, **resolved: Any) -> None:
    """Set ``write.values`` on its row (``resolved``: those given as names, as rows) and save it."""
    assert write.row is not None
    for name, value in {**write.values, **resolved}.items():
        setattr(write.row, name, value)
    write.row.save()


def _write_user(write: Write, _actor: Actor) -> None:
    get_user_model()._default_manager.create_user(username=write.values["username"])


def _write_tenant(write: Write, _actor: Actor) -> None:
    owner = {"default_owner": _user(write.values["default_owner"])} if "default_owner" in write.values else {}
    if write.row is not None:
        _save(write, **owner)
        return
    Tenant.objects.create(slug=write.tenant, **{**write.values, **owner})


def _write_policy(write: Write, actor: Actor) -> None:
    spec: PolicySpec = write.spec
    tenant = _tenant(write.tenant)
    policy_publish(tenant=tenant, tools=spec.tools, approvals=spec.approvals, note=spec.note, actor=actor)


def _write_tool(write: Write, _actor: Actor) -> None:
    if write.row is not None:
        _save(write)
        return
    Tool.objects.create(**write.values)


def _write_credential(write: Write, _actor: Actor) -> None:
    if write.row is not None:
        _save(write)
        return
    tool = Tool.objects.get(name=write.values["tool"])
    ToolCredential.objects.create(tenant=_tenant(write.tenant), **{**write.values, "tool": tool})


def _write_membership(write: Write, _actor: Actor) -> None:
    if write.row is not None:
        _save(write)
        return
    Membership.objects.create(tenant=_tenant(write.tenant), **{**write.values, "user": _user(write.values["user"])})


def _write_shift(write: Write, _actor: Actor) -> None:
    if write.row is not None:
        _save(write)
        return
    OnCallShift.objects.create(tenant=_tenant(write.tenant), **{**write.values, "user": _user(write.values["user"])})


def _write_channel(write: Write, actor: Actor) -> str | None:
    if write.row is not None:
        assert isinstance(write.row, Channel)
        services.channel_update(channel=write.row, actor=actor, **write.values)
        return None
    spec: ChannelSpec = write.spec
    assert spec.kind is not None
    assert spec.target is not None
    channel = services.channel_create(
        tenant=_tenant(write.tenant), name=spec.name, kind=spec.kind, target=spec.target, actor=actor
    )
    if spec.enabled is False:
        services.channel_update(channel=channel, actor=actor, enabled=False)
    if channel.secret:
        return (
            f"channel {channel.name} in {write.tenant}: signing secret {channel.secret} "
            "(shown only now; rotate it on the channel's page for a new one)"
        )
    return None


def _write_rule(write: Write, actor: Actor) -> None:
    if write.row is not None:
        assert isinstance(write.row, Rule)
        services.rule_update(rule=write.row, actor=actor, **write.values)
        return
    spec: RuleSpec = write.spec
    services.rule_create(
        tenant=_tenant(write.tenant),
        actor=actor,
        event=spec.event,
        channel_id=Channel.objects.get(tenant__slug=write.tenant, name=spec.channel).pk,
        **spec.values,
    )


#: How each thing is written.
WRITERS: dict[str, Callable[[Write, Actor], str | None]] = {
    USER: _write_user,
    TENANT: _write_tenant,
    POLICY: _write_policy,
    TOOL: _write_tool,
    CREDENTIAL: _write_credential,
    MEMBERSHIP: _write_membership,
    SHIFT: _write_shift,
    CHANNEL: _write_channel,
    RULE: _write_rule,
}

"""Who may do what, right now: the tenant's current policy.

Every dispatch, every retry and every approval asks these questions again
rather than trusting what was true when the intent was recorded: recovery
must not apply yesterday's authority to today's task.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Subquery

from ledgerdash.ledger.models import Attempt, Policy, Tenant, Tool


def scope_string(scopes: frozenset[str] | set[str]) -> str:
    return " ".join(sorted(scopes))


def current_policy(tenant_id: int) -> Policy | None:
    return Policy.objects.filter(tenant_id=tenant_id).order_by("-version").first()


@dataclass(frozen=True)
class Standing:
    """What changed between an attempt's authority and the tenant's current one."""

    changes: tuple[str, ...]
    policy: Policy | None

    @property
    def unchanged(self) -> bool:
        return not self.changes


def standing_of(attempt: Attempt, *, original: Attempt | None = None) -> Standing:
    """Compare ``attempt``'s recorded authority with the tenant's current one.

    With ``original`` (the attempt a linked retry re-tries), also refuse a
    scope wider than the original's and a tenant other than the original's.
    """
    tenant = Tenant.objects.only("slug", "is_active").get(pk=attempt.tenant_id)
    return _compare(attempt, tenant, current_policy(attempt.tenant_id), original)


def dispatch_standing(attempt: Attempt) -> tuple[Standing, float | None]:
    """:func:`standing_of` for a dispatch, plus the tool's dispatch lease in
    seconds (None: the default), read in one query: the tenant's current
    policy joined to its tenant, the lease as a subquery. It runs before
    every dispatch, so it is one round trip instead of three."""
    lease = Tool.objects.filter(name=attempt.tool_name).values("dispatch_lease_seconds")[:1]
    policy = (
        Policy.objects.filter(tenant_id=attempt.tenant_id)
        .select_related("tenant")
        .annotate(lease_seconds=Subquery(lease))
        .order_by("-version")
        .first()
    )
    if policy is None:  # no policy at all: nothing may be dispatched; explain it the usual way
        return standing_of(attempt), None
    return _compare(attempt, policy.tenant, policy, None), policy.lease_seconds


def _compare(attempt: Attempt, tenant: Tenant, policy: Policy | None, original: Attempt | None) -> Standing:
    changes: list[str] = []
    if not tenant.is_active:
        changes.append(f"tenant {tenant.slug} is no longer active")
    if original is not None and original.tenant_id != attempt.tenant_id:
        changes.append(f"tenant differs from the original attempt's (tenant {original.tenant_id})")
    if policy is None:
        changes.append(f"tenant {tenant.slug} has no policy any more")
        return Standing(tuple(changes), None)
    if policy.version != attempt.policy_version:
        changes.append(f"policy is now v{policy.version} (attempt recorded under v{attempt.policy_version})")
    allowed = policy.scopes_for(attempt.tool_name)
    if allowed is None:
        changes.append(f"tool {attempt.tool_name} is not allowed by policy v{policy.version}")
    else:
        extra = attempt.scopes - allowed
        if extra:
            changes.append(
                f"scope {scope_string(extra)} is not allowed for {attempt.tool_name} by policy v{policy.version}"
            )
    if original is not None:
        wider = attempt.scopes - original.scopes
        if wider:
            changes.append(f"scope {scope_string(wider)} is wider than the original attempt's")
    return Standing(tuple(changes), policy)

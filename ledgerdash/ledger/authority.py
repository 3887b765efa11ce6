"""Who may do what, right now: the tenant's current policy.

Every dispatch, every retry and every approval asks these questions again
rather than trusting what was true when the intent was recorded: recovery
must not apply yesterday's authority to today's task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from ledgerdash.ledger.errors import LedgerError, NoPolicy, ScopeNotAllowed, TenantInactive, ToolNotAllowed
from ledgerdash.ledger.models import Attempt, Policy, Tenant, Tool


def scope_string(scopes: frozenset[str] | set[str]) -> str:
    return " ".join(sorted(scopes))


def current_policy(tenant_id: int) -> Policy | None:
    return Policy.objects.filter(tenant_id=tenant_id).order_by("-version").first()


@dataclass(frozen=True)
class Standing:
    """Whether an attempt is still authorized under the tenant's current
    authority, and if not, what no longer holds.

    What authorizes an attempt is its tenant being active, its tool being
    allowed and its credential scope being within what the tool may use.
    The policy's version number alone is not authority: a new version that
    leaves this tool's permission and scopes as they were (it added another
    tool, say) changes nothing this attempt relies on, so it does not count
    as a change. Every dispatch and approval records the version it was
    re-checked under.
    """

    changes: tuple[str, ...]
    policy: Policy | None

    @property
    def holds(self) -> bool:
        return not self.changes


def standing_of(attempt: Attempt, *, original: Attempt | None = None) -> Standing:
    """Compare ``attempt``'s recorded authority with the tenant's current one.

    With ``original`` (the attempt a linked retry re-tries), also refuse a
    scope wider than the original's and a tenant other than the original's.
    """
    return dispatch_standing(attempt, original=original)[0]


@dataclass(frozen=True)
class Timing:
    """How long a tool's dispatch may be in flight. ``max_request_seconds``
    bounds one request (the adapter's timeout, and how long after it was sent
    a request can still land); the lease always exceeds it."""

    lease_seconds: float
    max_request_seconds: float


def timing(lease_seconds: float | None, max_request_seconds: float | None) -> Timing:
    """A tool's timing from its row (None: the settings' defaults). A lease
    that would not exceed the request time is stretched past it, so a
    request still in flight never looks lost."""
    max_request = float(max_request_seconds or settings.LEDGER_MAX_REQUEST_SECONDS)
    lease = float(lease_seconds or settings.LEDGER_DISPATCH_LEASE_SECONDS)
    return Timing(max(lease, max_request + max(1.0, max_request / 4)), max_request)


@dataclass(frozen=True)
class Authority:
    """A tenant's standing now: itself, its current policy, and a tool's timing."""

    tenant: Tenant | None
    policy: Policy | None
    timing: Timing
    #: An id for the attempt about to be recorded, when asked for (PostgreSQL only).
    attempt_id: int | None = None


#: One round trip for the questions every intent and every dispatch asks.
#: Plain SQL (SQLite and PostgreSQL alike): on the hot path, compiling the
#: equivalent ORM query cost more than running it.
_AUTHORITY_SQL = """
SELECT t.slug, t.is_active, p.id, p.version, p.tools, p.approvals, l.dispatch_lease_seconds, l.max_request_seconds
FROM {tenant} t
LEFT JOIN {tool} l ON l.name = %s
LEFT JOIN {policy} p ON p.tenant_id = t.id AND p.version = (SELECT max(version) FROM {policy} WHERE tenant_id = t.id)
WHERE t.id = %s
"""
#: The intent's id, taken from the attempts' sequence in the same round trip
#: (the event that records the intent names its attempt, so the id is needed
#: before the insert; asking for it on its own cost a round trip per intent).
_RESERVE_ID = ", nextval(pg_get_serial_sequence('{attempt}', 'id'))\nFROM"


def authority_of(tenant_id: int, tool_name: str, *, reserve_attempt_id: bool = False) -> Authority:
    """The tenant, its current policy and ``tool_name``'s timing, read now, in one query.

    ``reserve_attempt_id``: on PostgreSQL, also take the next attempt id
    (an intent refused or found recorded already leaves a gap in the ids,
    as any rolled-back insert does)."""
    sql = _AUTHORITY_SQL.format(tenant=Tenant._meta.db_table, policy=Policy._meta.db_table, tool=Tool._meta.db_table)
    reserve = reserve_attempt_id and connection.vendor == "postgresql"
    if reserve:
        sql = sql.replace("\nFROM", _RESERVE_ID.format(attempt=Attempt._meta.db_table), 1)
    with connection.cursor() as cursor:
        cursor.execute(sql, [tool_name, tenant_id])
        row = cursor.fetchone()
    if row is None:
        return Authority(None, None, timing(None, None))
    attempt_id = row[8] if reserve else None
    slug, is_active, policy_id, version, tools, approvals, lease, max_request = row[:8]
    tenant = Tenant(pk=tenant_id, slug=slug, is_active=bool(is_active))
    policy = None
    if policy_id is not None:
        policy = Policy(pk=policy_id, tenant_id=tenant_id, version=version)
        policy.tools = json.loads(tools) if isinstance(tools, str | bytes) else tools
        policy.approvals = json.loads(approvals) if isinstance(approvals, str | bytes) else approvals
        policy._state.adding = False
    return Authority(tenant, policy, timing(lease, max_request), attempt_id)


def dispatch_standing(attempt: Attempt, *, original: Attempt | None = None) -> tuple[Standing, Timing]:
    """:func:`standing_of`, plus the tool's timing, read in one query (it runs before every dispatch)."""
    now = authority_of(attempt.tenant_id, attempt.tool_name)
    if now.tenant is None:
        raise Tenant.DoesNotExist(f"tenant {attempt.tenant_id} of attempt #{attempt.pk} does not exist")
    return _compare(attempt, now.tenant, now.policy, original), now.timing


def authorize(
    tenant: Tenant, policy: Policy | None, tool_name: str, scopes: frozenset[str] | None = None
) -> frozenset[str]:
    """The one authority check: the scopes a call of ``tool_name`` in
    ``tenant`` may use under ``policy`` (``scopes``: those asked for, which
    must be within them; None: all it allows). Raises the named error that
    says what does not hold: the tenant is inactive, has no policy, the tool
    is not allowed, or a scope is not."""
    if not tenant.is_active:
        raise TenantInactive(TenantInactive.MESSAGE.format(tenant=tenant.slug))
    if policy is None:
        raise NoPolicy(NoPolicy.MESSAGE.format(tenant=tenant.slug))
    allowed = policy.scopes_for(tool_name)
    if allowed is None:
        raise ToolNotAllowed(ToolNotAllowed.MESSAGE.format(tool=tool_name, version=policy.version, tenant=tenant.slug))
    wanted = allowed if scopes is None else scopes
    if not wanted <= allowed:
        raise ScopeNotAllowed(
            ScopeNotAllowed.MESSAGE.format(
                scopes=scope_string(wanted - allowed),
                tool=tool_name,
                version=policy.version,
                allowed=scope_string(allowed) or "none",
            )
        )
    return wanted


def _compare(attempt: Attempt, tenant: Tenant, policy: Policy | None, original: Attempt | None) -> Standing:
    changes: list[str] = []
    if original is not None and original.tenant_id != attempt.tenant_id:
        changes.append(f"tenant differs from the original attempt's (tenant {original.tenant_id})")
    try:
        authorize(tenant, policy, attempt.tool_name, attempt.scopes)
    except TenantInactive as exc:
        changes.append(str(exc))
    except LedgerError as exc:
        changes.append(f"{exc} (attempt recorded under v{attempt.policy_version})")
    if original is not None:
        wider = attempt.scopes - original.scopes
        if wider:
            changes.append(f"scope {scope_string(wider)} is wider than the original attempt's")
    return Standing(tuple(changes), policy)

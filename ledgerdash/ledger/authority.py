"""Who may do what, right now: the tenant's current policy.

Every dispatch, every retry and every approval asks these questions again
rather than trusting what was true when the intent was recorded: recovery
must not apply yesterday's authority to today's task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jmespath
from django.conf import settings
from django.db import connection
from jmespath.exceptions import JMESPathError

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
    allowed, its credential scope being within what the tool may use, and,
    for a call no approver has let through, the policy not holding this
    call for approval; for one an approver let through, the policy not
    holding it by a rule the approval was not given under (``held_again``:
    it waits for a fresh approval, see :func:`held_again`). The policy's version number alone is not authority:
    a new version that leaves what it would do with this call as it was (it
    added another tool, say) changes nothing this attempt relies on, so it
    does not count as a change. Every dispatch and approval records the
    version it was re-checked under.
    """

    changes: tuple[str, ...]
    policy: Policy | None
    #: Why the current policy holds an approved call again (:func:`held_again`): "" when the approval stands.
    held_again: str = ""

    @property
    def holds(self) -> bool:
        return not self.changes and not self.held_again

    @property
    def refusals(self) -> tuple[str, ...]:
        """Everything that keeps the attempt from being sent as it is, in words."""
        return self.changes + ((self.held_again,) if self.held_again else ())


def standing_of(attempt: Attempt, *, original: Attempt | None = None, approving: bool = False) -> Standing:
    """Compare ``attempt``'s recorded authority with the tenant's current one.

    With ``original`` (the attempt a linked retry re-tries), also refuse a
    scope wider than the original's and a tenant other than the original's.
    ``approving``: an approver is letting the attempt through now, which
    meets any approval the policy asks for.
    """
    authority = authority_of(attempt.tenant_id, attempt.tool_name)
    return standing_under(attempt, authority, original=original, approving=approving)


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
    #: The tool row's lease, request time and claim_with_intent as stored (all None: no row).
    tool_row: tuple[float | None, float | None, bool | None] = (None, None, None)

    @property
    def claims_with_intent(self) -> bool:
        """Whether the tool's intent and dispatch claim commit together (``Tool.claim_with_intent``)."""
        return bool(self.tool_row[2])


#: One round trip for the questions every intent and every dispatch asks.
#: Plain SQL (SQLite and PostgreSQL alike): on the hot path, compiling the
#: equivalent ORM query cost more than running it.
_AUTHORITY_SQL = """
SELECT t.slug, t.is_active, p.id, p.version, p.tools, p.approvals, l.dispatch_lease_seconds, l.max_request_seconds,
       l.claim_with_intent, p.created_at
FROM {tenant} t
LEFT JOIN {tool} l ON l.name = %s
LEFT JOIN {policy} p ON p.tenant_id = t.id AND p.version = (SELECT max(version) FROM {policy} WHERE tenant_id = t.id)
WHERE t.id = %s
"""


def authority_of(tenant_id: int, tool_name: str) -> Authority:
    """The tenant, its current policy and ``tool_name``'s timing, read now, in one query."""
    sql = _AUTHORITY_SQL.format(tenant=Tenant._meta.db_table, policy=Policy._meta.db_table, tool=Tool._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [tool_name, tenant_id])
        row = cursor.fetchone()
    if row is None:
        return Authority(None, None, timing(None, None))
    slug, is_active, policy_id, version, tools, approvals, lease, max_request, claim, policy_created = row
    tenant = Tenant(pk=tenant_id, slug=slug, is_active=bool(is_active))
    policy = None
    if policy_id is not None:
        policy = Policy(pk=policy_id, tenant_id=tenant_id, version=version, created_at=policy_created)
        policy.tools = json.loads(tools) if isinstance(tools, str | bytes) else tools
        policy.approvals = json.loads(approvals) if isinstance(approvals, str | bytes) else approvals
        policy._state.adding = False
    claim = None if claim is None else bool(claim)
    return Authority(tenant, policy, timing(lease, max_request), (lease, max_request, claim))


def standing_under(
    attempt: Attempt, authority: Authority, *, original: Attempt | None = None, approving: bool = False
) -> Standing:
    """:func:`standing_of` against ``authority`` (read now, or remembered)."""
    if authority.tenant is None:
        raise Tenant.DoesNotExist(f"tenant {attempt.tenant_id} of attempt #{attempt.pk} does not exist")
    return _compare(attempt, authority.tenant, authority.policy, original, approved=approving)


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


def _compare(
    attempt: Attempt, tenant: Tenant, policy: Policy | None, original: Attempt | None, *, approved: bool
) -> Standing:
    changes: list[str] = []
    again = ""
    if original is not None and original.tenant_id != attempt.tenant_id:
        changes.append(f"tenant differs from the original attempt's (tenant {original.tenant_id})")
    try:
        authorize(tenant, policy, attempt.tool_name, attempt.scopes)
    except TenantInactive as exc:
        changes.append(str(exc))
    except LedgerError as exc:
        changes.append(f"{exc} (attempt recorded under v{attempt.policy_version})")
    else:
        if approved:
            held = ""
        elif attempt.approved_at is not None:
            again = held_again(attempt, policy)
            held = ""
        else:
            held = approval_needed(policy, attempt.tool_name, attempt.args)
        if held:
            changes.append(
                f"{held}, and no approver let this call through (attempt recorded under v{attempt.policy_version})"
            )
    if original is not None:
        wider = attempt.scopes - original.scopes
        if wider:
            changes.append(f"scope {scope_string(wider)} is wider than the original attempt's")
    return Standing(tuple(changes), policy, again)


def hold_of(policy: Any, tool_name: str, args: Any) -> str | None:
    """The rule by which ``policy`` holds a call of ``tool_name`` with ``args``
    for an approver: the tool's approval condition ("" when it holds every
    call), or None when it does not hold this call."""
    if not approval_needed(policy, tool_name, args):
        return None
    return str((getattr(policy, "approvals", None) or {}).get(tool_name) or "").strip()


def held_again(attempt: Attempt, policy: Any) -> str:
    """Why ``policy`` (the current one) holds ``attempt`` again although an
    approver let it through, or "" when the approval stands.

    An approval is bound to what it approved: the policy version it was
    given under and the rule by which that version held the call
    (``approved_hold``). The current policy is no stricter for this call
    when it does not hold it, or holds it by that very rule (the same
    condition of the tool); holding it by any other rule (every call, as a
    freeze does; another condition, a lower threshold say; or at all, where
    the approval's version did not) asks for a fresh approval. Conditions
    are compared as written, not by what they mean: one that reads
    differently is another rule."""
    if attempt.approved_at is None:
        return ""
    now = hold_of(policy, attempt.tool_name, attempt.args)
    if now is None or now == attempt.approved_hold:
        return ""
    under = f"v{attempt.approved_policy_version}" if attempt.approved_policy_version else "an earlier version"
    if attempt.approved_hold is None:
        then = "which did not hold it"
    elif attempt.approved_hold == "":
        then = "which held every call"
    else:
        then = f"which held it when {attempt.approved_hold}"
    return f"{approval_needed(policy, attempt.tool_name, attempt.args)}; its approval was given under {under}, {then}"


def approval_needed(policy: Any, tool_name: str, args: Any) -> str:
    """Why a call of ``tool_name`` with ``args`` must wait for an approver
    before it is sent under ``policy``, or "" when it need not.

    The policy's ``approvals`` name the tool with a JMESPath condition over
    the arguments (empty: every call). The condition decides only when it
    yields true or false; anything else (null, because a field is missing or
    of another type; a number; a list) cannot tell, and an undecided
    condition waits for approval: a risky call is never let through by a
    typo or a string where a number was expected.
    """
    approvals = getattr(policy, "approvals", None) or {}
    if tool_name not in approvals:
        return ""
    condition = str(approvals[tool_name] or "").strip()
    where = f"policy v{policy.version} requires approval for {tool_name}"
    if not condition:
        return where
    try:
        result = jmespath.search(condition, args)
    except (JMESPathError, TypeError, ValueError) as exc:
        # e.g. a string compared with a number: the condition cannot tell.
        return f"{where} when {condition}, and the condition could not be evaluated over these arguments ({exc})"
    if result is True:
        return f"{where} when {condition}"
    if result is False:
        return ""
    return f"{where} when {condition}, and the condition did not yield true or false for these arguments"

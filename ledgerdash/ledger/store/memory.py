"""The authority this process read last for a tenant and tool, kept for the
next intent or dispatch of that tool.

An agent's calls ask the same question again and again: is the tenant
active, which policy is current, what is the tool's timing. Where the
change is one autocommitted statement, the remembered answer is used
without a round trip and the change carries a guard: the server makes it
only if that authority is still the current one at that very moment (a
stricter check than a read before the write, which a policy change could
follow). When the guard fails, or the remembered authority would refuse,
the caller acts again under the authority read now: a refusal always rests
on a read made now.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection

from ledgerdash.ledger.authority import Authority, authority_of
from ledgerdash.ledger.errors import LedgerError
from ledgerdash.ledger.models import Policy, Tenant, Tool
from ledgerdash.ledger.store.statements import Guard

_GUARD_SQL = """EXISTS (
    SELECT FROM {tenant} t LEFT JOIN {tool} l ON l.name = %s
    WHERE t.id = %s AND t.is_active
      AND (SELECT (p.id, p.created_at) FROM {policy} p WHERE p.tenant_id = t.id ORDER BY p.version DESC LIMIT 1)
          = (%s::bigint, %s::timestamptz)
      AND l.dispatch_lease_seconds IS NOT DISTINCT FROM %s::double precision
      AND l.max_request_seconds IS NOT DISTINCT FROM %s::double precision
      AND l.claim_with_intent IS NOT DISTINCT FROM %s::boolean
)"""


#: (database, tenant id, tool name) -> the authority this process read last.
_remembered: dict[tuple[str, int, str], Authority] = {}


def forget() -> None:
    """Drop every authority this process remembers (its database was replaced)."""
    _remembered.clear()


def guard_of(authority: Authority, tool_name: str) -> Guard:
    """A SQL condition, with its parameters, that holds exactly while
    ``authority`` is still the tenant's current authority for ``tool_name``:
    the tenant active, the same newest policy row (versions are final, so
    the same row says the same; its id and creation time name it, even
    across a restore that hands ids out again), the tool's timing and claim
    setting as read."""
    assert authority.tenant is not None
    assert authority.policy is not None
    sql = _GUARD_SQL.format(tenant=Tenant._meta.db_table, policy=Policy._meta.db_table, tool=Tool._meta.db_table)
    return sql, [tool_name, authority.tenant.pk, authority.policy.pk, authority.policy.created_at, *authority.tool_row]


def under_authority[T](
    tenant_id: int, tool_name: str, act: Callable[[Authority, Guard | None], T | None], *, remember: bool
) -> T | None:
    """``act`` under the tenant's authority for ``tool_name``: first under the
    one this process remembers (when ``remember``), with the guard its
    write must carry; when that refuses (``act`` raised) or wrote nothing
    (``act`` returned None), again under the authority read now, without a
    guard, whose answer stands."""
    if not remember:
        return act(authority_of(tenant_id, tool_name), None)
    key = (str(connection.settings_dict["NAME"]), tenant_id, tool_name)
    remembered = _remembered.get(key)
    if remembered is not None:
        try:
            result = act(remembered, guard_of(remembered, tool_name))
        except LedgerError:
            result = None  # refused on what this process remembered: ask what holds now
        if result is not None:
            return result
    read = authority_of(tenant_id, tool_name)
    if read.tenant is not None and read.policy is not None:
        _remembered[key] = read
    else:
        _remembered.pop(key, None)
    return act(read, None)

"""What changed between an attempt and the linked attempt that re-tries it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ledgerdash.ledger.models import Attempt


@dataclass(frozen=True)
class Change:
    what: str
    before: str
    after: str


@dataclass(frozen=True)
class Diff:
    parent: Attempt
    child: Attempt
    changes: list[Change]

    @property
    def same(self) -> bool:
        return not self.changes


def as_json(value: Any) -> str:
    """JSON for people to read. The text is attacker-controlled: templates
    autoescape it like any other string, it is never marked safe."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _args_changes(before: Any, after: Any) -> list[Change]:
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [] if before == after else [Change("arguments", as_json(before), as_json(after))]
    changes = []
    for key in sorted(set(before) | set(after)):
        old = as_json(before[key]) if key in before else ""
        new = as_json(after[key]) if key in after else ""
        if key not in before or key not in after or before[key] != after[key]:
            changes.append(Change(f"argument {key}", old, new))
    return changes


def _scope_change(before: frozenset[str], after: frozenset[str]) -> Change:
    """One row with each side's whole scope, as it is: a row per scope left
    one side empty, which read as "the retry has no scope" when it had
    another one. What was dropped or added is named beside it."""
    dropped = " ".join(sorted(before - after))
    added = " ".join(sorted(after - before))
    if not added:
        what = f"credential scope (narrowed: {dropped} dropped)"
    elif not dropped:
        what = f"credential scope (widened: {added} added)"
    else:
        what = f"credential scope ({dropped} dropped, {added} added)"
    return Change(what, " ".join(sorted(before)), " ".join(sorted(after)))


def diff(parent: Attempt, child: Attempt) -> Diff:
    """Arguments (key by key), their hash, policy version, tenant, credential
    scope, tool and provider key: what a reviewer must see before letting a
    retry go out in place of its parent."""
    changes = _args_changes(parent.args, child.args)
    if parent.args_hash != child.args_hash:
        changes.append(Change("args hash", parent.args_hash, child.args_hash))
    if parent.policy_version != child.policy_version:
        changes.append(Change("policy version", f"v{parent.policy_version}", f"v{child.policy_version}"))
    if parent.tenant_id != child.tenant_id:
        changes.append(Change("tenant", str(parent.tenant_id), str(child.tenant_id)))
    if parent.scopes != child.scopes:
        changes.append(_scope_change(parent.scopes, child.scopes))
    if parent.tool_name != child.tool_name:
        changes.append(Change("tool", parent.tool_name, child.tool_name))
    if parent.provider_key != child.provider_key:
        changes.append(Change("provider key", parent.provider_key, child.provider_key))
    return Diff(parent, child, changes)

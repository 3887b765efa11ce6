"""Configuration as code: tenants, their policies, members, on-call shifts,
credential bindings and notifications, and the tools, described in one TOML
file (``manage.py ledger_config``; see docs/configuration.md).

A module for each step:

- :mod:`.parse` (:func:`parse`): the file into the desired state, its shape
  and types checked by pydantic models (:mod:`.schema`), then its values by
  the models' own validators; every problem is named by its place in the
  file (``tenants.acme.policy.tools."mail.send"``);
- :mod:`.plan` (:func:`make_plan`): the desired state compared with the
  database: what would be created or changed, what is already so, and what
  the database has that the file does not (kept: nothing is ever deleted),
  each row checked by its model's validators; it writes nothing;
- :mod:`.apply` (:func:`apply`): the plan's writes, in one transaction, each
  the way the dashboard makes it, so each is an event in the affected
  tenant's chain: the configuration rows record their own
  (:mod:`ledgerdash.ledger.configuration`), a policy is the next version
  (:func:`~ledgerdash.ledger.policies.policy_publish`, only when its tools
  or approvals differ), notification channels and rules go through
  :mod:`ledgerdash.notify.services`;
- :mod:`.export` (:func:`export`): the database's configuration in the same
  format; an export applied at once changes nothing.

Secrets are never in the file: a tool's headers reference them as
``${NAME}``, and a tenant binds a name to the name of its own secret.
"""

from __future__ import annotations

from ledgerdash.ledger.config.apply import apply
from ledgerdash.ledger.config.errors import ConfigError
from ledgerdash.ledger.config.export import current, export
from ledgerdash.ledger.config.parse import Desired, parse, parse_file
from ledgerdash.ledger.config.plan import Plan, Step, make_plan

__all__ = [
    "ConfigError",
    "Desired",
    "Plan",
    "Step",
    "apply",
    "current",
    "export",
    "make_plan",
    "parse",
    "parse_file",
]

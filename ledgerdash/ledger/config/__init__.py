"""Configuration as code: tenants, their policies, members, on-call shifts,
credential bindings and notifications, and the tools, described in one TOML
file (``manage.py ledger_config``; see docs/configuration.md).

Three steps: :func:`parse` reads the file into the desired state (its
shape and types checked by pydantic models, :mod:`.schema`, then its values
by the models' own validators, each problem named by where in the file it
is); :func:`make_plan` compares it with the database and lists what
would be created or changed, what is already so, and what the database has
that the file does not (kept: nothing is ever deleted), checking each row
with the models' own validators; :func:`apply` makes those changes, in one
transaction. Every change is written the way the dashboard writes it, so
each is an event in the affected tenant's chain: the configuration rows
record their own (:mod:`ledgerdash.ledger.configuration`), a policy is the
next version (:func:`~ledgerdash.ledger.policies.policy_publish`, only when
its tools or approvals differ), notification channels and rules go through
:mod:`ledgerdash.notify.services`.

Secrets are never in the file: a tool's headers reference them as
``${NAME}``, and a tenant binds a name to the name of its own secret.
:func:`export` writes the database's configuration in the same format; an
export applied at once changes nothing.
"""

from __future__ import annotations

from ledgerdash.ledger.config.errors import ConfigError
from ledgerdash.ledger.config.export import current, export
from ledgerdash.ledger.config.parse import Desired, parse, parse_file
from ledgerdash.ledger.config.plan import Plan, Step, apply, make_plan

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

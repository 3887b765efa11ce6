"""A deterministic simulation of the whole protocol (``manage.py simulate``).

The ledger's real code (the moves and rules, the recording wrapper's steps,
the reconciler's decisions, approvals, heartbeats, late reports, policy
changes) runs against simulated agents, providers, reconcilers and people.
Only time, the network and the providers are simulated: a virtual clock
drives every lease, landing time, back-off and deadline, and a seeded
scheduler chooses every interleaving and every fault. The protocol's
invariants (``docs/protocol.md``) are checked after every step; a failing
seed replays exactly.

:mod:`.world` the clock and the scheduler; :mod:`.provider` the providers,
the network and the adapter simulated tools use; :mod:`.scenario` the world
every run starts from and what a seed draws; :mod:`.actors` agents and
reconcilers; :mod:`.people` people and the policy author;
:mod:`.invariants` the checks; :mod:`.database` the run's own databases;
:mod:`.runner` a run, and shrinking a failing one; :mod:`.batch` a range of
seeds, in one process or spread over several.
"""

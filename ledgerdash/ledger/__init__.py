"""The ledger: every side effect an agent performs, recorded before it happens.

Agent-facing API: :mod:`ledgerdash.ledger.recording`. State changes:
:mod:`ledgerdash.ledger.transitions` (nothing else writes ``Attempt.state``).
"""

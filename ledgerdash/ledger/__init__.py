"""The ledger: every side effect an agent performs, recorded before it happens.

Agent-facing API: :mod:`ledgerdash.ledger.recording`. State changes:
:mod:`ledgerdash.ledger.moves` (nothing else writes ``Attempt.state``),
written through :mod:`ledgerdash.ledger.store`.
"""

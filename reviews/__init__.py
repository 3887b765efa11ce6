"""The human side of the ledger: queues, ownership, approvals, exports."""

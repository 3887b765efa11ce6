"""Notifications through an outbox: see :mod:`ledgerdash.notify.outbox`."""

"""Provider adapters: how the ledger dispatches a tool call and looks an
effect up afterwards. See :mod:`.base` for the interface, :mod:`.http` for
the generic adapter a user configures, :mod:`.registry` for how a tool name
finds its adapter."""

"""Provider adapters: how the ledger dispatches a tool call and looks an
effect up afterwards. See :mod:`.base` for the interface, :mod:`.http` for
the generic adapter a user configures, :mod:`.factory` for how a tool's
configuration becomes its adapter, :mod:`.registry` for how a tool name finds
its adapter."""

"""The crash drill: kill real agents and reconcilers at the points where a
crash can turn a tool call into a duplicate or a lost action, recover, and
prove nothing happened twice and nothing was lost. See :mod:`.runner`."""

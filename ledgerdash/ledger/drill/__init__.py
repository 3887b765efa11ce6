"""The crash drill: kill a real agent at the seed's six points, recover, and
prove nothing happened twice and nothing was lost. See :mod:`.runner`."""

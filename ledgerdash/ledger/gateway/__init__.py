"""The MCP gateway (``manage.py mcp_gateway``): the ledger in front of MCP servers.

:mod:`.config` reads its configuration file, :mod:`.keys` names each call's
side effect, :mod:`.server` fronts the upstreams and records every call.
Needs the ``mcp`` extra (``pip install ledgerdash[mcp]``).
"""

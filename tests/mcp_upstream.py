"""A real upstream MCP server for the gateway's tests, written with the
official SDK. Every effect is appended to the file named by
``UPSTREAM_EFFECTS`` (one JSON line each), so a test counts what happened.

    python -m tests.mcp_upstream stdio
    python -m tests.mcp_upstream http PORT
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

app = MCPServer("ledgerdash-test-upstream")


def _effect(tool: str, **data: Any) -> int:
    """Append one effect and return how many this file holds now."""
    path = os.environ["UPSTREAM_EFFECTS"]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"tool": tool, "upstream": os.environ.get("UPSTREAM_NAME", ""), **data}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    with open(path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


@app.tool()
def send_invoice(invoice_id: str, amount: int) -> dict[str, Any]:
    """Send an invoice (an effect that must happen once)."""
    n = _effect("send_invoice", invoice_id=invoice_id, amount=amount)
    return {"id": f"eff_{n}", "invoice_id": invoice_id, "amount": amount}


@app.tool()
def post_note(text: str) -> str:
    """Post a note (no key template: keyed by the task and its arguments)."""
    n = _effect("post_note", text=text)
    return f"note {n} posted"


@app.tool()
def break_midway(note: str) -> str:
    """Act, then die before answering: the caller cannot know it happened."""
    _effect("break_midway", note=note)
    os._exit(3)


@app.tool()
def slow_send(note: str, seconds: float) -> dict[str, Any]:
    """Take ``seconds`` before acting: longer than the gateway may wait, the call is lost to it."""
    import time

    time.sleep(seconds)
    n = _effect("slow_send", note=note)
    return {"id": f"eff_{n}"}


@app.tool()
def refuse(reason: str) -> str:
    """Answer with the tool's own error (nothing happens)."""
    raise ValueError(reason)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        app.run("streamable-http", port=int(sys.argv[2]))
    else:
        app.run("stdio")

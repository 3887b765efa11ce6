"""LangChain (and LangGraph) tools through the ledger::

    from ledgerdash_client.adapters.langchain import ledger_tool

    send_invoice = ledger_tool(send_invoice, key="invoice:{invoice_id}:send")

The result is a LangChain tool with the same name, description and
arguments: agents, ``bind_tools`` and LangGraph's ``ToolNode`` use it as
before. See :mod:`ledgerdash_client.adapters.base` for what the settings mean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from ledgerdash_client.adapters.base import ledgered


def ledger_tool(
    tool: BaseTool,
    *,
    key: str | Callable[[dict[str, Any]], str],
    scope: str | Iterable[str] | None = None,
    receipt: Callable[[Any], str | None] | None = None,
    ledger: ModuleType | None = None,
    name: str | None = None,
) -> BaseTool:
    """``tool``, every call recorded, dispatched and settled by the ledger
    under the policy's tool name ``name`` (default: the tool's own)."""
    call = ledgered(
        name or tool.name,
        framework="langchain",
        run=lambda arguments: tool.invoke(arguments),
        key=key,
        scope=scope,
        receipt=receipt,
        ledger=ledger,
    )
    return StructuredTool.from_function(
        func=call,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        return_direct=tool.return_direct,
        infer_schema=False,
    )

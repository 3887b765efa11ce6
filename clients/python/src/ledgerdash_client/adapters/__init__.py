"""Ledger tools for agent frameworks: wrap an existing tool object in one
line, and every call the framework makes goes through the ledger.

- :func:`ledgerdash_client.adapters.openai_agents.ledger_function_tool` (OpenAI
  Agents SDK ``FunctionTool``; ``pip install ledgerdash[openai-agents]``)
- :func:`ledgerdash_client.adapters.langchain.ledger_tool` (LangChain / LangGraph
  ``BaseTool``; ``pip install ledgerdash[langchain]``)

Both take the same settings (:func:`ledgerdash_client.adapters.base.ledgered`).
"""

from ledgerdash_client.adapters.base import current_call

__all__ = ["current_call"]

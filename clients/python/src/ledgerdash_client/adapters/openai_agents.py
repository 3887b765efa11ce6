"""OpenAI Agents SDK function tools through the ledger::

    from ledgerdash_client.adapters.openai_agents import ledger_function_tool

    send_invoice = ledger_function_tool(send_invoice, key="invoice:{invoice_id}:send")
    agent = Agent(name="billing", tools=[send_invoice])

The result is a ``FunctionTool`` with the same name, description, schema and
failure policy. Inside the ledger the tool runs without that policy, so a
tool that raised is recorded as such (UNKNOWN, or FAILED on
``PermanentFailure``) before its error message goes to the model as the
SDK would send it. A ledger refusal (unknown, under review, in flight) is
raised, which ends the run: the agent must not call the tool again.

The ledger's steps are synchronous: they run in a worker thread, and the
tool's own coroutine runs there in a loop of its own. See
:mod:`ledgerdash_client.adapters.base` for the settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from agents import FunctionTool
from agents.tool import maybe_invoke_function_tool_failure_error_function
from agents.tool_context import ToolContext

from ledgerdash_client import LedgerClientError
from ledgerdash_client.adapters.base import ledgered


def _refusals(ledger: ModuleType | None) -> tuple[type[BaseException], ...]:
    """What the ledger raises instead of letting a tool run, never handed to
    the model as a tool error: the client's refusals, and the in-process
    ledger's (its module names them in ``REFUSALS``)."""
    return (LedgerClientError, *getattr(ledger, "REFUSALS", ()))


def ledger_function_tool(
    tool: FunctionTool,
    *,
    key: str | Callable[[dict[str, Any]], str],
    scope: str | Iterable[str] | None = None,
    receipt: Callable[[Any], str | None] | None = None,
    ledger: ModuleType | None = None,
    name: str | None = None,
) -> FunctionTool:
    """``tool``, every call recorded, dispatched and settled by the ledger
    under the policy's tool name ``name`` (default: the tool's own)."""
    # A tool made by @function_tool turns its exceptions into messages for the
    # model; the ledger must see them, so it runs the tool's own invoker.
    raw = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)

    async def on_invoke_tool(context: ToolContext[Any], input_json: str) -> Any:
        arguments = json.loads(input_json or "{}")
        if not isinstance(arguments, dict):
            raise ValueError(f"{tool.name} takes a JSON object of arguments, not {input_json[:100]!r}")

        async def invoke(args: dict[str, Any]) -> Any:
            return await raw(context, json.dumps(args))

        def run(args: dict[str, Any]) -> Any:
            return asyncio.run(invoke(args))

        call = ledgered(
            name or tool.name,
            framework="openai-agents",
            run=run,
            key=key,
            scope=scope,
            receipt=receipt,
            ledger=ledger,
        )

        def in_worker() -> Any:
            try:
                return call(**arguments)
            finally:
                _release(ledger)

        try:
            return await asyncio.to_thread(in_worker)
        except _refusals(ledger):
            raise
        except Exception as error:  # the tool's own: recorded by now; the tool's policy says what the model hears
            message = await maybe_invoke_function_tool_failure_error_function(
                function_tool=wrapped, context=context, error=error
            )
            if message is None:
                raise
            return message

    wrapped = dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
    return wrapped


def _release(ledger: ModuleType | None) -> None:
    """The in-process ledger opened a database connection in the pool's
    worker thread: close it, or it would outlive the call idle in a thread
    nobody else uses for the database."""
    if ledger is not None and ledger.__name__ == "ledgerdash.ledger.recording":
        from django.db import connection

        connection.close()

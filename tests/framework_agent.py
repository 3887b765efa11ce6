"""An agent built with a framework (``langchain`` or ``openai-agents``, the
first argument), in a process of its own, for the adapters' crash tests.

It drives the framework with its own scripted model (no network), reaches
the ledger through the HTTP client and the sandbox provider over plain HTTP,
and is configured by its environment (LEDGERDASH_URL, LEDGERDASH_TOKEN,
SANDBOX_URL, E2E_INVOICE, LEDGERDASH_CRASH_AT). Prints one JSON line: what
the tool answered the framework, or what the ledger raised.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
import uuid
from typing import Any

import ledgerdash_client as ledger
from ledgerdash_client.adapters import current_call

KEY = "invoice:{invoice_id}:send"


def send(invoice_id: str, to: str) -> str:
    request = urllib.request.Request(
        os.environ["SANDBOX_URL"] + "/tools/send_email/effects",
        data=json.dumps({"invoice_id": invoice_id, "to": to}).encode(),
        headers={"Idempotency-Key": current_call().key, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.dumps({"message_id": json.loads(response.read())["id"]})


def receipt(answer: str) -> str:
    return str(json.loads(answer)["message_id"])


def with_langchain(arguments: dict[str, Any]) -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    from ledgerdash_client.adapters.langchain import ledger_tool

    @tool
    def send_email(invoice_id: str, to: str) -> str:
        """Email an invoice."""
        return send(invoice_id, to)

    wrapped = ledger_tool(send_email, key=KEY, receipt=receipt)
    call_id = f"call_{uuid.uuid4().hex[:8]}"  # a new id on every run, as a model makes
    model = GenericFakeChatModel(
        messages=iter([AIMessage(content="", tool_calls=[{"name": "send_email", "args": arguments, "id": call_id}])])
    )
    answer = model.invoke([HumanMessage("send the invoice")])
    assert isinstance(answer, AIMessage)
    return wrapped.invoke(answer.tool_calls[0]).content


def with_openai_agents(arguments: dict[str, Any]) -> Any:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    from ledgerdash_client.adapters.openai_agents import ledger_function_tool

    @function_tool
    def send_email(invoice_id: str, to: str) -> str:
        """Email an invoice."""
        return send(invoice_id, to)

    class Scripted(Model):
        turns = [
            ResponseFunctionToolCall(
                type="function_call",
                name="send_email",
                call_id=f"call_{uuid.uuid4().hex[:8]}",
                arguments=json.dumps(arguments),
            ),
            ResponseOutputMessage(
                id="msg_1",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
            ),
        ]

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return ModelResponse(output=[self.turns.pop(0)], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    set_tracing_disabled(True)
    tool = ledger_function_tool(send_email, key=KEY, receipt=receipt)
    agent = Agent(name="billing", tools=[tool], model=Scripted())
    result = Runner.run_sync(agent, "send the invoice")
    [output] = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    return output


def main() -> None:
    run = {"langchain": with_langchain, "openai-agents": with_openai_agents}[sys.argv[1]]
    outcome: dict[str, Any]
    with ledger.task(task_id="framework-run"):
        try:
            outcome = {"answer": run({"invoice_id": os.environ["E2E_INVOICE"], "to": "ap@example.com"})}
        except Exception as exc:
            cause = exc if isinstance(exc, ledger.LedgerClientError) else exc.__cause__
            if not isinstance(cause, ledger.LedgerClientError):
                raise
            outcome = {"raised": type(cause).__name__, "code": cause.code}
    print(json.dumps(outcome, default=str), flush=True)


if __name__ == "__main__":
    main()

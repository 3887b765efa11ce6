"""The framework adapters, each run by the framework with its own scripted
model (no network): an agent's run and a re-run (the model asked again, with
a new tool-call id) make one effect; a call that breaks after the tool acted
is UNKNOWN, and the re-run refuses instead of sending again."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ledgerdash.ledger import recording
from ledgerdash.ledger.errors import OutcomeUnknown
from ledgerdash.ledger.models import Attempt, State, Tenant

pytest.importorskip("langchain_core")
pytest.importorskip("agents")

from agents import Agent, FunctionTool, Runner, function_tool, set_tracing_disabled
from agents.exceptions import UserError
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as langchain_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from ledgerdash_client.adapters import current_call
from ledgerdash_client.adapters.langchain import ledger_tool
from ledgerdash_client.adapters.openai_agents import ledger_function_tool

S = State
KEY = "invoice:{invoice_id}:send"
ARGS = {"invoice_id": "INV-7", "to": "ap@example.com"}


class Provider:
    """Counts effects; can lose its answer after acting, as a dropped connection would."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str]] = []
        self.lose_answer = False

    def send(self, invoice_id: str) -> dict[str, Any]:
        self.effects.append((invoice_id, current_call().key))
        if self.lose_answer:
            raise ConnectionResetError("connection reset by peer")
        return {"sent": invoice_id, "n": len(self.effects)}


@pytest.fixture
def provider() -> Provider:
    return Provider()


# --- LangChain --------------------------------------------------------------------------


def _langchain_tool(provider: Provider) -> BaseTool:
    @langchain_tool
    def send_email(invoice_id: str, to: str) -> dict[str, Any]:
        """Email an invoice."""
        return provider.send(invoice_id)

    return ledger_tool(send_email, key=KEY, scope="email:send", ledger=recording)


def _langchain_run(tool: BaseTool, call_id: str) -> list[BaseMessage]:
    """A minimal agent loop: the model asks for the tool, the tool answers, the model ends."""
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(content="", tool_calls=[{"name": "send_email", "args": ARGS, "id": call_id}]),
                AIMessage(content="done"),
            ]
        )
    )
    messages: list[BaseMessage] = [HumanMessage("send invoice INV-7")]
    with recording.task(tenant="acme", task_id="billing-run"):
        while True:
            answer = model.invoke(messages)
            messages.append(answer)
            if not isinstance(answer, AIMessage) or not answer.tool_calls:
                return messages
            messages.extend(tool.invoke(call) for call in answer.tool_calls)


def test_langchain_a_rerun_replays_the_result(tenant_a: Tenant, provider: Provider) -> None:
    tool = _langchain_tool(provider)
    assert (tool.name, tool.description) == ("send_email", "Email an invoice.")
    first = _langchain_run(tool, "call_1")
    again = _langchain_run(_langchain_tool(provider), "call_2")  # a new process, a new tool-call id
    # The same answer (PostgreSQL's JSON may give the keys in another order).
    assert json.loads(str(first[2].content)) == json.loads(str(again[2].content)) == {"sent": "INV-7", "n": 1}
    assert len(provider.effects) == 1
    attempt = Attempt.objects.get(idempotency_key="invoice:INV-7:send")
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.result == {"sent": "INV-7", "n": 1}
    assert attempt.result_ref == "langchain:send_email"
    assert provider.effects[0][1] == attempt.provider_key  # the tool saw the key for its provider


def test_langchain_a_lost_answer_is_unknown_and_never_sent_again(tenant_a: Tenant, provider: Provider) -> None:
    provider.lose_answer = True
    with pytest.raises(ConnectionResetError):
        _langchain_run(_langchain_tool(provider), "call_1")
    assert Attempt.objects.get(idempotency_key="invoice:INV-7:send").state == S.UNKNOWN
    provider.lose_answer = False
    with pytest.raises(OutcomeUnknown):
        _langchain_run(_langchain_tool(provider), "call_2")
    assert len(provider.effects) == 1


# --- OpenAI Agents SDK --------------------------------------------------------------------


class ScriptedModel(Model):
    """The Agents SDK's model interface, answering from a script: first a call
    of the tool, then a final message."""

    def __init__(self, call_id: str) -> None:
        self.turns = [
            ResponseFunctionToolCall(
                type="function_call", name="send_email", call_id=call_id, arguments=_json(ARGS), id="fc_1"
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

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def _json(value: Any) -> str:
    return json.dumps(value)


def _openai_tool(provider: Provider) -> FunctionTool:
    @function_tool
    def send_email(invoice_id: str, to: str) -> str:
        """Email an invoice."""
        return _json(provider.send(invoice_id))

    return ledger_function_tool(send_email, key=KEY, scope="email:send", ledger=recording)


def _openai_run(tool: FunctionTool, call_id: str) -> Any:
    set_tracing_disabled(True)
    agent = Agent(name="billing", instructions="Send invoices.", tools=[tool], model=ScriptedModel(call_id))
    with recording.task(tenant="acme", task_id="billing-run"):
        return Runner.run_sync(agent, "send invoice INV-7")


def _tool_outputs(result: Any) -> list[Any]:
    return [item.output for item in result.new_items if item.type == "tool_call_output_item"]


# The ledger's steps run in worker threads beside the SDK's event loop: committed
# for real, so on PostgreSQL (SQLite's test database cannot be emptied after).
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_openai_agents_a_rerun_replays_the_result(tenant_a: Tenant, provider: Provider) -> None:
    tool = _openai_tool(provider)
    assert tool.name == "send_email"
    assert tool.params_json_schema["required"] == ["invoice_id", "to"]
    first = _openai_run(tool, "call_1")
    again = _openai_run(_openai_tool(provider), "call_2")
    assert first.final_output == again.final_output == "done"
    assert _tool_outputs(first) == _tool_outputs(again) == ['{"sent": "INV-7", "n": 1}']  # a string: kept as is
    assert len(provider.effects) == 1
    attempt = Attempt.objects.get(idempotency_key="invoice:INV-7:send")
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.result_ref == "openai-agents:send_email"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_openai_agents_a_lost_answer_is_unknown_and_never_sent_again(tenant_a: Tenant, provider: Provider) -> None:
    provider.lose_answer = True
    lost = _openai_run(_openai_tool(provider), "call_1")
    # The model hears the tool's error as the SDK tells it ("try again"); the ledger
    # recorded that nobody knows, and a try again is refused below.
    [told] = _tool_outputs(lost)
    assert told.startswith("An error occurred while running the tool")
    assert Attempt.objects.get(idempotency_key="invoice:INV-7:send").state == S.UNKNOWN
    provider.lose_answer = False
    with pytest.raises(UserError) as refused:  # the SDK ends the run with the ledger's refusal as the cause
        _openai_run(_openai_tool(provider), "call_2")
    assert isinstance(refused.value.__cause__, OutcomeUnknown)
    assert len(provider.effects) == 1


# --- killed mid-call, in a process of its own --------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize("framework", ["langchain", "openai-agents"])
def test_an_agent_killed_after_its_tool_acted_never_acts_again_and_the_rerun_replays(
    live_server: Any, tenant_a: Tenant, sandbox_tools: Any, framework: str
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from ledgerdash.ledger.reconciler import Reconciler
    from ledgerdash_client import crashpoints
    from tests.api_support import issue_token
    from tests.live import PYTHON, ROOT
    from tests.sandboxes import unique_key

    invoice = unique_key("INV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LEDGERDASH_"))}
    env.update(
        LEDGERDASH_URL=live_server.url,
        LEDGERDASH_TOKEN=issue_token(tenant_a),
        SANDBOX_URL=sandbox_tools.url,
        E2E_INVOICE=invoice,
        PYTHONPATH=str(ROOT),
    )

    def agent(crash_at: str | None = None) -> dict[str, Any] | None:
        extra = {crashpoints.ENV: crash_at, "LEDGERDASH_CRASH_WAIT": "0"} if crash_at else {}
        proc = subprocess.run(
            [PYTHON, "-m", "tests.framework_agent", framework],
            cwd=ROOT,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if crash_at:
            assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-3000:])
            return None
        assert proc.returncode == 0, proc.stderr[-3000:]
        outcome: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return outcome

    # Killed after the provider acted, before the outcome was recorded.
    assert agent(crash_at=crashpoints.AFTER_RESPONSE) is None
    attempt = Attempt.objects.get(idempotency_key=f"invoice:{invoice}:send")
    assert attempt.state == S.DISPATCHED
    assert sandbox_tools.count(attempt.provider_key) == 1
    # Restarted while the lease runs: refused, not sent.
    assert agent() == {"raised": "AttemptInFlight", "code": "attempt_in_flight"}
    # Recovery finds the effect at the provider; the next run replays it.
    Attempt.objects.filter(pk=attempt.pk).update(next_check_at=timezone.now() - timedelta(seconds=1))
    Reconciler(label="adapters").run_pass()
    attempt.refresh_from_db()
    assert attempt.state == S.OUTCOME_CONFIRMED
    replayed = agent()
    assert replayed is not None
    assert attempt.provider_request_id in str(replayed["answer"])
    assert sandbox_tools.count(attempt.provider_key) == 1

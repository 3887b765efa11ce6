"""The MCP gateway end to end: a real upstream MCP server process (written
with the SDK, counting its effects in a file), the gateway as its own
process (``manage.py mcp_gateway``), and a real MCP client.

The gateway is killed (SIGKILL, at the crash drill's points) after it
committed the dispatch; started again, the same call never reaches the
upstream a second time.

PostgreSQL only: the gateway process and the test share a database.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from django.utils import timezone

from ledgerdash.ledger.drill.processes import child_environment
from ledgerdash.ledger.events import Actor
from ledgerdash.ledger.gateway.keys import META_ATTEMPT, META_ERROR, META_REPEAT, META_REPLAYED, META_TASK
from ledgerdash.ledger.models import Attempt, State, Tenant, Tool
from ledgerdash.ledger.policies import policy_publish
from ledgerdash.ledger.reconciler import Reconciler
from ledgerdash.processes import stop_group
from ledgerdash_client import crashpoints
from tests.live import PYTHON, ROOT, free_port, running

pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
S = State

TOOLS = {
    "send_invoice": ["payments:charge"],
    "post_note": [],
    "break_midway": [],
    "refuse": [],
    "slow_send": [],
    "remote_send_invoice": ["payments:charge"],
    "remote_post_note": [],
    "remote_break_midway": [],
    "remote_refuse": [],
    "remote_slow_send": [],
}


class Effects:
    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def count(self, tool: str, **match: Any) -> int:
        return sum(1 for e in self.all() if e["tool"] == tool and all(e.get(k) == v for k, v in match.items()))


@pytest.fixture
def tenant(tenant_a: Tenant) -> Tenant:
    policy_publish(tenant=tenant_a, tools=TOOLS, actor=Actor.system("tests"), note="the gateway's tools")
    return tenant_a


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects.jsonl")


def _upstream_env(effects: Effects, name: str) -> dict[str, str]:
    return {"UPSTREAM_EFFECTS": str(effects.path), "UPSTREAM_NAME": name, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def remote_upstream(effects: Effects) -> Iterator[str]:
    """The upstream also served over streamable HTTP, as its own process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    env = {**_upstream_env(effects, "remote"), "DJANGO_SETTINGS_MODULE": ""}
    with running([PYTHON, "-m", "tests.mcp_upstream", "http", str(port)], env=env, url=url):
        yield url


@pytest.fixture
def config(tmp_path: Path, effects: Effects, remote_upstream: str) -> Path:
    path = tmp_path / "gateway.toml"
    env = ", ".join(f'{k} = "{v}"' for k, v in _upstream_env(effects, "local").items())
    path.write_text(
        f"""
tenant = "acme"
task_id = "gateway-tests"

[[upstreams]]
name = "local"
command = ["{PYTHON}", "-m", "tests.mcp_upstream", "stdio"]
env = {{ {env} }}
cwd = "{ROOT}"

[[upstreams]]
name = "remote"
url = "{remote_upstream}"
prefix = "remote_"

[tools.send_invoice]
key = "invoice:{{invoice_id}}:send"
scope = ["payments:charge"]
request_id = "structuredContent.id"
timeout = 20

[tools.remote_send_invoice]
key = "remote-invoice:{{invoice_id}}:send"
scope = ["payments:charge"]
"""
    )
    return path


def _gateway_env(crash_at: str | None = None) -> dict[str, str]:
    env = child_environment()
    if crash_at:
        env.update({crashpoints.ENV: crash_at, "LEDGERDASH_CRASH_WAIT": "0"})
    return env


def _dump(result: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _calls(target: Any, *calls: tuple[str, dict[str, Any], dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Connect one MCP client, make the calls in order, return each result (or the error raised)."""

    async def connect() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:
            async with Client(target, cache=None, read_timeout_seconds=60) as client:
                for name, arguments, meta in calls:
                    try:
                        out.append(_dump(await client.call_tool(name, arguments, meta=meta)))  # type: ignore[arg-type]
                    except Exception as exc:
                        out.append({"raised": type(exc).__name__, "message": str(exc)})
        except Exception as exc:  # the server died: the client's own tasks fail too
            if len(out) < len(calls):
                out.append({"raised": type(exc).__name__, "message": str(exc)})
        return out

    return anyio.run(connect)


def _stdio_gateway(config: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=PYTHON, args=["manage.py", "mcp_gateway", str(config)], env=_gateway_env(), cwd=str(ROOT)
    )


def _error_code(result: dict[str, Any]) -> str:
    return str(result.get("_meta", {}).get(META_ERROR, {}).get("code", ""))


def test_it_lists_every_upstreams_tools_as_its_own(tenant: Tenant, config: Path) -> None:
    async def listing() -> list[str]:
        async with Client(_stdio_gateway(config), cache=None) as client:
            return sorted(t.name for t in (await client.list_tools()).tools)

    names = ["send_invoice", "post_note", "break_midway", "slow_send", "refuse"]
    assert anyio.run(listing) == sorted([*names, *(f"remote_{name}" for name in names)])


def test_a_resent_call_replays_and_a_deliberate_repeat_is_sent(tenant: Tenant, config: Path, effects: Effects) -> None:
    invoice = {"invoice_id": "INV-1", "amount": 40}
    first, again, other_amount, repeat, note, note_again, note_repeat, remote = _calls(
        _stdio_gateway(config),
        ("send_invoice", invoice, None),
        ("send_invoice", invoice, None),
        ("send_invoice", {**invoice, "amount": 41}, None),
        ("send_invoice", invoice, {META_REPEAT: "2"}),
        ("post_note", {"text": "hello"}, None),
        ("post_note", {"text": "hello"}, None),
        ("post_note", {"text": "hello"}, {META_TASK: "another-run"}),
        ("remote_send_invoice", invoice, None),
    )
    attempt = Attempt.objects.get(idempotency_key="invoice:INV-1:send", parent__isnull=True)
    assert attempt.state == S.OUTCOME_CONFIRMED
    assert attempt.provider_request_id == first["structuredContent"]["id"]
    assert attempt.result_ref == "mcp://local/send_invoice"
    assert attempt.credential_scope == "payments:charge"
    assert first["_meta"][META_ATTEMPT] == attempt.pk
    assert META_REPLAYED not in first["_meta"]
    # Resent: the recorded result, said to be a replay; the upstream is not called.
    assert again["structuredContent"] == first["structuredContent"]
    assert again["_meta"][META_REPLAYED] is True
    # Same invoice, other amount: never sent, a linked attempt for review.
    assert _error_code(other_amount) == "idempotency_key_reused"
    assert Attempt.objects.get(pk=other_amount["_meta"][META_ERROR]["attempt_id"]).state == S.MANUAL_REVIEW
    # A deliberate repeat names itself and is sent.
    assert META_REPLAYED not in repeat["_meta"]
    assert effects.count("send_invoice", invoice_id="INV-1", upstream="local") == 2
    # No template: the task and the arguments name the effect.
    assert META_REPLAYED not in note["_meta"]
    assert note_again["_meta"][META_REPLAYED] is True
    assert META_REPLAYED not in note_repeat["_meta"]
    assert effects.count("post_note") == 2
    assert {a.task_id for a in Attempt.objects.filter(tool_name="post_note")} == {"gateway-tests", "another-run"}
    # The streamable HTTP upstream, under its prefix and its own key.
    assert not remote["isError"]
    assert effects.count("send_invoice", upstream="remote") == 1
    assert Attempt.objects.get(idempotency_key="remote-invoice:INV-1:send").state == S.OUTCOME_CONFIRMED


def test_policy_errors_and_broken_upstreams_are_recorded_not_hidden(
    tenant: Tenant, config: Path, effects: Effects
) -> None:
    policy_publish(
        tenant=tenant,
        tools={k: v for k, v in TOOLS.items() if k != "remote_post_note"},
        actor=Actor.system("tests"),
    )
    not_allowed, refused, broke, after = _calls(
        _stdio_gateway(config),
        ("remote_post_note", {"text": "x"}, None),
        ("refuse", {"reason": "no such customer"}, None),
        ("break_midway", {"note": "half"}, None),
        ("send_invoice", {"invoice_id": "INV-2", "amount": 1}, None),
    )
    assert _error_code(not_allowed) == "tool_not_allowed"
    assert not Attempt.objects.filter(tool_name="remote_post_note").exists()
    assert effects.count("post_note") == 0
    # The tool's own error: a definitive answer, FAILED.
    assert refused["isError"] is True
    assert Attempt.objects.get(tool_name="refuse").state == S.FAILED
    # The upstream died mid-call after acting: UNKNOWN, for recovery.
    assert _error_code(broke) == "outcome_unknown"
    assert Attempt.objects.get(tool_name="break_midway").state == S.UNKNOWN
    assert effects.count("break_midway") == 1
    # The gateway reconnected to a fresh upstream process for the next call.
    assert after["isError"] is False
    assert effects.count("send_invoice", invoice_id="INV-2") == 1


def _http_gateway(config: Path, crash_at: str | None = None) -> Any:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    cmd = [PYTHON, "manage.py", "mcp_gateway", str(config), "--http", "--port", str(port)]
    return url, running(cmd, env=_gateway_env(crash_at), url=url)


def _expire_and_recover(key: str) -> None:
    Attempt.objects.filter(idempotency_key=key).update(next_check_at=timezone.now() - timedelta(seconds=1))
    Reconciler(label="gateway-tests").run_pass()
    Reconciler(label="gateway-tests").run_pass()


@pytest.mark.parametrize("point", [crashpoints.BEFORE_SEND, crashpoints.AFTER_RESPONSE])
def test_killed_after_dispatch_the_resent_call_never_repeats_the_effect(
    tenant: Tenant, config: Path, effects: Effects, point: str
) -> None:
    invoice = {"invoice_id": "INV-9", "amount": 90}
    key = "invoice:INV-9:send"
    url, gateway = _http_gateway(config, crash_at=point)
    with gateway as proc:
        [lost] = _calls(url, ("send_invoice", invoice, None))
        assert proc.wait(timeout=30) == -9  # SIGKILL at the crash point
    assert "raised" in lost or lost.get("isError")
    sent = 1 if point == crashpoints.AFTER_RESPONSE else 0
    assert effects.count("send_invoice", invoice_id="INV-9") == sent
    attempt = Attempt.objects.get(idempotency_key=key)
    assert attempt.state == S.DISPATCHED

    url, gateway = _http_gateway(config)
    with gateway:
        # The lease still runs: the call may be on its way; the upstream is not called again.
        [in_flight] = _calls(url, ("send_invoice", invoice, None))
        assert _error_code(in_flight) == "attempt_in_flight"
        # Recovery: no adapter can look an MCP call up, so people decide.
        _expire_and_recover(key)
        attempt.refresh_from_db()
        assert attempt.state == S.MANUAL_REVIEW
        assert attempt.owner_id is not None
        [review] = _calls(url, ("send_invoice", invoice, None))
        assert _error_code(review) == "under_review"
    assert effects.count("send_invoice", invoice_id="INV-9") == sent


def test_killed_after_the_intent_the_resent_call_sends_once(tenant: Tenant, config: Path, effects: Effects) -> None:
    invoice = {"invoice_id": "INV-5", "amount": 5}
    url, gateway = _http_gateway(config, crash_at=crashpoints.AFTER_INTENT)
    with gateway as proc:
        _calls(url, ("send_invoice", invoice, None))
        assert proc.wait(timeout=30) == -9
    assert Attempt.objects.get(idempotency_key="invoice:INV-5:send").state == S.INTENT_RECORDED
    url, gateway = _http_gateway(config)
    with gateway:
        [sent, replayed] = _calls(url, ("send_invoice", invoice, None), ("send_invoice", invoice, None))
    assert sent["isError"] is False
    assert replayed["_meta"][META_REPLAYED] is True
    assert effects.count("send_invoice", invoice_id="INV-5") == 1


def test_a_bad_configuration_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('tenant = "acme"\n[[upstreams]]\nname = "x"\n')
    result = subprocess.run(
        [PYTHON, "manage.py", "mcp_gateway", str(path)],
        cwd=ROOT,
        env={**os.environ, "DEBUG": "true"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "give exactly one of command (stdio) or url (streamable HTTP)" in result.stderr


def test_the_gateway_waits_no_longer_than_the_tools_maximum_request_time(
    tenant: Tenant, config: Path, effects: Effects
) -> None:
    # The ledger counts on no request landing later than 2 s after the gateway gave up on it.
    Tool.objects.create(name="slow_send", config={"lookup_url": "http://127.0.0.1:9/x"}, max_request_seconds=2)
    [lost] = _calls(_stdio_gateway(config), ("slow_send", {"note": "n", "seconds": 8}, None))
    assert _error_code(lost) == "outcome_unknown"
    assert "no answer from the upstream within 2 s" in lost["_meta"][META_ERROR]["message"]
    assert Attempt.objects.get(tool_name="slow_send").state == S.UNKNOWN


def test_a_timeout_longer_than_the_tools_maximum_request_time_is_refused_at_start(tenant: Tenant, config: Path) -> None:
    Tool.objects.create(name="send_invoice", config={"lookup_url": "http://127.0.0.1:9/x"}, max_request_seconds=6)
    result = _check(config)
    assert result.returncode != 0
    assert (
        "tools.send_invoice.timeout: 20 s exceeds the maximum request time of the ledger tool send_invoice (6 s)"
        in (result.stderr)
    )


def _check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "manage.py", "mcp_gateway", str(config), "--check"],
        cwd=ROOT,
        env=_gateway_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_refuses_a_tenant_the_ledger_does_not_have(tenant: Tenant, config: Path) -> None:
    config.write_text(config.read_text().replace('tenant = "acme"', 'tenant = "acme-typo"'))
    result = _check(config)
    assert result.returncode != 0
    assert "tenant: no tenant 'acme-typo' in this ledger" in result.stderr


def test_check_names_the_configured_tools_the_policy_does_not_allow(tenant: Tenant, config: Path) -> None:
    config.write_text(config.read_text() + '\n[tools.not_allowed_yet]\nkey = "x:{id}"\n')
    result = _check(config)
    assert result.returncode == 0, result.stderr
    assert "note: tools.not_allowed_yet: tool not_allowed_yet is not allowed by policy" in result.stdout
    assert "note: tools.send_invoice" not in result.stdout


def test_arguments_the_tools_schema_refuses_are_refused_before_anything_is_recorded(
    tenant: Tenant, config: Path, effects: Effects
) -> None:
    wrong = {"invoice_id": "INV-9", "amount": "ten"}
    right = {"invoice_id": "INV-9", "amount": 10}
    [refused, sent] = _calls(_stdio_gateway(config), ("send_invoice", wrong, None), ("send_invoice", right, None))
    assert _error_code(refused) == "invalid_args"
    message = refused["_meta"][META_ERROR]["message"]
    assert "amount" in message
    assert "nothing was recorded or sent" in message
    assert sent["isError"] is False  # the corrected call is not taken for the key reused
    assert effects.count("send_invoice", invoice_id="INV-9") == 1
    assert Attempt.objects.filter(idempotency_key="invoice:INV-9:send").count() == 1


def _remote_only_config(tmp_path: Path, url: str, *, local: Effects | None = None) -> Path:
    """A gateway in front of the streamable HTTP upstream at ``url`` (and the stdio one, given ``local``)."""
    path = tmp_path / "remote.toml"
    stdio = ""
    if local is not None:
        env = ", ".join(f'{k} = "{v}"' for k, v in _upstream_env(local, "local").items())
        stdio = f"""
[[upstreams]]
name = "local"
command = ["{PYTHON}", "-m", "tests.mcp_upstream", "stdio"]
env = {{ {env} }}
cwd = "{ROOT}"
"""
    path.write_text(
        f"""
tenant = "acme"
task_id = "gateway-tests"
{stdio}
[[upstreams]]
name = "remote"
url = "{url}"
prefix = "remote_"

[tools.remote_send_invoice]
key = "remote-invoice:{{invoice_id}}:send"
scope = ["payments:charge"]
"""
    )
    return path


def test_a_refused_connection_to_the_upstream_is_proof_nothing_was_sent(
    tenant: Tenant, tmp_path: Path, effects: Effects
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    upstream_cmd = [PYTHON, "-m", "tests.mcp_upstream", "http", str(port)]
    upstream_env = {**_upstream_env(effects, "remote"), "DJANGO_SETTINGS_MODULE": ""}
    config = _remote_only_config(tmp_path, url)
    results: list[dict[str, Any]] = []

    async def session() -> None:
        async with Client(_stdio_gateway(config), cache=None, read_timeout_seconds=60) as client:
            with running(upstream_cmd, env=upstream_env, url=url) as upstream:
                # The gateway serves the upstream's tools once it has connected.
                while "remote_send_invoice" not in {tool.name for tool in (await client.list_tools()).tools}:
                    await anyio.sleep(0.2)
                results.append(_dump(await client.call_tool("remote_send_invoice", {"invoice_id": "R-1", "amount": 1})))
                stop_group(upstream, timeout=15)
                # The upstream is gone; the gateway's client to it does not know yet.
                results.append(_dump(await client.call_tool("remote_send_invoice", {"invoice_id": "R-2", "amount": 2})))
            with running(upstream_cmd, env=upstream_env, url=url):
                results.append(_dump(await client.call_tool("remote_send_invoice", {"invoice_id": "R-2", "amount": 2})))
                # The ledger's backoff for a retryable failure, run out.
                key = "remote-invoice:R-2:send"
                past = timezone.now() - timedelta(seconds=1)
                await anyio.to_thread.run_sync(
                    lambda: Attempt.objects.filter(idempotency_key=key).update(next_check_at=past)
                )
                results.append(_dump(await client.call_tool("remote_send_invoice", {"invoice_id": "R-2", "amount": 2})))

    anyio.run(session)
    first, refused, pending, again = results
    assert first["isError"] is False
    assert _error_code(refused) == "upstream_unavailable"
    message = refused["_meta"][META_ERROR]["message"]
    assert url in message
    assert "nothing was sent" in message
    assert "connection refused" in message
    lost = Attempt.objects.get(pk=refused["_meta"][META_ERROR]["attempt_id"])
    moves = [(e.from_state, e.to_state) for e in lost.events.order_by("seq") if e.to_state]
    # Not UNKNOWN: no person needs to look at a call that was never sent.
    assert (S.DISPATCHED, S.FAILED_RETRYABLE) in moves
    assert S.UNKNOWN not in {to for _, to in moves}
    # The same call, once the upstream is back and the backoff has run out, is sent: once.
    assert _error_code(pending) == "retry_pending"
    assert again["isError"] is False, again
    assert effects.count("send_invoice", invoice_id="R-2") == 1
    assert effects.count("send_invoice", invoice_id="R-1") == 1


def test_an_unreachable_upstream_holds_back_neither_the_start_nor_the_others_tools(
    tenant: Tenant, tmp_path: Path, effects: Effects
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/mcp"
    config = _remote_only_config(tmp_path, nobody, local=effects)
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}/mcp"
    log = tmp_path / "gateway.log"
    # Told to wait for ever for upstreams still connecting: one whose connection
    # is refused is not waited for, so the gateway serves at once all the same.
    cmd = [PYTHON, "manage.py", "mcp_gateway", str(config), "--http", "--port", str(port), "--start-wait", "3600"]
    with running(cmd, env=_gateway_env(), url=gateway_url, output=log):
        [listed_result] = _listed(gateway_url)
        down, sent = _calls(
            gateway_url,
            ("remote_send_invoice", {"invoice_id": "U-1", "amount": 1}, None),
            ("send_invoice", {"invoice_id": "U-2", "amount": 2}, None),
        )
    listed = {tool["name"] for tool in listed_result["tools"]}
    assert "send_invoice" in listed
    assert not any(name.startswith("remote_") for name in listed)
    assert _error_code(down) == "upstream_unavailable"
    assert nobody in down["_meta"][META_ERROR]["message"]
    assert not Attempt.objects.filter(idempotency_key="remote-invoice:U-1:send").exists()
    assert sent["isError"] is False
    assert effects.count("send_invoice", invoice_id="U-2") == 1
    text = log.read_text()
    assert f"upstream remote ({nobody}): could not connect: connection refused or unreachable" in text


def _listed(target: Any) -> list[dict[str, Any]]:
    async def connect() -> list[dict[str, Any]]:
        async with Client(target, cache=None, read_timeout_seconds=60) as client:
            return [_dump(await client.list_tools())]

    return anyio.run(connect)


def test_tools_the_policy_refuses_are_not_listed(tenant: Tenant, config: Path) -> None:
    allowed = {k: v for k, v in TOOLS.items() if k not in ("post_note", "send_invoice")}
    policy_publish(tenant=tenant, tools={**allowed, "send_invoice": []}, actor=Actor.system("tests"))
    url, gateway = _http_gateway(config)
    with gateway:
        [before] = _listed(url)
        # send_invoice is allowed, but not with the scope the gateway gives it.
        assert {"post_note", "send_invoice"}.isdisjoint(tool["name"] for tool in before["tools"])
        assert "refuse" in {tool["name"] for tool in before["tools"]}
        [refused] = _calls(url, ("post_note", {"text": "x"}, None))
        assert _error_code(refused) == "tool_not_allowed"
        # Each listing reads the current policy.
        policy_publish(tenant=tenant, tools=TOOLS, actor=Actor.system("tests"))
        [after] = _listed(url)
        assert {"post_note", "send_invoice"} <= {tool["name"] for tool in after["tools"]}

"""The MCP gateway's configuration file and how it names each call's effect
(no processes, no database)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerdash.ledger.errors import InvalidKey
from ledgerdash.ledger.gateway.config import ConfigError, ToolConfig, load, parse
from ledgerdash.ledger.gateway.keys import META_KEY, META_REPEAT, META_TASK, derive

UPSTREAM = {"name": "billing", "command": ["python", "server.py"]}


def _derive(arguments: dict[str, Any], meta: dict[str, Any] | None = None, key: str = "") -> tuple[str, str, str]:
    name = derive(
        tool="send_invoice", arguments=arguments, meta=meta, settings=ToolConfig(key=key), default_task="run-1"
    )
    return name.task_id, name.key, name.source


def test_a_template_names_the_effect_by_the_arguments_it_names() -> None:
    template = "invoice:{invoice_id}:send"
    assert _derive({"invoice_id": "INV-7", "amount": 1}, key=template) == ("run-1", "invoice:INV-7:send", "template")
    # Other amount, same invoice: the same effect (the ledger refuses the other arguments).
    assert _derive({"invoice_id": "INV-7", "amount": 2}, key=template)[1] == "invoice:INV-7:send"
    # Non-strings appear as canonical JSON, whatever the key order.
    assert _derive({"invoice_id": {"b": 2, "a": 1}}, key=template)[1] == 'invoice:{"a":1,"b":2}:send'


def test_without_a_template_the_task_and_canonical_arguments_name_the_effect() -> None:
    _, first, source = _derive({"to": "x", "n": 1})
    assert source == "arguments"
    assert first.startswith("mcp:send_invoice:")
    assert _derive({"n": 1.0, "to": "x"})[1] == first
    assert _derive({"n": 2, "to": "x"})[1] != first
    assert _derive({"to": "x", "n": 1}, {META_TASK: "run-2"})[1] != first


def test_a_deliberate_repeat_and_a_clients_own_key() -> None:
    assert _derive({"invoice_id": "I"}, {META_REPEAT: "2"}, key="inv:{invoice_id}")[1] == "inv:I:repeat:2"
    assert _derive({"invoice_id": "I"}, {META_KEY: "mine-1", META_REPEAT: "2"}, key="inv:{invoice_id}") == (
        "run-1",
        "mine-1",
        "client",
    )


def test_a_call_missing_a_templates_argument_or_with_bad_metadata_is_refused() -> None:
    with pytest.raises(InvalidKey, match="needs the argument"):
        _derive({"amount": 1}, key="invoice:{invoice_id}:send")
    with pytest.raises(InvalidKey, match=r"io\.ledgerdash/task"):
        _derive({}, {META_TASK: ["not", "a", "string"]})


def test_a_long_key_stays_within_the_ledgers_limit_and_stable() -> None:
    long = {"invoice_id": "x" * 400}
    key = _derive(long, key="inv:{invoice_id}")[1]
    assert len(key) <= 255
    assert key == _derive(long, key="inv:{invoice_id}")[1]


def test_a_good_configuration_parses() -> None:
    config = parse(
        {
            "tenant": "acme",
            "upstreams": [UPSTREAM, {"name": "tickets", "url": "http://127.0.0.1:9/mcp", "prefix": "t_"}],
            "tools": {"send_invoice": {"key": "inv:{invoice_id}", "scope": ["payments:charge"], "timeout": 5}},
        }
    )
    assert config.task_id == "mcp-gateway"
    assert [u.transport for u in config.upstreams] == ["stdio", "http"]
    assert config.tool("send_invoice").scope == ("payments:charge",)
    assert config.tool("other") == ToolConfig()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tenant": "acme"}, "list at least one upstream"),
        ({"tenant": "acme", "upstreams": [{"name": "x"}]}, "give exactly one of command"),
        ({"tenant": "acme", "upstreams": [UPSTREAM, UPSTREAM]}, "names must differ"),
        ({"tenant": "acme", "upstreams": [{"name": "x", "url": "ftp://h"}]}, "http:// or https://"),
        ({"upstreams": [UPSTREAM]}, "tenant: expected a non-empty string"),
        ({"tenant": "acme", "upstreams": [UPSTREAM], "extra": 1}, "unknown setting(s) extra"),
        ({"tenant": "acme", "upstreams": [UPSTREAM], "tools": {"t": {"key": "a:{}"}}}, "placeholders name"),
        ({"tenant": "acme", "upstreams": [UPSTREAM], "tools": {"t": {"on_error": "ignore"}}}, "on_error"),
        ({"tenant": "acme", "upstreams": [UPSTREAM], "tools": {"t": {"timeout": 0}}}, "timeout"),
        ({"tenant": "acme", "upstreams": [UPSTREAM], "tools": {"t": {"request_id": "a[["}}}, "JMESPath"),
    ],
)
def test_a_bad_configuration_says_where_and_why(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(data)


def test_a_file_that_is_not_toml_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("tenant = \n")
    with pytest.raises(ConfigError, match=r"gateway\.toml: not valid TOML"):
        load(path)
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        load(tmp_path / "missing.toml")

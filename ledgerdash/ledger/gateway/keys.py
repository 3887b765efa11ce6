"""How the gateway names the side effect of an MCP ``tools/call``: its task
and its idempotency key.

An MCP client sends a tool name and arguments; nothing in the protocol says
whether two identical calls are one effect resent after a crash or two
effects meant. The gateway decides from, in order:

1. ``_meta["io.ledgerdash/idempotency_key"]`` on the request: the client
   named the effect itself; used as is.
2. the tool's ``key`` template in the configuration, over the call's
   arguments (``"invoice:{invoice_id}:send"``): the effect is what the
   template names, whatever else the arguments say. The same invoice is
   never sent twice; a different invoice is a different effect.
3. otherwise, the task and the canonical arguments:
   ``mcp:<tool>:<sha256 of {task, tool, arguments}>``. The same call in the
   same task is the same effect.

The task is ``_meta["io.ledgerdash/task"]`` when the client sends one (an
agent run's id: a restarted run resends its calls under the same id),
else the gateway's configured ``task_id``.

A deliberate repeat of a call that would derive the same key (a second
reminder email with the same text) sends ``_meta["io.ledgerdash/repeat"]``
with a value of its own (``"2"``); it is appended to derived keys. And a
repeat is never silently swallowed: a replayed result says so in its
``_meta`` (``io.ledgerdash/replayed: true`` and the attempt's id).

Not the model's tool-call id: a model asked again after a crash makes a new
id for the same effect, which would send it twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledgerdash.ledger.canonical import normalize_args
from ledgerdash.ledger.errors import InvalidKey
from ledgerdash.ledger.gateway.config import ToolConfig, template_fields

META_KEY = "io.ledgerdash/idempotency_key"
META_TASK = "io.ledgerdash/task"
META_REPEAT = "io.ledgerdash/repeat"
META_REPLAYED = "io.ledgerdash/replayed"
META_ATTEMPT = "io.ledgerdash/attempt"
#: Sent to the upstream with every call: the key the provider should see (to send as its
#: idempotency key, or write into the field a preset's lookup finds it by).
META_PROVIDER_KEY = "io.ledgerdash/provider_key"
META_ERROR = "io.ledgerdash/error"
#: On a replay: the result is what the provider said when recovery looked the call up (its own answer was lost).
META_RECOVERED = "io.ledgerdash/recovered"


@dataclass(frozen=True)
class CallName:
    task_id: str
    key: str
    #: how the key was derived: "client", "template" or "arguments"
    source: str


def _meta_str(meta: Mapping[str, Any], name: str) -> str:
    value = meta.get(name)
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise InvalidKey(f"_meta[{name!r}] must be a non-empty string, not {value!r}")
    return value


def derive(
    *, tool: str, arguments: dict[str, Any], meta: Mapping[str, Any] | None, settings: ToolConfig, default_task: str
) -> CallName:
    """The task and idempotency key of one call (see the module's docstring).
    Raises InvalidKey (nothing recorded) when the template needs an argument
    the call lacks, or the metadata is malformed."""
    meta = meta or {}
    task_id = _meta_str(meta, META_TASK) or default_task
    explicit = _meta_str(meta, META_KEY)
    if explicit:
        return CallName(task_id, explicit, "client")
    repeat = _meta_str(meta, META_REPEAT)
    if settings.key:
        missing = [name for name in template_fields(settings.key) if name not in arguments]
        if missing:
            raise InvalidKey(
                f"the key template {settings.key!r} of {tool} needs the argument(s) {', '.join(missing)}; not sent"
            )
        key = settings.key.format_map({name: _plain(arguments[name]) for name in template_fields(settings.key)})
        source = "template"
    else:
        _, digest = normalize_args({"task": task_id, "tool": tool, "arguments": arguments})
        key = f"mcp:{tool}:{digest}"
        source = "arguments"
    if repeat:
        key = f"{key}:repeat:{repeat}"
    if len(key) > 255:  # a long template value: keep the key within the ledger's limit, still stable
        key = f"{key[:180]}…{hashlib.sha256(key.encode()).hexdigest()}"
    return CallName(task_id, key, source)


def _plain(value: Any) -> str:
    """An argument as it appears in a key: strings as they are, anything
    else as canonical JSON (so ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}``
    name one effect)."""
    if isinstance(value, str):
        return value
    normalized, _ = normalize_args({"v": value})
    return json.dumps(normalized["v"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)

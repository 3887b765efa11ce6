"""Secrets by name: the provider credentials tools and tenants refer to.

The database never holds a secret, only its name (a tool's ``${NAME}``
header placeholders, a tenant's :class:`~ledgerdash.ledger.models.ToolCredential`).
A name is resolved at call time: first in the secrets file (setting
``LEDGERDASH_SECRETS_FILE``, a JSON object of names to values, such as a
mounted Kubernetes or Docker secret; re-read when it changes, so a rotated
secret is used without a restart), then in the process environment.
Nothing here logs, returns in an error, or renders a secret's value.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from django.conf import settings


class SecretsFileInvalid(Exception):
    """The secrets file cannot be read as a JSON object of names to strings."""


_lock = threading.Lock()
_cache: dict[str, Any] = {"key": None, "values": {}}


def _file_values() -> dict[str, str]:
    path_text = getattr(settings, "LEDGERDASH_SECRETS_FILE", "")
    if not path_text:
        return {}
    path = Path(path_text)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise SecretsFileInvalid(f"the secrets file {path} (LEDGERDASH_SECRETS_FILE) does not exist") from None
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _lock:
        if _cache["key"] == key:
            return dict(_cache["values"])
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            # The parser's message may quote the file's text: name the error's kind only.
            raise SecretsFileInvalid(f"the secrets file {path} is not valid JSON ({type(exc).__name__})") from None
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise SecretsFileInvalid(f"the secrets file {path} must be a JSON object of names to strings")
        _cache.update(key=key, values=values)
        return dict(values)


def secret(name: str) -> str | None:
    """The secret called ``name``, or None if neither the file nor the environment has it."""
    values = _file_values()
    if name in values:
        return values[name]
    return os.environ.get(name)


def is_set(name: str) -> bool:
    """Whether ``name`` resolves (for pages that say so without showing it)."""
    try:
        return secret(name) is not None
    except SecretsFileInvalid:
        return False

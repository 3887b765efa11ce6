"""The sandbox provider as the tests use it: a real process on a free port."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.live import PYTHON, free_port, running


class Sandbox:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def faults(self, tool: str, **faults: Any) -> None:
        status, _ = self._call("PUT", f"/faults/{tool}", faults)
        assert status == 200

    def clear(self) -> None:
        self._call("DELETE", "/faults")

    def count(self, key: str) -> int:
        _, body = self._call("GET", "/effects/count?key=" + urllib.parse.quote(key, safe=""))
        return int(body["count"])

    def count_once_landed(self, key: str, *, within: float = 60.0) -> int:
        """``count(key)`` once at least one effect has landed (or ``within``
        seconds passed): a request an agent sent just before it was killed
        reaches the provider on the provider's time, not the agent's."""
        deadline = time.monotonic() + within
        while (counted := self.count(key)) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return counted

    def perform(self, tool: str, key: str, payload: dict[str, Any]) -> tuple[int, Any]:
        """Send a request directly, as another party (or an agent that then crashed) would."""
        return self._call("POST", f"/tools/{tool}/effects", payload, {"Idempotency-Key": key})

    def lookup(self, tool: str, key: str) -> tuple[int, Any]:
        return self._call("GET", f"/tools/{tool}/effects?key=" + urllib.parse.quote(key, safe=""))


@contextlib.contextmanager
def sandbox_process(directory: Path, *, key_retention: float = 3600.0) -> Iterator[Sandbox]:
    port = free_port()
    cmd = [PYTHON, "-m", "ledgerdash.sandbox", "--port", str(port), "--db", str(directory / "sandbox.sqlite3")]
    cmd += ["--key-retention", str(key_retention)]
    with running(cmd, url=f"http://127.0.0.1:{port}/health"):
        yield Sandbox(f"http://127.0.0.1:{port}")


def unique_key(label: str = "k") -> str:
    return f"{label}-{uuid.uuid4().hex[:12]}"

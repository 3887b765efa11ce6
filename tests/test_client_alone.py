"""The Python client runs in an agent's environment without Django, WeasyPrint
or any other package the server needs: importing it (and using it up to the
network) touches the standard library and a few Django-free modules only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What `from ledgerdash import client` may load of this project; each is standard library only.
CLIENT_MODULES = {
    "ledgerdash",
    "ledgerdash.client",
    "ledgerdash.errorcodes",
    "ledgerdash.httpconn",
    "ledgerdash.toolcalls",
    "ledgerdash.ledger",
    "ledgerdash.ledger.crashpoints",
    "ledgerdash.ledger.errors",
    "ledgerdash.ledger.keys",
}

AGENT = textwrap.dedent(
    """
    import sys

    class OnlyTheStandardLibrary:
        # Refuses every module outside the standard library and this project: django, weasyprint, ninja, ...
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top not in sys.stdlib_module_names and top != "ledgerdash":
                raise ImportError(f"the client imported {name}")
            return None

    sys.meta_path.insert(0, OnlyTheStandardLibrary())

    from ledgerdash import client as ledger
    from ledgerdash.client import IdempotencyConflict, LedgerClient

    @ledger.tool("send_email", key="invoice:{invoice_id}:send")
    def send_email(call, *, invoice_id):
        raise AssertionError("never called: no ledger answers")

    api = LedgerClient("http://127.0.0.1:9", "token", retries=0, timeout=1)
    exc = ledger.error_for(409, {"code": "idempotency_key_reused", "message": "m", "original_id": 3})
    assert isinstance(exc, IdempotencyConflict) and exc.original_id == 3
    try:
        with ledger.task(task_id="t", client=api):
            send_email(invoice_id="INV-7")
    except ledger.LedgerUnavailable as unreachable:
        assert unreachable.sent is False
    else:
        raise AssertionError("the closed port answered")
    print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "ledgerdash")))
    """
)


def test_the_client_imports_and_runs_without_django() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", AGENT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == CLIENT_MODULES

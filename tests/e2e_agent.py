"""An agent in a process of its own, for the end-to-end crash tests.

Configured only by its environment, as a real agent would be:
LEDGERDASH_URL and LEDGERDASH_TOKEN find the ledger, SANDBOX_URL the
provider, LEDGERDASH_CRASH_AT where it dies, E2E_INVOICE which invoice it sends. It talks to the ledger through
the HTTP client and to the sandbox provider over plain HTTP, and imports no
Django. Prints one JSON line: what the call returned or raised, and whether
Django was ever imported.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.parse
from typing import Any

import ledgerdash_client as ledger
from ledgerdash_client import crashpoints


@ledger.tool("send_email", key="invoice:{invoice_id}:send")
def send_email(call: ledger.ToolCall, *, invoice_id: str, to: str) -> dict[str, Any]:
    provider = urllib.parse.urlsplit(os.environ["SANDBOX_URL"])
    conn = http.client.HTTPConnection(provider.hostname or "", provider.port, timeout=10)
    body = json.dumps({"invoice_id": invoice_id, "to": to}, sort_keys=True, separators=(",", ":"))
    conn.request(
        "POST",
        "/tools/send_email/effects",
        body=body,
        headers={"Idempotency-Key": call.key, "Content-Type": "application/json"},
    )
    crashpoints.reached(crashpoints.AFTER_SEND)  # sent, the provider's answer not yet read
    response = json.loads(conn.getresponse().read())
    call.record_request_id(response["id"])
    return {"message_id": response["id"]}


def main() -> None:
    outcome: dict[str, Any]
    with ledger.task(task_id="billing-run-42"):
        try:
            outcome = {"result": send_email(invoice_id=os.environ["E2E_INVOICE"], to="ap@example.com")}
        except ledger.LedgerClientError as exc:
            outcome = {"raised": type(exc).__name__, "code": exc.code}
    outcome["django_imported"] = "django" in sys.modules
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()

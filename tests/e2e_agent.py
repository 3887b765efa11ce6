"""An agent in a process of its own, for the end-to-end crash tests.

Configured only by its environment, as a real agent would be:
LEDGERDASH_URL and LEDGERDASH_TOKEN find the ledger, LEDGERDASH_CRASH_AT
chooses where it dies, E2E_EFFECTS counts what "the provider" did (one line
per effect, fsynced, so a SIGKILL cannot lose one). Prints one JSON line:
what the call returned or raised, and whether Django was ever imported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ledgerdash import client as ledger
from ledgerdash.ledger import crashpoints


@ledger.tool("send_email", key="invoice:{invoice_id}:send")
def send_email(call: ledger.ToolCall, *, invoice_id: str, to: str) -> dict[str, Any]:
    with open(os.environ["E2E_EFFECTS"], "a") as effects:
        effects.write(json.dumps({"provider_key": call.key, "to": to, "pid": os.getpid()}) + "\n")
        effects.flush()
        os.fsync(effects.fileno())
    crashpoints.reached(crashpoints.AFTER_SEND)  # sent, the provider's answer not yet read
    message_id = f"msg-{invoice_id}"
    call.record_request_id(message_id)
    return {"message_id": message_id}


def main() -> None:
    outcome: dict[str, Any]
    with ledger.task(task_id="billing-run-42"):
        try:
            outcome = {"result": send_email(invoice_id="INV-7", to="ap@example.com")}
        except ledger.LedgerClientError as exc:
            outcome = {"raised": type(exc).__name__, "code": exc.code}
    outcome["django_imported"] = "django" in sys.modules
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()

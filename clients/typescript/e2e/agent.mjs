// An agent in a process of its own, configured only by its environment:
// LEDGERDASH_URL and LEDGERDASH_TOKEN find the ledger, SANDBOX_URL the
// provider, E2E_INVOICE the invoice it sends, LEDGERDASH_CRASH_AT where it
// dies. Prints one JSON line: what the call returned or threw.
import { LedgerClient, LedgerClientError } from "../src/index.js";

const ledger = new LedgerClient({ agent: "ts-e2e-agent" });
const task = ledger.task({ taskId: "billing-run-ts" });

const sendEmail = task.tool("send_email", { key: "invoice:{invoice_id}:send" }, async (call, { invoice_id, to }) => {
  const response = await fetch(`${process.env.SANDBOX_URL}/tools/send_email/effects`, {
    method: "POST",
    headers: { "Idempotency-Key": call.key, "Content-Type": "application/json" },
    body: JSON.stringify({ invoice_id, to }),
  });
  const body = await response.json();
  await call.recordRequestId(body.id);
  return { message_id: body.id };
});

let outcome;
try {
  outcome = { result: await sendEmail({ invoice_id: process.env.E2E_INVOICE, to: "ap@example.com" }) };
} catch (error) {
  if (!(error instanceof LedgerClientError)) throw error;
  outcome = { raised: error.name, code: error.code };
}
console.log(JSON.stringify(outcome));

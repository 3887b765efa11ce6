// Against a live ledger and the sandbox provider (LEDGERDASH_URL,
// LEDGERDASH_TOKEN, SANDBOX_URL; tests/test_typescript_client.py starts
// them): a run and a re-run send once; an agent killed after its dispatch
// is restarted and never sends again. Skipped without a server.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { describe, test } from "node:test";

import { LedgerClient } from "../src/index.js";

const live = Boolean(process.env.LEDGERDASH_URL && process.env.SANDBOX_URL);
const AGENT = fileURLToPath(new URL("../e2e/agent.mjs", import.meta.url));

function runAgent(invoice, crashAt) {
  const env = { ...process.env, E2E_INVOICE: invoice };
  delete env.LEDGERDASH_CRASH_AT;
  if (crashAt) env.LEDGERDASH_CRASH_AT = crashAt;
  const proc = spawnSync(process.execPath, [AGENT], { env, encoding: "utf8", timeout: 60000 });
  if (crashAt) {
    assert.equal(proc.signal, "SIGKILL", proc.stderr);
    assert.match(proc.stdout, new RegExp(`LEDGERDASH-CRASHPOINT ${crashAt}`));
    return null;
  }
  assert.equal(proc.status, 0, proc.stderr);
  return JSON.parse(proc.stdout.trim().split("\n").at(-1));
}

async function effects(key) {
  const response = await fetch(`${process.env.SANDBOX_URL}/effects/count?key=${encodeURIComponent(key)}`);
  return (await response.json()).count;
}

const invoice = (label) => `${process.env.E2E_PREFIX ?? "TS"}-${label}-${randomUUID().slice(0, 8)}`;

describe("against a live ledger", { skip: !live && "needs LEDGERDASH_URL and SANDBOX_URL" }, () => {
  test("a run and a re-run send once; the re-run replays the result", async () => {
    const id = invoice("clean");
    const first = runAgent(id);
    assert.ok(first.result.message_id);
    assert.deepEqual(runAgent(id), first);
    const attempt = (await new LedgerClient().find(`invoice:${id}:send`))[0];
    assert.equal(attempt.state, "OUTCOME_CONFIRMED");
    assert.equal(await effects(attempt.provider_key), 1);
  });

  test("killed after the intent, the restart sends once", async () => {
    const id = invoice("intent");
    assert.equal(runAgent(id, "after_intent"), null);
    const [recorded] = await new LedgerClient().find(`invoice:${id}:send`);
    assert.equal(recorded.state, "INTENT_RECORDED");
    assert.equal(await effects(recorded.provider_key), 0);
    assert.ok(runAgent(id).result);
    assert.equal(await effects(recorded.provider_key), 1);
  });

  test("killed after the dispatch, the restart never repeats the effect", async () => {
    const id = invoice("dispatch");
    assert.equal(runAgent(id, "after_response"), null);
    const [dispatched] = await new LedgerClient().find(`invoice:${id}:send`);
    assert.equal(dispatched.state, "DISPATCHED");
    assert.match(dispatched.provider_request_id, /^eff_/);
    assert.equal(await effects(dispatched.provider_key), 1);
    // The lease still runs: the ledger says someone holds it; the tool is not called.
    assert.deepEqual(runAgent(id), { raised: "AttemptInFlight", code: "attempt_in_flight" });
    assert.equal(await effects(dispatched.provider_key), 1);
    console.log(`LEDGERDASH-E2E dispatched ${id}`);
  });
});

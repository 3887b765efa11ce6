// The client against a scripted HTTP server (node:http): the retry rules,
// typed errors, the wrapper's steps and its heartbeats. No ledger needed.
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, beforeEach, describe, test } from "node:test";

import {
  AttemptInFlight,
  BodyTooLarge,
  ConfigurationError,
  IdempotencyConflict,
  InvalidKey,
  LedgerClient,
  LedgerUnavailable,
  NothingHappened,
  OutcomeUnknown,
  ResultUnavailable,
  ToolNotAllowed,
  UnderReview,
  errorFor,
  formatKey,
} from "../src/index.js";

// Each request is answered by the next scripted step for its path: [status, body] or "drop" (close the socket).
let script;
let seen;
let server;
let baseUrl;

before(async () => {
  server = http.createServer((req, res) => {
    let raw = "";
    req.on("data", (chunk) => (raw += chunk));
    req.on("end", () => {
      const path = req.url.replace(/^\/api\/v1/, "").replace(/\?.*$/, "");
      seen.push({ method: req.method, path, body: raw ? JSON.parse(raw) : undefined, headers: req.headers });
      const steps = script[`${req.method} ${path}`] ?? [];
      const step = steps.length > 1 ? steps.shift() : steps[0];
      if (!step) {
        res.writeHead(500).end("{}");
      } else if (step === "drop") {
        req.socket.destroy();
      } else {
        const [status, body, headers = {}] = typeof step === "function" ? step() : step;
        res.writeHead(status, { "Content-Type": "application/json", ...headers }).end(JSON.stringify(body));
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

beforeEach(() => {
  script = {};
  seen = [];
});

const client = (options = {}) => new LedgerClient({ baseUrl, token: "t", retries: 2, backoffMs: 1, ...options });
const now = Date.now();
const attempt = (extra = {}) => ({
  id: 7,
  state: "INTENT_RECORDED",
  fence: 0,
  provider_key: "k7",
  provider_request_id: "",
  args: {},
  updated_at: new Date(now).toISOString(),
  next_check_at: null,
  result_source: "",
  ...extra,
});
const count = (method, path) => seen.filter((r) => r.method === method && r.path === path).length;

describe("configuration", () => {
  test("it needs a URL and a token, and says which is missing", () => {
    assert.throws(() => new LedgerClient({ token: "t", baseUrl: "" }), /no ledger URL/);
    assert.throws(() => new LedgerClient({ baseUrl }), ConfigurationError);
    assert.throws(() => new LedgerClient({ baseUrl: "ftp://x", token: "t" }), /not an http\(s\) URL/);
    assert.equal(client().baseUrl, `${baseUrl}/api/v1`);
  });
});

describe("errors", () => {
  test("each code has its class, and unknown codes fall back by status", () => {
    const conflict = errorFor(409, { code: "idempotency_key_reused", message: "m", attempt_id: 3, original_id: 2 });
    assert.ok(conflict instanceof IdempotencyConflict);
    assert.equal(conflict.attemptId, 3);
    assert.equal(conflict.code, "idempotency_key_reused");
    const other = errorFor(409, { code: "something_new", message: "m" });
    assert.equal(other.constructor.name, "AttemptBlocked");
    assert.equal(other.code, "something_new");
    assert.ok(errorFor(403, { code: "tool_not_allowed" }) instanceof ToolNotAllowed);
    assert.equal(errorFor(500, {}).code, "http_500");
  });

  test("a key template missing an argument is refused before anything is sent", () => {
    assert.equal(formatKey("invoice:{id}:send", { id: "INV-1" }), "invoice:INV-1:send");
    assert.throws(() => formatKey("invoice:{id}:send", {}), InvalidKey);
  });
});

describe("retries", () => {
  test("recording an intent is retried after a 503 and a dropped connection", async () => {
    script["POST /attempts"] = [[503, { message: "busy" }], "drop", [201, attempt()]];
    const { attempt: got, created } = await client().recordIntent({
      taskId: "t",
      toolName: "x",
      idempotencyKey: "k",
      args: { a: 1 },
    });
    assert.equal(got.id, 7);
    assert.equal(created, true);
    assert.equal(count("POST", "/attempts"), 3);
    assert.equal(seen[0].headers.authorization, "Bearer t");
  });

  test("a dispatch claim that may have left is never sent again", async () => {
    script["POST /attempts/7/dispatch"] = ["drop", [200, attempt({ state: "DISPATCHED", fence: 1 })]];
    await assert.rejects(client().dispatch(7, { fence: 0 }), (error) => {
      assert.ok(error instanceof LedgerUnavailable);
      assert.equal(error.sent, null);
      return true;
    });
    assert.equal(count("POST", "/attempts/7/dispatch"), 1);

    script["POST /attempts/7/dispatch"] = [[503, {}], [200, attempt()]];
    await assert.rejects(client().dispatch(7), LedgerUnavailable);
    assert.equal(count("POST", "/attempts/7/dispatch"), 2);
  });

  test("a dispatch claim to a server that refused the connection was never sent: it is retried", async () => {
    const closed = http.createServer();
    await new Promise((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = closed.address().port;
    await new Promise((resolve) => closed.close(resolve));
    const refused = new LedgerClient({ baseUrl: `http://127.0.0.1:${port}`, token: "t", retries: 1, backoffMs: 1 });
    await assert.rejects(refused.dispatch(7), (error) => error instanceof LedgerUnavailable && error.sent === false);
  });
});

describe("the tool wrapper", () => {
  test("it records, claims, runs, and confirms with the receipt and the result", async () => {
    script["POST /attempts"] = [[201, attempt({ args: { invoice_id: "INV-1" } })]];
    script["POST /attempts/7/dispatch"] = [[200, attempt({ state: "DISPATCHED", fence: 1 })]];
    script["POST /attempts/7/request-id"] = [[200, attempt({ state: "DISPATCHED", fence: 1 })]];
    script["POST /attempts/7/outcome"] = [[200, attempt({ state: "OUTCOME_CONFIRMED", fence: 2 })]];
    const task = client().task({ taskId: "run-1" });
    const send = task.tool("send_email", { key: "invoice:{invoice_id}:send", scope: "email:send" }, async (call) => {
      assert.equal(call.key, "k7");
      await call.recordRequestId("eff_1");
      return { ok: true };
    });
    assert.deepEqual(await send({ invoice_id: "INV-1" }), { ok: true });
    const [intent] = seen;
    assert.equal(intent.body.idempotency_key, "invoice:INV-1:send");
    assert.deepEqual(intent.body.credential_scope, ["email:send"]);
    const outcome = seen.find((r) => r.path === "/attempts/7/outcome").body;
    assert.deepEqual(outcome, {
      outcome: "confirmed",
      fence: 1,
      provider_request_id: "eff_1",
      result_ref: "",
      result: { ok: true },
    });
  });

  test("a call claimed with its intent is sent without a second claim", async () => {
    script["POST /attempts"] = [[201, attempt({ state: "DISPATCHED", fence: 1 })]];
    script["POST /attempts/7/outcome"] = [[200, attempt({ state: "OUTCOME_CONFIRMED", fence: 2 })]];
    const send = client()
      .task({ taskId: "t" })
      .tool("x", { key: () => "k" }, async (call) => {
        await call.recordRequestId("eff_2");
        return { ok: true };
      });
    script["POST /attempts/7/request-id"] = [[200, attempt({ state: "DISPATCHED", fence: 1 })]];
    assert.deepEqual(await send({}), { ok: true });
    assert.equal(seen[0].body.claim, true);
    assert.equal(count("POST", "/attempts/7/dispatch"), 0);
    assert.equal(seen.find((r) => r.path === "/attempts/7/outcome").body.fence, 1);
  });

  test("a key recorded before and in flight is not taken for this call's claim", async () => {
    script["POST /attempts"] = [[200, attempt({ state: "DISPATCHED", fence: 1 })]];
    script["POST /attempts/7/dispatch"] = [[409, { code: "attempt_in_flight", message: "in flight" }]];
    let called = 0;
    const send = client()
      .task({ taskId: "t" })
      .tool("x", { key: () => "k" }, () => called++);
    await assert.rejects(send({}), AttemptInFlight);
    assert.equal(called, 0);
  });

  test("a confirmed key replays its result without calling the tool", async () => {
    script["POST /attempts"] = [[200, attempt({ state: "OUTCOME_CONFIRMED", result: { id: 1 }, result_source: "tool" })]];
    let called = 0;
    const send = client()
      .task({ taskId: "t" })
      .tool("x", { key: () => "k" }, () => called++);
    assert.deepEqual(await send({}), { id: 1 });
    assert.equal(called, 0);
    script["POST /attempts"] = [[200, attempt({ state: "OUTCOME_CONFIRMED", result_source: "" })]];
    await assert.rejects(send({}), ResultUnavailable);
    assert.equal(called, 0);
  });

  test("a refusal carries the wait the ledger asked for and the first attempt of the key", async () => {
    const ledger = client({ retries: 0 });
    const args = { taskId: "t", toolName: "x", idempotencyKey: "k", args: { a: 1 } };
    script["POST /attempts"] = [[409, { code: "attempt_in_flight", message: "m", attempt_id: 7 }, { "Retry-After": "9" }]];
    const inFlight = await ledger.recordIntent(args).catch((e) => e);
    assert.ok(inFlight instanceof AttemptInFlight);
    assert.equal(inFlight.retryAfter, 9);
    script["POST /attempts"] = [[409, { code: "idempotency_key_reused", message: "m", attempt_id: 9, original_id: 7 }]];
    const reused = await ledger.recordIntent(args).catch((e) => e);
    assert.deepEqual([reused.attemptId, reused.originalId, reused.retryAfter], [9, 7, null]);
    script["POST /attempts"] = [[503, { code: "ledger_unavailable", message: "m" }, { "Retry-After": "5" }]];
    const unavailable = await ledger.recordIntent(args).catch((e) => e);
    assert.ok(unavailable instanceof LedgerUnavailable);
    assert.equal(unavailable.retryAfter, 5);
  });

  test("a refusal is thrown typed, and the tool is not called", async () => {
    let called = 0;
    const send = client()
      .task({ taskId: "t" })
      .tool("x", { key: "k" }, () => called++);
    script["POST /attempts"] = [[409, { code: "under_review", message: "m", attempt_id: 7, state: "MANUAL_REVIEW" }]];
    await assert.rejects(send({}), UnderReview);
    script["POST /attempts"] = [[201, attempt()]];
    script["POST /attempts/7/dispatch"] = [[409, { code: "claim_lost", message: "lost" }]];
    await assert.rejects(send({}), AttemptInFlight);
    script["POST /attempts"] = [[409, { code: "outcome_unknown", message: "m" }]];
    await assert.rejects(send({}), OutcomeUnknown);
    assert.equal(called, 0);
  });

  test("the tool's errors become the outcomes the rules say", async () => {
    script["POST /attempts"] = [[201, attempt()]];
    script["POST /attempts/7/dispatch"] = [[200, attempt({ state: "DISPATCHED", fence: 1 })]];
    script["POST /attempts/7/outcome"] = [[200, attempt()]];
    const task = client().task({ taskId: "t" });
    const nothing = task.tool("x", { key: "k" }, () => {
      throw new NothingHappened("rate limited");
    });
    await assert.rejects(nothing({}), NothingHappened);
    const broke = task.tool("x", { key: "k" }, () => {
      throw new Error("socket hang up");
    });
    await assert.rejects(broke({}), /socket hang up/);
    const noReceipt = task.tool("x", { key: "k" }, () => "sent?");
    assert.equal(await noReceipt({}), "sent?");
    const outcomes = seen.filter((r) => r.path === "/attempts/7/outcome").map((r) => [r.body.outcome, r.body.reason]);
    assert.deepEqual(outcomes.map(([o]) => o), ["failed_retryable", "unknown", "unknown"]);
    assert.match(outcomes[1][1], /tool raised Error: socket hang up/);
    assert.match(outcomes[2][1], /without a receipt/);
  });

  test("it beats the heartbeat while a long tool runs", async () => {
    const lease = { updated_at: new Date(now).toISOString(), next_check_at: new Date(now + 150).toISOString() };
    script["POST /attempts"] = [[201, attempt()]];
    script["POST /attempts/7/dispatch"] = [[200, attempt({ state: "DISPATCHED", fence: 1, ...lease })]];
    script["POST /attempts/7/heartbeat"] = [[200, attempt({ state: "DISPATCHED", fence: 1 })]];
    script["POST /attempts/7/outcome"] = [[200, attempt()]];
    const slow = client()
      .task({ taskId: "t" })
      .tool("x", { key: "k" }, async (call) => {
        await new Promise((resolve) => setTimeout(resolve, 400));
        call.resultRef = "ref";
        return 1;
      });
    await slow({});
    const beats = seen.filter((r) => r.path === "/attempts/7/heartbeat");
    assert.ok(beats.length >= 3, `${beats.length} heartbeats`);
    assert.deepEqual(beats[0].body, { fence: 1 });
    const settled = seen.findIndex((r) => r.path === "/attempts/7/outcome");
    assert.ok(seen.slice(settled).every((r) => r.path !== "/attempts/7/heartbeat"), "no beat after the outcome");
  });
});

describe("a body over the limit", () => {
  test("is refused before sending, saying what to raise", async () => {
    script["POST /attempts"] = [[201, { attempt: {}, created: true }]];
    const big = { text: "x".repeat(600 * 1024) };
    await assert.rejects(
      client().recordIntent({ taskId: "t", toolName: "x", idempotencyKey: "k", args: big }),
      (error) =>
        error instanceof BodyTooLarge &&
        error.status === 413 &&
        /over the limit of 524288/.test(error.message) &&
        /maxBodyBytes/.test(error.message) &&
        /nothing was sent/.test(error.message),
    );
    assert.equal(seen.length, 0);
    await client({ maxBodyBytes: 1024 * 1024 }).recordIntent({ taskId: "t", toolName: "x", idempotencyKey: "k", args: big });
    assert.equal(seen.length, 1);
  });

  test("an unreadable limit in the environment is a configuration error", () => {
    process.env.LEDGERDASH_MAX_BODY_BYTES = "a lot";
    try {
      assert.throws(() => client(), ConfigurationError);
    } finally {
      delete process.env.LEDGERDASH_MAX_BODY_BYTES;
    }
  });
});

// The ledger over HTTP for agents in JavaScript or TypeScript: the same tool
// wrapper and the same safe-retry rules as the Python client
// (ledgerdash/client.py). No dependencies: `fetch`, and `process.env` where
// there is one.
//
//   import { LedgerClient } from "@ledgerdash/client";
//
//   const ledger = new LedgerClient();          // LEDGERDASH_URL, LEDGERDASH_TOKEN
//   const task = ledger.task({ taskId: "billing-run-42" });
//   const sendEmail = task.tool("send_email", { key: "invoice:{invoice_id}:send" }, async (call, args) => {
//     const response = await provider.send({ ...args, idempotencyKey: call.key });
//     await call.recordRequestId(response.id);   // persisted at once
//     return response;
//   });
//   await sendEmail({ invoice_id: "INV-7", to: "ap@example.com" });
//
// Requests the ledger may receive twice are retried on transport errors and
// 502/503/504: reads, recording an intent, heartbeats, request ids, outcome
// reports with the same fence, abandoning. The dispatch claim is retried only
// when the request certainly never left (the connection was refused): after
// that, a lost answer throws LedgerUnavailable and the tool is not called.
// The tool itself is never called again by the client.

import {
  ApiError,
  ConfigurationError,
  LedgerClientError,
  LedgerUnavailable,
  NoTask,
  NothingHappened,
  PermanentFailure,
  retryAfterOf,
} from "./base.js";
import {
  AttemptInFlight,
  BodyTooLarge,
  ClaimLost,
  ERRORS,
  InvalidArgs,
  InvalidKey,
  ResultUnavailable,
} from "./errors.js";

export * from "./base.js";
export * from "./errors.js";

export const ENV_URL = "LEDGERDASH_URL";
export const ENV_TOKEN = "LEDGERDASH_TOKEN";
export const ENV_AGENT = "LEDGERDASH_AGENT";
export const ENV_MAX_BODY = "LEDGERDASH_MAX_BODY_BYTES";
/** The largest request body the ledger takes unless its operator raised it (LEDGER_API_MAX_BODY_BYTES). */
export const MAX_BODY_BYTES = 512 * 1024;
const API_PATH = "/api/v1";
const CONFIRMED = "OUTCOME_CONFIRMED";
const NO_RECEIPT =
  "the tool returned without a receipt (no provider request id or result reference); " +
  "the reconciler will verify it at the provider";

const BY_STATUS = {
  400: "bad_request",
  401: "not_authenticated",
  403: "not_allowed",
  404: "not_found",
  405: "method_not_allowed",
  409: "attempt_blocked",
  413: "body_too_large",
  415: "unsupported_media_type",
  422: "invalid_input",
};

function env(name) {
  return globalThis.process?.env?.[name] ?? "";
}

function maxBodyFromEnv() {
  const given = env(ENV_MAX_BODY).trim();
  if (!given) return MAX_BODY_BYTES;
  const value = /^\d+$/.test(given) ? Number(given) : 0;
  if (value < 1024) {
    throw new ConfigurationError(`${ENV_MAX_BODY}=${JSON.stringify(given)}: a whole number of bytes, 1024 or more`);
  }
  return value;
}

/** The typed error for an error answer: by its code, else its status. */
export function errorFor(status, body, retryAfterHeader = null) {
  const code = String(body?.code || `http_${status}`);
  const cls =
    ERRORS[code] ?? ERRORS[BY_STATUS[status]] ?? (status >= 500 ? ERRORS.internal_error : undefined) ?? ApiError;
  const retryAfter = retryAfterOf(body, retryAfterHeader);
  return new cls(String(body?.message || `HTTP ${status}`), { status, body: body ?? {}, code, retryAfter });
}

/** The crash drill's named points (LEDGERDASH_CRASH_AT): announce, then die as a crash would. */
function crashPoint(point) {
  if (env("LEDGERDASH_CRASH_AT") !== point) return;
  globalThis.process.stdout.write(`LEDGERDASH-CRASHPOINT ${point} pid=${globalThis.process.pid}\n`);
  globalThis.process.kill(globalThis.process.pid, "SIGKILL");
}

// A request that certainly did not reach the server.
function neverSent(error) {
  for (let e = error; e; e = e.cause) {
    if (["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN"].includes(e.code)) return true;
  }
  return false;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function checkKey(key) {
  if (typeof key !== "string" || !key.trim()) {
    throw new InvalidKey("an idempotency key must be a non-empty string", { status: 0, body: {} });
  }
  if (key.length > 255) {
    throw new InvalidKey(`an idempotency key is at most 255 characters, not ${key.length}`, { status: 0, body: {} });
  }
}

/** `"invoice:{invoice_id}:send"` over the call's arguments; a missing one is refused before anything is sent. */
export function formatKey(template, args) {
  return template.replace(/\{([A-Za-z_][A-Za-z0-9_]*)\}/g, (_, name) => {
    if (!(name in args)) {
      throw new InvalidKey(`the key template ${JSON.stringify(template)} needs the argument ${name}`, {
        status: 0,
        body: {},
      });
    }
    const value = args[name];
    return typeof value === "string" ? value : JSON.stringify(value);
  });
}

export class LedgerClient {
  /**
   * @param {object} [options]
   * @param {string} [options.baseUrl] the server (LEDGERDASH_URL)
   * @param {string} [options.token] an API token (LEDGERDASH_TOKEN)
   */
  constructor({ baseUrl, token, agent, timeoutMs = 10000, retries = 4, backoffMs = 200, maxBodyBytes, fetch } = {}) {
    baseUrl = baseUrl || env(ENV_URL);
    token = token || env(ENV_TOKEN);
    if (!baseUrl) throw new ConfigurationError(`no ledger URL: pass baseUrl or set ${ENV_URL}`);
    if (!token) throw new ConfigurationError(`no API token: pass token or set ${ENV_TOKEN}`);
    let parsed;
    try {
      parsed = new URL(baseUrl);
    } catch {
      throw new ConfigurationError(`${JSON.stringify(baseUrl)} is not an http(s) URL`);
    }
    if (!["http:", "https:"].includes(parsed.protocol)) {
      throw new ConfigurationError(`${JSON.stringify(baseUrl)} is not an http(s) URL`);
    }
    const root = baseUrl.replace(/\/+$/, "");
    this.baseUrl = root.endsWith(API_PATH) ? root : root + API_PATH;
    this.agent = agent || env(ENV_AGENT) || `node:${globalThis.process?.pid ?? "agent"}`;
    this.timeoutMs = timeoutMs;
    this.retries = Math.max(0, retries);
    this.backoffMs = backoffMs;
    this.maxBodyBytes = maxBodyBytes || maxBodyFromEnv();
    this._token = token;
    this._fetch = fetch ?? globalThis.fetch.bind(globalThis);
  }

  async _request(method, path, body, { params, retryIfSent, timeoutMs }) {
    let url = this.baseUrl + path;
    if (params) {
      const query = new URLSearchParams(
        Object.entries(params)
          .filter(([, v]) => v !== undefined && v !== null)
          .map(([k, v]) => [k, String(v)]),
      );
      url += `?${query}`;
    }
    let data;
    if (body !== undefined) {
      try {
        data = JSON.stringify(body, (_, v) => {
          if (typeof v === "number" && !Number.isFinite(v)) throw new TypeError(`${v} is not JSON`);
          if (typeof v === "bigint") throw new TypeError("a BigInt is not JSON");
          return v;
        });
      } catch (error) {
        throw new InvalidArgs(`not JSON: ${error.message}`, { status: 0, body: { code: "invalid_args" } });
      }
    }
    const size = data === undefined ? 0 : new TextEncoder().encode(data).length;
    if (size > this.maxBodyBytes) {
      // A server refuses a body over its limit by closing the connection while it is sent, which reads
      // as a server down: refuse it here, where it is certain nothing was sent.
      const message =
        `the request body is ${size} bytes, over the limit of ${this.maxBodyBytes} (the ledger's ` +
        `LEDGER_API_MAX_BODY_BYTES; where the ledger allows more, pass maxBodyBytes or set ${ENV_MAX_BODY}); ` +
        "nothing was sent";
      throw new BodyTooLarge(message, { status: 413, body: { code: "body_too_large", message } });
    }
    const headers = {
      Authorization: `Bearer ${this._token}`,
      Accept: "application/json",
      "Ledgerdash-Agent": [...this.agent].filter((c) => c >= " " && c <= "~").join("").slice(0, 100),
    };
    if (data !== undefined) headers["Content-Type"] = "application/json";
    let last;
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      if (attempt) await sleep(Math.random() * Math.min(5000, this.backoffMs * 2 ** attempt));
      let response;
      try {
        response = await this._fetch(url, {
          method,
          headers,
          body: data,
          redirect: "manual",
          signal: AbortSignal.timeout(timeoutMs ?? this.timeoutMs),
        });
      } catch (error) {
        const certain = neverSent(error);
        last = new LedgerUnavailable(`${method} ${url}: ${error.cause?.message ?? error.message}`, {
          sent: certain ? false : null,
        });
        if (certain || retryIfSent) continue;
        throw last;
      }
      const payload = await this._json(response);
      if (response.ok) return { status: response.status, data: payload };
      if (response.status >= 300 && response.status < 400) {
        throw new ConfigurationError(
          `the ledger answered ${response.status} with a redirect to ${response.headers.get("Location")}; ` +
            `point ${ENV_URL} at that address`,
        );
      }
      if ([502, 503, 504].includes(response.status)) {
        last = new LedgerUnavailable(String(payload.message || `HTTP ${response.status}`), {
          sent: true,
          status: response.status,
          retryAfter: retryAfterOf(payload, response.headers.get("Retry-After")),
        });
        if (retryIfSent) continue;
        throw last;
      }
      throw errorFor(response.status, payload, response.headers.get("Retry-After"));
    }
    throw last;
  }

  async _json(response) {
    const text = await response.text();
    if (!text) return {};
    try {
      const value = JSON.parse(text);
      return value && typeof value === "object" && !Array.isArray(value) ? value : { value };
    } catch {
      return { code: `http_${response.status}`, message: text.slice(0, 200) };
    }
  }

  // --- the steps ------------------------------------------------------------------

  /**
   * Record the intent; safe to repeat. Resolves to `{ attempt, created, claimed }`. With `claim`,
   * the dispatch is claimed in the same commit where the tool allows it (`claimed`: the attempt is
   * DISPATCHED and yours to send, with its fence; skip `dispatch`).
   */
  async recordIntent({ taskId, toolName, idempotencyKey, args, credentialScope, claim = false }) {
    checkKey(idempotencyKey);
    const body = { task_id: taskId, tool_name: toolName, idempotency_key: idempotencyKey, args };
    if (claim) body.claim = true;
    if (credentialScope !== undefined && credentialScope !== null) {
      body.credential_scope = typeof credentialScope === "string" ? credentialScope.split(/\s+/) : [...credentialScope];
    }
    const { status, data } = await this._request("POST", "/attempts", body, { retryIfSent: true });
    const created = status === 201;
    return { attempt: data, created, claimed: created && data.state === "DISPATCHED" };
  }

  /** Claim the attempt for dispatch; call the provider only after this resolves. Never re-sent once it may have left. */
  async dispatch(attemptId, { fence } = {}) {
    const body = fence === undefined || fence === null ? undefined : { fence };
    return (await this._request("POST", `/attempts/${attemptId}/dispatch`, body, { retryIfSent: false })).data;
  }

  async heartbeat(attemptId, { fence }) {
    return (await this._request("POST", `/attempts/${attemptId}/heartbeat`, { fence }, { retryIfSent: true })).data;
  }

  async abandon(attemptId, { fence = 0, reason = "" } = {}) {
    const body = { fence, reason };
    return (await this._request("POST", `/attempts/${attemptId}/abandon`, body, { retryIfSent: true })).data;
  }

  async recordRequestId(attemptId, requestId, { fence }) {
    const body = { fence, provider_request_id: requestId };
    return (await this._request("POST", `/attempts/${attemptId}/request-id`, body, { retryIfSent: true })).data;
  }

  async _outcome(attemptId, body) {
    return (await this._request("POST", `/attempts/${attemptId}/outcome`, body, { retryIfSent: true })).data;
  }

  confirm(attemptId, { fence, providerRequestId = "", resultRef = "", result = null }) {
    const body = { outcome: "confirmed", fence, provider_request_id: providerRequestId, result_ref: resultRef, result };
    return this._outcome(attemptId, body);
  }

  fail(attemptId, { fence, reason }) {
    return this._outcome(attemptId, { outcome: "failed", fence, reason });
  }

  failRetryable(attemptId, { fence, reason }) {
    return this._outcome(attemptId, { outcome: "failed_retryable", fence, reason });
  }

  markUnknown(attemptId, { fence, reason }) {
    return this._outcome(attemptId, { outcome: "unknown", fence, reason });
  }

  // --- reads ------------------------------------------------------------------------

  // With `wait` (seconds, at most 25): answered as soon as the attempt's fence
  // differs from `fence` (default: its fence when the ledger receives the request).
  async get(attemptId, { wait = 0, fence = null } = {}) {
    const params = wait ? { wait, fence } : undefined;
    const timeoutMs = this.timeoutMs + wait * 1000;
    return (await this._request("GET", `/attempts/${attemptId}`, undefined, { params, retryIfSent: true, timeoutMs }))
      .data;
  }

  async _list(params, limit) {
    const found = [];
    let before = null;
    while (limit === null || found.length < limit) {
      const { data } = await this._request("GET", "/attempts", undefined, {
        params: { ...params, limit: 200, before },
        retryIfSent: true,
      });
      found.push(...data.items);
      before = data.next_before;
      if (before === null || before === undefined) break;
    }
    return limit === null ? found : found.slice(0, limit);
  }

  /** The key's attempts, newest first. */
  find(idempotencyKey) {
    checkKey(idempotencyKey);
    return this._list({ idempotency_key: idempotencyKey }, null);
  }

  /** The tenant's UNKNOWN and MANUAL_REVIEW attempts, newest first. */
  needsAttention({ limit = 1000 } = {}) {
    return this._list({ needs_attention: "true" }, limit);
  }

  /** The task that tools made from it belong to. */
  task({ taskId }) {
    if (typeof taskId !== "string" || !taskId.trim()) throw new NoTask("a task needs a non-empty taskId");
    return new Task(this, taskId);
  }
}

/** What a wrapped tool receives first. */
export class ToolCall {
  constructor(client, attempt) {
    this.client = client;
    this.attempt = attempt;
    this.fence = attempt.fence;
    this.requestId = attempt.provider_request_id || "";
    /** Set this to where the result can be checked, if the provider gives no request id. */
    this.resultRef = "";
  }

  /** The idempotency key to send to the provider. */
  get key() {
    return this.attempt.provider_key;
  }

  get args() {
    return { ...(this.attempt.args ?? {}) };
  }

  /** Persist the provider's request id now, before anything else can go wrong. */
  async recordRequestId(requestId) {
    if (requestId && requestId !== this.requestId) {
      this.attempt = await this.client.recordRequestId(this.attempt.id, requestId, { fence: this.fence });
      this.requestId = requestId;
    }
  }

  /** The work is still running: extend the lease (the wrapper also beats on its own). */
  heartbeat() {
    return this.client.heartbeat(this.attempt.id, { fence: this.fence });
  }
}

function heartbeatInterval(attempt) {
  const end = Date.parse(attempt.next_check_at ?? "");
  const start = Date.parse(attempt.updated_at ?? "");
  if (Number.isNaN(end) || Number.isNaN(start)) return 0;
  return Math.max(50, (end - start) / 3);
}

// A beat that fails is logged and beating goes on; a superseded dispatch stops it.
function beat(call, interval) {
  if (interval <= 0) return () => {};
  let stopped = false;
  const timer = setInterval(async () => {
    try {
      await call.heartbeat();
    } catch (error) {
      if (["stale_fence", "claim_lost"].includes(error?.code)) {
        stopped = true;
        clearInterval(timer);
      }
      console.warn(`attempt ${call.attempt.id}: heartbeat failed: ${error?.message ?? error}`);
    }
  }, interval);
  timer.unref?.();
  return () => {
    if (!stopped) clearInterval(timer);
  };
}

function storable(value) {
  let dumped;
  try {
    dumped = JSON.stringify(value === undefined ? null : value, (_, v) => {
      if (typeof v === "number" && !Number.isFinite(v)) throw new TypeError(`${v} is not JSON`);
      return v;
    });
  } catch (error) {
    return [null, `result not stored for replay: ${error.message}`];
  }
  if (dumped.includes("\\u0000")) return [null, "result not stored for replay: it contains a NUL character"];
  return [JSON.parse(dumped), ""];
}

async function bestEffort(what, attempt, report) {
  // The tool's own outcome matters more than a failed report: an unreported
  // outcome is found by the reconciler when the lease runs out.
  try {
    await report();
  } catch (error) {
    console.warn(`could not report attempt ${attempt.id} as ${what}; the reconciler will settle it: ${error.message}`);
  }
}

export class Task {
  constructor(client, taskId) {
    this.client = client;
    this.taskId = taskId;
  }

  /**
   * Wrap `fn(call, args)` so every call goes through the ledger. `key` names the
   * logical side effect: a template over the arguments or a function of them;
   * stable across restarts, never random. Throw NothingHappened when the
   * provider guarantees it did not act, PermanentFailure for a definitive
   * refusal; anything else leaves the outcome UNKNOWN for the reconciler.
   */
  tool(name, { key, scope } = {}, fn) {
    if (typeof name !== "string" || !name.trim()) throw new TypeError("a tool needs a name");
    if (typeof fn !== "function") throw new TypeError("a tool needs a function");
    if (typeof key !== "string" && typeof key !== "function") throw new TypeError("a tool needs a key");
    const client = this.client;
    const taskId = this.taskId;
    const wrapped = async (args = {}) => {
      const idempotencyKey = typeof key === "function" ? key(args) : formatKey(key, args);
      const recorded = await client.recordIntent({
        taskId,
        toolName: name,
        idempotencyKey,
        args,
        credentialScope: scope,
        claim: true,
      });
      const { attempt, claimed } = recorded;
      if (!claimed && attempt.state === CONFIRMED) return replay(attempt);
      crashPoint("after_intent"); // claimed: the claim committed with the intent
      let dispatched = attempt;
      if (!claimed) {
        try {
          dispatched = await client.dispatch(attempt.id, { fence: attempt.fence });
        } catch (error) {
          if (error instanceof ClaimLost) {
            throw new AttemptInFlight(error.message, { status: error.status, body: error.body });
          }
          throw error;
        }
      }
      return run(fn, new ToolCall(client, dispatched), args);
    };
    Object.defineProperty(wrapped, "ledgerTool", { value: name });
    return wrapped;
  }
}

function replay(attempt) {
  if (attempt.result_source === "tool" || attempt.result_source === "lookup") return attempt.result;
  throw new ResultUnavailable(
    `attempt ${attempt.id} is confirmed (${attempt.last_note || "confirmed"}) but has no recorded result to ` +
      "replay; the effect happened, do not call the tool again",
    { status: 200, body: { code: ResultUnavailable.code, attempt_id: attempt.id, state: attempt.state } },
  );
}

async function run(fn, call, args) {
  const { client } = call;
  const fence = call.fence;
  const stop = beat(call, heartbeatInterval(call.attempt));
  let value;
  try {
    value = await fn(call, args);
  } catch (error) {
    stop();
    const id = call.attempt.id;
    if (error instanceof NothingHappened) {
      const reason = error.message || "provider rejected the request before acting";
      await bestEffort("failed, retryable", call.attempt, () => client.failRetryable(id, { fence, reason }));
    } else if (error instanceof PermanentFailure) {
      const reason = error.message || "provider refused the request";
      await bestEffort("failed", call.attempt, () => client.fail(id, { fence, reason }));
    } else {
      const reason = `tool raised ${error?.name ?? "an error"}: ${error?.message ?? error}`.slice(0, 1000);
      await bestEffort("unknown", call.attempt, () => client.markUnknown(id, { fence, reason }));
    }
    throw error;
  }
  stop();
  crashPoint("after_response");
  const id = call.attempt.id;
  if (!call.requestId && !call.resultRef) {
    await bestEffort("unknown", call.attempt, () => client.markUnknown(id, { fence, reason: NO_RECEIPT }));
    return value;
  }
  const [stored, note] = storable(value);
  if (note) console.warn(`attempt ${id}: ${note}`);
  await bestEffort("confirmed", call.attempt, () =>
    client.confirm(id, { fence, providerRequestId: call.requestId, resultRef: call.resultRef, result: stored }),
  );
  return value;
}

// The client's API. The API's shapes come from the generated api.d.ts
// (the OpenAPI document) and the error classes from the generated errors.d.ts.
import type { AttemptDetailOut, AttemptOut, AttemptSummaryOut } from "./api.js";

export * from "./base.js";
export * from "./errors.js";
export type * from "./api.js";

export declare const ENV_URL: "LEDGERDASH_URL";
export declare const ENV_TOKEN: "LEDGERDASH_TOKEN";
export declare const ENV_AGENT: "LEDGERDASH_AGENT";
export declare const ENV_MAX_BODY: "LEDGERDASH_MAX_BODY_BYTES";
export declare const MAX_BODY_BYTES: number;

export declare function errorFor(
  status: number,
  body: Record<string, unknown>,
  retryAfterHeader?: string | null,
): import("./base.js").ApiError;
export declare function formatKey(template: string, args: Record<string, unknown>): string;

export interface LedgerClientOptions {
  /** The server, e.g. http://127.0.0.1:8000 (default: LEDGERDASH_URL). */
  baseUrl?: string;
  /** An API token (default: LEDGERDASH_TOKEN). */
  token?: string;
  /** Who the ledger's events name (default: LEDGERDASH_AGENT, else node:<pid>). */
  agent?: string;
  timeoutMs?: number;
  retries?: number;
  backoffMs?: number;
  /**
   * The largest request body to send (default: LEDGERDASH_MAX_BODY_BYTES, else 512 KiB, the ledger's own
   * default): a larger one is refused with BodyTooLarge before it is sent.
   */
  maxBodyBytes?: number;
  fetch?: typeof globalThis.fetch;
}

export interface Recorded {
  attempt: AttemptOut;
  /** false when the key was already recorded with these arguments. */
  created: boolean;
  /** the dispatch was claimed with the intent (`claim: true`, allowed by the tool): DISPATCHED, yours to send. */
  claimed: boolean;
}

export type Key<A> = string | ((args: A) => string);

export declare class LedgerClient {
  constructor(options?: LedgerClientOptions);
  readonly baseUrl: string;
  agent: string;
  recordIntent(request: {
    taskId: string;
    toolName: string;
    idempotencyKey: string;
    args: Record<string, unknown>;
    credentialScope?: string | Iterable<string> | null;
    claim?: boolean;
  }): Promise<Recorded>;
  dispatch(attemptId: number, options?: { fence?: number | null }): Promise<AttemptOut>;
  heartbeat(attemptId: number, options: { fence: number }): Promise<AttemptOut>;
  abandon(attemptId: number, options?: { fence?: number; reason?: string }): Promise<AttemptOut>;
  recordRequestId(attemptId: number, requestId: string, options: { fence: number }): Promise<AttemptOut>;
  confirm(
    attemptId: number,
    options: { fence: number; providerRequestId?: string; resultRef?: string; result?: unknown },
  ): Promise<AttemptOut>;
  fail(attemptId: number, options: { fence: number; reason: string }): Promise<AttemptOut>;
  failRetryable(attemptId: number, options: { fence: number; reason: string }): Promise<AttemptOut>;
  markUnknown(attemptId: number, options: { fence: number; reason: string }): Promise<AttemptOut>;
  /** With `wait` (seconds, at most 25): answered as soon as the attempt moves past `fence`. */
  get(attemptId: number, options?: { wait?: number; fence?: number | null }): Promise<AttemptDetailOut>;
  find(idempotencyKey: string): Promise<AttemptSummaryOut[]>;
  needsAttention(options?: { limit?: number | null }): Promise<AttemptSummaryOut[]>;
  task(options: { taskId: string }): Task;
}

export declare class ToolCall<A = Record<string, unknown>> {
  readonly attempt: AttemptOut;
  readonly fence: number;
  requestId: string;
  /** Where the result can be checked, if the provider gives no request id. */
  resultRef: string;
  /** The idempotency key to send to the provider. */
  readonly key: string;
  readonly args: A;
  recordRequestId(requestId: string): Promise<void>;
  heartbeat(): Promise<AttemptOut>;
}

export declare class Task {
  readonly client: LedgerClient;
  readonly taskId: string;
  tool<A extends Record<string, unknown>, R>(
    name: string,
    options: { key: Key<A>; scope?: string | Iterable<string> },
    fn: (call: ToolCall<A>, args: A) => Promise<R> | R,
  ): ((args: A) => Promise<R>) & { readonly ledgerTool: string };
}

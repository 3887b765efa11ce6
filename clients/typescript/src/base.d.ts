export declare class LedgerClientError extends Error {
  static code: string;
  code: string;
  constructor(message: string);
}
export declare class ConfigurationError extends LedgerClientError {}
export declare class NoTask extends LedgerClientError {}
export declare class LedgerUnavailable extends LedgerClientError {
  /** false: the request certainly never arrived; true or null: it may have. */
  sent: boolean | null;
  status: number | null;
  /** Seconds the ledger asked to wait before trying again (its Retry-After), when it said. */
  retryAfter: number | null;
  constructor(
    message: string,
    options?: { sent?: boolean | null; status?: number | null; retryAfter?: number | null },
  );
}
/** Seconds from a Retry-After header or a body's `retry_after`, or null. */
export declare function retryAfterOf(body: Record<string, unknown> | null | undefined, header: string | null): number | null;
export declare class ApiError extends LedgerClientError {
  status: number;
  body: import("./api.js").ErrorOut | Record<string, unknown>;
  attemptId: number | null;
  /** On idempotency_key_reused and authorization_changed: the attempt first recorded under the key. */
  originalId: number | null;
  state: string | null;
  /** Seconds to wait before asking again (awaiting_approval, retry_pending, attempt_in_flight), when said. */
  retryAfter: number | null;
  constructor(
    message: string,
    options: { status: number; body?: Record<string, unknown>; code?: string; retryAfter?: number | null },
  );
}
export declare class NothingHappened extends Error {
  constructor(message?: string);
}
export declare class PermanentFailure extends Error {
  constructor(message?: string);
}

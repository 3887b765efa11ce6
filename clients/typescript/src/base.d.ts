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
  constructor(message: string, options?: { sent?: boolean | null; status?: number | null });
}
export declare class ApiError extends LedgerClientError {
  status: number;
  body: import("./api.js").ErrorOut | Record<string, unknown>;
  attemptId: number | null;
  state: string | null;
  constructor(message: string, options: { status: number; body?: Record<string, unknown>; code?: string });
}
export declare class NothingHappened extends Error {
  constructor(message?: string);
}
export declare class PermanentFailure extends Error {
  constructor(message?: string);
}

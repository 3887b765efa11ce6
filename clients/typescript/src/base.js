// The client's own errors and the base every code's class extends (errors.js).

/** Base of everything this client throws on purpose. */
export class LedgerClientError extends Error {
  static code = "client_error";
  constructor(message) {
    super(message);
    this.name = new.target.name;
    this.code = new.target.code;
  }
}

export class ConfigurationError extends LedgerClientError {
  static code = "client_configuration";
}

export class NoTask extends LedgerClientError {
  static code = "no_task";
}

/**
 * The ledger could not be reached, or kept answering that it is unavailable.
 * `sent` is false when the request certainly never arrived, true or null when
 * it may have.
 */
export class LedgerUnavailable extends LedgerClientError {
  static code = "ledger_unavailable";
  constructor(message, { sent = null, status = null, retryAfter = null } = {}) {
    super(message);
    this.sent = sent;
    this.status = status;
    /** seconds the ledger asked to wait before trying again (its Retry-After), when it said */
    this.retryAfter = retryAfter;
  }
}

/** Seconds from a Retry-After header or a body's `retry_after`, or null. */
export function retryAfterOf(body, header) {
  const fromBody = body?.retry_after;
  if (Number.isInteger(fromBody) && fromBody > 0) return fromBody;
  const seconds = Number.parseInt(header ?? "", 10);
  return Number.isInteger(seconds) && seconds > 0 ? seconds : null;
}

/** The ledger answered with an error: `code` (stable), `status`, `body`. */
export class ApiError extends LedgerClientError {
  static code = "api_error";
  constructor(message, { status, body = {}, code, retryAfter = null } = {}) {
    super(message);
    this.status = status;
    this.body = body;
    if (code && code !== new.target.code) this.code = code;
    /** the attempt the error is about, when there is one (on a conflict: the linked attempt) */
    this.attemptId = body.attempt_id ?? null;
    /** on idempotency_key_reused and authorization_changed: the attempt first recorded under the key */
    this.originalId = body.original_id ?? null;
    this.state = body.state ?? null;
    /** seconds to wait before asking again (awaiting_approval, retry_pending, attempt_in_flight), when the ledger said */
    this.retryAfter = retryAfterOf(body, null) ?? retryAfter;
  }
}

/** Throw from a tool when the provider guarantees it did not act (FAILED_RETRYABLE). */
export class NothingHappened extends Error {
  constructor(message = "provider rejected the request before acting") {
    super(message);
    this.name = "NothingHappened";
  }
}

/** Throw from a tool for a definitive refusal (FAILED). */
export class PermanentFailure extends Error {
  constructor(message = "provider refused the request") {
    super(message);
    this.name = "PermanentFailure";
  }
}

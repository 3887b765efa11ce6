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
  constructor(message, { sent = null, status = null } = {}) {
    super(message);
    this.sent = sent;
    this.status = status;
  }
}

/** The ledger answered with an error: `code` (stable), `status`, `body`. */
export class ApiError extends LedgerClientError {
  static code = "api_error";
  constructor(message, { status, body = {}, code } = {}) {
    super(message);
    this.status = status;
    this.body = body;
    if (code && code !== new.target.code) this.code = code;
    /** the attempt the error is about, when there is one (on a conflict: the linked attempt) */
    this.attemptId = body.attempt_id ?? null;
    this.state = body.state ?? null;
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

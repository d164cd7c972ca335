import { STATUS_CODES } from "node:http";

/** The base of every error this package throws. */
export class IdemError extends Error {
  override name = "IdemError";
}

/** The fields of an RFC 9457 problem answered by idemd. */
export interface ProblemInit {
  status: number;
  code: string;
  title: string;
  type?: string;
  detail?: string;
  instance?: string;
  retryAfterMs?: number;
  body?: unknown;
}

/**
 * An RFC 9457 problem answered by idemd, or by something in front of it (then `code` is
 * empty). Codes this package does not know arrive as a plain ProblemError: branch on
 * `status` for those. A failure to get any answer is an UnavailableError with status 0.
 */
export class ProblemError extends IdemError {
  override name = "ProblemError";
  /** The HTTP status, or 0 when no answer came. */
  readonly status: number;
  /** idemd's machine-readable code, e.g. in_progress; an open set. */
  readonly code: string;
  readonly title: string;
  readonly type: string;
  readonly detail: string;
  readonly instance: string | undefined;
  /** When trying again makes sense, for in_progress, rate_limited and unavailable. */
  readonly retryAfterMs: number | undefined;
  /** The answer's body as received (parsed JSON when it was JSON). */
  readonly body: unknown;

  constructor(p: ProblemInit, options?: ErrorOptions) {
    let message = `idemd: ${p.status} ${p.title}`;
    if (p.code) message += ` (${p.code})`;
    if (p.detail) message += `: ${p.detail}`;
    super(message, options);
    this.status = p.status;
    this.code = p.code;
    this.title = p.title;
    this.type = p.type ?? "about:blank";
    this.detail = p.detail ?? "";
    this.instance = p.instance;
    this.retryAfterMs = p.retryAfterMs;
    this.body = p.body;
  }
}

/** Another caller holds a live lease on the key. */
export class InProgressError extends ProblemError {
  override name = "InProgressError";
}

/** The key was first claimed with another fingerprint (another payload). */
export class FingerprintMismatchError extends ProblemError {
  override name = "FingerprintMismatchError";
}

/** The lease is no longer held: it ran out and another caller took the key over. */
export class LeaseLostError extends ProblemError {
  override name = "LeaseLostError";
}

/**
 * The lease ran out by the holder's own clock: no renewal was answered before its local
 * deadline (see Lease.deadline), so idemd may have given the key to another caller. It is
 * a LeaseLostError, and is handled as one; its class tells it apart from a lease_lost
 * that idemd answered. Its status is 0 (no answer came) and its cause the last renewal's
 * failure, if any.
 */
export class LeaseExpiredError extends LeaseLostError {
  override name = "LeaseExpiredError";
}

/** idemd has no record of the key. */
export class NotFoundError extends ProblemError {
  override name = "NotFoundError";
}

/**
 * idemd, its store, or the network to it failed. The call may or may not have taken
 * effect; resending it is safe. With status 0 no answer came at all (see `cause`).
 */
export class UnavailableError extends ProblemError {
  override name = "UnavailableError";
}

/**
 * An UnavailableError of a result that complete sent as the raw body of
 * PUT /v1/keys/{key}/result (a body, or sealed envelope, over 1 MiB). A daemon without a
 * blob store may refuse such a body with 413 before reading it and close the connection,
 * which reaches the client as no answer: the middlewares then store the key as
 * response_not_stored (docs/middleware.md R10a) rather than leave it claimed.
 */
export class RawResultUnavailableError extends UnavailableError {
  override name = "RawResultUnavailableError";
}

/**
 * idemd refused a new key: the tenant keeps its quota of idemd's store, or more than its
 * share of a store that is nearly full (status 429, code quota_exceeded). Keys already
 * stored still replay; `retryAfterMs` says when records expire, when idemd knows.
 */
export class QuotaExceededError extends ProblemError {
  override name = "QuotaExceededError";
}

/**
 * idemd refused a body over its limits: a recovery point's data over the daemon's
 * --max-recovery-point-bytes (4096 by default), or a result or request too large. Nothing
 * was recorded; for a recovery point the lease goes on.
 */
export class PayloadTooLargeError extends ProblemError {
  override name = "PayloadTooLargeError";
}

/** A finished key whose operation failed for good: run replays the stored failure. */
export class FailedError extends IdemError {
  override name = "FailedError";
  /** The value given to the PermanentError that stored the failure. */
  readonly value: unknown;

  constructor(message: string, value: unknown) {
    super(message);
    this.value = value;
  }
}

/**
 * An operation's failure that must not be retried (a declined card, say): thrown from
 * the function given to run, it is stored as the key's terminal failure, and later runs
 * of the key throw a FailedError carrying its message and value.
 */
export class PermanentError extends IdemError {
  override name = "PermanentError";
  readonly value: unknown;

  constructor(message: string, options?: ErrorOptions & { value?: unknown }) {
    super(message, options);
    this.value = options?.value;
  }
}

/** The operation ran, but idemd did not store its result (see `cause`). */
export class ResultNotStoredError extends IdemError {
  override name = "ResultNotStoredError";
  /** What the operation returned. */
  readonly value: unknown;

  constructor(key: string, value: unknown, cause: unknown) {
    super(`idem: ${JSON.stringify(key)} ran but its result was not stored`, { cause });
    this.value = value;
  }
}

/**
 * Why a sealed result or recovery point did not open (docs/sealing.md): unknown_key, the
 * envelope names a key the ring does not hold (or the client has no ring); invalid, not
 * an envelope, or one that fails to open (changed in the store, moved to another key,
 * tenant, status or point, or sealed with other bytes under the id); not_sealed, the
 * ring requires sealed results and this one is plain.
 */
export type UnsealableReason = "unknown_key" | "invalid" | "not_sealed";

/**
 * A stored result or recovery point that this client cannot open. The key is not run
 * again for it: its operation ran, and its result is unreadable here. run, once and
 * consume throw it without running the work; the middlewares answer 502
 * stored_response_unsealable (P5).
 */
export class UnsealableError extends IdemError {
  override name = "UnsealableError";
  readonly reason: UnsealableReason;
  /** The id of the key the envelope names; "" when it names none (not an envelope, or plain). */
  readonly keyId: string;

  constructor(reason: UnsealableReason, keyId = "", options?: ErrorOptions) {
    let message: string;
    switch (reason) {
      case "unknown_key":
        message = `idem: the result is sealed with key ${JSON.stringify(keyId)}, which the key ring does not hold`;
        break;
      case "not_sealed":
        message = "idem: the result is not sealed, and the key ring requires sealed results";
        break;
      default:
        message = "idem: the sealed result does not open: changed, moved, or sealed with other key bytes";
    }
    super(message, options);
    this.reason = reason;
    this.keyId = keyId;
  }
}

const byCode: Record<string, new (p: ProblemInit, options?: ErrorOptions) => ProblemError> = {
  in_progress: InProgressError,
  fingerprint_mismatch: FingerprintMismatchError,
  lease_lost: LeaseLostError,
  not_found: NotFoundError,
  payload_too_large: PayloadTooLargeError,
  store_unavailable: UnavailableError,
  not_replicated: UnavailableError,
  quota_exceeded: QuotaExceededError,
};

/** Reads a failed answer into the ProblemError its code names. */
export function problemFrom(response: Response, body: unknown): ProblemError {
  const mediaType = (response.headers.get("Content-Type") ?? "").split(";")[0]?.trim().toLowerCase();
  const isJSON = mediaType === "application/problem+json" || mediaType === "application/json";
  let init: ProblemInit;
  if (isJSON && typeof body === "object" && body !== null) {
    const wire = body as Record<string, unknown>;
    init = {
      status: response.status,
      code: typeof wire.code === "string" ? wire.code : "",
      title: typeof wire.title === "string" ? wire.title : response.statusText,
      body,
    };
    if (typeof wire.type === "string") init.type = wire.type;
    if (typeof wire.detail === "string") init.detail = wire.detail;
    if (typeof wire.instance === "string") init.instance = wire.instance;
    if (typeof wire.retry_after_ms === "number") init.retryAfterMs = wire.retry_after_ms;
  } else {
    // Not idemd's answer: a proxy or load balancer in between.
    const text = typeof body === "string" ? body : "";
    init = { status: response.status, code: "", title: response.statusText, detail: text.trim().slice(0, 200), body };
  }
  if (init.retryAfterMs === undefined) {
    const seconds = Number.parseInt(response.headers.get("Retry-After") ?? "", 10);
    if (Number.isFinite(seconds)) init.retryAfterMs = seconds * 1000;
  }
  return problemOf(init);
}

/**
 * Reads the problem of one item of a batch, which has no headers of its own: the same
 * ProblemError the item's single call would have thrown.
 */
export function itemProblem(status: number, wire: Record<string, unknown> | undefined): ProblemError {
  const init: ProblemInit = {
    status,
    code: typeof wire?.code === "string" ? wire.code : "",
    title: typeof wire?.title === "string" ? wire.title : (STATUS_CODES[status] ?? ""),
    body: wire,
  };
  if (typeof wire?.type === "string") init.type = wire.type;
  if (typeof wire?.detail === "string") init.detail = wire.detail;
  if (typeof wire?.instance === "string") init.instance = wire.instance;
  if (typeof wire?.retry_after_ms === "number") init.retryAfterMs = wire.retry_after_ms;
  return problemOf(init);
}

/** The ProblemError class a problem's code (or, without one, its status) names. */
function problemOf(init: ProblemInit): ProblemError {
  const known = byCode[init.code];
  if (known) return new known(init);
  if (init.code === "" && [502, 503, 504].includes(init.status)) return new UnavailableError(init);
  return new ProblemError(init);
}

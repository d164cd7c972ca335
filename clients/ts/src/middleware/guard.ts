// The Idempotency-Key middleware's behaviour, shared by the Express middleware and the
// Fastify plugin: docs/middleware.md, row by row (the row names are in the comments).
import type { IncomingMessage, ServerResponse } from "node:http";
import { type IdemClient, type Lease, type RecoveryPoint, type StoredResponse } from "../client.js";
import {
  FingerprintMismatchError,
  InProgressError,
  LeaseExpiredError,
  LeaseLostError,
  ProblemError,
  QuotaExceededError,
  RawResultUnavailableError,
  UnavailableError,
  UnsealableError,
} from "../errors.js";
import { fingerprint, idemdKey, parseIdempotencyKey } from "../fingerprint.js";
import { Recorder } from "./recorder.js";

/** The cases where the middleware could not keep a promise (docs/middleware.md, Incidents). */
export type IncidentKind =
  | "unavailable"
  | "fail_open"
  | "idemd_refused"
  | "quota_exceeded"
  | "scope_missing"
  | "result_not_stored"
  | "complete_failed"
  | "release_failed"
  | "lease_lost"
  | "lease_expired"
  | "replay_invalid"
  | "replay_unsealable";

export interface Incident {
  kind: IncidentKind;
  /** The idemd key, "" when none was derived. */
  idemdKey: string;
  error?: unknown;
}

/** The middleware's options; only scope is required (see docs/middleware.md, Options). */
export interface IdempotencyOptions<Req> {
  /**
   * Whose request it is: the authenticated user, account or tenant, a non-empty string.
   * A replay never crosses scopes. There is no default; a service whose answers are not
   * private says so with a constant.
   */
  scope: (req: Req) => string | null | undefined | Promise<string | null | undefined>;
  /**
   * Put before every idemd key the middleware derives, so that the keys of one route or
   * service share it: a completer (or the abandoned-keys feed) selects them by it, for
   * example "orders/". The idemd key of a request becomes the prefix followed by the
   * derived key; the lease the handler finds, and incidents, carry that full key, and
   * lookup takes it. The derivation itself does not change. Default "". At most 172
   * bytes of UTF-8, refused at construction otherwise: a derived key is 83 bytes, and
   * idemd's keys 255 at most.
   */
  keyPrefix?: string;
  /** The methods the middleware applies to; default POST and PATCH. */
  methods?: readonly string[];
  /** Answer 400 to a request of those methods without a key; default off. */
  requireKey?: boolean;
  /**
   * How long a duplicate waits for the first request to finish instead of a 409 (at most
   * 30 s); default 0. A duplicate whose client leaves stops waiting at once.
   */
  waitMs?: number;
  /** The lease held while the handler runs, renewed every leaseMs/3; default 30 s (100 ms to 1 h). */
  leaseMs?: number;
  /** The response headers stored and replayed; default content-type and location. */
  storedHeaders?: readonly string[];
  /** The largest request body read to fingerprint it; default 10 MiB. */
  maxBodyBytes?: number;
  /**
   * The largest result recorded and stored, body plus stored header names and values;
   * default 64 MiB, idemd's default --max-blob-bytes. Below it idemd's own limit decides:
   * one without a blob store refuses a result over its --max-response-bytes (1 MiB by
   * default) with 413, answered as a result over this bound is (response_not_stored).
   */
  maxStoredBytes?: number;
  /** Whether an answer of this status is a result to store; default 2xx, 3xx and 402. */
  storeStatus?: (status: number) => boolean;
  /** Let requests through, unprotected, while idemd cannot be reached; default off. */
  failOpen?: boolean;
  /** Called, after the answer is written, for every case where a promise could not be kept. */
  onIncident?: (req: Req, incident: Incident) => void;
}

/** An answer the middleware writes itself. */
export interface Answer {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer;
}

// P2: never stored, and refused at construction if listed.
const neverStored = new Set([
  "set-cookie",
  "set-cookie2",
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "content-length",
  "date",
  "idempotent-replayed",
]);

const leases = new WeakMap<IncomingMessage, Lease>();

/**
 * The signal of a request the middleware runs under a lease: it aborts when the lease is
 * lost (R12). Undefined for a request it does not protect.
 */
export function idempotencySignal(req: IncomingMessage | { raw: IncomingMessage }): AbortSignal | undefined {
  return idempotencyLease(req)?.signal;
}

/**
 * The lease a request the middleware protects runs under (L1): the idemd key, its
 * attempt and whether it was recovered from a request whose lease ran out. Undefined for
 * a request it does not protect (L2). Express handlers also find it at
 * res.locals.idemdLease, Fastify handlers at request.idemdLease.
 */
export function idempotencyLease(req: IncomingMessage | { raw: IncomingMessage }): Lease | undefined {
  return leases.get("raw" in req ? req.raw : req);
}

/** A problem+json answer of the middleware (never stored, except response_not_stored). */
export function problem(status: number, code: string, title: string, detail: string, retryAfterS?: number): Answer {
  const headers: Record<string, string> = { "content-type": "application/problem+json" };
  if (retryAfterS !== undefined) headers["retry-after"] = String(retryAfterS);
  const body = Buffer.from(JSON.stringify({ type: "about:blank", title, status, detail, code }));
  return { status, headers, body };
}

/**
 * P5: the stored answer (or the recovery point the lease would start from) does not
 * open here. The operation ran or started, so the handler does not run, and the
 * envelope is no answer to pass on.
 */
const unsealable = (derived: string, error: UnsealableError): Decision => ({
  answer: problem(
    502,
    "stored_response_unsealable",
    "Stored response unsealable",
    "the stored answer of this Idempotency-Key cannot be opened by this service: it was not run again",
  ),
  incident: { kind: "replay_unsealable", idemdKey: derived, error },
});

const notStored = () =>
  problem(
    409,
    "response_not_stored",
    "Response not stored",
    "the request with this Idempotency-Key ran, but its answer could not be stored: do not resend it, look the result up",
  );

/** The target without the scheme and authority of an absolute-form target (through a proxy), as Go reads it. */
function originForm(target: string): string {
  if (target.startsWith("/")) return target;
  const scheme = target.indexOf("://");
  if (scheme >= 0) {
    const rest = target.slice(scheme + 3);
    const at = rest.search(/[/?]/);
    target = at >= 0 ? rest.slice(at) : "";
  }
  return target.startsWith("/") ? target : `/${target}`;
}

/** The length of a derived key (idemdKey): "idempotency-key:v1:" and 64 hex digits. */
const derivedKeyBytes = 83;
/** The longest key idemd takes, in bytes of UTF-8. */
const maxKeyBytes = 255;

/** The lease the middleware claimed for a request. */
export interface Acquired {
  idemdKey: string;
  leaseToken: string;
  attempt: number;
  recovered: boolean;
  /** The last point an earlier holder recorded, to resume from. */
  recoveryPoint: RecoveryPoint | undefined;
  /** The performance.now() at which the claim was sent: the lease's deadline is reckoned from it. */
  sentAt: number;
}

/** What to do with a request, decided before the handler runs. */
export type Decision =
  /** Run the handler without protection (M1, M2, fail-open); then report the incident, if any. */
  | { pass: true; incident?: Incident }
  /** Answer in the handler's place; then report the incident, if any. */
  | { answer: Answer; incident?: Incident }
  /** The lease is held: run the handler under it. */
  | { acquired: Acquired }
  /** The client left before the handler could run (C3a): nobody is there to answer. */
  | { gone: true };

/**
 * A signal that aborts when the client of res goes away before its answer is finished.
 * A request's own 'close' says nothing of the client: Node emits it once the body has
 * been read. The response's 'close' before it finished does (Node's http docs).
 */
export function clientGone(res: ServerResponse): AbortSignal {
  const gone = new AbortController();
  const leave = () => gone.abort(new Error("the client went away"));
  if (res.destroyed || res.socket?.destroyed) leave();
  else {
    res.once("close", () => {
      if (!res.writableFinished) leave();
    });
  }
  return gone.signal;
}

/** Reads a request body whole, up to a limit. */
export type BodyRead = { body: Buffer } | { tooLarge: true } | { unreadable: unknown };

export class Guard<Req> {
  readonly #client: IdemClient;
  readonly #o: Required<Omit<IdempotencyOptions<Req>, "onIncident">> & Pick<IdempotencyOptions<Req>, "onIncident">;

  readonly #methods: Set<string>;
  readonly #stored: Set<string>;

  constructor(client: IdemClient, options: IdempotencyOptions<Req>) {
    if (typeof options?.scope !== "function") {
      // M5: no safe default exists.
      throw new TypeError(
        "idempotency middleware: the scope option is required: a function of the request naming whose request it is (a user or account ID)",
      );
    }
    const stored = (options.storedHeaders ?? ["content-type", "location"]).map((h) => h.toLowerCase());
    const refused = stored.filter((h) => neverStored.has(h));
    if (refused.length > 0) {
      throw new TypeError(`idempotency middleware: storedHeaders may not list ${refused.join(", ")}`);
    }
    // idemd refuses every claim outside the contract's limits: such a middleware would
    // answer 503 to every request.
    const waitMs = options.waitMs ?? 0;
    const leaseMs = options.leaseMs ?? 30_000;
    if (!(waitMs >= 0 && waitMs <= 30_000)) {
      throw new RangeError(`idempotency middleware: waitMs is ${waitMs}; idemd waits 0 to 30000 ms`);
    }
    if (!(leaseMs >= 100 && leaseMs <= 3_600_000)) {
      throw new RangeError(`idempotency middleware: leaseMs is ${leaseMs}; idemd's leases last 100 to 3600000 ms`);
    }
    const keyPrefix = options.keyPrefix ?? "";
    // A lone surrogate has no UTF-8 form: idemd would get a key other than the one the
    // lease and lookups name.
    if (
      typeof keyPrefix !== "string" ||
      /\p{Surrogate}/u.test(keyPrefix) ||
      Buffer.byteLength(keyPrefix, "utf8") > maxKeyBytes - derivedKeyBytes
    ) {
      throw new RangeError(
        `idempotency middleware: keyPrefix must be valid UTF-8 of at most ${maxKeyBytes - derivedKeyBytes} bytes, so that its keys fit idemd's ${maxKeyBytes}`,
      );
    }
    this.#client = client;
    this.#o = {
      scope: options.scope,
      keyPrefix,
      methods: options.methods ?? ["POST", "PATCH"],
      requireKey: options.requireKey ?? false,
      waitMs,
      leaseMs,
      storedHeaders: stored,
      maxBodyBytes: options.maxBodyBytes ?? 10 << 20,
      maxStoredBytes: options.maxStoredBytes ?? 64 << 20,
      storeStatus: options.storeStatus ?? ((s) => (s >= 200 && s < 400) || s === 402),
      failOpen: options.failOpen ?? false,
      onIncident: options.onIncident,
    };
    this.#methods = new Set(this.#o.methods.map((m) => m.toUpperCase()));
    this.#stored = new Set(stored);
  }

  get maxBodyBytes(): number {
    return this.#o.maxBodyBytes;
  }

  /** M1, M2, M3: whether the request is to be protected, and its key. */
  readKey(raw: IncomingMessage): { key: string } | { pass: true } | { answer: Answer } {
    if (!this.#methods.has((raw.method ?? "").toUpperCase())) return { pass: true };
    const read = parseIdempotencyKey(raw.headersDistinct["idempotency-key"] ?? []);
    if ("missing" in read) {
      if (!this.#o.requireKey) return { pass: true };
      return {
        answer: problem(
          400,
          "missing_idempotency_key",
          "Idempotency-Key is required",
          "this endpoint needs an Idempotency-Key header",
        ),
      };
    }
    if ("error" in read) {
      return { answer: problem(400, "invalid_idempotency_key", "Invalid Idempotency-Key", read.error) };
    }
    return { key: read.key };
  }

  /** M6, M7: the answer for a body that could not be read, if it could not. */
  bodyAnswer(read: BodyRead): Answer | undefined {
    if ("tooLarge" in read) {
      return problem(
        413,
        "payload_too_large",
        "Request body too large",
        `the body is over ${this.#o.maxBodyBytes} bytes`,
      );
    }
    if ("unreadable" in read) {
      return problem(400, "unreadable_body", "Unreadable request body", String(read.unreadable));
    }
    return undefined;
  }

  /**
   * M4, then the claim: C1 to C6, and the replay of P1 to P5. gone is clientGone's
   * signal: a claim that waits is given up when it aborts (C3a), and a lease taken for
   * a client that has gone is given back.
   */
  async decide(
    req: Req,
    raw: IncomingMessage,
    target: string,
    key: string,
    body: Buffer,
    gone: AbortSignal,
  ): Promise<Decision> {
    let scope: unknown;
    try {
      scope = await this.#o.scope(req);
    } catch (err) {
      return this.#scopeMissing(err);
    }
    if (typeof scope !== "string" || scope === "" || /\p{Surrogate}/u.test(scope)) return this.#scopeMissing(undefined);

    const derived = this.#o.keyPrefix + idemdKey(scope, key);
    target = originForm(target);
    const queryAt = target.indexOf("?");
    const fp = fingerprint({
      method: raw.method ?? "",
      path: queryAt < 0 ? target : target.slice(0, queryAt),
      query: queryAt < 0 ? "" : target.slice(queryAt + 1),
      contentType: raw.headersDistinct["content-type"]?.[0],
      contentEncoding: raw.headers["content-encoding"],
      body,
    });
    // A claim that waits may wait up to 30 s: it ends with its client, and so does
    // idemd's waiter. A lease idemd granted as the client left never arrives and runs
    // out, which keeps at most once. A claim that does not wait is answered at once, so
    // it outlives its client, and a lease it took is given back below.
    const waits = this.#o.waitMs > 0;
    let claim: Awaited<ReturnType<IdemClient["claim"]>>;
    const sentAt = performance.now();
    try {
      claim = await this.#client.claim(derived, {
        fingerprint: fp.fingerprint,
        leaseMs: this.#o.leaseMs,
        waitMs: this.#o.waitMs,
        ...(waits ? { signal: gone } : {}),
      });
    } catch (err) {
      if (waits && gone.aborted) return { gone: true };
      if (err instanceof UnsealableError) return unsealable(derived, err);
      return this.#refused(derived, err);
    }
    if (claim.outcome === "acquired") {
      if (gone.aborted) {
        // Nothing ran, and nobody is there to answer: a retry may run it.
        await this.#release(req, derived, claim.leaseToken);
        return { gone: true };
      }
      return {
        acquired: {
          idemdKey: derived,
          leaseToken: claim.leaseToken,
          attempt: claim.attempt,
          recovered: claim.recovered,
          recoveryPoint: claim.recoveryPoint,
          sentAt,
        },
      };
    }
    return this.#replay(derived, claim.response);
  }

  #scopeMissing(error: unknown): Decision {
    return {
      answer: problem(
        500,
        "idempotency_scope_missing",
        "Idempotency scope missing",
        "the service could not tell whose request this is",
      ),
      incident: { kind: "scope_missing", idemdKey: "", error },
    };
  }

  #refused(derived: string, err: unknown): Decision {
    if (err instanceof InProgressError) {
      // C3
      const retry = Math.max(1, Math.ceil((err.retryAfterMs ?? 0) / 1000));
      return {
        answer: problem(
          409,
          "in_progress",
          "Request in progress",
          "a request with this Idempotency-Key is being processed",
          retry,
        ),
      };
    }
    if (err instanceof FingerprintMismatchError) {
      // C4
      return {
        answer: problem(
          422,
          "fingerprint_mismatch",
          "Idempotency-Key reused",
          "this Idempotency-Key was used with a different request",
        ),
      };
    }
    const retry = Math.max(1, Math.ceil(((err instanceof ProblemError && err.retryAfterMs) || 1000) / 1000));
    const unavailable = problem(
      503,
      "idempotency_unavailable",
      "Idempotency service unavailable",
      "the request was not run: its Idempotency-Key could not be checked",
      retry,
    );
    if (err instanceof UnavailableError) {
      // C5: an outage.
      if (this.#o.failOpen) return { pass: true, incident: { kind: "fail_open", idemdKey: derived, error: err } };
      return { answer: unavailable, incident: { kind: "unavailable", idemdKey: derived, error: err } };
    }
    if (err instanceof QuotaExceededError) {
      // C7: the tenant is at its quota of stored keys; an answer, never failed open.
      const quota = problem(
        503,
        "idempotency_quota_exceeded",
        "Idempotency quota exceeded",
        "the request was not run: the service keeps as many Idempotency-Keys as idemd allows it until some expire",
        retry,
      );
      return { answer: quota, incident: { kind: "quota_exceeded", idemdKey: derived, error: err } };
    }
    // C6: an answer that holds for every retry, never failed open.
    return { answer: unavailable, incident: { kind: "idemd_refused", idemdKey: derived, error: err } };
  }

  #replay(derived: string, stored: StoredResponse | undefined): Decision {
    const status = stored?.status ?? 200;
    if (status < 200 || status > 599) {
      // P3
      return {
        answer: problem(
          502,
          "stored_response_invalid",
          "Stored response invalid",
          "the stored answer cannot be replayed",
        ),
        incident: { kind: "replay_invalid", idemdKey: derived },
      };
    }
    // P1, P2, P4
    const headers: Record<string, string | string[]> = {};
    for (const [name, values] of Object.entries(stored?.headers ?? {})) {
      if (!neverStored.has(name.toLowerCase())) headers[name.toLowerCase()] = values;
    }
    const body = Buffer.from(stored?.body ?? []);
    headers["idempotent-replayed"] = "true";
    headers["content-length"] = String(body.length);
    return { answer: { status, headers, body } };
  }

  /**
   * Runs the handler under the lease (R1 to R14): records its answer as it passes
   * through, renews the lease, and finishes the key by how the handler ended. `proceed`
   * starts the handler, once idempotencyLease(raw) gives the lease; it is called once,
   * synchronously, or not at all when the lease was lost before the handler could start
   * (then the answer is written here). Never rejects.
   */
  async run(req: Req, raw: IncomingMessage, res: ServerResponse, lease: Acquired, proceed: () => void): Promise<void> {
    const recorder = new Recorder(res, this.#stored, this.#o.maxStoredBytes, this.#o.leaseMs);
    try {
      await this.#runRecorded(req, raw, res, lease, recorder, proceed);
    } finally {
      recorder.finish();
    }
  }

  async #runRecorded(
    req: Req,
    raw: IncomingMessage,
    res: ServerResponse,
    lease: Acquired,
    recorder: Recorder,
    proceed: () => void,
  ): Promise<void> {
    const { idemdKey: key, leaseToken } = lease;
    let ending: Awaited<Recorder["ending"]>;
    let started = false;
    try {
      ending = await this.#client.underLease(
        key,
        leaseToken,
        this.#o.leaseMs,
        undefined,
        (signal, held) => {
          started = true;
          leases.set(raw, held);
          signal.addEventListener("abort", () => {
            if (signal.reason instanceof LeaseLostError && recorder.status === 0 && !res.headersSent) {
              // R12, R16: the handler wrote nothing; the key belongs to another request now,
              // or may.
              const a = problem(409, "lease_lost", "Request taken over", signal.reason.detail, 1);
              recorder.answer(a.status, a.headers as Record<string, string>, a.body);
            }
            // Else the status went out: the handler's answer goes on to the client, so
            // that it ends; nothing of it is stored.
          });
          proceed();
          return recorder.ending;
        },
        lease,
      );
    } catch (err) {
      if (err instanceof LeaseLostError) {
        if (!started) {
          // R12 or R16 before the handler ran: a claim that waited found the lease gone
          // when it renewed it, or past its deadline. The handler does not run.
          const a = problem(409, "lease_lost", "Request taken over", err.detail, 1);
          recorder.answer(a.status, a.headers as Record<string, string>, a.body);
        }
        // R16 (lease_expired) when no renewal was answered before the lease's deadline,
        // R12 (lease_lost) when idemd said the lease was gone.
        const kind = err instanceof LeaseExpiredError ? "lease_expired" : "lease_lost";
        this.#incident(req, { kind, idemdKey: key, error: err });
      }
      return;
    }

    if (ending.kind === "cancelled") {
      await this.#release(req, key, leaseToken); // R5
      return;
    }
    const body = recorder.body();
    if (recorder.switchedProtocols || (ending.kind !== "abandoned" && body === undefined)) {
      await this.#notStored(req, key, leaseToken, undefined); // R9, R10
      return;
    }
    const status = recorder.status || 200;
    if (status >= 500 || !this.#o.storeStatus(status)) {
      await this.#release(req, key, leaseToken); // R2, R3, R4, R15
      return;
    }
    if (ending.kind === "abandoned") {
      // R15: a result began to reach the client and was cut short; the part written is
      // no answer, and running the handler again could do the work twice.
      await this.#notStored(req, key, leaseToken, undefined);
      return;
    }
    if (recorder.storedBytes() > this.#o.maxStoredBytes) {
      await this.#notStored(req, key, leaseToken, undefined); // R10
      return;
    }
    try {
      await this.#client.complete(key, leaseToken, { status, headers: recorder.headers, body }); // R1
    } catch (err) {
      if (err instanceof ProblemError && (err.status === 413 || err.status === 400)) {
        await this.#notStored(req, key, leaseToken, err); // R10: idemd refused to store it.
        return;
      }
      if (err instanceof RawResultUnavailableError) {
        // R10a: a daemon without a blob store may answer 413 to a large body before
        // reading it and close the connection, which reaches the client as a failure to
        // answer; left claimed (R13), the key would run the handler again later. Large is
        // what complete sent raw: the body, or the sealed envelope when the client seals.
        await this.#notStored(req, key, leaseToken, err);
        return;
      }
      this.#incident(req, { kind: "complete_failed", idemdKey: key, error: err }); // R13
    }
  }

  async #release(req: Req, key: string, leaseToken: string): Promise<void> {
    try {
      await this.#client.release(key, leaseToken, "retry");
    } catch (err) {
      this.#incident(req, { kind: "release_failed", idemdKey: key, error: err }); // R14
    }
  }

  async #notStored(req: Req, key: string, leaseToken: string, cause: unknown): Promise<void> {
    try {
      await this.#client.release(key, leaseToken, "fail", { response: notStored() });
      this.#incident(req, { kind: "result_not_stored", idemdKey: key, error: cause });
    } catch (err) {
      this.#incident(req, { kind: "release_failed", idemdKey: key, error: err });
    }
  }

  /** Reports an incident; a hook that throws changes nothing. */
  report(req: Req, incident: Incident | undefined): void {
    if (incident) this.#incident(req, incident);
  }

  #incident(req: Req, incident: Incident): void {
    try {
      this.#o.onIncident?.(req, incident);
    } catch {
      // The answer is written; a failing hook must not change it.
    }
  }
}

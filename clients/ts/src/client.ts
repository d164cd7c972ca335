import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { Batcher, type Deadline, deadlineOf, noAnswer } from "./batch.js";
import {
  FailedError,
  FingerprintMismatchError,
  IdemError,
  InProgressError,
  LeaseExpiredError,
  LeaseLostError,
  NotFoundError,
  PermanentError,
  type ProblemError,
  problemFrom,
  RawResultUnavailableError,
  ResultNotStoredError,
  UnavailableError,
} from "./errors.js";
import { createClient, createConfig, type Client as GeneratedClient } from "./gen/client/index.js";
import * as sdk from "./gen/sdk.gen.js";
import type * as api from "./gen/types.gen.js";
import { KeyRing, noResponseStatus, type Outcome, Sealer } from "./seal.js";

/** Settings of an IdemClient; only baseUrl is required. */
export interface ClientOptions {
  /** The idemd to talk to, e.g. http://idemd.internal:8080. */
  baseUrl: string;
  /** An API token, sent as Authorization: Bearer, for a daemon with an auth file. */
  token?: string;
  /** Bounds each call, retries included; a claim that waits gets its wait on top. Default 10 s. */
  timeoutMs?: number;
  /**
   * How many times a call is resent after a transport failure (a connection refused or
   * reset before any answer); default 3. Every call is safe to resend: a resent claim
   * carries the same claim secret and gets the same lease back, a resent complete or
   * release is answered like the first.
   */
  retries?: number;
  /** The first pause before a resend, doubled for each next one; default 50 ms. */
  backoffMs?: number;
  /** The owner label of this client's claims, shown by lookups; it grants nothing. Default random. */
  owner?: string;
  /** How long completed and failed results are kept; default: the daemon's (24 h). */
  retentionMs?: number;
  /** The fetch to send requests with; default globalThis.fetch. */
  fetch?: typeof fetch;
  /**
   * Whether concurrent calls share requests; default true. A claim (that does not wait),
   * complete, release or extend goes out at once when none of this client's batches is
   * in flight; the calls made meanwhile go out together as one POST /v1/batch when it
   * returns, each answered as it would be alone. No timer delays a lone call. A daemon
   * without the batch endpoint is detected on the first batch, and calls go one by one
   * from then on.
   */
  batching?: boolean;
  /**
   * Seals the results this client stores and the recovery points it records with keys
   * idemd never sees, and opens them when they come back (docs/sealing.md). Off when
   * absent: results and points are stored plain, a sealed result that comes back is an
   * UnsealableError (unknown_key), and a recovery point's data is handed on as it is.
   */
  sealing?: SealingOptions;
}

/** The sealing of a client: the key space it works in and the keys it seals and opens with. */
export interface SealingOptions {
  /**
   * The tenant the client's token works in, bound into every envelope so that one
   * sealed under one tenant's name does not open under another's; the clients of one
   * tenant use the same name. Non-empty.
   */
  tenant: string;
  /** The keys: the first seals, every one opens; made with requireSealed, plain results are refused. */
  ring: KeyRing;
}

/** An operation's result as idemd stores and replays it. */
export interface StoredResponse {
  status: number;
  headers: Record<string, string[]>;
  body: Uint8Array;
}

/** A result to store: headers may be single strings, the body a string (UTF-8). */
export interface ResponseInit {
  status: number;
  headers?: Record<string, string | string[]>;
  body?: Uint8Array | string;
}

/**
 * How far a holder of a key got, as it recorded it (Lease.checkpoint,
 * IdemClient.recordRecoveryPoint): the next acquisition of the key receives it, so that
 * the work resumes from there instead of starting over.
 */
export interface RecoveryPoint {
  /** The point reached, for example "charged". */
  readonly name: string;
  /** What the holder recorded with it; empty when it recorded nothing. */
  readonly data: Uint8Array;
  /** The attempt of the holder that recorded it. */
  readonly attempt: number;
  /** When idemd recorded it, by idemd's clock. */
  readonly recordedAt: Date;
}

/** Reads the wire form of key's recovery point, opening its data when it is sealed. */
function fromPoint(wire: api.RecoveryPoint | undefined, key: string, sealer: Sealer): RecoveryPoint | undefined {
  if (wire === undefined) return undefined;
  const data = sealer.openPoint(key, wire.name, Buffer.from(wire.data ?? "", "base64"));
  return Object.freeze({
    name: wire.name,
    data: new Uint8Array(data),
    attempt: wire.attempt,
    recordedAt: new Date(wire.recorded_at),
  });
}

/** The answer of a claim that got the lease. */
export interface Acquired {
  outcome: "acquired";
  /** Proves the lease to complete, release and extend. */
  leaseToken: string;
  attempt: number;
  /** True when the lease was taken over from a holder whose lease ran out. */
  recovered: boolean;
  leaseExpiresAt: Date;
  /** When idemd forgets the record if nobody completes or releases it. */
  expiresAt: Date;
  /**
   * The last point an earlier holder recorded (a takeover, or a claim after a release
   * for a retry), to resume from; undefined when none was recorded.
   */
  recoveryPoint: RecoveryPoint | undefined;
}

/** The answer of a claim of a finished key: its stored result. */
export interface Finished {
  outcome: "completed" | "failed";
  attempt: number;
  response: StoredResponse | undefined;
  /** When idemd forgets the record; until then the result is replayed. */
  expiresAt: Date;
}

/** A claim's answer; a key held by someone else is an InProgressError instead. */
export type Claim = Acquired | Finished;

/** What idemd keeps for a key. */
export interface KeyRecord {
  key: string;
  /** pending, released, completed or failed; an open set. */
  state: string;
  attempt: number;
  fingerprint: string;
  owner: string;
  createdAt: Date;
  updatedAt: Date;
  leaseExpiresAt: Date | undefined;
  expiresAt: Date;
  response: StoredResponse | undefined;
  /** The last point a holder recorded, while the key is not finished. */
  recoveryPoint: RecoveryPoint | undefined;
}

/** Selects a page of the abandoned-keys feed; the default is the first page of every key. */
export interface AbandonedOptions extends CallOptions {
  /** Keeps the keys that begin with it (at most 255 bytes); "" or absent keeps all. */
  prefix?: string;
  /** Keeps the keys whose lease ran out at least this long ago; default 0. */
  olderThanMs?: number;
  /** Bounds the keys of the page, 1 to 1000; default idemd's (100). */
  limit?: number;
  /** The next of the page before, read with the same prefix; absent for the first page. */
  cursor?: string;
}

/** A key whose holder left it pending: its lease ran out and nobody has claimed it since. */
export interface AbandonedKey {
  key: string;
  /** The attempt of the holder that left it; a claim now is the next. */
  attempt: number;
  /**
   * The key's fingerprint, which a claim must carry to acquire it; "" when it has none,
   * and a claim must then carry none.
   */
  fingerprint: string;
  /** The owner label of that holder's claim; "" when it gave none. */
  owner: string;
  /** When its lease ran out, by idemd's clock. */
  leaseExpiredAt: Date;
  /** The name of the last recovery point recorded, "" for none; a claim receives the whole point. */
  recoveryPoint: string;
}

/**
 * One page of the feed. next is the cursor of the next page, undefined at the end. A
 * page may hold fewer keys than its limit, even none, and still have a next: idemd
 * bounds the work one page costs.
 */
export interface AbandonedPage {
  keys: AbandonedKey[];
  next: string | undefined;
}

/** Options every call takes. */
export interface CallOptions {
  /** Cancels the call (and, for run, the operation). */
  signal?: AbortSignal;
}

export interface ClaimOptions extends CallOptions {
  /** A digest of the payload; the key reused with another one is a FingerprintMismatchError. */
  fingerprint?: string;
  /** How long the lease lasts; default the daemon's 30 s. */
  leaseMs?: number;
  /** Wait up to this long (at most 30 s) for a holder to finish instead of an InProgressError. */
  waitMs?: number;
  /** Replaces the client's owner label for this claim. */
  owner?: string;
  /**
   * Replaces the claim's own secret (see newClaimSecret). A claim carrying the live
   * lease's secret gets that lease back, so keep it private to the one execution that
   * made it: never derive it from a job ID, which every redelivery shares.
   */
  claimSecret?: string;
}

export interface FinishOptions extends CallOptions {
  /** How long the result is kept; default the client's retentionMs. */
  retentionMs?: number;
}

export interface ReleaseOptions extends FinishOptions {
  /** For mode "fail", the failure to store and replay. */
  response?: ResponseInit;
}

/** Options of run and once. */
export interface RunOptions extends CallOptions {
  /** A digest of the payload; the key reused with another one is a FingerprintMismatchError. */
  fingerprint?: string;
  /** The lease to claim and to renew every leaseMs/3 while the operation runs; default 30 s. */
  leaseMs?: number;
  /** Wait up to this long for another holder to finish instead of an InProgressError. */
  waitMs?: number;
}

/**
 * The lease an operation runs under, handed to the function given to run and once, and
 * to handlers behind the middleware (res.locals.idemdLease, request.idemdLease). attempt
 * and recovered let the operation make its effect happen once (docs/effects.md).
 */
export interface Lease {
  /** The idemd key the lease is on; behind the middleware, the key it derived. */
  readonly key: string;
  /**
   * Grows by one at every acquisition of the key: a fencing token. A store that keeps the
   * highest attempt it has seen for the key can refuse the writes of a holder whose lease
   * ran out and was taken over.
   */
  readonly attempt: number;
  /**
   * True when this lease took the key over from a holder whose lease ran out: that holder
   * may have done part of the work, so look the effect up before doing it again.
   */
  readonly recovered: boolean;
  /**
   * Aborts when the lease is lost (or the caller's signal aborts): with a LeaseLostError
   * when idemd answered that the lease is gone, with a LeaseExpiredError (a kind of
   * LeaseLostError) when no renewal was answered before the deadline.
   */
  readonly signal: AbortSignal;
  /**
   * When the lease runs out by this process's clock, on the performance.now() clock: the
   * moment the claim, or the last renewal idemd answered, was sent, plus 95 % of the
   * lease. idemd starts the lease when it receives the call, after it was sent; the 5 %
   * left over covers this clock and idemd's running at different rates. Each answered
   * renewal moves it; when it passes with none answered, the lease is lost.
   */
  readonly deadline: number;
  /**
   * The time left until the deadline, in milliseconds; 0 once the lease is lost. Bound
   * the calls the work makes by it (a provider's request timeout, say), so that none
   * goes on after the lease.
   */
  remainingMs(): number;
  /**
   * The last point an earlier holder of the key recorded with checkpoint, which this
   * lease starts from: handed on by a takeover (recovered) and by a claim after a
   * release for a retry. Undefined when none was recorded.
   */
  readonly recoveryPoint: RecoveryPoint | undefined;
  /**
   * Records a recovery point under the lease: name says how far the work got (1 to 128
   * bytes of UTF-8, for example "charged") and data what the next holder needs to go on
   * from there (at most the daemon's limit, 4096 bytes by default). It replaces the
   * point recorded before. Should this holder not finish the key, the next one finds the
   * point in its recoveryPoint: record one right after each effect that must not be made
   * twice, with what identifies it.
   *
   * When idemd answers that the lease is lost (another caller took the key over, or it
   * is gone), it throws a LeaseLostError and ends the lease as a renewal answered so
   * would: the signal aborts with it, and the call that runs the work throws it and
   * stores nothing. Once the lease is lost, it throws why without asking idemd. Data
   * over the daemon's limit is a PayloadTooLargeError and records nothing; the lease
   * goes on. Other failures (UnavailableError) leave the lease as it is.
   */
  checkpoint(name: string, data?: Uint8Array | string): Promise<void>;
}

/** What run returns: the operation's value, and whether it was replayed from an earlier run. */
export interface RunResult<T> {
  value: T;
  replayed: boolean;
}

/**
 * What consume decided for one delivery: "ack" removes the message (handled now or
 * before), "requeue" leaves it to be delivered again after delayMs (not handled; never
 * dropped), "dead-letter" removes it to the broker's dead-letter queue where it has one
 * (failed for good, the failure stored). ran says that fn ran for this delivery; error is
 * why the message was not acknowledged.
 */
export interface Verdict {
  action: "ack" | "requeue" | "dead-letter";
  delayMs: number;
  ran: boolean;
  error?: unknown;
}

/** The delay of a requeue whose cause does not say when to try again. */
const requeueDelayMs = 1000;

// fnFailed says that the error is fn's own, handed back by run once it finished the key
// as the error asks (the failure stored, or the key released).
function verdictOf(error: unknown, ran: boolean, fnFailed: boolean): Verdict {
  if (!ran) {
    // An UnsealableError is requeued with the rest: a consumer whose ring holds the key
    // can take the message, and the error shows that one is needed.
    if (error instanceof FailedError || error instanceof FingerprintMismatchError) {
      return { action: "dead-letter", delayMs: 0, ran, error };
    }
    const delayMs = error instanceof InProgressError ? (error.retryAfterMs ?? requeueDelayMs) : requeueDelayMs;
    return { action: "requeue", delayMs, ran, error };
  }
  if (fnFailed && error instanceof PermanentError) return { action: "dead-letter", delayMs: 0, ran, error };
  return { action: "requeue", delayMs: requeueDelayMs, ran, error };
}

/**
 * The share of the lease a holder counts on, from the moment it sent the call that
 * granted it: idemd starts the lease on receipt, which is later, so the network is
 * covered already; the rest is room for the holder's and idemd's clocks running at
 * different rates (NTP keeps them within 500 ppm; 5 % leaves far more).
 */
const leaseShare = 0.95;

/**
 * How long to wait before trying a failed renewal again, with timeLeftMs until the
 * lease's local deadline: drawn at random from [d/2, d], where d is a sixth of the lease
 * or a third of the time left, whichever is less, and at least 10 ms. The tries come
 * faster as the deadline nears, and the jitter keeps holders cut off together from
 * retrying in step.
 */
export function retryDelayMs(leaseMs: number, timeLeftMs: number, random: () => number = Math.random): number {
  const d = Math.max(10, Math.min(leaseMs / 6, timeLeftMs / 3));
  return d / 2 + (random() * d) / 2;
}

/** Returns a fresh claim secret: 128 random bits, hex-encoded. */
export function newClaimSecret(): string {
  return randomBytes(16).toString("hex");
}

const defaultLeaseMs = 30_000;

let batcherOf: (client: IdemClient) => Batcher | undefined;
let claimAndRunOf: (client: IdemClient) => CompleterRun;

/** run's path as a completer takes it: fn's result stored as given, an error leaving the key pending. */
export type CompleterRun = (
  key: string,
  fn: (signal: AbortSignal, lease: Lease) => Promise<ResponseInit> | ResponseInit,
  options: RunOptions,
) => Promise<{ ran: true; value: ResponseInit } | { ran: false; finished: Finished }>;

/** run's path for a completer of client's keys (the package's own Completer uses it). */
export function completerRun(client: IdemClient): CompleterRun {
  return claimAndRunOf(client);
}

/** How many calls of client wait for its request in flight to return (for tests). */
export function queuedCalls(client: IdemClient): number {
  return batcherOf(client)?.queued ?? 0;
}

/** A client of one idemd, safe to share. */
export class IdemClient {
  readonly #api: GeneratedClient;
  readonly #owner: string;
  readonly #timeoutMs: number;
  readonly #retentionMs: number | undefined;
  readonly #batcher: Batcher | undefined;
  readonly #sealer: Sealer;

  static {
    batcherOf = (client) => client.#batcher;
    claimAndRunOf = (client) => (key, fn, options) => client.#claimAndRun(key, fn, options, (r) => r, true);
  }

  constructor(options: ClientOptions) {
    const fetchFn = options.fetch ?? globalThis.fetch;
    const config: Parameters<typeof createConfig>[0] = {
      baseUrl: options.baseUrl.replace(/\/+$/, ""),
      fetch: resending(fetchFn, options.retries ?? 3, options.backoffMs ?? 50),
    };
    if (options.token !== undefined) config.auth = options.token;
    this.#api = createClient(createConfig(config));
    this.#owner = options.owner ?? `ts-${randomBytes(8).toString("hex")}`;
    this.#timeoutMs = options.timeoutMs ?? 10_000;
    this.#retentionMs = options.retentionMs;
    this.#sealer = sealerOf(options.sealing);
    if (options.batching ?? true) {
      this.#batcher = new Batcher({
        single: (item, deadline) => this.#single(item, deadline),
        batch: (body, items, signal) =>
          sdk.batch({
            client: this.#api,
            body: { items },
            // The items are encoded already, to measure them.
            bodySerializer: () => body,
            signal,
          }),
        timeoutMs: this.#timeoutMs,
      });
    }
  }

  /**
   * Asks for the lease on key. Throws an InProgressError (with retryAfterMs) when another
   * caller holds a live lease, and a FingerprintMismatchError when the key was used with
   * another fingerprint. With sealing, the stored result, or the recovery point the lease
   * starts from, is opened; one that does not open is an UnsealableError. A lease
   * acquired with a point that does not open is released for a retry first (the point
   * stays), so that a holder whose ring opens it can take the key.
   */
  async claim(key: string, options: ClaimOptions = {}): Promise<Claim> {
    return this.#claim(key, options, true);
  }

  /**
   * claim; a lease acquired with a recovery point that does not open is released for a
   * retry when release is set, and left pending under its lease (to run out) otherwise.
   */
  async #claim(key: string, options: ClaimOptions, release: boolean): Promise<Claim> {
    // The secret is made once per call, so every resend of this claim carries it.
    const body: api.ClaimRequest = {
      key,
      owner: options.owner ?? this.#owner,
      claim_secret: options.claimSecret ?? newClaimSecret(),
    };
    if (options.fingerprint) body.fingerprint = options.fingerprint;
    if (options.leaseMs !== undefined) body.lease_ms = options.leaseMs;
    if (options.waitMs) body.wait_ms = options.waitMs;
    const data = (await this.#do({ claim: body }, options.signal, options.waitMs ?? 0)) as
      api.ClaimAcquired | api.ClaimFinished | undefined;
    if (data?.outcome === "acquired" && typeof data.lease_token === "string" && data.lease_token !== "") {
      let recoveryPoint: RecoveryPoint | undefined;
      try {
        recoveryPoint = fromPoint(data.recovery_point, key, this.#sealer);
      } catch (err) {
        // Nothing runs from a point it cannot read. If this release fails too, the
        // lease runs out.
        if (release) await this.release(key, data.lease_token, "retry").catch(() => undefined);
        throw err;
      }
      return {
        outcome: "acquired",
        leaseToken: data.lease_token,
        attempt: data.attempt,
        recovered: data.recovered,
        leaseExpiresAt: new Date(data.lease_expires_at),
        expiresAt: new Date(data.expires_at),
        recoveryPoint,
      };
    }
    if (data?.outcome !== "completed" && data?.outcome !== "failed") {
      // Not idemd's answer (a base URL that points at something else): nothing may run
      // or be replayed on it.
      throw new IdemError("idem: the claim's answer is neither a lease nor a stored result; is the base URL idemd's?");
    }
    return {
      outcome: data.outcome,
      attempt: data.attempt,
      response: fromWire(data.response, key, this.#sealer, data.outcome),
      expiresAt: new Date(data.expires_at),
    };
  }

  /**
   * Stores the result of the operation the lease was for, its headers and body sealed
   * when the client seals. Repeating it is safe. A body (or, sealing, an envelope) over
   * 1 MiB goes as the raw PUT /v1/keys/{key}/result; when that gets no answer, or
   * idemd answers it unavailable, the error is a RawResultUnavailableError (an
   * UnavailableError).
   */
  async complete(key: string, leaseToken: string, response: ResponseInit, options: FinishOptions = {}): Promise<void> {
    const retention = options.retentionMs ?? this.#retentionMs;
    const result = rawResult(response, key, this.#sealer, "completed");
    if (result.body.length > rawResultBytes) {
      try {
        await this.#putResult(key, leaseToken, result, retention, options.signal);
      } catch (err) {
        // Marked, so that the middlewares' R10a counts what was sent, not what they recorded.
        throw err instanceof UnavailableError ? rawUnavailable(err) : err;
      }
      return;
    }
    const body: api.CompleteRequest = { key, lease_token: leaseToken, response: wireOf(result) };
    if (retention !== undefined) body.retention_ms = retention;
    await this.#do({ complete: body }, options.signal);
  }

  /** Completes key with result as raw bytes (PUT /v1/keys/{key}/result): the same transition as complete. */
  async #putResult(
    key: string,
    leaseToken: string,
    result: RawResult,
    retention: number | undefined,
    callerSignal: AbortSignal | undefined,
  ): Promise<void> {
    const headers: api.PutResultData["headers"] = { "Idemd-Lease-Token": leaseToken, "Idemd-Status": result.status };
    if (result.sealed) headers["Idemd-Sealed"] = "1";
    else if (result.headers !== undefined) headers["Idemd-Result-Headers"] = JSON.stringify(result.headers);
    if (retention !== undefined) headers["Idemd-Retention-Ms"] = retention;
    // Blob copies the bytes, whatever buffer they are a view of.
    const record = await this.#call(this.#deadline(callerSignal), (signal) =>
      sdk.putResult({
        client: this.#api,
        path: { key },
        headers,
        body: new Blob([result.body as Uint8Array<ArrayBuffer>]),
        signal,
      }),
    );
    if (typeof (record as { state?: unknown } | undefined)?.state !== "string") {
      throw new IdemError("idem: the result was answered without the record; is the base URL idemd's?");
    }
  }

  /**
   * Gives the lease back: "retry" frees the key, "fail" stores a terminal failure, with
   * options.response when given. A sealing client stores a failure without a response
   * sealed too (docs/sealing.md).
   */
  async release(key: string, leaseToken: string, mode: "retry" | "fail", options: ReleaseOptions = {}): Promise<void> {
    const body: api.ReleaseRequest = { key, lease_token: leaseToken, mode };
    if (options.response) body.response = toWire(options.response, key, this.#sealer, "failed");
    else if (mode === "fail") {
      const sealed = this.#sealer.sealNoResponse(key);
      if (sealed !== undefined) body.response = { status: noResponseStatus, sealed: sealed.toString("base64") };
    }
    const retention = options.retentionMs ?? this.#retentionMs;
    if (retention !== undefined) body.retention_ms = retention;
    await this.#do({ release: body }, options.signal);
  }

  /**
   * Records a recovery point for key under the lease token: name (1 to 128 bytes of
   * UTF-8) and data (at most the daemon's limit, 4096 bytes by default; a string is
   * sent as UTF-8). It replaces the point recorded before; the next acquisition of the
   * key receives it in Acquired.recoveryPoint. Throws a LeaseLostError when the token is
   * no longer the key's lease or the key is not pending, a NotFoundError when the key is
   * gone, and a PayloadTooLargeError for data over the limit. Repeating it is safe.
   * With sealing, the data is sealed, bound to the key and name: the envelope is the
   * data plus 47 bytes plus the sealing key's id, which the limit counts.
   * Work run by run, once, consume, the middlewares or a completer records through its
   * lease instead (Lease.checkpoint), which also ends the lease when idemd says it is
   * lost.
   *
   * A recovery point is never part of a batch: the contract has no batch item for it,
   * so it always goes as a request of its own.
   */
  async recordRecoveryPoint(
    key: string,
    leaseToken: string,
    name: string,
    data?: Uint8Array | string,
    options: CallOptions = {},
  ): Promise<void> {
    const body: api.RecoveryPointRequest = { key, lease_token: leaseToken, name };
    const bytes = data === undefined ? Buffer.alloc(0) : typeof data === "string" ? Buffer.from(data, "utf8") : data;
    // Empty data is sealed too, so that a ring that requires sealing opens it.
    const recorded = this.#sealer.sealPoint(key, name, bytes);
    if (recorded.length > 0) body.data = Buffer.from(recorded).toString("base64");
    const record = await this.#call(this.#deadline(options.signal), (signal) =>
      sdk.recordRecoveryPoint({ client: this.#api, body, signal }),
    );
    // The record is read only to know the answer is idemd's: the point is the caller's.
    if (typeof (record as { state?: unknown } | undefined)?.state !== "string") {
      throw new IdemError("idem: the recovery point was answered without the record; is the base URL idemd's?");
    }
  }

  /** Renews the lease for another leaseMs; returns when it now runs out. */
  async extend(
    key: string,
    leaseToken: string,
    leaseMs: number,
    options: CallOptions = {},
  ): Promise<{ leaseExpiresAt: Date; expiresAt: Date }> {
    const body: api.ExtendRequest = { key, lease_token: leaseToken, lease_ms: leaseMs };
    const data = (await this.#do({ extend: body }, options.signal)) as api.LeaseExtended;
    return { leaseExpiresAt: new Date(data.lease_expires_at), expiresAt: new Date(data.expires_at) };
  }

  /**
   * Returns the record of key, or throws a NotFoundError. With sealing, its result and
   * recovery point are opened; one that does not open is an UnsealableError.
   */
  async lookup(key: string, options: CallOptions = {}): Promise<KeyRecord> {
    const data = await this.#call(this.#deadline(options.signal), (signal) =>
      sdk.lookup({ client: this.#api, path: { key }, signal }),
    );
    return {
      key: data.key,
      state: data.state,
      attempt: data.attempt,
      fingerprint: data.fingerprint ?? "",
      owner: data.owner ?? "",
      createdAt: new Date(data.created_at),
      updatedAt: new Date(data.updated_at),
      leaseExpiresAt: data.lease_expires_at === undefined ? undefined : new Date(data.lease_expires_at),
      expiresAt: new Date(data.expires_at),
      response: fromWire(data.response, key, this.#sealer, data.state),
      recoveryPoint: fromPoint(data.recovery_point, key, this.#sealer),
    };
  }

  /**
   * Reads a page of the abandoned-keys feed: this caller's keys that are pending under a
   * lease that ran out, which their holders died or were cut off holding. To finish
   * them, claim each with its fingerprint (the claim decides who finishes a key; one
   * held again answers InProgressError), or let a completer do it. Read on with next
   * until it is undefined (abandonedKeys does).
   */
  async abandoned(options: AbandonedOptions = {}): Promise<AbandonedPage> {
    const query: NonNullable<api.ListAbandonedData["query"]> = {};
    if (options.prefix) query.prefix = options.prefix;
    if (options.olderThanMs) query.older_than_ms = Math.ceil(options.olderThanMs);
    if (options.limit !== undefined) query.limit = options.limit;
    if (options.cursor) query.cursor = options.cursor;
    const data = await this.#call(this.#deadline(options.signal), (signal) =>
      sdk.listAbandoned({ client: this.#api, query, signal }),
    );
    if (!Array.isArray(data?.keys)) {
      throw new IdemError("idem: the feed's answer has no keys; is the base URL idemd's?");
    }
    return {
      keys: data.keys.map((k) => ({
        key: k.key,
        attempt: k.attempt,
        fingerprint: k.fingerprint ?? "",
        owner: k.owner ?? "",
        leaseExpiredAt: new Date(k.lease_expired_at),
        recoveryPoint: k.recovery_point ?? "",
      })),
      next: data.next_cursor || undefined,
    };
  }

  /**
   * Yields every key of the abandoned-keys feed, page after page from options.cursor
   * (or the start), until the last page; a page that cannot be read throws. A key
   * given up while the pages are read may be listed twice.
   */
  async *abandonedKeys(options: AbandonedOptions = {}): AsyncGenerator<AbandonedKey, void, undefined> {
    let cursor = options.cursor;
    for (;;) {
      const page = await this.abandoned({ ...options, ...(cursor === undefined ? {} : { cursor }) });
      yield* page.keys;
      if (page.next === undefined) return;
      // A feed that never moves on would be read forever.
      if (page.next === cursor) throw new IdemError("idem: the feed answered the same cursor again");
      cursor = page.next;
    }
  }

  /** Deletes the record of key (it needs the admin scope), or throws a NotFoundError. */
  async purge(key: string, options: CallOptions = {}): Promise<void> {
    await this.#call(this.#deadline(options.signal), (signal) =>
      sdk.purge({ client: this.#api, path: { key }, signal }),
    );
  }

  /**
   * Runs fn at most once for key and returns its value. It claims the key; when it gets
   * the lease it runs fn, renewing the lease every leaseMs/3, and stores fn's value (as
   * JSON). When the key is already done it returns the stored value with replayed true,
   * without running fn.
   *
   * If fn throws, the key is released so that a later run calls fn again; a
   * PermanentError is stored as a terminal failure instead, and later runs throw a
   * FailedError. If the lease is lost while fn runs, fn's signal is aborted and run
   * throws a LeaseLostError, without storing anything or releasing the key: a
   * LeaseExpiredError when no renewal was answered before the lease's local deadline
   * (idemd unreachable), whatever fn returned. fn gets the lease as its second argument:
   * its attempt, whether it recovered the key from a holder whose lease ran out, and the
   * time it has left (remainingMs).
   *
   * With sealing, a stored result that does not open is an UnsealableError and fn does
   * not run: the key is done, and running fn again would do it twice. So is a recovery
   * point the lease would start from that does not open; the key is then released for a
   * retry by a holder whose ring opens it.
   */
  async run<T>(
    key: string,
    fn: (signal: AbortSignal, lease: Lease) => Promise<T> | T,
    options: RunOptions = {},
  ): Promise<RunResult<T>> {
    const ran = await this.#claimAndRun(
      key,
      fn,
      options,
      (value) => jsonResponse(value === undefined ? "" : JSON.stringify(value)),
      false,
    );
    if (ran.ran) return { value: ran.value, replayed: false };
    const claim = ran.finished;
    const stored = parseStored(key, claim.response);
    if (claim.outcome === "completed") return { value: stored as T, replayed: true };
    const failure = (stored ?? {}) as { message?: unknown; value?: unknown };
    throw new FailedError(typeof failure.message === "string" ? failure.message : "failed", failure.value);
  }

  /**
   * run's path: claims key, runs fn under the lease and stores store(value), or returns
   * the finished claim without running fn. An error from fn releases the key for a
   * retry, unless leavePending: a completer leaves it pending, because a released key
   * drops out of the abandoned-keys feed it works from; the key is listed again once the
   * lease runs out. A PermanentError is stored as the key's failure either way.
   */
  async #claimAndRun<T>(
    key: string,
    fn: (signal: AbortSignal, lease: Lease) => Promise<T> | T,
    options: RunOptions,
    store: (value: T) => ResponseInit,
    leavePending: boolean,
  ): Promise<{ ran: true; value: T } | { ran: false; finished: Finished }> {
    const leaseMs = options.leaseMs ?? defaultLeaseMs;
    const claimOptions: ClaimOptions = { leaseMs };
    if (options.fingerprint !== undefined) claimOptions.fingerprint = options.fingerprint;
    if (options.waitMs !== undefined) claimOptions.waitMs = options.waitMs;
    if (options.signal !== undefined) claimOptions.signal = options.signal;
    // The lease's local deadline is reckoned from here, before any batching queue: never
    // later than the claim's real send.
    const sentAt = performance.now();
    // A completer leaves the key of a point that does not open pending, as it leaves one
    // whose handler failed: released, it would drop out of the feed.
    const claim = await this.#claim(key, claimOptions, !leavePending);
    if (claim.outcome !== "acquired") return { ran: false, finished: claim };

    let value: T;
    try {
      value = await this.underLease(key, claim.leaseToken, leaseMs, options.signal, fn, {
        attempt: claim.attempt,
        recovered: claim.recovered,
        recoveryPoint: claim.recoveryPoint,
        sentAt,
      });
    } catch (err) {
      if (err instanceof LeaseLostError) throw err;
      if (err instanceof PermanentError) {
        const failure = JSON.stringify({ message: err.message, value: err.value });
        await this.release(key, claim.leaseToken, "fail", { response: jsonResponse(failure) });
      } else if (!leavePending) {
        // If this release fails too, the lease runs out and a later run calls fn again.
        await this.release(key, claim.leaseToken, "retry").catch(() => undefined);
      }
      throw err;
    }
    try {
      await this.complete(key, claim.leaseToken, store(value));
    } catch (err) {
      throw new ResultNotStoredError(key, value, err);
    }
    return { ran: true, value };
  }

  /**
   * Runs fn at most once per message key, for consumers of brokers that deliver at least
   * once. Resolves true when fn ran now, false when an earlier delivery already ran it.
   * An error from fn releases the key so that the next delivery runs fn again; another
   * consumer running the same key is an InProgressError: leave the message for redelivery.
   * fn gets the lease as its second argument, as with run.
   */
  async once(
    key: string,
    fn: (signal: AbortSignal, lease: Lease) => Promise<void> | void,
    options: RunOptions = {},
  ): Promise<boolean> {
    const { replayed } = await this.run(
      key,
      async (signal, lease) => {
        await fn(signal, lease);
        return null;
      },
      options,
    );
    return !replayed;
  }

  /**
   * Runs fn at most once for a message's key and says what to do with the delivery, by
   * the same rules in every idemd client:
   *
   * - fn ran and its result is stored, or an earlier delivery ran it: "ack".
   * - Another consumer holds the key: "requeue", after the time its lease has left (or
   *   wait for it with waitMs); never drop the message.
   * - fn threw: the key is released and the message requeued.
   * - fn threw a PermanentError: the failure is stored and the message dead-lettered; a
   *   later delivery of it is dead-lettered without running fn.
   * - idemd could not be asked, or did not store the outcome: "requeue". fn does not run
   *   without a lease.
   * - The stored result, or the recovery point fn would start from, does not open
   *   (sealing): "requeue" with the UnsealableError; fn does not run. The message is not
   *   acknowledged, so that a consumer whose ring holds the key can take it.
   *
   * fn gets the lease as its second argument, as with run: a recovered lease means that
   * a consumer died holding the key, so the work may be done in part and fn must fence
   * or reconcile its effects.
   */
  async consume(
    key: string,
    fn: (signal: AbortSignal, lease: Lease) => Promise<void> | void,
    options: RunOptions = {},
  ): Promise<Verdict> {
    let ran = false;
    let threw = false;
    let fnError: unknown;
    try {
      await this.run(
        key,
        async (signal, lease) => {
          ran = true;
          try {
            await fn(signal, lease);
          } catch (err) {
            threw = true;
            fnError = err;
            throw err;
          }
          return null;
        },
        options,
      );
      return { action: "ack", delayMs: 0, ran };
    } catch (err) {
      return verdictOf(err, ran, threw && err === fnError);
    }
  }

  /**
   * Runs fn under the lease, renewing it every leaseMs/3. fn's signal aborts when the
   * caller's does or when the lease is lost; a lost lease is thrown as a LeaseLostError
   * whatever fn did. The key is not finished here. fn gets the lease as its second
   * argument, with the attempt and recovered of acquired, the claim that got it (attempt
   * 0 when it is not given).
   *
   * The lease is held until its local deadline (Lease.deadline), reckoned from
   * acquired.sentAt, the performance.now() at which the claim was sent (without it, from
   * now), and moved by every renewal idemd answers. A failed renewal is tried again
   * sooner, the sooner the nearer the deadline; when the deadline passes with none
   * answered, the lease is lost with a LeaseExpiredError, as if idemd had said so, and
   * a renewal's later answer changes nothing. A claim answered more than leaseMs/3 after
   * it was sent (it waited for another holder) is renewed once before fn starts; fn does
   * not start on a lease already lost or past its deadline.
   */
  async underLease<T>(
    key: string,
    leaseToken: string,
    leaseMs: number,
    callerSignal: AbortSignal | undefined,
    fn: (signal: AbortSignal, lease: Lease) => Promise<T> | T,
    acquired: { attempt: number; recovered: boolean; recoveryPoint?: RecoveryPoint | undefined; sentAt?: number } = {
      attempt: 0,
      recovered: false,
    },
  ): Promise<T> {
    let basis = acquired.sentAt ?? performance.now();
    let deadline = basis + leaseMs * leaseShare;
    // Why the renewals failed, for the LeaseExpiredError's cause.
    let failure: unknown;
    const takenOver = (err: ProblemError) =>
      new LeaseLostError(
        {
          status: err.status,
          code: "lease_lost",
          title: "Lease lost",
          detail: `${JSON.stringify(key)} was taken over while the operation ran`,
        },
        { cause: err },
      );
    const expired = () =>
      new LeaseExpiredError(
        {
          status: 0,
          code: "lease_expired",
          title: "Lease expired",
          detail: `no renewal of ${JSON.stringify(key)} was answered within its lease; another caller may have taken it over`,
        },
        failure === undefined ? undefined : { cause: failure },
      );

    if (acquired.sentAt !== undefined && performance.now() - acquired.sentAt > leaseMs / 3) {
      // The claim waited: the work would start with much of its lease gone, or all of
      // it. An answered renewal counts even if it comes after the claim's deadline:
      // idemd extended the lease on receipt, and nothing has run yet.
      const sent = performance.now();
      try {
        await this.extend(key, leaseToken, leaseMs, callerSignal ? { signal: callerSignal } : {});
        basis = sent;
        deadline = sent + leaseMs * leaseShare;
      } catch (err) {
        if (err instanceof LeaseLostError || err instanceof NotFoundError) throw takenOver(err);
        if (callerSignal?.aborted) throw callerSignal.reason;
        // Without an answer the claim's deadline stands.
        failure = err;
      }
    }
    if (performance.now() >= deadline) throw expired();

    const lease = new AbortController();
    // Cuts off a renewal in flight once its answer can change nothing.
    const renewals = new AbortController();
    const signal = callerSignal ? AbortSignal.any([callerSignal, lease.signal]) : lease.signal;
    let lost: LeaseLostError | undefined;
    const held: Lease = Object.freeze({
      key,
      attempt: acquired.attempt,
      recovered: acquired.recovered,
      signal,
      get deadline() {
        return deadline;
      },
      remainingMs: () => (lost ? 0 : Math.max(0, deadline - performance.now())),
      recoveryPoint: acquired.recoveryPoint,
      checkpoint: async (name: string, data?: Uint8Array | string) => {
        if (lost) throw lost;
        try {
          await this.recordRecoveryPoint(key, leaseToken, name, data);
        } catch (err) {
          if (err instanceof LeaseLostError || err instanceof NotFoundError) {
            // Ends the lease as an answered renewal would; once the work is over there
            // is nothing left to end, and the answer is thrown as it came.
            const cause = new LeaseLostError(
              {
                status: err.status,
                code: "lease_lost",
                title: "Lease lost",
                detail: `${JSON.stringify(key)} was taken over, or is gone, before its recovery point ${JSON.stringify(name)} was recorded`,
              },
              { cause: err },
            );
            lose(cause);
            throw lost ?? cause;
          }
          throw err;
        }
      },
    });
    let stopped = false;
    const period = Math.max(leaseMs / 3, 10);
    // The renewals not yet answered; more than one when idemd answers slower than a period.
    const inFlight = new Set<Promise<void>>();
    // The send time of the latest renewal, and when the next one goes.
    let lastSent = basis;
    let nextAt = Infinity;
    let renewTimer: NodeJS.Timeout | undefined;
    let expiryTimer: NodeJS.Timeout | undefined;

    const lose = (err: LeaseLostError) => {
      if (lost || stopped) return;
      lost = err;
      clearTimeout(renewTimer);
      clearTimeout(expiryTimer);
      renewals.abort(err);
      lease.abort(err);
    };
    // Fires at the deadline whatever the renewals are doing. A timer may fire a little
    // before the deadline by performance.now(); then it is set again for the rest.
    const watch = () => {
      clearTimeout(expiryTimer);
      if (lost || stopped) return;
      const left = deadline - performance.now();
      if (left <= 0) {
        lose(expired());
        return;
      }
      expiryTimer = setTimeout(watch, Math.ceil(left));
    };
    /** Sets the next renewal for the performance.now() time at. */
    const plan = (at: number) => {
      if (lost || stopped) return;
      clearTimeout(renewTimer);
      nextAt = at;
      renewTimer = setTimeout(send, Math.max(0, at - performance.now()));
    };
    const send = () => {
      if (lost || stopped) return;
      // Reckoned from before the call, as the claim's is: never later than its send.
      const sent = performance.now();
      lastSent = sent;
      // The next one goes a period after this one whether this one is answered by then or
      // not: an idemd that answers slowly does not hold the renewals back towards the
      // deadline.
      plan(sent + period);
      const renewal = renew(sent);
      inFlight.add(renewal);
      void renewal.finally(() => inFlight.delete(renewal));
    };
    const renew = async (sent: number) => {
      try {
        await this.extend(key, leaseToken, leaseMs, { signal: renewals.signal });
      } catch (err) {
        if (lost || stopped) return;
        if (err instanceof LeaseLostError || err instanceof NotFoundError) {
          lose(takenOver(err));
          return;
        }
        // No answer, or not one that ends the lease: try again soon, the sooner the
        // nearer the deadline.
        failure = err;
        const now = performance.now();
        plan(Math.min(nextAt, now + retryDelayMs(leaseMs, deadline - now)));
        return;
      }
      if (lost || stopped) return;
      if (performance.now() >= deadline) {
        // Answered after the deadline, before its timer ran: too late all the same.
        lose(expired());
        return;
      }
      // Answers may come out of order; the deadline only moves on.
      if (sent + leaseMs * leaseShare > deadline) {
        deadline = sent + leaseMs * leaseShare;
        watch();
      }
      failure = undefined;
      // Back to the normal period, if a failure had planned a retry sooner.
      if (nextAt < lastSent + period) plan(lastSent + period);
    };

    watch();
    plan(basis + period);
    // A deadline that passed while fn held the event loop (synchronous work starves the
    // timers) ends the lease as the timer would have.
    const check = () => {
      if (performance.now() >= deadline) lose(expired());
    };
    try {
      const value = await fn(signal, held);
      check();
      if (lost) throw lost;
      return value;
    } catch (err) {
      check();
      throw lost ?? err;
    } finally {
      stopped = true;
      clearTimeout(renewTimer);
      clearTimeout(expiryTimer);
      // The work is over: the renewals still in flight have nothing left to keep.
      renewals.abort();
      await Promise.all(inFlight);
    }
  }

  /** The deadline of a call starting now: the client's timeout plus extraMs. */
  #deadline(callerSignal: AbortSignal | undefined, extraMs = 0): Deadline {
    return deadlineOf(callerSignal, this.#timeoutMs > 0 ? this.#timeoutMs + extraMs : 0);
  }

  /**
   * Runs a claim, complete, release or extend, in a batch when it can share one, and
   * returns its answer's data or throws as the single call does.
   */
  #do(item: api.BatchItem, callerSignal: AbortSignal | undefined, extraMs = 0): Promise<unknown> {
    const deadline = this.#deadline(callerSignal, extraMs);
    return this.#batcher ? this.#batcher.do(item, deadline) : this.#single(item, deadline);
  }

  /** Sends item's call on its own. */
  #single(item: api.BatchItem, deadline: Deadline): Promise<unknown> {
    const client = this.#api;
    return this.#call(deadline, (signal): Promise<{ data?: unknown; error?: unknown; response?: Response }> => {
      if (item.claim) return sdk.claim({ client, body: item.claim, signal });
      if (item.complete) return sdk.complete({ client, body: item.complete, signal });
      if (item.release) return sdk.release({ client, body: item.release, signal });
      if (item.extend) return sdk.extend({ client, body: item.extend, signal });
      return Promise.reject(new IdemError("idem: an operation without a body"));
    });
  }

  /**
   * Sends one call under deadline and returns its data, or throws the problem it
   * answered. A failure to get any answer is an UnavailableError; the caller's own abort
   * throws its reason.
   */
  async #call<D>(
    deadline: Deadline,
    send: (signal: AbortSignal) => Promise<{ data?: D; error?: unknown; response?: Response }>,
  ): Promise<D> {
    const result = await send(deadline.signal);
    if (result.response === undefined) throw noAnswer(deadline, result.error);
    if (!result.response.ok) throw problemFrom(result.response, result.error);
    return result.data as D;
  }
}

/**
 * Wraps fetch so that a request whose answer never came (a transport failure, which
 * fetch reports as a TypeError) is resent with backoff: every idemd call is safe to resend.
 */
function resending(fetchFn: typeof fetch, retries: number, backoffMs: number): typeof fetch {
  return async (input, init) => {
    const request = new Request(input, init);
    for (let attempt = 0; ; attempt++) {
      try {
        return await fetchFn(request.clone());
      } catch (err) {
        if (attempt >= retries || request.signal.aborted || !(err instanceof TypeError)) throw err;
        await sleep(backoffMs * 2 ** attempt, undefined, { signal: request.signal }).catch(() => undefined);
        if (request.signal.aborted) throw err;
      }
    }
  };
}

/** The sealing of a client's options, checked. */
function sealerOf(sealing: SealingOptions | undefined): Sealer {
  if (sealing === undefined) return Sealer.none;
  if (typeof sealing.tenant !== "string" || sealing.tenant === "" || /\p{Surrogate}/u.test(sealing.tenant)) {
    throw new TypeError("idem: sealing needs the tenant the client works in, a non-empty string");
  }
  if (!(sealing.ring instanceof KeyRing)) throw new TypeError("idem: sealing needs a KeyRing");
  return new Sealer(sealing.tenant, sealing.ring);
}

/**
 * The largest body (or sealed envelope) complete sends base64 in JSON; a larger one goes
 * as the raw body of PUT /v1/keys/{key}/result, a third fewer bytes and no base64. A
 * daemon with a blob store takes such a result up to its --max-blob-bytes; one without
 * answers 413 over its --max-response-bytes, either way.
 */
export const rawResultBytes = 1 << 20;

/** err, the failure of a raw upload of a result, as a RawResultUnavailableError; its cause is err's. */
function rawUnavailable(err: UnavailableError): RawResultUnavailableError {
  const init = {
    status: err.status,
    code: err.code,
    title: err.title,
    type: err.type,
    detail: err.detail,
    instance: err.instance,
    retryAfterMs: err.retryAfterMs,
    body: err.body,
  };
  return new RawResultUnavailableError(init, err.cause === undefined ? undefined : { cause: err.cause });
}

/** A response as stored: its status, and its headers and body or their sealed envelope. */
interface RawResult {
  status: number;
  headers?: Record<string, string[]>;
  /** The body, or the envelope when sealed. */
  body: Uint8Array;
  sealed: boolean;
}

/**
 * The stored form of key's response, a result of outcome: with a sealer that holds a
 * ring, its status and the envelope of its headers and body.
 */
function rawResult(r: ResponseInit, key: string, sealer: Sealer, outcome: Outcome): RawResult {
  const headers: Record<string, string[]> = {};
  for (const [name, value] of Object.entries(r.headers ?? {})) headers[name] = Array.isArray(value) ? value : [value];
  const body =
    r.body === undefined ? Buffer.alloc(0) : typeof r.body === "string" ? Buffer.from(r.body, "utf8") : r.body;
  const sealed = sealer.sealResponse(key, outcome, r.status, headers, body);
  if (sealed !== undefined) return { status: r.status, body: sealed, sealed: true };
  return { status: r.status, headers: Object.keys(headers).length > 0 ? headers : undefined, body, sealed: false };
}

/** A RawResult as JSON carries it. */
function wireOf(r: RawResult): api.StoredResponse {
  if (r.sealed) return { status: r.status, sealed: Buffer.from(r.body).toString("base64") };
  const wire: api.StoredResponse = { status: r.status };
  if (r.headers !== undefined) wire.headers = r.headers;
  if (r.body.length > 0) wire.body = Buffer.from(r.body).toString("base64");
  return wire;
}

/**
 * Builds the stored form of key's response, a result of outcome: with a sealer that
 * holds a ring, its status and the envelope of its headers and body, which then are not
 * sent.
 */
export function toWire(
  r: ResponseInit,
  key = "",
  sealer: Sealer = Sealer.none,
  outcome: Outcome = "completed",
): api.StoredResponse {
  return wireOf(rawResult(r, key, sealer, outcome));
}

/**
 * Reads the stored form of key's response, of a record in state (completed, failed,
 * or one not finished), opening it when it is sealed. A sealed one that does not open,
 * or a plain one, or none for a finished record, under a ring that requires sealing,
 * throws an UnsealableError; without a ring, every sealed one does (unknown_key).
 */
export function fromWire(
  wire: api.StoredResponse | undefined,
  key = "",
  sealer: Sealer = Sealer.none,
  state = "completed",
): StoredResponse | undefined {
  const sealed = wire?.sealed === undefined ? undefined : Buffer.from(wire.sealed, "base64");
  const stored = { present: wire !== undefined, status: wire?.status ?? 0, sealed };
  const opened = sealer.openResponse(key, state, stored, () => ({
    headers: wire?.headers ?? {},
    body: Buffer.from(wire?.body ?? "", "base64"),
  }));
  if (wire === undefined || opened === undefined) return undefined;
  return { status: wire.status, headers: opened.headers, body: opened.body };
}

function jsonResponse(body: string): ResponseInit {
  return { status: 200, headers: { "Content-Type": "application/json" }, body };
}

function parseStored(key: string, response: StoredResponse | undefined): unknown {
  if (response === undefined || response.body.length === 0) return undefined;
  try {
    return JSON.parse(Buffer.from(response.body).toString("utf8"));
  } catch (err) {
    throw new IdemError(`idem: the result stored for ${JSON.stringify(key)} is not JSON: was it stored by run?`, {
      cause: err,
    });
  }
}

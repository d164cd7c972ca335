// The Completer: finishes the work that holders left pending, from the abandoned-keys feed.
import { setTimeout as sleep } from "node:timers/promises";
import { type AbandonedKey, completerRun, type IdemClient, type Lease, type ResponseInit } from "./client.js";
import { FailedError, InProgressError, PermanentError, ProblemError, UnavailableError } from "./errors.js";

/** The settings of a Completer; handler, and prefix (or allKeys), are required. */
export interface CompleterOptions {
  /**
   * Selects the keys the completer finishes: those that begin with it, for example the
   * keyPrefix of a middleware, or the keys a service gives run for one kind of work. One
   * handler finishes them all, so they must be work of one kind.
   */
  prefix?: string;
  /**
   * Lets prefix be empty and the completer take every abandoned key of the tenant. It is
   * an option of its own so that a prefix left empty by mistake is an error rather than a
   * completer that runs its handler on every other kind of work.
   */
  allKeys?: boolean;
  /**
   * Leaves alone the keys whose lease ran out less than this long ago, for example to
   * give their own callers time to retry first; default 0.
   */
  olderThanMs?: number;
  /** Bounds the handlers that run at once; default 4. */
  concurrency?: number;
  /**
   * The lease each handler runs under, renewed while it runs, as run's leaseMs (default
   * 30 s; 100 ms to 1 h). It is also how long a key whose handler failed waits before it
   * is listed again.
   */
  leaseMs?: number;
  /** How long run waits before the next pass once a pass finished nothing; default 5 s. */
  pollIntervalMs?: number;
  /**
   * Finishes, or compensates, the work of one abandoned key. It is called as the
   * function given to run is: with a signal, and the lease, whose key, recovered (true
   * when the key was taken over from a holder whose lease ran out, the usual case),
   * attempt and recoveryPoint (what that holder recorded, if anything) say where the work
   * stands. Its result is stored as the key's, which the key's own callers then get
   * back; a PermanentError stores a failure; any other error leaves the key pending, to
   * be listed again once the lease runs out. It may record progress with
   * lease.checkpoint.
   */
  handler: (signal: AbortSignal, lease: Lease) => Promise<ResponseInit> | ResponseInit;
  /**
   * Called with every error the completer meets and does not throw: a key whose handler
   * failed or whose result could not be stored (key set), and in run a pass that could
   * not read the feed (key ""). An error it throws is ignored.
   */
  onError?: (key: string, error: unknown) => void;
}

/**
 * What one pass did with the keys it listed: listed is finished + failed + skipped +
 * errors.
 */
export interface CompleterStats {
  /** The keys the pass took from the feed. */
  listed: number;
  /** The keys whose handler ran and whose result is stored. */
  finished: number;
  /** The keys whose handler threw a PermanentError, stored as the key's failure. */
  failed: number;
  /**
   * The keys the pass did not run: another caller or completer holds the key, or it was
   * finished since the feed listed it.
   */
  skipped: number;
  /**
   * The keys whose handler failed or that could not be claimed or finished; they stay
   * pending and are listed again once their lease runs out. A key whose recovery point,
   * or result, does not open with the client's ring (an UnsealableError) is one: its
   * handler does not run.
   */
  errors: number;
}

type Outcome = "finished" | "failed" | "skipped" | "errors";

const maxKeyBytes = 255;
const maxBackoffMs = 30_000;
const firstBackoffMs = 250;

/**
 * Finishes the work that holders left: it reads the abandoned-keys feed
 * (IdemClient.abandonedKeys) under a prefix and runs its handler for each key, by run's
 * own path, as for a caller that retries, with the fingerprint the feed shows. The claim
 * decides who finishes a key, so any number of completers, in any number of processes,
 * and the keys' own callers may run at once: a key another one holds is skipped, a key
 * already finished is skipped (never run again), and no handler runs for a key twice
 * unless a lease is lost.
 *
 * A handler that fails does not free the key for a retry as run would: a key released
 * is no longer pending and would drop out of the feed the completer works from. It stays
 * pending, and the feed lists it again once its lease runs out.
 *
 *     const completer = new Completer(client, { prefix: "orders/", handler: finishOrder });
 *     await completer.run(shutdown.signal);
 */
export class Completer {
  readonly #run: ReturnType<typeof completerRun>;
  readonly #client: IdemClient;
  readonly #prefix: string;
  readonly #olderThanMs: number;
  readonly #concurrency: number;
  readonly #leaseMs: number;
  readonly #pollIntervalMs: number;
  readonly #handler: CompleterOptions["handler"];
  readonly #onError: CompleterOptions["onError"];

  /**
   * Refuses options without a handler, without a prefix unless allKeys is set (and with
   * both), with a prefix over 255 bytes or not valid UTF-8, with a negative duration, a
   * concurrency that is not a positive integer, or a leaseMs outside 100 ms to 1 h.
   */
  constructor(client: IdemClient, options: CompleterOptions) {
    const prefix = options.prefix ?? "";
    if (typeof options.handler !== "function") throw new TypeError("Completer: a handler is required");
    if (prefix === "" && !options.allKeys) {
      throw new TypeError(
        "Completer: a prefix is required; set allKeys to finish every abandoned key with one handler",
      );
    }
    if (prefix !== "" && options.allKeys) throw new TypeError("Completer: allKeys with a prefix: choose one");
    if (/\p{Surrogate}/u.test(prefix) || Buffer.byteLength(prefix, "utf8") > maxKeyBytes) {
      throw new RangeError(`Completer: the prefix must be valid UTF-8 of at most ${maxKeyBytes} bytes`);
    }
    const olderThanMs = options.olderThanMs ?? 0;
    const pollIntervalMs = options.pollIntervalMs ?? 5000;
    const concurrency = options.concurrency ?? 4;
    const leaseMs = options.leaseMs ?? 30_000;
    if (!(olderThanMs >= 0) || !(pollIntervalMs >= 0)) {
      throw new RangeError("Completer: olderThanMs and pollIntervalMs cannot be negative");
    }
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new RangeError(`Completer: concurrency is ${concurrency}; it must be a positive integer`);
    }
    if (!(leaseMs >= 100 && leaseMs <= 3_600_000)) {
      throw new RangeError(`Completer: leaseMs is ${leaseMs}; idemd's leases last 100 to 3600000 ms`);
    }
    this.#client = client;
    this.#run = completerRun(client);
    this.#prefix = prefix;
    this.#olderThanMs = olderThanMs;
    this.#concurrency = concurrency;
    this.#leaseMs = leaseMs;
    this.#pollIntervalMs = pollIntervalMs;
    this.#handler = options.handler;
    this.#onError = options.onError;
  }

  /**
   * Makes one pass over the feed, every page of it, and resolves once the handlers it
   * started have returned. It rejects when the feed could not be read to its end (the
   * keys listed until then were run), or with the signal's reason when it aborts; a key
   * that could not be finished is counted in errors, and reported to onError, instead.
   * When the signal aborts, no more keys are taken, and the signals of the handlers
   * that run abort too; it settles once they have returned. It may run alongside other
   * passes and run.
   */
  async runOnce(signal?: AbortSignal): Promise<CompleterStats> {
    const stats: CompleterStats = { listed: 0, finished: 0, failed: 0, skipped: 0, errors: 0 };
    const running = new Set<Promise<void>>();
    let failure: { error: unknown } | undefined;
    try {
      await this.#pass(
        signal,
        running,
        () => true,
        (outcome) => stats[outcome]++,
        () => stats.listed++,
      );
    } catch (err) {
      failure = { error: err };
    }
    await Promise.all(running);
    if (failure) throw failure.error;
    signal?.throwIfAborted();
    return stats;
  }

  /**
   * Keeps finishing abandoned keys until signal aborts, and then resolves. Its
   * concurrency bounds the handlers running across passes: a pass starts only keys that
   * are not running already, so a handler that takes long holds up no other key. After
   * a pass during which a key was finished or failed, the next starts at once, for more
   * may be waiting; otherwise it starts pollIntervalMs later. While idemd cannot be
   * reached (UnavailableError, 429, 5xx) the passes come further and further apart,
   * from 250 ms doubling up to 30 s with jitter; each failed pass goes to onError, and
   * run never ends for one. A feed that idemd refuses otherwise (401, 403, 400) is a
   * mistake that no retry mends: run rejects with that error, once its handlers
   * returned.
   *
   * When signal aborts, run takes no more keys and the signals of the handlers that run
   * abort too (they derive from it); run resolves once they have all returned. A handler
   * that returns a result anyway has it stored; one that throws leaves its key pending
   * for the next completer.
   */
  async run(signal: AbortSignal): Promise<void> {
    const running = new Set<Promise<void>>();
    const keys = new Set<string>();
    let progress = 0;
    let backoffMs = 0;
    try {
      while (!signal.aborted) {
        const before = progress;
        let waitMs = this.#pollIntervalMs;
        try {
          await this.#pass(
            signal,
            running,
            (key) => {
              if (keys.has(key)) return false;
              keys.add(key);
              return true;
            },
            (outcome, key) => {
              keys.delete(key);
              if (outcome === "finished" || outcome === "failed") progress++;
            },
            () => undefined,
          );
          backoffMs = 0;
          if (progress > before) continue;
        } catch (err) {
          if (signal.aborted) break;
          if (!passAgain(err)) throw err;
          backoffMs = Math.min(Math.max(2 * backoffMs, firstBackoffMs), maxBackoffMs);
          waitMs = backoffMs / 2 + Math.random() * (backoffMs / 2);
          if (err instanceof ProblemError && err.retryAfterMs !== undefined && err.retryAfterMs > waitMs) {
            waitMs = err.retryAfterMs;
          }
          this.#report("", err);
        }
        await sleep(waitMs, undefined, { signal }).catch(() => undefined);
      }
    } finally {
      await Promise.all(running);
    }
  }

  /**
   * Reads every page of the feed and starts each key that take accepts, once in the
   * pass, as soon as fewer than concurrency handlers run; done is called with each
   * key's outcome. It returns once every key is started, not finished.
   */
  async #pass(
    signal: AbortSignal | undefined,
    running: Set<Promise<void>>,
    take: (key: string) => boolean,
    done: (outcome: Outcome, key: string) => void,
    listed: () => void,
  ): Promise<void> {
    // A page read later may list again a key that was given up meanwhile; one run a
    // pass is enough.
    const seen = new Set<string>();
    const feed = this.#client.abandonedKeys({
      prefix: this.#prefix,
      olderThanMs: this.#olderThanMs,
      ...(signal ? { signal } : {}),
    });
    for await (const k of feed) {
      signal?.throwIfAborted();
      if (seen.has(k.key)) continue;
      seen.add(k.key);
      if (!take(k.key)) continue;
      while (running.size >= this.#concurrency) await Promise.race(running);
      signal?.throwIfAborted();
      listed();
      const one: Promise<void> = this.#finish(k, signal).then((outcome) => {
        running.delete(one);
        done(outcome, k.key);
      });
      running.add(one);
    }
  }

  /** Runs the handler for k by run's path, and says how it went; never rejects. */
  async #finish(k: AbandonedKey, signal: AbortSignal | undefined): Promise<Outcome> {
    let ran = false;
    let handlerError: { error: unknown } | undefined;
    try {
      const result = await this.#run(
        k.key,
        async (s, lease) => {
          ran = true;
          try {
            return await this.#handler(s, lease);
          } catch (err) {
            handlerError = { error: err };
            throw err;
          }
        },
        {
          leaseMs: this.#leaseMs,
          // The claim carries the listed fingerprint, since one with another is refused;
          // a key without one is claimed without one.
          ...(k.fingerprint ? { fingerprint: k.fingerprint } : {}),
          ...(signal ? { signal } : {}),
        },
      );
      // A key finished since the feed listed it is never run again.
      return result.ran ? "finished" : "skipped";
    } catch (err) {
      if (!ran && (err instanceof InProgressError || err instanceof FailedError)) return "skipped";
      if (ran && handlerError?.error === err && err instanceof PermanentError) return "failed";
      this.#report(k.key, err);
      return "errors";
    }
  }

  #report(key: string, error: unknown): void {
    try {
      this.#onError?.(key, error);
    } catch {
      // A failing hook must not stop the completer.
    }
  }
}

/** Tells a pass that failed because idemd could not answer, or not now, from one it refused. */
function passAgain(err: unknown): boolean {
  if (err instanceof UnavailableError) return true;
  if (err instanceof ProblemError) return err.status === 429 || err.status >= 500;
  // A failure to get any answer that was not read into a problem.
  return err instanceof TypeError;
}

// Natural batching: the claims, completes, releases and extends an IdemClient makes
// while one of its requests is in flight gather, and go out together as one
// POST /v1/batch when it returns. There is no timer: a lone call waits for nothing.
import { IdemError, itemProblem, problemFrom, UnavailableError } from "./errors.js";
import type * as api from "./gen/types.gen.js";

// The bounds of one batch. A call larger than maxBatchItemBytes goes on its own, so
// that a batch stays far below any daemon's body limit (at least 64 KiB).
const maxBatchItems = 128;
const maxBatchBytes = 60 << 10;
const maxBatchItemBytes = 16 << 10;

/** What bounds a caller's wait for one call: its own signal and the client's timeout. */
export interface Deadline {
  caller: AbortSignal | undefined;
  timeout: AbortSignal | undefined;
  /** The timeout's length, for its message. */
  timeoutMs: number;
  /** Aborts when the caller's signal or the timeout does. */
  signal: AbortSignal;
}

/** The deadline of a call starting now; timeoutMs of 0 or less means none. */
export function deadlineOf(caller: AbortSignal | undefined, timeoutMs: number): Deadline {
  const timeout = timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined;
  const signals = [caller, timeout].filter((s): s is AbortSignal => s !== undefined);
  const signal = signals.length === 1 ? (signals[0] as AbortSignal) : AbortSignal.any(signals);
  return { caller, timeout, timeoutMs, signal };
}

/**
 * The error of a call that got no answer: the caller's own abort reason, or an
 * UnavailableError saying why no answer came.
 */
export function noAnswer(deadline: Deadline, cause: unknown): unknown {
  if (deadline.caller?.aborted) return deadline.caller.reason;
  const detail = deadline.timeout?.aborted
    ? `no answer within ${deadline.timeoutMs} ms`
    : cause instanceof Error
      ? `${cause.message}${cause.cause instanceof Error ? `: ${cause.cause.message}` : ""}`
      : String(cause);
  return new UnavailableError({ status: 0, code: "", title: "idemd unreachable", detail }, { cause });
}

/** A request's outcome as the generated client returns it: no response when none came. */
export interface Sent<D> {
  data?: D;
  error?: unknown;
  response?: Response;
}

/** How a Batcher reaches idemd. */
export interface Transport {
  /** Sends item on its own and resolves to its answer's data, or rejects as the call does. */
  single(item: api.BatchItem, deadline: Deadline): Promise<unknown>;
  /** Posts body, the batch of items already encoded, under signal. */
  batch(body: string, items: api.BatchItem[], signal: AbortSignal): Promise<Sent<api.BatchResults>>;
  /** The client's timeout, which bounds a batch as it bounds one call. */
  timeoutMs: number;
}

/** One call on its way: queued, in a batch, or sent on its own. */
interface Call {
  item: api.BatchItem;
  encoded: string;
  bytes: number;
  deadline: Deadline;
  settled: boolean;
  settle(outcome: { data: unknown } | { error: unknown }): void;
}

/**
 * Gathers the calls of one client. At most one request of the batcher is in flight:
 * the loop that sent it takes what gathered meanwhile as the next batch, and stops when
 * nothing is left.
 */
export class Batcher {
  readonly #transport: Transport;
  #queue: Call[] = [];
  #sending = false;
  /** Set once the daemon answered a batch as an unknown endpoint. */
  #unsupported = false;

  constructor(transport: Transport) {
    this.#transport = transport;
  }

  /** How many calls wait for the request in flight to return. */
  get queued(): number {
    return this.#queue.filter((call) => !call.settled).length;
  }

  /**
   * Runs item: through the batch when it can share a request, on its own otherwise.
   * The deadline bounds the caller's wait; a call already sent in a batch may still take
   * effect after its caller stopped waiting, as a call cut off on its own may.
   */
  do(item: api.BatchItem, deadline: Deadline): Promise<unknown> {
    // A claim that waits would hold the whole batch back; the daemon refuses it there.
    if (this.#unsupported || (item.claim?.wait_ms ?? 0) > 0 || deadline.signal.aborted) {
      return this.#transport.single(item, deadline);
    }
    const encoded = JSON.stringify(item);
    const bytes = Buffer.byteLength(encoded);
    if (bytes > maxBatchItemBytes) return this.#transport.single(item, deadline);
    return new Promise((resolve, reject) => {
      const onAbort = () => call.settle({ error: noAnswer(deadline, deadline.signal.reason) });
      const call: Call = {
        item,
        encoded,
        bytes,
        deadline,
        settled: false,
        settle(outcome) {
          if (call.settled) return;
          call.settled = true;
          deadline.signal.removeEventListener("abort", onAbort);
          if ("error" in outcome) reject(outcome.error);
          else resolve(outcome.data);
        },
      };
      // A caller that gives up is answered at once; while queued, it is left out.
      deadline.signal.addEventListener("abort", onAbort, { once: true });
      this.#queue.push(call);
      if (!this.#sending) {
        this.#sending = true;
        // Calls made in the same turn of the event loop go out together.
        queueMicrotask(() => void this.#run());
      }
    });
  }

  /** Sends what gathered, batch after batch, until nothing is left. */
  async #run(): Promise<void> {
    for (;;) {
      const calls = this.#next();
      if (calls.length === 0) return;
      try {
        if (this.#unsupported) {
          await Promise.all(calls.map((call) => this.#alone(call)));
        } else if (calls.length === 1) {
          // Alone: the call's own request, under its own deadline.
          await this.#alone(calls[0] as Call);
        } else {
          await this.#send(calls);
        }
      } catch (error) {
        // Whatever went wrong, no call is left waiting and the loop goes on.
        for (const call of calls) call.settle({ error });
      }
    }
  }

  /** Takes the calls of the next batch off the queue, or says the loop is done. */
  #next(): Call[] {
    const calls: Call[] = [];
    let size = 0;
    let n = 0;
    for (; n < this.#queue.length && calls.length < maxBatchItems; n++) {
      const call = this.#queue[n] as Call;
      if (call.settled) continue;
      if (size + call.bytes + 1 > maxBatchBytes && calls.length > 0) break;
      size += call.bytes + 1;
      calls.push(call);
    }
    this.#queue = this.#queue.slice(n);
    if (calls.length === 0) this.#sending = false;
    return calls;
  }

  /** Sends call on its own. */
  async #alone(call: Call): Promise<void> {
    if (call.settled) return;
    try {
      call.settle({ data: await this.#transport.single(call.item, call.deadline) });
    } catch (error) {
      call.settle({ error });
    }
  }

  /**
   * Sends calls as one batch and answers each. A batch the daemon refuses as a whole
   * (no batch endpoint, too large, not accepted as valid) is sent again call by call,
   * so that every call gets the answer it would get on its own.
   */
  async #send(calls: Call[]): Promise<void> {
    const body = `{"items":[${calls.map((call) => call.encoded).join(",")}]}`;
    // The batch is nobody's own call: one caller giving up must not cut it off for the
    // others, so it runs under the client's timeout alone.
    const deadline = deadlineOf(undefined, this.#transport.timeoutMs);
    let sent: Sent<api.BatchResults>;
    try {
      sent = await this.#transport.batch(
        body,
        calls.map((call) => call.item),
        deadline.signal,
      );
    } catch (error) {
      // An answer that is not JSON, as on its own.
      for (const call of calls) call.settle({ error });
      return;
    }
    const response = sent.response;
    if (response === undefined) {
      for (const call of calls) call.settle({ error: noAnswer(deadline, sent.error) });
      return;
    }
    switch (response.status) {
      case 404:
      case 405:
        // A daemon from before the batch endpoint: batches are not tried again.
        this.#unsupported = true;
        for (const call of calls) await this.#alone(call);
        return;
      case 400:
      case 413:
      case 415:
        for (const call of calls) await this.#alone(call);
        return;
    }
    if (!response.ok) {
      for (const call of calls) call.settle({ error: problemFrom(response, sent.error) });
      return;
    }
    const results = (sent.data as { results?: unknown } | undefined)?.results;
    if (!Array.isArray(results) || results.length !== calls.length) {
      const got = Array.isArray(results) ? `${results.length} results` : "no results";
      for (const call of calls) {
        call.settle({
          error: new IdemError(
            `idem: a batch of ${calls.length} calls was answered with ${got}; is the base URL idemd's?`,
          ),
        });
      }
      return;
    }
    calls.forEach((call, i) => call.settle(fromBatch(call.item, results[i])));
  }
}

/** An item's result as its single call's would be: the answer's data, or the error. */
function fromBatch(item: api.BatchItem, result: unknown): { data: unknown } | { error: unknown } {
  if (typeof result !== "object" || result === null || typeof (result as { status?: unknown }).status !== "number") {
    return { error: new IdemError("idem: a batch item was answered without a status; is the base URL idemd's?") };
  }
  const res = result as api.BatchItemResult;
  if (res.status < 200 || res.status >= 300 || res.problem !== undefined) {
    return { error: itemProblem(res.status, res.problem as Record<string, unknown> | undefined) };
  }
  // A claim checks its answer itself, as it does on its own.
  if (item.claim) return { data: res.acquired ?? res.finished };
  const [name, data] = item.extend ? ["lease", res.extended] : ["record", res.record];
  if (typeof data !== "object" || data === null) {
    return {
      error: new IdemError(
        `idem: a batch item was answered ${res.status} without its ${name}; is the base URL idemd's?`,
      ),
    };
  }
  return { data };
}

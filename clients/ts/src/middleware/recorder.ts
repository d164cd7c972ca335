import type { ServerResponse } from "node:http";

/** How the handler's answer ended. */
export type Ending =
  /** The handler ended its answer (res.end). */
  | { kind: "ended" }
  /** The client went away and the handler wrote no status within a lease (R5). */
  | { kind: "cancelled" }
  /**
   * The answer was cut short after its status: the client went away, or the handler
   * threw and the framework closed the connection, and the handler never ended it (R15).
   */
  | { kind: "abandoned" };

/**
 * Passes the handler's answer through to the client as it is written (flushes
 * included) and records it at the same time: the final status (1xx are not final), the
 * stored headers, and the body up to a limit, so memory stays bounded.
 */
export class Recorder {
  status = 0;
  switchedProtocols = false;
  readonly headers: Record<string, string[]> = {};
  readonly #chunks: Buffer[] = [];
  #size = 0;
  overflow = false;
  #blocked = false;
  #ended = false;
  #deferredEnd: (() => void) | undefined;
  readonly ending: Promise<Ending>;
  #end: (e: Ending) => void = () => undefined;
  readonly #original: Pick<ServerResponse, "writeHead" | "write" | "end">;

  constructor(
    readonly res: ServerResponse,
    readonly storedHeaders: ReadonlySet<string>,
    readonly maxStoredBytes: number,
    abandonAfterMs: number,
  ) {
    this.ending = new Promise((resolve) => {
      this.#end = resolve;
    });
    const original = { writeHead: res.writeHead, write: res.write, end: res.end };
    this.#original = original;
    const recorder = this;
    res.writeHead = function (this: ServerResponse, ...args: unknown[]) {
      if (recorder.#blocked) return this;
      recorder.#head(args);
      return (original.writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
    } as ServerResponse["writeHead"];
    res.write = function (this: ServerResponse, ...args: unknown[]) {
      if (recorder.#blocked) return true;
      recorder.#body(args[0], args[1]);
      return (original.write as (...a: unknown[]) => boolean).apply(this, args);
    } as ServerResponse["write"];
    res.end = function (this: ServerResponse, ...args: unknown[]) {
      if (recorder.#blocked || recorder.#ended) return this;
      if (typeof args[0] !== "function") recorder.#body(args[0], args[1]);
      // The end of the answer waits until the key is finished (see finish), so that a
      // client that retries as soon as it has the answer gets it replayed, not a 409.
      if (recorder.status === 0) recorder.#head([this.statusCode]);
      recorder.#ended = true;
      recorder.#deferredEnd = () => (original.end as (...a: unknown[]) => ServerResponse).apply(this, args);
      recorder.#end({ kind: "ended" });
      return this;
    } as ServerResponse["end"];
    // Once the middleware has answered in the handler's place (R12, R16), a handler
    // that did not watch its signal may still answer; the headers it sets go the way of
    // the rest of its answer, where Node would throw because the headers were sent.
    for (const name of ["setHeader", "appendHeader", "removeHeader"] as const) {
      const own = res[name] as (...a: unknown[]) => unknown;
      res[name] = function (this: ServerResponse, ...args: unknown[]) {
        if (recorder.#blocked && this.headersSent) return this;
        return own.apply(this, args);
      } as never;
    }
    res.once("close", () => {
      if (this.#ended) return;
      // The handler may still be running, and may still do the work and answer: give it
      // a lease's time to end the answer (then its status decides, R6) before calling
      // it cancelled (no status, R5) or abandoned (R15).
      setTimeout(
        () => this.#end(this.status === 0 && !res.headersSent ? { kind: "cancelled" } : { kind: "abandoned" }),
        abandonAfterMs,
      ).unref();
    });
  }

  /** Sends the end of the handler's answer, held back until the key was finished. */
  finish(): void {
    const end = this.#deferredEnd;
    this.#deferredEnd = undefined;
    end?.();
  }

  /** Stops passing the handler's writes on: the middleware answers in its place. */
  block(): void {
    this.#blocked = true;
  }

  /** Writes an answer of the middleware's own, bypassing the recording. */
  answer(status: number, headers: Record<string, string>, body: Buffer): void {
    this.block();
    if (this.res.headersSent || this.res.destroyed) return;
    (this.#original.writeHead as (...a: unknown[]) => void).call(this.res, status, {
      ...headers,
      "content-length": String(body.length),
    });
    (this.#original.end as (...a: unknown[]) => void).call(this.res, body);
  }

  /** The recorded body; undefined when it went over the limit. */
  body(): Buffer | undefined {
    return this.overflow ? undefined : Buffer.concat(this.#chunks);
  }

  /** Body bytes plus stored header names and values, as maxStoredBytes counts them. */
  storedBytes(): number {
    let n = this.#size;
    for (const [name, values] of Object.entries(this.headers)) {
      for (const v of values) n += name.length + Buffer.byteLength(v);
    }
    return n;
  }

  #head(args: unknown[]): void {
    const status = Number(args[0]);
    if (status >= 100 && status < 200 && status !== 101) return; // Informational: not the answer (R8).
    if (status === 101) this.switchedProtocols = true;
    if (this.status !== 0) return;
    this.status = status;
    const given = typeof args[1] === "string" ? args[2] : args[1];
    const all: Record<string, unknown> = { ...this.res.getHeaders() };
    if (Array.isArray(given)) {
      const flat = given.flat() as unknown[];
      for (let i = 0; i + 1 < flat.length; i += 2) all[String(flat[i]).toLowerCase()] = flat[i + 1];
    } else if (given && typeof given === "object") {
      for (const [k, v] of Object.entries(given)) all[k.toLowerCase()] = v;
    }
    for (const [name, value] of Object.entries(all)) {
      if (!this.storedHeaders.has(name.toLowerCase()) || value === undefined) continue;
      this.headers[name.toLowerCase()] = Array.isArray(value) ? value.map(String) : [String(value)];
    }
  }

  #body(chunk: unknown, encoding: unknown): void {
    if (chunk === undefined || chunk === null || this.overflow) return;
    if (this.status === 0) {
      // Node writes the head on the first write; record it as it will be sent.
      this.#head([this.res.statusCode]);
    }
    const bytes =
      typeof chunk === "string"
        ? Buffer.from(chunk, typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8")
        : Buffer.from(chunk as Uint8Array);
    this.#size += bytes.length;
    if (this.#size > this.maxStoredBytes) {
      this.overflow = true;
      this.#chunks.length = 0;
      return;
    }
    this.#chunks.push(bytes);
  }
}

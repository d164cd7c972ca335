// Proxies in front of a real server for the tests. LossyProxy is a loopback TCP proxy
// that can lose answers: it forwards a connection's request, and for the first
// `dropAnswers` connections it closes the client's side as soon as the server's answer
// starts, so the client never reads it although the server acted on the request.
// CutProxy forwards everything but the requests it is told to cut, whose connection it
// destroys unanswered.
import {
  createServer as createHTTPServer,
  type IncomingMessage,
  request as httpRequest,
  type Server as HTTPServer,
  type ServerResponse,
  STATUS_CODES,
} from "node:http";
import { connect, createServer, type Server, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

export class LossyProxy {
  readonly url: string;
  dropAnswers: number;
  /** How many answers were dropped so far. */
  dropped = 0;
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();

  private constructor(server: Server, url: string, dropAnswers: number) {
    this.#server = server;
    this.url = url;
    this.dropAnswers = dropAnswers;
  }

  static async start(target: string, dropAnswers: number): Promise<LossyProxy> {
    const { hostname, port } = new URL(target);
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no address");
    const proxy = new LossyProxy(server, `http://127.0.0.1:${address.port}`, dropAnswers);
    server.on("connection", (client) => {
      const upstream = connect(Number(port), hostname);
      proxy.#sockets.add(client).add(upstream);
      const drop = proxy.dropped < proxy.dropAnswers;
      if (drop) proxy.dropped++;
      client.on("data", (chunk) => upstream.write(chunk));
      upstream.on("data", (chunk) => {
        if (drop) {
          client.destroy();
          upstream.destroy();
          return;
        }
        client.write(chunk);
      });
      for (const [a, b] of [
        [client, upstream],
        [upstream, client],
      ] as const) {
        a.on("end", () => b.end());
        a.on("error", () => b.destroy());
        a.on("close", () => {
          b.destroy();
          proxy.#sockets.delete(a);
        });
      }
    });
    return proxy;
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise((resolve) => this.#server.close(resolve));
  }
}

/** A request a GateProxy received: its path, and for a batch how many items it held. */
export interface Received {
  path: string;
  items: number;
}

/** How a GateProxy treats the requests it receives. */
export interface GateOptions {
  /** How many of the first requests are held until opened; default 1. */
  hold?: number;
  /**
   * Answers POST /v1/batch with this status itself instead of forwarding it: 404 as a
   * daemon from before the batch endpoint does, 413 as one with a smaller body limit.
   */
  batchStatus?: number;
  /** How long to hold a request to this path before forwarding it; default none. */
  delayMs?: (path: string) => number;
}

/**
 * A loopback HTTP proxy in front of a real idemd that records every request and holds
 * the first ones until open(i) is called, so that a test can gather a client's calls
 * behind a request in flight. It can also slow the requests to some paths down.
 */
export class GateProxy {
  readonly url: string;
  readonly received: Received[] = [];
  readonly #server: HTTPServer;
  readonly #gates: { opened: Promise<void>; open: () => void }[] = [];

  private constructor(server: HTTPServer, url: string, hold: number) {
    this.#server = server;
    this.url = url;
    for (let i = 0; i < hold; i++) {
      let open: () => void = () => undefined;
      const opened = new Promise<void>((resolve) => {
        open = resolve;
      });
      this.#gates.push({ opened, open });
    }
  }

  static async start(target: string, options: GateOptions = {}): Promise<GateProxy> {
    const server = createHTTPServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no address");
    const proxy = new GateProxy(server, `http://127.0.0.1:${address.port}`, options.hold ?? 1);
    server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      void proxy.#forward(target, req, res, options).catch((err: unknown) => {
        res.destroy(err instanceof Error ? err : new Error(String(err)));
      });
    });
    return proxy;
  }

  /** Lets the request with this index (0 for the first) through. */
  open(index = 0): void {
    this.#gates[index]?.open();
  }

  async #forward(target: string, req: IncomingMessage, res: ServerResponse, options: GateOptions): Promise<void> {
    const batchStatus = options.batchStatus;
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    const path = req.url ?? "";
    let items = 0;
    if (path === "/v1/batch") {
      const parsed = JSON.parse(body.toString("utf8")) as { items?: unknown[] };
      items = parsed.items?.length ?? 0;
    }
    const index = this.received.length;
    this.received.push({ path, items });
    await this.#gates[index]?.opened;
    const delay = options.delayMs?.(path) ?? 0;
    if (delay > 0) await sleep(delay);
    if (batchStatus !== undefined && path === "/v1/batch") {
      const title = STATUS_CODES[batchStatus] ?? "";
      const codes: Record<number, string> = { 404: "not_found", 413: "payload_too_large" };
      const code = codes[batchStatus] ?? "invalid_request";
      res.writeHead(batchStatus, { "Content-Type": "application/problem+json" });
      res.end(JSON.stringify({ type: `urn:idemd:problem:${code}`, title, status: batchStatus, code }));
      return;
    }
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (typeof value === "string" && !["host", "connection", "content-length"].includes(name)) {
        headers.set(name, value);
      }
    }
    const answer = await fetch(new URL(path, target), {
      method: req.method ?? "GET",
      headers,
      ...(body.length > 0 && { body }),
    });
    const out = Buffer.from(await answer.arrayBuffer());
    const outHeaders: Record<string, string> = {};
    answer.headers.forEach((value, name) => {
      if (!["content-length", "content-encoding", "transfer-encoding", "connection"].includes(name)) {
        outHeaders[name] = value;
      }
    });
    res.writeHead(answer.status, outHeaders);
    res.end(out);
  }

  async close(): Promise<void> {
    for (const gate of this.#gates) gate.open();
    this.#server.closeAllConnections();
    await new Promise((resolve) => this.#server.close(resolve));
  }
}

/**
 * A loopback TCP proxy in front of a real server that holds every chunk a client sends
 * for a delay drawn from [minMs, maxMs] before passing it on, in order: a slow server
 * that still answers. The answers come back at once.
 */
export class DelayProxy {
  readonly url: string;
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();

  private constructor(server: Server, url: string) {
    this.#server = server;
    this.url = url;
  }

  static async start(target: string, minMs: number, maxMs: number): Promise<DelayProxy> {
    const { hostname, port } = new URL(target);
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no address");
    const proxy = new DelayProxy(server, `http://127.0.0.1:${address.port}`);
    server.on("connection", (client) => {
      const upstream = connect(Number(port), hostname);
      proxy.#sockets.add(client).add(upstream);
      // The chunks go on one after the other, so that none overtakes the one before it.
      let passing = Promise.resolve();
      const pass = (at: number, then: () => void) => {
        passing = passing
          .then(() => sleep(Math.max(0, at - Date.now())))
          .then(() => {
            if (!upstream.destroyed) then();
          });
      };
      client.on("data", (chunk) => {
        pass(Date.now() + minMs + Math.random() * (maxMs - minMs), () => upstream.write(chunk));
      });
      client.on("end", () => pass(0, () => upstream.end()));
      upstream.on("data", (chunk) => client.write(chunk));
      upstream.on("end", () => client.end());
      for (const [a, b] of [
        [client, upstream],
        [upstream, client],
      ] as const) {
        a.on("error", () => b.destroy());
        a.on("close", () => {
          b.destroy();
          proxy.#sockets.delete(a);
        });
      }
    });
    return proxy;
  }

  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise((resolve) => this.#server.close(resolve));
  }
}

/**
 * A loopback HTTP relay in front of a real idemd that forwards every request and its
 * answer as they come, except one that cut(method, path) picks: that one's connection is
 * destroyed before anything of it is read and with no answer, as a daemon that refuses a
 * large body before reading it and closes the connection can leave it.
 */
export class CutProxy {
  readonly url: string;
  /** The requests cut so far, as "METHOD path". */
  readonly cut: string[] = [];
  /** Every request received, as "METHOD path". */
  readonly received: string[] = [];
  readonly #server: HTTPServer;

  private constructor(server: HTTPServer, url: string) {
    this.#server = server;
    this.url = url;
  }

  static async start(target: string, cut: (method: string, path: string) => boolean): Promise<CutProxy> {
    const { hostname, port } = new URL(target);
    const server = createHTTPServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("no address");
    const proxy = new CutProxy(server, `http://127.0.0.1:${address.port}`);
    server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      const what = `${req.method ?? ""} ${req.url ?? ""}`;
      proxy.received.push(what);
      if (cut(req.method ?? "", req.url ?? "")) {
        proxy.cut.push(what);
        req.socket.destroy();
        return;
      }
      const upstream = httpRequest(
        { host: hostname, port: Number(port), method: req.method, path: req.url, headers: req.headers, agent: false },
        (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.rawHeaders);
          answer.pipe(res);
          answer.on("error", () => res.destroy());
        },
      );
      upstream.on("error", () => res.destroy());
      req.on("error", () => upstream.destroy());
      req.pipe(upstream);
    });
    return proxy;
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise((resolve) => this.#server.close(resolve));
  }
}

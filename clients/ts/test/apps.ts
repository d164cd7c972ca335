// The same small service, written for Express 4, Express 5 and Fastify, behind the
// idempotency middleware, listening on a loopback port. Its routes exercise the rows of
// docs/middleware.md; every handler run is counted by Idempotency-Key.
import { randomBytes } from "node:crypto";
import { type IncomingMessage, request as httpRequest, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import express5 from "express";
import express4 from "express4";
import Fastify, { type FastifyRequest } from "fastify";
import { idemdKey } from "../src/fingerprint.js";
import type { IdemClient } from "../src/index.js";
import { idempotency as expressIdempotency, type Incident, idempotencySignal } from "../src/express.js";
import { idempotency as fastifyIdempotency } from "../src/fastify.js";
import type { IdempotencyOptions } from "../src/middleware/guard.js";
import { scaled, waitFor } from "./daemon.js";

export type Framework = "express4" | "express5" | "fastify";
export const frameworks: Framework[] = ["express4", "express5", "fastify"];

export interface App {
  url: string;
  /** Handler runs by route and Idempotency-Key. */
  runs: Map<string, number>;
  incidents: Incident[];
  /** Opens the gate of /slow. */
  open(): void;
  /** What a handler saw of its lease signal. */
  signals: AbortSignal[];
  /** Runs of /slow, by route and Idempotency-Key, whose client went away before the answer. */
  gone: Set<string>;
  close(): Promise<void>;
}

type Options = Partial<IdempotencyOptions<{ headers: IncomingMessage["headers"] }>>;

/** What the routes do, shared by every framework: given the request, answer through res. */
interface Ctx {
  route: string;
  key: string;
  user: string;
  body: unknown;
  signal: AbortSignal | undefined;
  /** The raw response, still the framework's (not taken over). */
  res: ServerResponse;
}

export async function startApp(
  framework: Framework,
  client: IdemClient,
  admin: IdemClient,
  options: Options = {},
): Promise<App> {
  const runs = new Map<string, number>();
  const incidents: Incident[] = [];
  const signals: AbortSignal[] = [];
  const gone = new Set<string>();
  let openGate: () => void = () => undefined;
  let gate = new Promise<void>((resolve) => {
    openGate = resolve;
  });
  const scope = (req: { headers: IncomingMessage["headers"] }) => {
    const user = req.headers["x-user"];
    if (user === "throw") throw new Error("no session");
    return typeof user === "string" ? user : undefined;
  };
  const guardOptions = {
    scope,
    // Short, so that R12 sees a renewal soon. Scaled: the tests' premise is that the
    // lease holds while a handler waits on the test (R5, C3a and R12 are about a key
    // released, a waiter that gives up, and a lease lost by a purge, never one that ran
    // out), and a renewal every leaseMs/3 must be answered within it on a busy machine.
    leaseMs: scaled(3000),
    onIncident: (_req: unknown, incident: Incident) => {
      incidents.push(incident);
    },
    ...options,
  };

  /**
   * Runs a route: json answers through the framework (send), the rest through the raw
   * response (raw() hands it over).
   */
  const route = async (
    ctx: Ctx,
    send: (status: number, body: string, headers: Record<string, string | string[]>) => void,
    raw: () => ServerResponse,
    earlyHints: (hints: Record<string, string>) => void,
  ): Promise<void> => {
    const runKey = `${ctx.route} ${ctx.key}`;
    runs.set(runKey, (runs.get(runKey) ?? 0) + 1);
    if (ctx.signal) signals.push(ctx.signal);
    const json = (status: number, value: unknown, headers: Record<string, string | string[]> = {}) =>
      send(status, JSON.stringify(value), { "content-type": "application/json", ...headers });
    switch (ctx.route) {
      case "orders":
        return json(
          201,
          { order: runs.get(runKey), key: ctx.key, body: ctx.body },
          {
            location: "/orders/1",
            "set-cookie": "session=first",
            "x-extra": "not stored",
          },
        );
      case "status": {
        const status = Number((ctx.body as { status: number }).status);
        return json(status, { status });
      }
      case "throw":
        throw new Error("handler failed");
      case "throw-after-status": {
        // R15: the status (the one the body asks for) and part of the body are on the
        // wire when the handler throws.
        const status = Number((ctx.body as { status: number }).status);
        const res = ctx.res;
        res.writeHead(status, { "content-type": "application/json" });
        res.write('{"partial":');
        await new Promise<void>((resolve) => setImmediate(resolve));
        throw new Error("handler failed after its status");
      }
      case "slow":
        ctx.res.once("close", () => {
          if (!ctx.res.writableEnded) gone.add(runKey);
        });
        await gate;
        return json(200, { slow: true });
      case "stream": {
        const res = raw();
        // The test opens the gate once it has read the first chunk: a recorder that
        // held the chunk back would leave this waiting.
        res.writeHead(200, { "content-type": "text/plain" });
        res.write("first ");
        await gate;
        res.end("second");
        return;
      }
      case "slow-fail":
        await gate;
        return json(500, { failed: true });
      case "switch": {
        // R9: the answer is a 101; there is nothing to replay.
        const res = raw();
        res.writeHead(101, { connection: "upgrade", upgrade: "example" });
        res.end();
        return;
      }
      case "big":
        return json(200, { big: "x".repeat(4000) });
      case "large": {
        // 20 MiB of random bytes, the same on every run.
        const res = raw();
        res.writeHead(201, { "content-type": "application/octet-stream" });
        res.end(largeBody());
        return;
      }
      case "under-mib": {
        // Just under 1 MiB, the same on every run: sealed, its envelope is over 1 MiB.
        const res = raw();
        res.writeHead(201, { "content-type": "application/octet-stream" });
        res.end(underMiBBody());
        return;
      }
      case "hints":
        earlyHints({ link: "</style.css>; rel=preload" });
        return json(201, { hinted: true });
      case "lose":
        // Another hand deletes the key while the handler runs: the next renewal finds
        // it gone, the signal aborts, and the handler returns without answering.
        await admin.purge(idemdKey(ctx.user, ctx.key));
        raw();
        await waitFor("the lease signal to abort", () => ctx.signal?.aborted === true);
        return;
      case "lose-after-status": {
        // R12 after the status went out: the key is deleted while the answer is being
        // written; the handler sees its signal abort and ends the answer.
        const res = raw();
        res.writeHead(200, { "content-type": "text/plain" });
        res.write("before ");
        await admin.purge(idemdKey(ctx.user, ctx.key));
        await waitFor("the lease signal to abort", () => ctx.signal?.aborted === true);
        res.end("after");
        return;
      }
      default:
        return json(404, { route: ctx.route });
    }
  };

  let url: string;
  let close: () => Promise<void>;
  if (framework === "fastify") {
    const app = Fastify();
    await app.register(fastifyIdempotency, { client, ...(guardOptions as IdempotencyOptions<FastifyRequest>) });
    app.route({
      method: ["POST", "PUT"],
      url: "/:route",
      handler: async (request, reply) => {
        const params = request.params as { route: string };
        const key = String(request.headers["idempotency-key"] ?? "");
        await route(
          {
            route: params.route,
            key,
            user: String(request.headers["x-user"]),
            body: request.body,
            signal: idempotencySignal(request),
            res: reply.raw,
          },
          (status, body, headers) => {
            void reply.code(status).headers(headers).send(body);
          },
          () => {
            reply.hijack();
            return reply.raw;
          },
          (hints) => {
            void reply.writeEarlyHints(hints);
          },
        );
        return reply;
      },
    });
    await app.listen({ port: 0, host: "127.0.0.1" });
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    close = () => app.close();
  } else {
    const express = (framework === "express4" ? express4 : express5) as typeof express5;
    const app = express();
    app.use(expressIdempotency(client, guardOptions as IdempotencyOptions<express5.Request>));
    app.use(express.json());
    app.all("/:route", async (req, res, next) => {
      try {
        const key = String(req.headers["idempotency-key"] ?? "");
        await route(
          {
            route: req.params.route as string,
            key,
            user: String(req.headers["x-user"]),
            body: req.body,
            signal: idempotencySignal(req),
            res,
          },
          (status, body, headers) => {
            res.status(status).set(headers).send(body);
          },
          () => res,
          (hints) => res.writeEarlyHints(hints),
        );
      } catch (err) {
        next(err);
      }
    });
    const server = app.listen(0, "127.0.0.1");
    await new Promise((resolve) => server.once("listening", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      });
  }
  return {
    url,
    runs,
    incidents,
    signals,
    gone,
    open: () => {
      openGate();
      gate = new Promise<void>((resolve) => {
        openGate = resolve;
      });
    },
    close,
  };
}

let large: Buffer | undefined;
/** What the route /large answers: 20 MiB of random bytes, made once. */
export function largeBody(): Buffer {
  large ??= randomBytes(20 << 20);
  return large;
}

let underMiB: Buffer | undefined;
/** What the route /under-mib answers: 1 MiB less 64 bytes of random bytes, made once. */
export function underMiBBody(): Buffer {
  underMiB ??= randomBytes((1 << 20) - 64);
  return underMiB;
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  /** The body's bytes. */
  bytes: Buffer;
}

/**
 * Sends one request with node:http, which can send a header in several field lines
 * (an array value) and leaves everything else as given.
 */
export function send(
  url: string,
  options: {
    method?: string;
    headers?: Record<string, string | string[]>;
    body?: string | Buffer;
    agent?: import("node:http").Agent | false;
  },
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      { method: options.method ?? "POST", headers: options.headers ?? {}, agent: options.agent },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const bytes = Buffer.concat(chunks);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: bytes.toString(), bytes });
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(options.body);
  });
}

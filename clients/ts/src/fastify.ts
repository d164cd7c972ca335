// The Idempotency-Key plugin for Fastify: docs/middleware.md, row by row.
import { Readable } from "node:stream";
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import type { IdemClient, Lease } from "./client.js";
import {
  type Answer,
  type BodyRead,
  clientGone,
  Guard,
  type IdempotencyOptions,
  idempotencyLease,
} from "./middleware/guard.js";

export {
  type Incident,
  type IncidentKind,
  type IdempotencyOptions,
  idempotencyLease,
  idempotencySignal,
} from "./middleware/guard.js";

declare module "fastify" {
  interface FastifyRequest {
    /**
     * The lease the idempotency plugin runs this request under (docs/effects.md);
     * undefined for a request it does not protect.
     */
    idemdLease?: Lease | undefined;
  }
}

export interface FastifyIdempotencyOptions extends IdempotencyOptions<FastifyRequest> {
  client: IdemClient;
}

const bodies = new WeakMap<FastifyRequest, { key: string; body: Buffer }>();

/**
 * Makes the routes registered after it in the same context idempotent by the
 * Idempotency-Key request header. It reads the body in preParsing (to fingerprint it,
 * handing the same bytes on to the parser) and claims the key in preHandler, after
 * authentication hooks registered before it, which the scope comes from.
 *
 *     await app.register(idempotency, { client, scope: (request) => request.user.id });
 *
 * A handler it runs under a lease finds it at request.idemdLease (docs/effects.md).
 */
const plugin: FastifyPluginAsync<FastifyIdempotencyOptions> = async (app, options) => {
  const { client, ...rest } = options;
  const guard = new Guard<FastifyRequest>(client, rest);
  if (!app.hasRequestDecorator("idemdLease")) app.decorateRequest("idemdLease", undefined);

  app.addHook("preParsing", async (request, reply, payload) => {
    const read = guard.readKey(request.raw);
    if ("pass" in read) return payload;
    if ("answer" in read) return send(reply, read.answer);
    const body = await readBody(payload, guard.maxBodyBytes);
    const bodyProblem = guard.bodyAnswer(body);
    if (bodyProblem || !("body" in body)) return send(reply, bodyProblem as Answer);
    bodies.set(request, { key: read.key, body: body.body });
    const again = Readable.from([body.body]) as Readable & { receivedEncodedLength?: number };
    again.receivedEncodedLength = body.body.length;
    return again;
  });

  app.addHook("preHandler", async (request, reply) => {
    let read = bodies.get(request);
    if (read === undefined) {
      // No body was parsed (nothing to read), or the request is not protected.
      const key = guard.readKey(request.raw);
      if ("pass" in key) return;
      if ("answer" in key) return send(reply, key.answer);
      read = { key: key.key, body: Buffer.alloc(0) };
    }
    const decision = await guard.decide(
      request,
      request.raw,
      request.raw.url ?? "",
      read.key,
      read.body,
      clientGone(reply.raw),
    );
    if ("gone" in decision) {
      // C3a: the client left; nothing is answered and the handler does not run.
      return reply.hijack();
    }
    if ("answer" in decision) {
      // Not awaited: the incident is reported as soon as the answer is written.
      send(reply, decision.answer);
      guard.report(request, decision.incident);
      return reply;
    }
    if ("pass" in decision) {
      guard.report(request, decision.incident);
      return;
    }
    const started = await new Promise<boolean>((resolve) => {
      void guard
        .run(request, request.raw, reply.raw, decision.acquired, () => {
          request.idemdLease = idempotencyLease(request.raw); // L1
          resolve(true);
        })
        .then(() => resolve(false));
    });
    // The lease was lost before the handler could start: the guard has answered.
    if (!started) return reply.hijack();
  });
};

// Like fastify-plugin: the hooks apply to the context that registers the plugin.
(plugin as unknown as Record<symbol, boolean>)[Symbol.for("skip-override")] = true;

export const idempotency = plugin;
export default plugin;

function send(reply: FastifyReply, answer: Answer): FastifyReply {
  // Fastify reads a content-type given as an array as none, so single values go as strings.
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(answer.headers)) {
    headers[name] = Array.isArray(value) && value.length === 1 ? (value[0] as string) : value;
  }
  return reply.code(answer.status).headers(headers).send(answer.body);
}

async function readBody(payload: NodeJS.ReadableStream, max: number): Promise<BodyRead> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of payload) {
      const bytes = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      size += bytes.length;
      if (size > max) return { tooLarge: true };
      chunks.push(bytes);
    }
  } catch (err) {
    return { unreadable: err };
  }
  return { body: Buffer.concat(chunks) };
}

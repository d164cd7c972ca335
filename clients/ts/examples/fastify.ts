// The README's Fastify snippet, cut from the region below; test/examples.test.ts runs it.
import Fastify, { type RouteHandlerMethod } from "fastify";
import { idempotency } from "../src/fastify.js";
import type { IdemClient } from "../src/index.js";

// What the service's authentication sets, whose user the middleware scopes keys to.
declare module "fastify" {
  interface FastifyRequest {
    user?: { id: string };
  }
}

/** A Fastify app whose POST /orders runs at most once per Idempotency-Key and user. */
export async function fastifyApp(
  client: IdemClient,
  authenticate: (request: { headers: Record<string, unknown>; user?: { id: string } }) => Promise<void>,
  createOrder: RouteHandlerMethod,
) {
  const app = Fastify();
  app.addHook("onRequest", authenticate);
  // #region readme-fastify
  await app.register(idempotency, { client, scope: (request) => request.user?.id });
  app.post("/orders", createOrder);
  // #endregion
  return app;
}

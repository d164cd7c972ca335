// The README's "From TypeScript" snippets are cut from the regions below (between
// `#region readme-NAME` and `#endregion`); test/examples.test.ts runs these functions
// against a real idemd and checks that the README still shows the same code.
import express, { type RequestHandler } from "express";
import { idempotency } from "../src/express.js";
import { IdemClient, messageKey } from "../src/index.js";

// What the service's authentication sets, whose user the middleware scopes keys to.
declare global {
  namespace Express {
    interface Request {
      user?: { id: string };
    }
  }
}

/** An Express app whose POST /orders runs at most once per Idempotency-Key and user. */
export function expressApp(client: IdemClient, authenticate: RequestHandler, createOrder: RequestHandler) {
  const app = express();
  // #region readme-express
  app.use(authenticate); // sets req.user
  app.use(idempotency(client, { scope: (req) => req.user?.id }));
  app.use(express.json());
  app.post("/orders", createOrder);
  // #endregion
  return app;
}

export interface Email {
  to: string;
}

/** Runs an operation at most once per key and returns what the README says it returns. */
export async function runOnce(
  baseUrl: string,
  sendEmail: (to: string, options: { signal: AbortSignal }) => Promise<{ messageId: string }>,
) {
  // #region readme-client
  const client = new IdemClient({ baseUrl, token: process.env.IDEMD_TOKEN });
  // #endregion
  // #region readme-run
  const { value, replayed } = await client.run("welcome-email:user-42", (signal) =>
    sendEmail("user-42@example.org", { signal }),
  );
  // replayed is true when an earlier call already sent it; value is what that call returned.
  // #endregion
  return { value, replayed };
}

/** Consumes one delivery of a message; returns whether the handler ran. */
export async function consume(
  client: IdemClient,
  message: { topic: string; partition: number; id: string },
  handle: (signal: AbortSignal) => Promise<void>,
) {
  const { topic, partition, id } = message;
  // #region readme-once
  const ran = await client.once(messageKey(topic, String(partition), id), (signal) => handle(signal));
  // #endregion
  return ran;
}

// The payments example's API. POST /payments with an Idempotency-Key records the payment
// request and publishes a message that carries the request's idemd key in the idemd-key
// header; the chargers (Go and Python) consume it and charge the account once.
//
// Settings come from the environment: PORT, IDEMD_URL, DATABASE_URL, AMQP_URL. The
// caller's identity, which scopes its keys, is the X-User header: a stand-in for the
// authentication a real API has.
import amqp from "amqplib";
import express from "express";
import pg from "pg";
import { IdemClient, messageHeader } from "@idemd/client";
import { idempotency, idempotencyLease } from "@idemd/client/express";

/** The queue of payments to charge, and where the ones that fail for good go. */
export const queue = "payments";
export const deadLetters = "payments.dead";

function setting(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

const idemd = new IdemClient({ baseUrl: setting("IDEMD_URL") });
const db = new pg.Pool({ connectionString: setting("DATABASE_URL"), max: 8 });
const broker = await amqp.connect(setting("AMQP_URL"));
const channel = await broker.createConfirmChannel();
await channel.assertQueue(deadLetters, { durable: true });
await channel.assertQueue(queue, {
  durable: true,
  arguments: { "x-dead-letter-exchange": "", "x-dead-letter-routing-key": deadLetters },
});
// A broker that closes the channel (it went away) ends the process: the supervisor
// restarts it, and the callers' retries find the same keys.
channel.on("close", () => process.exit(1));

/** Publishes body with the key, and resolves once the broker has taken the message. */
function publish(key: string, body: unknown): Promise<void> {
  return new Promise((resolve, reject) => {
    channel.sendToQueue(
      queue,
      Buffer.from(JSON.stringify(body)),
      { persistent: true, messageId: key, headers: { [messageHeader]: key } },
      (err: unknown) => (err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve()),
    );
  });
}

const app = express();
app.post(
  "/payments",
  idempotency(idemd, { scope: (req) => req.headers["x-user"] as string | undefined, requireKey: true }),
  express.json(),
  async (req, res) => {
    const { account, cents } = (req.body ?? {}) as { account?: unknown; cents?: unknown };
    if (typeof account !== "string" || !Number.isSafeInteger(cents) || (cents as number) <= 0) {
      res
        .status(400)
        .type("application/problem+json")
        .json({ title: "Bad payment", status: 400, detail: "account must be a string, cents a positive integer" });
      return;
    }
    // The request's idemd key names the payment: a retry, or a holder that recovers a
    // dead one's lease, records and publishes the same payment again, and both are
    // harmless (the row exists; the chargers deduplicate by the key).
    const key = idempotencyLease(req)?.key;
    if (key === undefined) throw new Error("POST /payments runs without a lease");
    await db.query("INSERT INTO payments (key, account, cents) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING", [
      key,
      account,
      cents,
    ]);
    await publish(key, { account, cents });
    res.status(202).json({ payment: key });
  },
);
app.get("/healthz", (_req, res) => {
  res.status(200).send("ok");
});

app.listen(Number(setting("PORT")), "127.0.0.1");

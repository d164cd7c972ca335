// The payments example's API. POST /payments with an Idempotency-Key records the payment
// request and publishes a message that carries the request's idemd key in the idemd-key
// header; the chargers (Go and Python) consume it and charge the account once.
//
// Settings come from the environment: PORT, IDEMD_URL, DATABASE_URL, AMQP_URL;
// IDEMD_SEAL_KEYS, a key ring, seals what the API stores in idemd under the tenant name
// IDEMD_SEAL_TENANT (default "payments"), as the Go programs do; LEASE_MS
// is the lease of a request (default 30000). The caller's identity, which scopes its
// keys, is the X-User header: a stand-in for the authentication a real API has.
//
// CRASH_BEFORE_PUBLISH, a share between 0 and 1 (default 0), makes the process kill
// itself with SIGKILL after that share of requests, between recording the payment and
// publishing its message: the crash the completer (../completer) exists for. Tests set
// it; nothing else should.
import amqp from "amqplib";
import express from "express";
import pg from "pg";
import { IdemClient, KeyRing, messageHeader } from "@idemd/client";
import { idempotency, idempotencyLease } from "@idemd/client/express";

/** The queue of payments to charge, and where the ones that fail for good go. */
export const queue = "payments";
export const deadLetters = "payments.dead";
/**
 * The prefix of every idemd key of POST /payments, and the recovery point recorded once
 * a payment is in the database: the completer (Go) finds this route's abandoned keys by
 * the one and resumes from the other (payments.KeyPrefix, payments.PointRecorded).
 */
export const keyPrefix = "payments/";
export const pointRecorded = "recorded";

function setting(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

const sealKeys = process.env.IDEMD_SEAL_KEYS;
const idemd = new IdemClient({
  baseUrl: setting("IDEMD_URL"),
  ...(sealKeys
    ? { sealing: { tenant: process.env.IDEMD_SEAL_TENANT || "payments", ring: KeyRing.parse(sealKeys) } }
    : {}),
});
const leaseMs = Number(process.env.LEASE_MS ?? 30_000);
const crashRate = Number(process.env.CRASH_BEFORE_PUBLISH ?? 0);
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
  idempotency(idemd, {
    scope: (req) => req.headers["x-user"] as string | undefined,
    requireKey: true,
    keyPrefix,
    leaseMs,
  }),
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
    const lease = idempotencyLease(req);
    if (lease === undefined) throw new Error("POST /payments runs without a lease");
    const key = lease.key;
    await db.query("INSERT INTO payments (key, account, cents) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING", [
      key,
      account,
      cents,
    ]);
    // Recorded after the insert has committed: whoever finishes this request knows
    // the payment is in the database and only the message is left to publish.
    await lease.checkpoint(pointRecorded);
    if (crashRate > 0 && Math.random() < crashRate) process.kill(process.pid, "SIGKILL");
    await publish(key, { account, cents });
    res.status(202).json({ payment: key });
  },
);
app.get("/healthz", (_req, res) => {
  res.status(200).send("ok");
});

app.listen(Number(setting("PORT")), "127.0.0.1");

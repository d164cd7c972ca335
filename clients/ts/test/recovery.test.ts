// Recovery points on the lease (checkpoint, recoveryPoint), recordRecoveryPoint, and the
// middlewares' keyPrefix, against a real idemd.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import express5 from "express";
import express4 from "express4";
import Fastify from "fastify";
import { idemdKey } from "../src/fingerprint.js";
import {
  IdemClient,
  InProgressError,
  type Lease,
  LeaseLostError,
  PayloadTooLargeError,
  ProblemError,
} from "../src/index.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotency as fastifyIdempotency } from "../src/fastify.js";
import { type Framework, frameworks, send } from "./apps.js";
import { Daemon, freshKey, stalledClient, waitFor } from "./daemon.js";

let daemon: Daemon;
let client: IdemClient;
before(async () => {
  daemon = await Daemon.start();
  client = new IdemClient({ baseUrl: daemon.url });
});
after(async () => {
  await daemon.stop();
});

const text = (data: Uint8Array | undefined) => (data === undefined ? undefined : Buffer.from(data).toString("utf8"));

describe("recovery points", () => {
  test("a holder's checkpoint reaches the caller that takes over; the stale holder's is lease-lost", async () => {
    const key = freshKey("rp-takeover");
    const stalled = stalledClient(daemon.url);
    let first: Lease | undefined;
    let wake: () => void = () => undefined;
    const woken = new Promise<void>((resolve) => {
      wake = resolve;
    });
    const holding = stalled.client.run(
      key,
      async (_signal, lease) => {
        assert.equal(lease.recoveryPoint, undefined);
        await lease.checkpoint("charged", new TextEncoder().encode("ch_123"));
        first = lease;
        stalled.cut(true);
        await woken;
        return "late";
      },
      { leaseMs: 1000 },
    );
    await waitFor("the first holder to checkpoint", () => first !== undefined);
    let second: Lease | undefined;
    await waitFor("the key to be taken over", async () => {
      try {
        await client.run(key, (_signal, lease) => {
          second = lease;
          return "finished from the point";
        });
        return true;
      } catch (err) {
        if (err instanceof InProgressError) return false;
        throw err;
      }
    });
    assert.equal(second?.recovered, true);
    assert.equal(second?.attempt, 2);
    assert.equal(second?.recoveryPoint?.name, "charged");
    assert.equal(text(second?.recoveryPoint?.data), "ch_123");
    assert.equal(second?.recoveryPoint?.attempt, 1);
    assert.ok(second?.recoveryPoint?.recordedAt instanceof Date);
    assert.ok(!Number.isNaN(second?.recoveryPoint?.recordedAt.getTime()));

    stalled.cut(false);
    // The stale holder cannot record over the key's new state: lease-lost, and its
    // lease ends (if its own deadline had not ended it already).
    await assert.rejects(first!.checkpoint("refunded"), LeaseLostError);
    assert.equal(first!.signal.aborted, true);
    wake();
    await assert.rejects(holding, LeaseLostError);
    const record = await client.lookup(key);
    assert.equal(record.state, "completed");
    assert.equal(record.recoveryPoint, undefined);
  });

  test("a lease_lost answer to a checkpoint aborts the lease and the work's call throws it", async () => {
    const key = freshKey("rp-answered");
    const claim = await client.claim(key, { leaseMs: 10_000 });
    assert.equal(claim.outcome, "acquired");
    if (claim.outcome !== "acquired") return;
    let checkpointError: unknown;
    let lease: Lease | undefined;
    await assert.rejects(
      client.underLease(key, claim.leaseToken, 10_000, undefined, async (_signal, held) => {
        lease = held;
        // The key is finished behind the lease's back: it is no longer pending.
        await client.complete(key, claim.leaseToken, { status: 200, body: "done elsewhere" });
        try {
          await held.checkpoint("too-late");
        } catch (err) {
          checkpointError = err;
        }
        return "value";
      }),
      LeaseLostError,
    );
    assert.ok(checkpointError instanceof LeaseLostError);
    assert.equal((checkpointError as LeaseLostError).status, 409);
    assert.equal(lease?.signal.aborted, true);
    assert.equal(lease?.signal.reason, checkpointError);
    // Once lost, a checkpoint throws why without asking idemd.
    await assert.rejects(lease!.checkpoint("again"), (err) => err === checkpointError);
  });

  test("after a release for a retry the next run starts from the point; finishing drops it", async () => {
    const key = freshKey("rp-retry");
    await assert.rejects(
      client.run(key, async (_signal, lease) => {
        await lease.checkpoint("reserved", "seat 12A");
        throw new Error("transient");
      }),
      /transient/,
    );
    let next: Lease | undefined;
    await client.run(key, (_signal, lease) => {
      next = lease;
      return "ok";
    });
    assert.equal(next?.attempt, 2);
    assert.equal(next?.recovered, false);
    assert.equal(next?.recoveryPoint?.name, "reserved");
    assert.equal(text(next?.recoveryPoint?.data), "seat 12A");
    assert.equal(next?.recoveryPoint?.attempt, 1);
    assert.equal((await client.lookup(key)).recoveryPoint, undefined);
  });

  test("an oversized checkpoint is a 413 PayloadTooLargeError that records nothing; the lease goes on", async () => {
    const key = freshKey("rp-large");
    let refused: unknown;
    let during: Awaited<ReturnType<IdemClient["lookup"]>> | undefined;
    const { value } = await client.run(
      key,
      async (signal, lease) => {
        await lease.checkpoint("small", "x");
        try {
          await lease.checkpoint("large", new Uint8Array(4097));
        } catch (err) {
          refused = err;
        }
        during = await client.lookup(key);
        assert.equal(signal.aborted, false);
        return "stored";
      },
      { leaseMs: 5000 },
    );
    assert.equal(value, "stored");
    assert.ok(refused instanceof PayloadTooLargeError);
    assert.ok(refused instanceof ProblemError);
    assert.equal((refused as ProblemError).status, 413);
    assert.equal(during?.state, "pending");
    assert.equal(during?.recoveryPoint?.name, "small");
    assert.equal(text(during?.recoveryPoint?.data), "x");
  });

  test("recordRecoveryPoint records under a token; a stale token is lease-lost", async () => {
    const key = freshKey("rp-low");
    const claim = await client.claim(key, { leaseMs: 10_000 });
    if (claim.outcome !== "acquired") throw new Error("not acquired");
    await client.recordRecoveryPoint(key, claim.leaseToken, "step", new Uint8Array([0, 1, 2]));
    const record = await client.lookup(key);
    assert.equal(record.recoveryPoint?.name, "step");
    assert.deepEqual([...(record.recoveryPoint?.data ?? [])], [0, 1, 2]);
    assert.equal(record.recoveryPoint?.attempt, 1);
    await assert.rejects(client.recordRecoveryPoint(key, "not-the-token", "step"), LeaseLostError);
    // Batching does not apply: the call goes alone even among batched ones.
    await Promise.all([
      client.extend(key, claim.leaseToken, 10_000),
      client.recordRecoveryPoint(key, claim.leaseToken, "step2"),
    ]);
    assert.equal((await client.lookup(key)).recoveryPoint?.name, "step2");
  });
});

interface PrefixApp {
  url: string;
  close(): Promise<void>;
}

/** A service behind the middleware with keyPrefix whose POST /orders checkpoints under its lease. */
async function prefixApp(framework: Framework, keyPrefix: string, seen: Lease[]): Promise<PrefixApp> {
  const options = {
    scope: (req: { headers: Record<string, string | string[] | undefined> }) => String(req.headers["x-user"]),
    keyPrefix,
    leaseMs: 5000,
  };
  const handle = async (lease: Lease | undefined) => {
    if (!lease) throw new Error("no lease");
    seen.push(lease);
    await lease.checkpoint("accepted", "order-1");
    const record = await client.lookup(lease.key);
    return { point: record.recoveryPoint?.name };
  };
  if (framework === "fastify") {
    const app = Fastify();
    await app.register(fastifyIdempotency, { client, ...options });
    app.post("/orders", async (request, reply) => reply.code(201).send(await handle(request.idemdLease)));
    await app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = app.server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}`, close: () => app.close() };
  }
  const app = framework === "express4" ? express4() : express5();
  app.use(expressIdempotency(client, options));
  app.post("/orders", (_req, res, next) => {
    handle(res.locals.idemdLease as Lease | undefined).then((body) => res.status(201).json(body), next);
  });
  const server = app.listen(0, "127.0.0.1");
  await new Promise<void>((resolve) => server.once("listening", () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

for (const framework of frameworks) {
  describe(`${framework}: keyPrefix and checkpoint behind the middleware`, () => {
    test("the idemd key is the prefix and the derived key; the handler's lease checkpoints", async () => {
      const seen: Lease[] = [];
      const prefix = `orders-${framework}/`;
      const app = await prefixApp(framework, prefix, seen);
      try {
        const key = freshKey("mw-prefix");
        const res = await send(`${app.url}/orders`, {
          headers: { "idempotency-key": `"${key}"`, "content-type": "application/json", "x-user": "user-1" },
          body: "{}",
        });
        assert.equal(res.status, 201);
        assert.deepEqual(JSON.parse(res.body), { point: "accepted" });
        const full = prefix + idemdKey("user-1", key);
        assert.equal(seen.length, 1);
        assert.equal(seen[0]?.key, full);
        const record = await client.lookup(full);
        assert.equal(record.state, "completed");
        assert.equal(record.response?.status, 201);
      } finally {
        await app.close();
      }
    });

    test("a keyPrefix over 172 bytes of UTF-8, or not UTF-8, is refused at construction", async () => {
      const scope = () => "user";
      const tooLong = "é".repeat(86) + "x"; // 173 bytes
      const fits = "é".repeat(86); // 172 bytes
      if (framework === "fastify") {
        for (const bad of [tooLong, "a\ud800"]) {
          const app = Fastify();
          await assert.rejects(
            (async () => {
              await app.register(fastifyIdempotency, { client, scope, keyPrefix: bad });
              await app.ready();
            })(),
            RangeError,
          );
          await app.close().catch(() => undefined);
        }
        const app = Fastify();
        await app.register(fastifyIdempotency, { client, scope, keyPrefix: fits });
        await app.ready();
        await app.close();
        return;
      }
      assert.throws(() => expressIdempotency(client, { scope, keyPrefix: tooLong }), RangeError);
      assert.throws(() => expressIdempotency(client, { scope, keyPrefix: "a\ud800" }), RangeError);
      assert.equal(typeof expressIdempotency(client, { scope, keyPrefix: fits }), "function");
    });
  });
}
